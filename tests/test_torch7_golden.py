"""Real Torch7: the stored outputs of Torch7 nn (OpenCV's test data, ../shared/corpus/torch7-golden)
reproduced through the float64 reference, PyTorch and ONNX Runtime; OpenCV's importer on the same
original files; and the three real-world model.t7 files (convert, or fail with a clear message).

Each case is ``<case>_net.<ext>`` with ``<case>_input.<ext>`` and ``<case>_output.<ext>``, in Torch7's
binary (.dat) or ASCII (.txt) serialization; a case in both is tested in both. The input shape
given is the input file's. A 3-D input (net_spatial_zero_padding: C, H, W) is one image to
Torch7's spatial modules: it gets a batch dim of 1 here and loses it again for the comparison.
net_pool_max_output_2 holds the max-pool indices, not a network output: only the first output is
compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS, corpus

from convert import isolate, reference, verify
from convert.api import convert
from convert.artifacts import write
from convert.errors import ConvertError, Unsupported
from convert.torch7.frontend import build, load
from convert.torch7.t7file import T7Error
from convert.torch7.t7file import load as load_t7
from convert.verify import metrics, run_onnx, run_torch

GOLDEN = CORPUS / "torch7-golden"
CASES = sorted({(p.name[: -len("_net" + p.suffix)], p.suffix) for p in GOLDEN.glob("*_net.*")}) \
    if GOLDEN.exists() else []
IDS = [f"{c}{e}" for c, e in CASES]


@pytest.fixture(autouse=True)
def _no_full_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    # verify() collects garbage after each backend (big models); 0.1 s a call with torch loaded
    monkeypatch.setattr(verify.gc, "collect", lambda *a: 0)


def golden(case: str, ext: str) -> tuple[Path, np.ndarray, np.ndarray, bool]:
    """(net file, input with a batch dim, first output likewise, whether a batch dim was added)."""
    d = corpus("torch7-golden")
    x = np.asarray(load_t7(d / f"{case}_input{ext}"), np.float64)
    y = np.asarray(load_t7(d / f"{case}_output{ext}"), np.float64)
    single = x.ndim == 3  # one C, H, W image: Torch7's spatial modules take it unbatched
    return d / f"{case}_net{ext}", x[None] if single else x, y[None] if single else y, single


def test_corpus_has_cases() -> None:
    corpus("torch7-golden")
    assert len(CASES) >= 25


@pytest.mark.parametrize("case,ext", CASES, ids=IDS)
def test_golden_output_reproduced(case: str, ext: str, tmp_path: Path) -> None:
    net, x, y, _ = golden(case, ext)
    loaded = load(net, {"input": x.shape}, 0, {})
    g = loaded.graph
    res = write(g, tmp_path / "m", loaded.extra, None, loaded.known_opencv)
    assert res.report["status"] == "verified", res.report["verification"]
    feeds = {"input": x.astype(np.float32)}
    outs = {"reference": reference.run(g, {"input": x})["output"],
            "pytorch": run_torch(tmp_path / "m" / "model.py", feeds)["output"],
            "onnxruntime": run_onnx(tmp_path / "m" / "model.onnx", feeds)["output"]}
    rel = {k: metrics(y, o)["max_rel"] for k, o in outs.items()}
    assert all(r <= 1e-4 for r in rel.values()), rel
    assert outs["pytorch"].shape == y.shape


def test_opencv_on_the_golden_files(tmp_path: Path) -> None:
    """OpenCV's readNetFromTorch on the original files against Torch7's own outputs (one child
    process for all): it agrees, or deviates where the frontend recorded a known deviation."""
    corpus("torch7-golden")  # skips without the corpus
    feeds, ys, known, jobs = {}, {}, {}, []
    for (case, ext), key in zip(CASES, IDS):
        net, x, y, _ = golden(case, ext)
        feeds[key], ys[key] = x.astype(np.float32), y
        known[key] = build(load_t7(net), x.shape, str(net)).notes
        jobs.append([key, str(net), ext != ".txt"])
    outs, _ = isolate.call("convert.torch7.opencv:forward_many", feeds, jobs=jobs)
    status = {}
    for key in IDS:
        if key + "!error" in outs:
            status[key] = "refused"
        elif metrics(ys[key], outs[key])["max_rel"] <= 1e-4:
            status[key] = "agrees"
        else:
            status[key] = "deviates (known)" if known[key] else f"MISMATCH {metrics(ys[key], outs[key])}"
    assert all(s in ("agrees", "refused", "deviates (known)") for s in status.values()), status
    assert status["net_batch_norm_train.dat"] == "deviates (known)"  # OpenCV: running statistics
    assert sum(s == "agrees" for s in status.values()) >= len(status) - 3, status


# --- real-world model.t7 files ---------------------------------------------------------------

def test_cuda_model_converts(tmp_path: Path) -> None:
    """henlisp/DeepLearning_HW1: an MLP saved with torch.CudaTensor weights (View(784), Linear,
    ReLU, LogSoftMax) for 28x28 MNIST images."""
    src = corpus("realworld", "henlisp", "DeepLearning_HW1", "model.t7")
    res = convert(src, out=tmp_path, shapes={"input": (2, 1, 28, 28)})
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified" and v["opencv"]["ok"], v
    assert res.report["params"] == 784 * 64 + 64 + 64 * 128 + 128 + 128 * 10 + 10
    assert res.report["outputs"] == ["output"] and res.report["dynamic_batch"]


def test_nngraph_model_is_refused_clearly() -> None:
    src = corpus("realworld", "Cadene", "AS_Exam", "model.t7")
    with pytest.raises(Unsupported, match=r"nn\.gModule .*nngraph"):
        load(src, {"input": (1, 5)}, 0, {})


def test_serialized_functions_are_refused_clearly() -> None:
    src = corpus("realworld", "apsvvfb", "compress", "model.t7")
    with pytest.raises(T7Error, match=r"model\.t7: serialized Lua function .* inside nn\.Sequencer") as e:
        load(src, {"input": (1, 5)}, 0, {})
    assert isinstance(e.value, ConvertError) and "\n" not in str(e.value)
