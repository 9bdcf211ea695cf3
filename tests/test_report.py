"""zoo report: the Markdown snapshot of a fixed run, rounding to the noise, CSV, self-contained
HTML (and, where Chromium is installed, what a browser makes of it), plots, and the CLI."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bench import plots, report
from bench.results import validate
from bench.stats import summarize
from zoo.bench_cli import _ms
from zoo.cli import app

SNAPSHOT = Path(__file__).parent / "snapshots" / "report.md"
# Fixed relative deviations: deterministic "noise" without a random generator.
SPREAD = (-0.03, -0.01, 0.0, 0.02, 0.05, -0.02, 0.01, 0.0, 0.04, -0.04, 0.015)
ENV = {"hostname": "bench-box", "os": "Linux-6.1-x86_64", "cpu": "Test CPU 3000", "cores_physical": 4,
       "cores_logical": 8, "threads": 4, "memory_bytes": 16 * 2**30,
       "libraries": {"python": "3.11.7", "torch": "2.3.0", "onnxruntime": "1.18.0",
                     "opencv-python-headless": "4.10.0.84"},
       "env_vars": {"OMP_NUM_THREADS": "4"}, "tf32": False,
       "gemm_peak": {"cpu": {"fp32": {"n": 1024, "tflops": 0.5, "median_ms": 4.3}}}}
GFLOPS = {"alexnet": 1.449, "resnet50": 7.716}


def stats(median: float, scale: float = 1.0) -> dict[str, Any]:
    return summarize([median * (1 + scale * d) for d in SPREAD])


def row(model: str, runtime: str, precision: str = "fp32", batch: int = 1, mode: str = "inference",
        fwd: float | None = None, bwd: float | None = None, status: str = "ok", reason: str = "",
        max_rel: float = 1e-6) -> dict[str, Any]:
    r: dict[str, Any] = {"model": model, "source_format": "caffe", "runtime": runtime, "device": "cpu",
                         "precision": precision, "layout": "nchw", "batch": batch, "mode": mode,
                         "protocol": "zoo", "status": status, "threads": 4}
    if reason:
        r["reason"] = reason
    if fwd is not None:
        r["forward"] = stats(fwd)
        r["backward"] = stats(bwd) if bwd else None
        total_ms = r["forward"]["median_ms"] + (r["backward"]["median_ms"] if bwd else 0.0)
        flops = GFLOPS[model] * batch * (3 if bwd else 1)
        r.update(images_per_s=batch / total_ms * 1000, gflops_per_image=GFLOPS[model],
                 achieved_tflops=flops / total_ms, pct_of_peak=100 * flops / total_ms / 0.5,  # GFLOP/ms = TFLOP/s
                 verification={"max_rel": max_rel, "tolerance": 1e-4 if precision == "fp32" else 1e-2,
                               "ok": status == "ok"})
    return r


def fixture_doc() -> dict[str, Any]:
    """2 models, 3 runtimes, ok / skipped / unverified / error rows, training rows with backward,
    and two batch sizes of one case (for the throughput plot)."""
    rows = [
        row("alexnet", "torch", fwd=30.0), row("alexnet", "onnxruntime", fwd=24.0),
        row("alexnet", "opencv", fwd=27.0, max_rel=2.3e-5), row("alexnet", "torch", batch=8, fwd=150.0),
        row("alexnet", "onnxruntime", batch=8, fwd=120.0),
        row("alexnet", "onnxruntime", "fp16", status="skipped", reason="fp16 needs a GPU"),
        row("resnet50", "torch", batch=16, mode="training", fwd=820.0, bwd=1650.0),
        row("resnet50", "torch", "bf16", batch=16, mode="training", fwd=610.0, bwd=1240.0, status="unverified",
            reason="output differs from the float64 reference by 0.031 (tolerance 0.01)", max_rel=0.031),
        row("resnet50", "onnxruntime", batch=16, mode="training", status="skipped",
            reason="onnxruntime has no training mode here"),
        row("resnet50", "opencv", batch=16, mode="training", status="error",
            reason="worker exited with code -9 (out of memory?)"),
    ]
    return validate({"schema_version": 1, "env": ENV, "rows": rows})


def runs() -> list[report.Run]:
    return [report.Run("fixture.json", fixture_doc())]


def test_markdown_snapshot() -> None:
    text = report.markdown(runs())
    if os.environ.get("ZOO_UPDATE_SNAPSHOTS") or not SNAPSHOT.exists():
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), "report changed: review, then ZOO_UPDATE_SNAPSHOTS=1 pytest ..."


def test_markdown_content() -> None:
    text = report.markdown(runs())
    alex = text[text.index("## alexnet"):text.index("## resnet50")]
    # sorted by total: onnxruntime (24) before opencv (27) before torch (30)
    assert alex.index("| onnxruntime |") < alex.index("| opencv |") < alex.index("| torch | cpu | fp32 | 1 |")
    assert "onnxruntime cpu fp16 nchw 1 inference: skipped — fp16 needs a GPU" in alex
    res = text[text.index("## resnet50"):text.index("## Environment")]
    assert "unverified — output differs" in res and "(forward 610" in res
    assert "opencv cpu fp32 nchw 16 training: error — worker exited" in res
    assert "| Backward (ms) |" in res and "1650" in res
    summary = text[text.index("## Summary"):text.index("## alexnet")]
    assert "| alexnet | cpu | 1 | inference | onnxruntime fp32 |" in summary
    assert "| 1.250× | 1.125× |" in summary  # torch 30 ms, opencv 27 ms / onnxruntime 24 ms
    assert "Test CPU 3000, 4 physical / 8 logical cores, 4 threads" in text
    assert "torch 2.3.0" in text and "OMP_NUM_THREADS=4" in text


@pytest.mark.parametrize("median, iqr", [(29.635, 3.4046), (562.25, 21.74), (1.23456, 0.0123), (0.05, 0.0004),
                                         (12345.6, 250.0), (7.0, 0.0)])
def test_ms_rounding_matches_zoo_bench(median: float, iqr: float) -> None:
    s = {"median_ms": median, "iqr_ms": iqr, "n": 10}
    assert report.fmt_ms(s) == _ms(s)


def test_numbers_carry_no_more_digits_than_the_noise() -> None:
    assert report.fmt_ms({"median_ms": 562.2539, "iqr_ms": 21.7, "n": 4}) == "562 ± 22"
    assert report.fmt_ms({"median_ms": 1993.674, "iqr_ms": 0.0, "n": 1}) == "1994 (n=1)"
    assert report.fmt_noisy(33.7437, 3.4 / 29.6) == "33.7"  # spread 3.9: tenths at most
    assert report.fmt_noisy(1234.5, 0.001) == "1234.5"
    assert report.fmt_noisy(4.8888e-05, 0.1) == "4.89e-05"  # spread 4.9e-06
    assert report.fmt_noisy(0.50159, 0.0) == "0.502"  # no spread known: three significant digits
    assert report.fmt_noisy(None, 0.1) == "-"


def test_csv_has_every_row_at_full_precision() -> None:
    text = report.csv_text(runs())
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(fixture_doc()["rows"])
    assert list(rows[0]) == report.CSV_HEAD
    first = fixture_doc()["rows"][0]
    assert float(rows[0]["forward_median_ms"]) == first["forward"]["median_ms"]
    assert rows[5]["status"] == "skipped" and rows[5]["forward_median_ms"] == ""
    assert float(rows[6]["total_ms"]) == pytest.approx(820 + 1650, rel=0.01)


def test_html_is_self_contained() -> None:
    page = report.html(runs())
    assert page.startswith("<!doctype html>") and "<style>" in page and "<script>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "no network resources"
    assert "<link" not in page and "@import" not in page and "url(http" not in page
    assert page.count("<svg") >= 4  # two timing charts, throughput, roofline
    assert page.count('class="sortable"') == 3  # summary + one per model
    assert "fp16 needs a GPU" in page and "Test CPU 3000" in page


def test_figures(tmp_path: Path) -> None:
    doc = fixture_doc()
    figs = plots.figures(report.all_rows(runs()), [doc["env"]])
    assert set(figs) == {"time-alexnet", "time-resnet50", "throughput", "roofline"}
    paths = plots.save(figs, tmp_path)
    assert len(paths) == 8 and all(p.stat().st_size > 5000 for p in paths)
    assert (tmp_path / "roofline.svg").read_text().lstrip().startswith("<?xml")
    again = plots.save(plots.figures(report.all_rows(runs()), [doc["env"]]), tmp_path / "again")
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(paths, again))  # same data, same bytes


def test_point_names_do_not_cover_each_other() -> None:
    """Five models at nearly the same place (two far ones set the scale): each name gets its own spot."""
    at = [(7.0 + 0.01 * i, 0.1 + 0.0002 * i) for i in range(5)] + [(1.0, 0.01), (50.0, 1.0)]
    rows = [{**row("m", "torch"), "model": f"model-{i}", "gflops_per_image": x, "achieved_tflops": y}
            for i, (x, y) in enumerate(at)]
    fig = plots.roofline(rows, [ENV])
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts]
    assert len(boxes) == 7
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_no_throughput_or_roofline_without_their_data() -> None:
    rows = [r for r in report.all_rows(runs()) if r["batch"] != 8]
    for r in rows:
        r["achieved_tflops"] = None
    figs = plots.figures(rows, [ENV])
    assert "throughput" not in figs and "roofline" not in figs and "time-alexnet" in figs


def test_screenshot_in_a_real_browser(tmp_path: Path) -> None:
    page, png = tmp_path / "report.html", tmp_path / "report.png"
    page.write_text(report.html(runs()))
    ok, why = report.screenshot(page, png, width=1200, height=1600)
    if not ok and "no chromium" in why:
        pytest.skip(why)
    assert ok, why
    assert png.stat().st_size > 30_000
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    assert img.shape[:2] == (1600, 1200)
    gray = img[..., :3].mean(axis=2)
    assert gray.std() > 0.05  # not a blank page
    assert (gray < 0.5).mean() > 0.01  # text and plots drawn


# ---------------------------------------------------------------- the command

runner = CliRunner()


def zoo(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def write(tmp_path: Path, doc: Any, name: str = "run.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_cli_markdown_to_stdout(tmp_path: Path) -> None:
    r = zoo("report", str(write(tmp_path, fixture_doc(), "fixture.json")))
    assert r.exit_code == 0, r.output
    assert r.stdout == report.markdown(runs())


def test_cli_html_and_plots(tmp_path: Path) -> None:
    src = write(tmp_path, fixture_doc())
    r = zoo("report", str(src), "--format", "html", "--out", str(tmp_path / "out" / "r.html"),
            "--plots", str(tmp_path / "plots"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "r.html").read_text().startswith("<!doctype html>")
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"time-alexnet.png", "time-alexnet.svg",
                                                                 "roofline.png", "throughput.svg"}
    r = zoo("report", str(src), "--out", str(tmp_path / "out" / "r.md"), "--plots", str(tmp_path / "plots"))
    assert r.exit_code == 0, r.output
    assert "![alexnet: time per call](../plots/time-alexnet.png)" in (tmp_path / "out" / "r.md").read_text()


def test_cli_csv(tmp_path: Path) -> None:
    r = zoo("report", str(write(tmp_path, fixture_doc())), "--format", "csv")
    assert r.exit_code == 0 and r.stdout.startswith("run,model,runtime")


@pytest.mark.parametrize("content, message", [
    ([1, 2], "neither a zoo results file"),
    ({"schema_version": 2, "env": {}, "rows": []}, "schema_version 2 is newer"),
    ({"schema_version": 1, "env": {}, "rows": []}, "nothing to report"),
    ({"schema_version": 1, "env": {}, "rows": [{"model": "x"}]}, "row 0: missing"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, content: Any, message: str) -> None:
    r = zoo("report", str(write(tmp_path, content)))
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) <= 2  # the error (and the empty-run warning)


def test_cli_empty_run_is_a_warning_when_others_are_usable(tmp_path: Path) -> None:
    empty = write(tmp_path, {"schema_version": 1, "env": {}, "rows": []}, "empty.json")
    r = zoo("report", str(empty), str(write(tmp_path, fixture_doc())))
    assert r.exit_code == 0
    assert "an empty run" in r.stderr and "## alexnet" in r.stdout


def test_a_folder_reports_its_results_and_skips_other_json(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    write(tmp_path / "runs", fixture_doc(), "a.json")
    write(tmp_path / "runs", {"status": "verified"}, "convert.json")
    r = zoo("report", str(tmp_path / "runs"))
    assert r.exit_code == 0, r.output
    assert "convert.json: neither a zoo results file" in r.stderr and "## resnet50" in r.stdout


def test_cli_unknown_format(tmp_path: Path) -> None:
    r = zoo("report", str(write(tmp_path, fixture_doc())), "--format", "pdf")
    assert r.exit_code == 2 and "unknown format 'pdf'" in r.output


def test_total_combines_spreads() -> None:
    r = fixture_doc()["rows"][6]
    t, iqr = report.total(r)
    assert t == pytest.approx(r["forward"]["median_ms"] + r["backward"]["median_ms"])
    assert iqr == pytest.approx(math.hypot(r["forward"]["iqr_ms"], r["backward"]["iqr_ms"]))
    assert np.isclose(r["images_per_s"], 16 / t * 1000)


def test_requests_in_flight_are_a_column_a_summary_group_and_in_the_csv() -> None:
    one, two = row("alexnet", "onnxruntime", fwd=24.0), {**row("alexnet", "onnxruntime", fwd=40.0), "concurrency": 4}
    slow = {**row("alexnet", "torch", fwd=30.0), "concurrency": 4}
    rs = [report.Run("c.json", validate({"schema_version": 1, "env": ENV, "rows": [one, two, slow]}))]
    head, body = report.summary_table(report.all_rows(rs))
    assert "concurrency" in head and len(body) == 2  # one fastest per requests in flight
    k = head.index("concurrency")
    assert sorted(r[k][0] for r in body) == ["1", "4"]
    text = report.render(rs, "md")
    assert "None" not in text
    got = list(csv.DictReader(io.StringIO(report.csv_text(rs))))
    assert [r["concurrency"] for r in got] == ["1", "4", "4"]
    single = report.render([report.Run("s.json", validate({"schema_version": 1, "env": ENV, "rows": [one]}))], "md")
    assert "in flight" not in single  # one request at a time is not said


def test_the_fastest_is_a_verified_runtime() -> None:
    rows = [row("alexnet", "torch", fwd=30.0),
            row("alexnet", "onnxruntime", fwd=10.0, status="unverified", reason="differs", max_rel=0.5)]
    rs = [report.Run("v.json", validate({"schema_version": 1, "env": ENV, "rows": rows}))]
    head, body = report.summary_table(report.all_rows(rs))
    assert body[0][head.index("fastest")][1] == "torch"


def test_figure_text_with_dollars_is_drawn_as_text() -> None:
    """A '$' in a model name is not a math formula (an unbalanced one failed the whole figure)."""
    from matplotlib.figure import Figure

    from bench import plots

    fig = Figure()
    ax = fig.add_subplot()
    ax.bar([0], [1.0])
    ax.set_xticks([0], [plots.plain("net$\\frac$")])
    ax.set_title(plots.plain("a$b"))
    assert "net" in plots.svg_inline(fig)


def test_the_summary_has_a_line_per_precision_against_the_fp32_baselines() -> None:
    """A faster bf16 does not hide the fastest fp32; both are measured against OpenCV fp32."""
    rows = [row("alexnet", "opencv", fwd=20.0), row("alexnet", "openvino", fwd=14.0),
            row("alexnet", "openvino", precision="bf16", fwd=5.0, max_rel=0.04), row("alexnet", "torch", fwd=25.0)]
    rs = [report.Run("p.json", validate({"schema_version": 1, "env": ENV, "rows": rows}))]
    head, body = report.summary_table(report.all_rows(rs))
    fastest, cv = head.index("fastest"), head.index("× OpenCV fp32")
    assert [(b[fastest][0], round(b[cv][1], 2)) for b in body] == [("openvino fp32", 1.43), ("openvino bf16", 4.0)]
