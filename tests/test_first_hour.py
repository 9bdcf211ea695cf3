"""A new user's first hour (issue 11): progress in a log, tables at 80/120 columns, messages that
say what to do, zoo --version, zoo list's cache, zoo info's layers."""

from __future__ import annotations

import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from bench import compare as cmp
from bench import results
from bench.stats import summarize
from zoo import bench_cli, catalogue, tables
from zoo import cli as zcli
from zoo.cli import app, si

runner = CliRunner()
NET = '''input: "data" input_dim: 1 input_dim: 3 input_dim: 12 input_dim: 12
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc1000" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
'''


def zoo(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def net(tmp_path: Path, text: str = NET, name: str = "tiny.prototxt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- progress in a log ------------------------------------------------------------------------

def _row(case: Any, status: str = "ok", ms: float = 12.34) -> dict[str, Any]:
    r = {"model": case.model, "runtime": case.runtime, "device": case.device, "precision": case.precision,
         "layout": case.layout, "batch": case.batch, "mode": case.mode, "protocol": case.protocol,
         "status": status}
    if status == "ok":
        r.update(forward=summarize(np.full(5, ms)), images_per_s=1000 / ms)
    else:
        r["reason"] = "no reason at all"
    return r


@pytest.fixture
def fake_sweep(monkeypatch):  # type: ignore[no-untyped-def]
    """zoo bench's flow with the sweep replaced: each case 'finishes' at once (no conversion, no timing)."""
    def run(cases, recorder, progress=None, live=None, **kw):  # type: ignore[no-untyped-def]
        rows = []
        for i, c in enumerate(cases):
            progress(i, len(cases), c, None, math.nan)
            c = live(c)
            rows.append(_row(c, "ok" if i == 0 else "skipped"))
            recorder.add(rows[-1])
            progress(i + 1, len(cases), c, rows[-1], 5.0 * (len(cases) - i - 1))
        return rows

    monkeypatch.setattr(bench_cli.sweep, "run", run)
    monkeypatch.setattr(bench_cli.interleaved, "run", run)
    monkeypatch.setattr(bench_cli.benchmark.Plan, "live", lambda self, case: case)  # nothing converted
    monkeypatch.setattr(bench_cli, "_peaks", lambda *a, **k: {})


BENCH = ["--runtime", "torch", "--runtime", "onnxruntime", "--precision", "fp32"]


def test_plain_progress_lines_when_stdout_is_not_a_terminal(tmp_path: Path, fake_sweep) -> None:  # type: ignore[no-untyped-def]
    r = zoo("bench", str(net(tmp_path)), *BENCH, "--out", str(tmp_path / "r.json"))
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any(re.fullmatch(r"planning 1/1: tiny \(elapsed \d+s\)", ln) for ln in lines), r.stdout
    assert any(ln.startswith("tiny: converting and verifying") for ln in lines)
    first = next(ln for ln in lines if ln.startswith("[1/2]"))
    assert re.fullmatch(r"\[1/2\] tiny torch cpu fp32 b1 inference: forward 12\.3 ms \(median\), ok "
                        r"\(elapsed \d+s, about 5s left\)", first), first
    second = next(ln for ln in lines if ln.startswith("[2/2]"))
    assert "tiny onnxruntime cpu fp32 b1 inference: skipped: no reason at all" in second
    assert "None" not in r.output and "\r" not in r.output and "\x1b" not in r.output


def test_no_plain_lines_on_a_terminal(tmp_path: Path, fake_sweep, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    term = {"force_terminal": True, "width": 100, "markup": False}
    out, err = Console(file=io.StringIO(), **term), Console(file=io.StringIO(), **term)
    monkeypatch.setattr(zcli, "out", out)
    monkeypatch.setattr(zcli, "err", err)
    r = zoo("bench", str(net(tmp_path)), *BENCH, "--out", str(tmp_path / "r.json"))
    assert r.exit_code == 0, r.output
    text = out.file.getvalue()
    assert "[1/2]" not in text and "planning" not in text and "tiny" in text  # the table, not the lines


def test_a_progress_total_not_known_yet_is_not_shown_as_none() -> None:
    from rich.progress import Progress

    with Progress(bench_cli._Count(), console=Console(file=io.StringIO())) as bar:
        t = bar.add_task("preparing models", total=None)
        assert str(bench_cli._Count().render(bar.tasks[t])) == ""
        bar.update(t, total=13, completed=2)
        assert str(bench_cli._Count().render(bar.tasks[t])) == "2/13"


# --- tables at 80 and 120 columns -------------------------------------------------------------

def _bench_rows() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for model, rt, ms in (("alexnet", "torch", 35.3), ("alexnet", "onnxruntime", 28.1),
                          ("resnet101-lua", "opencv", 353.2), ("googlenet", "torch-compile", 1234.5),
                          ("resnet101-lua", "onnxruntime-trt", None)):
        r = {"model": model, "runtime": rt, "device": "cpu", "precision": "fp32", "layout": "nchw", "batch": 1,
             "mode": "inference", "protocol": "zoo", "status": "ok" if ms else "skipped", "backward": None,
             "verification": {"max_rel": 1.2e-6}}
        if ms:
            r.update(forward=summarize(rng.normal(ms, ms * 0.02, 20)), images_per_s=1000 / ms)
        else:
            r.update(forward=None, reason="TensorRT needs CUDA (this machine has none)")
        rows.append(r)
    return rows


def render(renderable: Any, width: int) -> str:
    con = Console(width=width, file=io.StringIO(), markup=False, emoji=False, highlight=False)
    con.print(renderable)
    return con.file.getvalue()


def test_bench_summary_at_80_columns_is_compact_and_cuts_nothing() -> None:
    rows = _bench_rows()
    text = render(bench_cli.summary_table(rows, 80), 80)
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for model, cells in (("alexnet", ["torch", "35.", "ms", "ok"]), ("googlenet", ["compile", "1.2", " s "]),
                         ("resnet101-lua", ["opencv", "35", "ms"])):
        assert any(model in ln and all(c in ln for c in cells) for ln in text.splitlines()), (model, text)
    assert "compile = torch-compile" in text and "ort = onnxruntime" in text  # the abbreviations, explained
    assert "every row: cpu fp32 b1 inf" in text and "TensorRT needs CUDA (this machine has none)" in text
    assert "max rel err" not in text  # the full table (in the results file and zoo report) has it
    wide = render(bench_cli.summary_table(rows[:2], 200), 200)
    assert "max rel err" in wide and "onnxruntime" in wide  # the full table where it fits


def _compare_lines() -> list[cmp.Line]:
    a = _bench_rows()[:4]
    b = [dict(r, forward=summarize(np.asarray(r["forward"]["samples_ms"]) * 1.1)) for r in a]
    doc = lambda rows: {"schema_version": 1, "env": {}, "rows": rows}  # noqa: E731
    return cmp.compare(doc(a), doc(b)).lines


@pytest.mark.parametrize("width", [80, 120])
def test_compare_table_cells_neither_cut_nor_wrapped(width: int) -> None:
    lines = _compare_lines()
    full = render_compare(lines, width)
    assert "…" not in full and max(map(len, full.splitlines())) <= width
    for ln in lines:  # each case on one line of its own, its ratio whole
        model, runtime = ln.case[0], tables.runtime(ln.case[1])
        row = [t for t in full.splitlines() if t.startswith(model) and f" {runtime} " in t]
        assert len(row) == 1 and cmp.fmt_ratio(ln).replace(", ", ",") in row[0] and "slower" in row[0], full


def render_compare(lines: list[cmp.Line], width: int) -> str:
    from rich.table import Table

    full = Table(*"model runtime device prec batch mode part A B ratio floor verdict".split())
    for ln in lines:
        full.add_row(*map(str, ln.case), ln.part, str(ln.a_ms), str(ln.b_ms), cmp.fmt_ratio(ln), "2%", ln.verdict)
    return render(tables.fit(full, width, lambda: tables.compact_compare(lines, cmp.fmt_ratio)), width)


def test_zoo_compare_at_80_columns(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rows = _bench_rows()[:2]
    for name, scale in (("a", 1.0), ("b", 1.2)):
        doc = {"schema_version": 1, "env": {}, "rows": [
            dict(r, forward=summarize(np.asarray(r["forward"]["samples_ms"]) * scale)) for r in rows]}
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    out = Console(file=io.StringIO(), width=80, markup=False)
    monkeypatch.setattr(zcli, "out", out)
    r = zoo("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert r.exit_code == 1  # 20% slower
    text = out.file.getvalue()
    assert "…" not in text and "ort = onnxruntime" in text and text.count("slower") >= 2, text


def test_short_units() -> None:
    assert [tables.short_ms(x) for x in (0.0753, 3.531, 35.31, 353.1, 1234.5)] == \
        ["75.3 µs", "3.53 ms", "35.3 ms", "353 ms", "1.23 s"]
    assert [si(x) for x in (0, 43_200, 724_406_816, 1.583e9, 25.56e6)] == ["0.00", "43.2k", "724M", "1.58G", "25.6M"]


# --- messages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["convert", "info", "bench"])
def test_a_directory_argument_lists_the_model_files_inside(tmp_path: Path, command: str) -> None:
    for name in ("b.prototxt", "a.prototxt", "c.t7", "notes.txt"):
        (tmp_path / name).write_text("x")
    r = zoo(command, str(tmp_path))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{tmp_path}: is a directory; directories are not supported" in r.stderr
    assert "(inside: a.prototxt, b.prototxt, c.t7)" in r.stderr


def test_did_you_mean_for_a_layer_type_and_a_field(tmp_path: Path) -> None:
    text = NET.replace('"InnerProduct"', '"InnerProdcut"').replace("num_output: 10", "num_ouput: 10")
    r = zoo("info", str(net(tmp_path, text)))
    assert r.exit_code == 2
    assert "unsupported caffe layer type: InnerProdcut ('fc1000'; did you mean 'InnerProduct'?)" in r.stderr
    assert "field 'num_ouput' is not in BVLC Caffe's InnerProductParameter (did you mean 'num_output'?)" in r.stderr
    r = zoo("info", str(net(tmp_path, NET.replace("kernel_size: 3", "kernel_sise: 3"))))
    assert "did you mean 'kernel_size'?" in r.stderr
    r = zoo("info", str(net(tmp_path, NET.replace('type: "ReLU"', 'type: "Sigmoidd"'))))
    assert "did you mean 'Sigmoid'?" in r.stderr
    r = zoo("info", str(net(tmp_path, NET.replace('type: "ReLU"', 'type: "Frobnicate"'))))
    assert r.exit_code == 2 and "did you mean" not in r.stderr  # no guess when nothing is close


def test_a_missing_brace_gives_the_error_line_first(tmp_path: Path) -> None:
    text = NET.replace("kernel_size: 3 } }", "kernel_size: 3 }")  # the conv layer's '}' deleted
    r = zoo("info", str(net(tmp_path, text)))
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"error: {tmp_path / 'tiny.prototxt'}:") and "never closed" in lines[0]
    assert "missing before 'layer' at line 4" in lines[0]
    assert "is not in" not in r.stderr  # no misleading 'field layer is not in LayerParameter'


def test_gpu_on_a_cpu_only_torch_says_how_to_install_cuda() -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    r = zoo("bench", "alexnet", "--gpu", "0", "--dry-run")
    assert r.exit_code == 2
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu" in r.stderr


# --- small things -----------------------------------------------------------------------------

def test_version() -> None:
    from importlib.metadata import version

    r = zoo("--version")
    assert r.exit_code == 0
    assert r.stdout.strip() == (f"zoo {version('zoo')} (torch {version('torch')}, onnx {version('onnx')}, "
                                f"onnxruntime {version('onnxruntime')})")


def test_info_shows_an_inner_product_once_with_its_flatten_noted(tmp_path: Path) -> None:
    r = zoo("info", str(net(tmp_path)))
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.stdout.splitlines() if "fc1000" in ln]
    assert len(rows) == 1 and "linear (input flattened)" in rows[0] and "4,010" in rows[0]  # 4*10*10 + 10
    assert "multiply-adds 14,800 (14.8k per image)" in r.stdout  # conv 4*10*10*27 + fc 400*10, not '0.000 G'


def test_results_files_get_the_users_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        results.write(tmp_path / "r.json", {"schema_version": 1, "env": {}, "rows": []})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_list_figures_come_from_the_cache_when_the_definition_is_unchanged(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    entry = catalogue.Entry("tiny", net(tmp_path), (3, 12, 12))
    monkeypatch.setattr(catalogue, "CATALOGUE", {"tiny": entry})
    cache = tmp_path / "cache" / "zoo-list.json"
    (row,) = catalogue.list_rows(tmp_path / "models", cache)
    assert (row["params"], row["macs"], row["status"]) == (4 * 27 + 4 + 4010, 14_800, "not converted")
    monkeypatch.setattr(catalogue, "_figures", lambda e: pytest.fail("recomputed although cached"))
    assert catalogue.list_rows(tmp_path / "models", cache) == [row]
    entry.source.write_text(NET.replace("num_output: 10", "num_output: 20"))  # a changed definition
    monkeypatch.setattr(catalogue, "_figures", lambda e: {"params": 1, "macs": 2})
    assert catalogue.list_rows(tmp_path / "models", cache)[0]["params"] == 1
    assert json.loads(cache.read_text())["tiny"]["params"] == 1


def test_info_on_a_narrow_terminal_folds_cells_instead_of_cutting_them(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = Console(file=io.StringIO(), width=50, markup=False)
    monkeypatch.setattr(zcli, "out", out)
    r = zoo("info", str(net(tmp_path, NET.replace('"fc1000"', '"a_rather_long_layer_name_of_fc"'))))
    assert r.exit_code == 0, r.output
    text = out.file.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 50
    first_column = "".join(ln.split("│")[1].strip() for ln in text.splitlines() if ln.startswith("│"))
    assert "a_rather_long_layer_name_of_fc" in first_column  # whole, over several lines


def test_wide_table_takes_names_with_brackets_as_text() -> None:
    """Measuring whether the full table fits must not read a model's name as console markup."""
    rows = [dict(r, model="net[/x]") for r in _bench_rows()[:2]]
    text = render(bench_cli.summary_table(rows, 200), 200)
    assert "net[/x]" in text
