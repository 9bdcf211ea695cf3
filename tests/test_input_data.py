"""zoo bench --input-data: .npy and image folders checked against the model input, images prepared with
the catalogue's preprocessing, rotated batches, the input source recorded in every row."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench.inputs import InputData, load_batches
from bench.worker import run_case
from convert.errors import ConvertError
from zoo import benchmark
from zoo.catalogue import CAFFE_IMAGENET, CATALOGUE, TORCH_IMAGENET
from zoo.cli import app

cv2 = pytest.importorskip("cv2")
NET = """name: "tiny"
input: "data" input_dim: 1 input_dim: 3 input_dim: 12 input_dim: 10
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 } }
"""


def folder(tmp_path: Path, **arrays: np.ndarray) -> Path:
    d = tmp_path / "inputs"
    d.mkdir(exist_ok=True)
    for name, a in arrays.items():
        if name.endswith("_png"):
            cv2.imwrite(str(d / f"{name[:-4]}.png"), a)
        else:
            np.save(d / f"{name}.npy", a)
    return d


def uniform_bgr(b: int, g: int, r: int, h: int = 20, w: int = 30) -> np.ndarray:
    return np.tile(np.uint8([b, g, r]), (h, w, 1))


def test_folder_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="not a folder"):
        InputData.scan(tmp_path / "missing")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "notes.txt").write_text("x")
    with pytest.raises(ConvertError, match="no .npy or image"):
        InputData.scan(tmp_path / "e")


@pytest.mark.parametrize("shape,ok", [((3, 12, 10), True), ((5, 3, 12, 10), True), ((3, 10, 12), False),
                                      ((1, 1, 3, 12, 10), False), ((12, 10), False)])
def test_npy_shape_checked(tmp_path: Path, shape: tuple[int, ...], ok: bool) -> None:
    data = InputData.scan(folder(tmp_path, x=np.zeros(shape, np.float32)))
    if ok:
        data.check("data", "tiny", (3, 12, 10))
    else:
        with pytest.raises(ConvertError, match=r"x\.npy: shape .* does not fit input 'data' of tiny"):
            data.check("data", "tiny", (3, 12, 10))


def test_images_need_one_or_three_channels(tmp_path: Path) -> None:
    data = InputData.scan(folder(tmp_path, a_png=uniform_bgr(1, 2, 3)))
    data.check("data", "m", (1, 8, 8))
    with pytest.raises(ConvertError, match="1 or 3 channels"):
        data.check("data", "m", (2, 8, 8))


def test_caffe_and_torch_preprocessing(tmp_path: Path) -> None:
    data = InputData.scan(folder(tmp_path, a_png=uniform_bgr(10, 20, 30)))
    caffe = data.samples((3, 7, 5), CAFFE_IMAGENET)[0]  # BGR minus BVLC's mean, resized to 7 x 5
    assert caffe.shape == (3, 7, 5)
    np.testing.assert_allclose(caffe[:, 0, 0], [10 - 104, 20 - 117, 30 - 123])
    torch_ = data.samples((3, 7, 5), TORCH_IMAGENET)[0]  # RGB in [0, 1], ImageNet mean and std
    np.testing.assert_allclose(torch_[:, 3, 2], [(30 / 255 - 0.485) / 0.229, (20 / 255 - 0.456) / 0.224,
                                                 (10 / 255 - 0.406) / 0.225], rtol=1e-5)
    raw = data.samples((3, 7, 5), None)[0]
    np.testing.assert_allclose(raw[:, 0, 0], [10, 20, 30])
    grey = data.samples((1, 4, 4), None)[0]
    np.testing.assert_allclose(grey[0, 0, 0], 0.299 * 30 + 0.587 * 20 + 0.114 * 10, rtol=1e-5)


def test_pillow_reads_the_same_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("PIL")
    data = InputData.scan(folder(tmp_path, a_png=uniform_bgr(10, 20, 30)))
    with_cv2 = data.samples((3, 6, 6), CAFFE_IMAGENET)
    monkeypatch.setitem(sys.modules, "cv2", None)  # `import cv2` now fails: Pillow reads the file
    np.testing.assert_allclose(data.samples((3, 6, 6), CAFFE_IMAGENET), with_cv2)


def test_unreadable_image_named(tmp_path: Path) -> None:
    d = folder(tmp_path)
    (d / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ConvertError, match="broken.jpg: not a readable image"):
        InputData.scan(d).samples((3, 4, 4), None)


def test_batches_rotate_every_sample_and_fingerprint(tmp_path: Path) -> None:
    a = np.arange(5 * 2 * 2 * 2, dtype=np.float32).reshape(5, 2, 2, 2)
    data = InputData.scan(folder(tmp_path, a=a))
    bs = data.batches((2, 2, 2), 2, None)
    assert len(bs) == 3 and all(b.shape == (2, 2, 2, 2) for b in bs)
    np.testing.assert_array_equal(np.concatenate(bs)[:5], a)
    np.testing.assert_array_equal(bs[2][1], a[0])  # the last batch filled up from the first sample
    desc = data.describe(None)
    assert desc.startswith(f"{data.folder} (1 files, sha256 {data.sha256[:16]}")
    np.save(data.folder / "a.npy", a + 1)
    assert InputData.scan(data.folder).sha256 != data.sha256


def test_catalogue_preprocessing() -> None:
    for e in CATALOGUE.values():
        assert e.preprocess == (CAFFE_IMAGENET if e.framework == "caffe" else TORCH_IMAGENET), e.name


def test_real_inputs_reach_worker_and_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # outputs/ of this test
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    x = np.random.default_rng(3).standard_normal((3, 3, 12, 10)).astype(np.float32)
    d = folder(tmp_path, x=x)
    plan = benchmark.plan([str(proto)], runtimes=["torch"], precisions=["fp32"], layouts=["nchw"], batches=[2],
                          input_data=d)
    case = plan.live(plan.cases[0])
    np.testing.assert_array_equal(np.concatenate([b["data"] for b in load_batches(case.input_data, "data")])[:3], x)
    case.policy = {**case.policy, "min_iters": 3, "min_s": 0.0, "max_s": 0.2, "warmup_s": 0.0, "warmup_max_s": 0.2}
    row = run_case(case.to_dict())
    assert row["status"] == "ok", row.get("reason")
    assert row["inputs"] == f"{d} (1 files, sha256 {InputData.scan(d).sha256[:16]})"
    assert "-d" in Path(case.reference).name  # the reference ran on the real batch, not the seeded one


def test_cli_refuses_bad_npy_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    d = folder(tmp_path, bad=np.zeros((3, 5, 5), np.float32))
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["bench", str(proto), "--runtime", "torch", "--input-data", str(d), "--out", str(out)])
    assert r.exit_code == 2 and "bad.npy: shape (3, 5, 5) does not fit input 'data' of tiny" in r.output
    assert "Traceback" not in r.output and not out.exists() and not (tmp_path / "outputs" / "models").exists()
    assert [ln for ln in r.output.splitlines() if ln.startswith("error")] == [r.output.splitlines()[-1]]


def test_broken_image_and_text_npy_refused_at_check(tmp_path: Path) -> None:
    """Refused by check(), before any model is converted or timed (not mid-sweep, not a traceback)."""
    d = folder(tmp_path)
    (d / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ConvertError, match="broken.jpg: not a readable image"):
        InputData.scan(d).check("data", "m", (3, 4, 4))
    (tmp_path / "e").mkdir()
    e = folder(tmp_path / "e", words=np.array([["a", "b"]]))
    with pytest.raises(ConvertError, match="words.npy: holds <U1 values, not numbers"):
        InputData.scan(e).check("data", "m", (1, 2))


def test_unreadable_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = folder(tmp_path, x=np.zeros((1, 2), np.float32))

    def denied(self: Path):  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(ConvertError, match="cannot read .Permission denied"):
        InputData.scan(d)
