"""zoo convert --jobs N: each model in its own process with its share of the memory budget, the
same results as one after another."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from convert import limits
from zoo import parallel
from zoo.cli import app
from zoo.parallel import Failed, map_jobs

NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 12 input_dim: 12
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: {n} kernel_size: 3 pad: 1 }} }}
layer {{ name: "relu" type: "ReLU" bottom: "conv" top: "conv" }}
layer {{ name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
'''


def nets(d: Path) -> list[str]:
    d.mkdir()
    out = []
    for i, n in enumerate((4, 6)):
        p = d / f"net{i}.prototxt"
        p.write_text(NET.format(n=n))
        out.append(str(p))
    return out


def _stable(text: str, tmp: Path) -> str:
    """The printed output without the run's times and folders."""
    text = text.replace(str(tmp), "TMP")
    return re.sub(r"\d+\.\d(?= *│|\s*\|| *$)", "S", text, flags=re.M)


VARYING = ("seconds", "write_seconds", "created", "peak_rss_bytes")  # differ between any two runs


def _report(d: Path) -> dict:  # type: ignore[type-arg]
    """convert.json without what differs between any two runs (times, memory peaks)."""
    def strip(x):  # type: ignore[no-untyped-def]
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VARYING}
        return x

    return strip(json.loads((d / "convert.json").read_text()))


def test_jobs_give_the_serial_results(tmp_path: Path) -> None:
    files = nets(tmp_path / "src")
    runs = {}
    for name, extra in (("serial", []), ("jobs", ["--jobs", "2"])):
        r = CliRunner().invoke(app, ["convert", *files, "--out", str(tmp_path / name), *extra])
        assert r.exit_code == 0, r.output
        runs[name] = r.output.replace(str(tmp_path / name), "OUT")
    assert _stable(runs["serial"], tmp_path).splitlines()[:3] == _stable(runs["jobs"], tmp_path).splitlines()[:3]
    for i in range(2):
        a, b = tmp_path / "serial" / f"net{i}", tmp_path / "jobs" / f"net{i}"
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
        assert (a / "model.py").read_text() == (b / "model.py").read_text()
        assert _report(a) == _report(b)


def test_a_bad_model_is_one_line_as_in_the_serial_run(tmp_path: Path) -> None:
    files = nets(tmp_path / "src")
    bad = tmp_path / "src" / "bad.prototxt"
    bad.write_text('input: "data" input_dim: 1 input_dim: 3 input_dim: 2 input_dim: 2\n'
                   'layer { name: "conv" type: "Convolution" bottom: "data" top: "c" '
                   'convolution_param { num_output: 2 kernel_size: 3 } }\n')
    outs = []
    for extra in ([], ["--jobs", "2"]):
        r = CliRunner().invoke(app, ["convert", files[0], str(bad), "--out", str(tmp_path / "o"), *extra])
        assert r.exit_code == 2 and "Traceback" not in r.output
        outs.append([ln for ln in r.output.splitlines() if ln.startswith("error:")])
    assert outs[0] == outs[1] and len(outs[0]) == 1 and "layer 'conv'" in outs[0][0]


def child_budget(_: object) -> str | None:
    return os.environ.get(limits.ENV)


def child_fails(_: object) -> None:
    raise limits.ConvertError("refused in the child")


def test_each_job_gets_its_share_of_the_memory_budget() -> None:
    share = limits.memory_budget() // 2
    pids = list(map_jobs(child_budget, [0, 1, 2], jobs=2))
    assert pids == [str(share)] * 3
    assert list(map_jobs(child_fails, [0], jobs=1)) == [Failed("refused in the child")]


def test_jobs_must_be_positive(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["convert", *nets(tmp_path / "src"), "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs must be at least 1" in r.output


@pytest.mark.parametrize("cmd", [["convert", "alexnet", "--cluster", "local"]])
def test_cluster_without_ray_is_one_line(cmd: list[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    r = CliRunner().invoke(app, cmd)
    assert r.exit_code == 2 and "pip install -e '.[cluster]'" in r.output


def child_dies(_: object) -> None:
    os._exit(9)  # as a kill for memory would


def test_a_killed_child_is_one_line_not_a_hang() -> None:
    with pytest.raises(limits.ConvertError, match="its process died"):
        list(map_jobs(child_dies, ["x"], jobs=1))


def test_corpus_check_with_jobs(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from zoo import checks, checks_common

    monkeypatch.setattr(checks_common, "OUT", tmp_path / "checks")  # not the committed outputs/checks
    root = tmp_path / "corpus"
    (root / "seeds").mkdir(parents=True)
    nets(root / "realworld")
    (root / "seeds" / "odd.prototxt").write_text('input: "data" input_dim: 1 input_dim: 3 input_dim: 4 '
                                                 'input_dim: 4\nlayer { name: "x" type: "NoSuchLayer" '
                                                 'bottom: "data" top: "y" }\n')
    res = checks.corpus(root, jobs=2)
    assert res["counts"] == {"verified": 2, "unsupported": 1} and res["unsupported_layer_types"] == {"NoSuchLayer": 1}
    assert [r["file"] for r in res["rows"]] == ["realworld/net0.prototxt", "realworld/net1.prototxt",
                                                 "seeds/odd.prototxt"]
    assert (tmp_path / "checks" / "corpus.json").exists()  # written where the test said, not in outputs/


def child_needs(item: tuple[int, str]) -> str:
    """Refused, in the budget's own words, unless the budget holds ``item[0]`` bytes."""
    need, name = item
    reason = limits.over_budget(need, f"converting {name}")
    if reason:
        raise limits.ConvertError(reason)
    return f"{name} converted"


def test_a_job_refused_for_its_share_runs_again_alone_with_the_whole_budget() -> None:
    full = limits.memory_budget()
    items = [(full, "big"), (1, "small"), (full * 4, "too-big"), (full // 2 + 1, "half")]
    serial = []
    for it in items:
        try:
            serial.append(child_needs(it))
        except limits.ConvertError as e:
            serial.append(Failed(str(e)))
    assert serial[0] == "big converted" and isinstance(serial[2], Failed)
    assert parallel.MEMORY in serial[2].message  # the words a refusal for memory has (limits.over_budget)
    assert list(map_jobs(child_needs, items, jobs=3)) == serial


def child_warns(_: object) -> None:
    import logging

    logging.getLogger("convert.caffe").warning("layer '\x1b[31mred\x1b[0m'\nskipped")
    logging.getLogger("convert.caffe").info("an info the parent does not show")


def test_a_childs_warnings_are_printable_at_the_parents_level(capfd) -> None:  # type: ignore[no-untyped-def]
    import logging

    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.WARNING)
    try:
        list(map_jobs(child_warns, [0], jobs=1))
    finally:
        root.setLevel(old)
    err = capfd.readouterr().err
    assert "warning: layer 'red' skipped" in err
    assert "\x1b" not in err and "an info" not in err


def child_slow_or_dies(item: str) -> str:
    import time

    if item == "dies":
        os._exit(9)
    time.sleep(30 if item == "slow" else 0)
    return item


def test_a_dead_child_is_named_not_the_first_pending_job() -> None:
    with pytest.raises(limits.ConvertError) as e:
        list(map_jobs(child_slow_or_dies, ["slow", "dies"], jobs=2))
    assert str(e.value).startswith("dies: its process died")  # not 'slow', the first in order, stopped for it


def test_cluster_jobs_are_resolved_on_the_driver(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from zoo.catalogue import ROOT
    from zoo.pipeline import resolve

    monkeypatch.chdir(ROOT / "tests")
    inside = resolve(str(ROOT / "prototxt" / "alexnet.prototxt"))
    (spec, out, weights, *rest), kw = parallel.portable(((inside, Path("../outputs/x"), None, None, 0), {"fold": 1}))
    assert (spec, out, weights, rest, kw) == ("prototxt/alexnet.prototxt", "outputs/x", None, [None, 0], {"fold": 1})
    named = parallel.portable(((resolve("alexnet"), tmp_path / "o", None), {}))
    assert named[0][:2] == ("alexnet", str(tmp_path / "o"))  # a zoo name as it is; --out outside: absolute
    outside = resolve(nets(tmp_path / "src")[0])
    with pytest.raises(limits.ConvertError, match="must be inside the zoo checkout"):
        parallel.portable(((outside, Path("o"), None), {}))
