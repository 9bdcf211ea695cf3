"""zoo compare: matching, verdicts (interval and noise floor), environment warnings, exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bench import compare as cmp
from bench.results import ResultsError, validate
from bench.stats import summarize
from zoo.cli import app

ENV = {"cpu": "Test CPU 3000", "threads": 4, "libraries": {"torch": "2.3.0", "onnxruntime": "1.18.0"},
       "gpu": {"name": "NVIDIA H200", "driver": "550.54", "cuda": "12.4", "cudnn": 90100}}
runner = CliRunner()


def row(samples: np.ndarray, model: str = "resnet50", runtime: str = "torch", backward: np.ndarray | None = None,
        layout: str = "nchw", status: str = "ok") -> dict[str, Any]:
    r = {"model": model, "runtime": runtime, "device": "cuda:0", "precision": "fp32", "layout": layout,
         "batch": 16, "mode": "training" if backward is not None else "inference", "protocol": "zoo",
         "status": status, "forward": summarize(samples),
         "backward": summarize(backward) if backward is not None else None}
    if status != "ok":
        r["reason"] = "why"
    return r


def doc(*rows: dict[str, Any], env: dict[str, Any] | None = None) -> dict[str, Any]:
    return validate({"schema_version": 1, "env": env or ENV, "rows": list(rows)})


def files(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str]:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return str(pa), str(pb)


def zoo(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def base(n: int = 40, sd: float = 0.3, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(10, sd, n)


def test_a_20_percent_slowdown_is_slower_and_exits_1(tmp_path: Path) -> None:
    a = base()
    c = cmp.compare(doc(row(a)), doc(row(a * 1.2)))
    (ln,) = c.lines
    assert ln.verdict == "slower" and ln.lo > 1.1 and ln.ratio == pytest.approx(1.2)
    assert c.geomean() == pytest.approx(1.2)
    r = zoo("compare", *files(tmp_path, doc(row(a)), doc(row(a * 1.2))), "--threshold", "5")
    assert r.exit_code == 1, r.output
    assert "slower" in r.stdout and "regression" in r.stderr and "resnet50 torch cuda:0" in r.stderr


def test_a_20_percent_speedup_exits_0(tmp_path: Path) -> None:
    a = base()
    r = zoo("compare", *files(tmp_path, doc(row(a * 1.2)), doc(row(a))))
    assert r.exit_code == 0, r.output
    assert "faster" in r.stdout


def test_identical_runs_show_no_significant_difference(tmp_path: Path) -> None:
    a = base()
    c = cmp.compare(doc(row(a)), doc(row(a.copy())))
    assert [ln.verdict for ln in c.lines] == ["no significant difference"]
    r = zoo("compare", *files(tmp_path, doc(row(a)), doc(row(a))))
    assert r.exit_code == 0, r.output
    assert "no significant" in r.stdout and "warning" not in r.output


def test_a_tiny_real_difference_below_the_noise_floor(tmp_path: Path) -> None:
    a = base(200, 0.01, 3)
    c = cmp.compare(doc(row(a)), doc(row(a * 1.005)))
    (ln,) = c.lines
    assert ln.lo > 1  # real: the interval excludes 1...
    assert ln.verdict == "no significant difference"  # ...but smaller than the 2% floor
    assert cmp.compare(doc(row(a)), doc(row(a * 1.005)), floor=0.001).lines[0].verdict == "slower"
    fa, fb = files(tmp_path, doc(row(a)), doc(row(a * 1.005)))
    assert zoo("compare", fa, fb).exit_code == 0
    # a lower floor makes it significant, yet 0.5% is under the 5% threshold; a 0.1% threshold fails
    assert zoo("compare", fa, fb, "--noise-floor", "0.1").exit_code == 0
    assert zoo("compare", fa, fb, "--noise-floor", "0.1", "--threshold", "0.1").exit_code == 1


def test_the_runs_own_noise_raises_the_floor() -> None:
    a = base(400, 2.0, 4)  # single calls vary by about 27% (IQR / median)
    c = cmp.compare(doc(row(a)), doc(row(a * 1.1)))
    (ln,) = c.lines
    assert ln.lo > 1 and ln.floor > 0.2  # significant by the interval, within the runs' own noise
    assert ln.verdict == "no significant difference"


def test_training_rows_compare_forward_and_backward() -> None:
    a = base()
    c = cmp.compare(doc(row(a, backward=2 * a)), doc(row(a, backward=2.6 * a)))
    assert [(ln.part, ln.verdict) for ln in c.lines] == [("forward", "no significant difference"),
                                                          ("backward", "slower")]
    assert c.geomean("backward") == pytest.approx(1.3) and c.geomean("forward") == pytest.approx(1.0)
    assert c.geomean() == pytest.approx(np.sqrt(1.3))
    assert "forward 1.000, backward 1.300, all 1.140" in cmp.summary(c)


def test_rows_match_by_case_and_layout_where_ambiguous() -> None:
    a = base()
    rows_a = [row(a, layout="nchw"), row(a * 2, layout="channels_last"), row(a, model="vgg16")]
    rows_b = [row(a * 2.2, layout="channels_last"), row(a, layout="nchw"), row(a, model="alexnet")]
    pairs, only_a, only_b = cmp.match(rows_a, rows_b)
    assert [(x["layout"], y["layout"]) for x, y in pairs] == [("nchw", "nchw"), ("channels_last", "channels_last")]
    assert [k[0] for k in only_a] == ["vgg16"] and [k[0] for k in only_b] == ["alexnet"]
    # a case with other layout/protocol in each run still matches when it is the only one
    x, y = row(a, layout="nchw"), row(a, layout="channels_last")
    assert len(cmp.match([x], [y])[0]) == 1
    # one row against several of the same case: compared with each; several against several: not
    z = row(a, layout="nhwc")
    assert len(cmp.match([x], [y, z])[0]) == 2
    pairs, only_a, only_b = cmp.match([x, z], [y, row(a, layout="other")])
    assert pairs == [] and len(only_a) == len(only_b) == 2


def test_any_runtime_matches_across_runtimes() -> None:
    a = base()
    da, db = doc(row(a, runtime="torch7-cudnn")), doc(row(a * 0.5, runtime="torch"), row(a, runtime="onnxruntime"))
    with pytest.raises(ResultsError, match="no matching rows"):
        cmp.compare(da, db)
    c = cmp.compare(da, db, any_runtime=True)
    assert sorted(ln.case[1] for ln in c.lines) == ["torch7-cudnn→onnxruntime", "torch7-cudnn→torch"]
    assert {ln.case[1]: ln.verdict for ln in c.lines}["torch7-cudnn→torch"] == "faster"


def test_env_differences_are_warned_unless_ignored(tmp_path: Path) -> None:
    other = {**ENV, "gpu": {**ENV["gpu"], "name": "NVIDIA A100", "driver": "535.1"},
             "libraries": {"torch": "2.4.0", "onnxruntime": "1.18.0"}}
    assert cmp.env_differences(ENV, other) == ["GPU: NVIDIA H200 vs NVIDIA A100", "driver: 550.54 vs 535.1",
                                               "torch: 2.3.0 vs 2.4.0"]
    assert cmp.env_differences(ENV, {**ENV, "threads": 8}) == ["threads: 4 vs 8"]
    a = base()
    fa, fb = files(tmp_path, doc(row(a)), doc(row(a), env=other))
    r = zoo("compare", fa, fb)
    assert r.exit_code == 0 and "environments differ: GPU: NVIDIA H200 vs NVIDIA A100" in r.stderr
    r = zoo("compare", fa, fb, "--ignore-env")
    assert r.exit_code == 0 and "environments differ" not in r.output


def test_no_matching_rows_is_exit_2_with_a_clear_message(tmp_path: Path) -> None:
    a = base()
    r = zoo("compare", *files(tmp_path, doc(row(a, model="vgg16")), doc(row(a, model="alexnet"))))
    assert r.exit_code == 2
    assert "no matching rows" in r.output and "vgg16" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_partly_matching_runs_warn_about_the_rest(tmp_path: Path) -> None:
    a = base()
    r = zoo("compare", *files(tmp_path, doc(row(a), row(a, model="vgg16")), doc(row(a))))
    assert r.exit_code == 0 and "1 case(s) only in A" in r.stderr


def test_rows_without_timings_are_listed_not_compared() -> None:
    a = base()
    c = cmp.compare(doc(row(a), row(a, runtime="onnxruntime")),
                    doc(row(a), {**row(a, runtime="onnxruntime", status="error"), "forward": None}))
    assert len(c.lines) == 1 and c.not_timed == ["resnet50 onnxruntime cuda:0 fp32 b16 inference forward: "
                                                 "A ok, B error"]


@pytest.mark.parametrize("b, message", [
    ({"schema_version": 1, "env": {}, "rows": []}, "an empty run"),
    ({"schema_version": 3, "env": {}, "rows": []}, "schema_version 3 is newer"),
    ({"hello": 1}, "neither a zoo results file"),
])
def test_bad_input_is_exit_2(tmp_path: Path, b: dict[str, Any], message: str) -> None:
    r = zoo("compare", *files(tmp_path, doc(row(base())), b))
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_empty_run_raises() -> None:
    with pytest.raises(ResultsError, match="empty"):
        cmp.compare(doc(), doc(row(base())))


def test_ratio_is_shown_with_the_precision_of_its_interval() -> None:
    ln = cmp.Line(("m", "r", "cpu", "fp32", 1, "inference"), "forward", 10, 12, 1, 1, 1.2034, 1.1871, 1.2212,
                  0.02, "slower")
    assert cmp.fmt_ratio(ln) == "1.203 [1.187, 1.221]"


def interleaved(samples: np.ndarray, runtime: str, round_ratios: np.ndarray, baseline: str = "opencv"
                ) -> dict[str, Any]:
    r = row(samples, runtime=runtime)
    r["interleave"] = {"rounds": len(round_ratios), "window_s": 0.3, "label": runtime, "baseline": baseline,
                       "round_ratios": list(round_ratios), "ratio": float(np.median(round_ratios)),
                       "ratio_ci": [0.0, 0.0]}
    return r


def test_interleaved_runs_compare_ratios_to_the_baseline_not_times() -> None:
    rng = np.random.default_rng(3)
    ratios = lambda m: m + 0.01 * rng.standard_normal(12)  # noqa: E731
    a = doc(interleaved(base(), "opencv", np.ones(12)), interleaved(base() * 0.6, "onnxruntime", ratios(0.6)),
            interleaved(base() * 0.8, "torch", ratios(0.8)))
    # B: the whole machine 30% slower (every time), ORT's ratio the same, torch's 20% worse
    b = doc(interleaved(base(seed=2) * 1.3, "opencv", np.ones(12)),
            interleaved(base(seed=2) * 0.78, "onnxruntime", ratios(0.6)),
            interleaved(base(seed=2) * 1.25, "torch", ratios(0.96)))
    c = cmp.compare(a, b)
    by = {ln.case[1]: ln for ln in c.lines}
    assert by["opencv"].part == "forward" and by["opencv"].verdict == "slower"  # the baseline: by time
    assert by["onnxruntime"].part == "forward / opencv" and by["onnxruntime"].baseline == "opencv"
    assert by["onnxruntime"].verdict == "no significant difference"  # by time it would be 1.3x slower
    assert by["onnxruntime"].a_ms == pytest.approx(0.6, abs=0.01)
    assert by["torch"].verdict == "slower" and by["torch"].ratio == pytest.approx(1.2, abs=0.03)
    assert by["torch"].lo > 1.1
    assert "2 of them compare interleaved ratios to the baseline (opencv)" in cmp.summary(c)
    # the baseline's own time (30% slower: the machine) is information, not a regression or in a mean
    assert by["opencv"].informational and not by["torch"].informational
    assert [ln.case[1] for ln in c.regressions(5)] == ["torch"]
    assert c.geomean() == pytest.approx(math.sqrt(by["onnxruntime"].ratio * by["torch"].ratio))
    assert "baseline's own time (resnet50 opencv cuda:0 fp32 b16 inference) is informational" in cmp.summary(c)
    ms = lambda m, q: f"{m:.1f} ms"  # noqa: E731
    assert by["onnxruntime"].side("A", ms) == f"{by['onnxruntime'].a_ms:.3g}× opencv time"
    assert by["opencv"].side("B", ms).endswith(" ms")


def test_ratios_to_different_baselines_compare_times() -> None:
    a = doc(interleaved(base(), "torch", np.full(5, 0.6), baseline="opencv"))
    b = doc(interleaved(base(), "torch", np.full(5, 0.6), baseline="onnxruntime"))
    (ln,) = cmp.compare(a, b).lines
    assert ln.part == "forward" and not ln.baseline


def test_requests_in_flight_make_another_case() -> None:
    from bench.results import key

    one, two = row(base()), {**row(base() * 0.6), "concurrency": 2}
    assert key(one) != key(two) and key(one) == key({**one, "concurrency": 1})
    c = cmp.compare(doc(one, two), doc(row(base() * 1.2), {**row(base() * 0.6), "concurrency": 2}))
    assert sorted(round(ln.ratio, 1) for ln in c.lines) == [1.0, 1.2]  # each paired with its own


def test_rows_with_different_requests_in_flight_never_pair() -> None:
    # the layouts differ too, so the exact keys do not match; the case alone would pair them
    one = row(base())
    two = {**row(base() * 0.6, layout="nhwc"), "concurrency": 2}
    pairs, only_a, only_b = cmp.match([one], [two])
    assert pairs == [] and len(only_a) == len(only_b) == 1
    pairs, _, _ = cmp.match([one], [row(base(), layout="nhwc")])
    assert len(pairs) == 1  # the same concurrency (1): they do pair


def test_interleaved_ratios_are_compared_with_a_block_bootstrap() -> None:
    from bench import interleave

    steps = np.repeat([0.9, 1.1, 0.95, 1.05, 1.0, 1.0], 2)  # rounds that move in pairs
    a = doc(interleaved(base(), "opencv", np.ones(12)), interleaved(base() * 0.6, "torch", steps * 0.6))
    b = doc(interleaved(base(), "opencv", np.ones(12)), interleaved(base() * 0.6, "torch", steps[::-1] * 0.6))
    ln = next(ln for ln in cmp.compare(a, b).lines if ln.baseline)
    assert (ln.ratio, ln.lo, ln.hi) == interleave.ratio_ci(steps * 0.6, steps[::-1] * 0.6)


def test_an_old_non_fp32_baseline_is_not_taken_for_todays_fp32_one() -> None:
    """Before sessions, "torch" in an fp16 group meant torch fp16; since then it means torch fp32."""
    from bench.compare import _baseline

    old = {"precision": "fp16", "interleave": {"baseline": "torch"}}
    new = {"precision": "fp16", "interleave": {"baseline": "torch", "round_session": [0, 1]}}
    assert _baseline(old) == "torch fp16" and _baseline(new) == "torch"
    assert _baseline({"precision": "fp32", "interleave": {"baseline": "opencv"}}) == "opencv"
