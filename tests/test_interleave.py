"""Interleaved timing: runtimes taking turns in long-lived workers, ratios to a baseline with an
interval over rounds, failures as error rows, and the sweep / CLI around it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bench import interleave, report
from bench.cases import Case
from bench.interleave import Entrant, attach, describe, median_ci, run_group
from bench.results import KEY, Recorder, validate
from bench.stats import summarize
from bench.timing import Policy
from zoo.cli import app

TESTS = Path(__file__).parent
POLICY = Policy(warmup_iters=1, warmup_s=0, min_iters=3, min_s=0, max_iters=5, max_s=1).__dict__


@pytest.fixture(autouse=True)
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the workers import the fake runtimes
    import fake_runtimes  # noqa: F401  (and this process, for the skip checks)


def case(runtime: str, mode: str = "inference", **kw: Any) -> dict[str, Any]:
    return Case(model="m", source_format="caffe", artifact="", runtime=runtime, device="cpu", precision="fp32",
                layout="nchw", batch=1, mode=mode, protocol="zoo", threads=1, input_shapes={"x": [1, 2]},
                output_shapes=[[1, 2]], policy=POLICY, **kw).to_dict() | {"plugin": "fake_runtimes"}


def test_ratios_with_an_interval_over_rounds_and_a_runtime_entered_twice() -> None:
    # test-sleep: 20 ms per forward; test-async: 15 ms of queued work waited for by sync
    rows = run_group([case("test-sleep"), case("test-async"), case("test-sleep")], labels=["a", "b", "a2"],
                     rounds=8, window_s=0.06, timeout_s=60)
    assert [r["status"] for r in rows] == ["unverified"] * 3  # timed; no reference to verify
    base, other, again = (r["interleave"] for r in rows)
    assert {base["baseline"], other["baseline"], again["baseline"]} == {"a"} and base["ratio"] == 1.0
    assert base["order"] == ["a", "b", "a2"] and other["rounds"] == 8
    assert len(other["round_ms"]) == len(other["round_ratios"]) == 8
    lo, hi = other["ratio_ci"]
    assert lo <= other["ratio"] <= hi and 0.65 < lo and hi < 0.85, other
    lo, hi = again["ratio_ci"]  # A/A: the same runtime twice; a 95% interval misses an exact 1.0 in
    # about one run of twenty, and sleep's wake-up differs by position in the round by ~0.01%, so
    # the interval must reach within 1% of 1 (a failure of 1 in ~20 CI runs at 1.00013 before)
    assert lo <= 1.01 and hi >= 0.99 and hi - lo < 0.2, again
    # the row's own statistics cover every sample of every round
    assert rows[0]["forward"]["n"] >= 8 * 2 and rows[0]["forward"]["median_ms"] >= 20.0


def test_training_rounds_time_the_whole_step() -> None:
    rows = run_group([case("test-sleep", "training"), case("test-async", "training")], rounds=3, window_s=0.1,
                     timeout_s=60)
    assert rows[0]["backward"]["median_ms"] >= 30.0
    assert 50.0 <= rows[0]["interleave"]["round_ms"][0] < 60.0  # 20 ms forward + 30 ms backward
    assert 0.5 < rows[1]["interleave"]["ratio"] < 0.7  # (15 + 15) / (20 + 30)


def test_a_crash_or_a_hang_is_an_error_row_and_the_others_go_on() -> None:
    rows = run_group([case("test-crash"), case("test-sleep"), case("test-hang")], rounds=3, window_s=0.05,
                     timeout_s=6)
    assert rows[0]["status"] == "error" and "exit code 3" in rows[0]["reason"]
    assert rows[2]["status"] == "error" and "timed out" in rows[2]["reason"]
    assert "interleave" not in rows[0] and rows[1]["interleave"]["entrants"] == ["test-sleep"]


def test_baseline_is_opencv_when_timed_else_as_asked_else_the_first() -> None:
    def ents(*labels: str) -> list[Entrant]:
        out = []
        for k, lb in enumerate(labels):
            e = Entrant(lb, {}, row={"status": "ok"})
            e.round_ms = [10.0 * (k + 1), 10.0 * (k + 1) * 1.02, 10.0 * (k + 1) * 0.99]
            out.append(e)
        return out

    es = ents("torch", "opencv", "onnxruntime")
    attach(es, 3, 0.3, None)
    assert [e.row["interleave"]["baseline"] for e in es] == ["opencv"] * 3
    assert es[0].row["interleave"]["ratio"] == pytest.approx(0.5) and es[2].row["interleave"]["ratio"] == 1.5
    es = ents("torch", "onnxruntime")
    attach(es, 3, 0.3, "onnxruntime")
    assert es[0].row["interleave"]["baseline"] == "onnxruntime"
    es = ents("torch", "onnxruntime")
    attach(es, 3, 0.3, None)
    assert es[1].row["interleave"]["baseline"] == "torch"


def test_median_interval_is_seeded_and_covers_the_spread() -> None:
    rng = np.random.default_rng(1)
    v = 1.0 + 0.05 * rng.standard_normal(12)
    assert median_ci(v) == median_ci(v)  # fixed seed: the same interval twice
    m, lo, hi = median_ci(v)
    assert lo < m < hi and hi - lo < 0.1
    m, lo, hi = median_ci([2.0] * 5)
    assert m == lo == hi == 2.0


def test_sweep_interleaves_groups_and_records_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    orig = Case.to_dict
    monkeypatch.setattr(Case, "to_dict", lambda self: {**orig(self), "plugin": "fake_runtimes"})
    plain = lambda rt, **over: Case(**{k: v for k, v in case(rt).items() if k != "plugin"} | over)  # noqa: E731
    fixed = Policy(fixed=3).__dict__
    cases = [plain("test-sleep"), plain("test-async"),  # a group; a fixed-count protocol's pair
             plain("test-sleep", batch=4, policy=fixed), plain("test-async", batch=4, policy=fixed)]
    rec = Recorder(tmp_path / "r.json", {"threads": 1})
    seen: list[tuple[int, int]] = []
    rows = interleave.run(cases, rec, rounds=3, window_s=0.05, timeout_s=60,
                          progress=lambda i, n, c, row, eta: seen.append((i, n)))
    assert len(rows) == 4 and len(validate(rec.doc)["rows"]) == 4
    # a fixed-count protocol keeps its own counts: not interleaved
    assert [("interleave" in r) for r in rows] == [True, True, False, False]
    assert seen[-1] == (4, 4)
    assert interleave.run(cases, Recorder(tmp_path / "r.json", {}, resume=True), rounds=3) == []


@pytest.mark.parametrize("args, message", [
    (["--baseline", "tensorflow"], "--baseline 'tensorflow' is not one of the runtimes"),
    (["--rounds", "2"], "--rounds must be at least 8"),
    (["--rounds", "7"], "--rounds must be at least 8"),
    (["--concurrency", "0"], "--concurrency must be at least 1"),
])
def test_bad_interleave_options_are_exit_2(args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, ["bench", "alexnet", "--runtime", "torch", "--runtime", "opencv", "--dry-run",
                                 *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_report_and_summary_show_the_interleaved_speed(tmp_path: Path) -> None:
    def entrant(runtime: str, ms: float, rounds: list[float]) -> Entrant:
        row = {k: v for k, v in case(runtime).items() if k in KEY}
        e = Entrant(runtime, {}, row={**row, "status": "ok", "forward": summarize([ms, ms * 1.01, ms * 0.99])})
        e.round_ms = rounds
        return e

    ents = [entrant("opencv", 10.0, [10.0, 11.0, 10.5, 10.2]), entrant("onnxruntime", 5.0, [5.0, 5.6, 5.2, 5.1]),
            entrant("torch", 20.0, [20.0, 22.0, 21.0, 20.4])]
    attach(ents, 4, 0.3, None)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema_version": 1, "env": {"threads": 1}, "rows": [e.row for e in ents]}))
    text = report.render(report.load_runs([path]), "md")
    assert "× baseline (interleaved)" in text
    ort = next(ln for ln in text.splitlines() if ln.startswith("| onnxruntime |"))
    assert "× [" in ort and ort.count("opencv") == 1, ort  # its speed against opencv, with the interval
    summary = next(ln for ln in text.splitlines() if ln.startswith("| m |"))
    assert "× [" in summary, summary  # the fastest against OpenCV from the rounds, with the interval
    (line,) = describe([e.row for e in ents])
    assert "speed against opencv" in line and "onnxruntime 2.0" in line and "torch 0.50" in line, line


def test_a_budget_shrinks_the_rounds_to_fit() -> None:
    cases = [Case(**{k: v for k, v in case(rt).items() if k != "plugin"}) for rt in ("test-sleep", "test-async")]
    assert interleave.fit_rounds(16, 3600, cases) == 16  # plenty of time: as asked
    assert interleave.fit_rounds(16, 2 * (4.0 + 8 * 0.6), cases) == 8
    assert interleave.fit_rounds(12, 1, cases) == 8  # never below an interval's minimum
    assert interleave.fit_rounds(16, 2 * (4.0 + 9.5 * 0.6), cases) == 16  # a multiple of 8 (4 sessions)


def test_rounds_asked_are_at_least_8_and_a_multiple_of_8() -> None:
    from zoo.bench_cli import _check_interleave

    assert _check_interleave(["torch", "opencv"], None, 9) == 16
    assert _check_interleave(["torch", "opencv"], None, 8) == 8
    assert _check_interleave(["torch", "opencv"], None, None) is None


def test_the_order_is_reversed_every_other_round_and_rotates(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def ask(self: Entrant, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if "window" in msg:
            seen.append(self.label)
            return {"samples_ms": [[10.0, 11.0, 12.0]]}
        if "prior" in msg:  # a later session's worker takes the earlier samples
            return {"ok": True}
        return {"status": "ok", "forward": summarize([10.0])}  # the final row

    monkeypatch.setattr(interleave, "_open", lambda e, timeout: None)  # no worker processes here
    monkeypatch.setattr(Entrant, "ask", ask)
    rows = run_group([case("x"), case("y"), case("z")], labels=["a", "b", "c"], rounds=6)
    assert "".join(seen) == "abc" "cba" "bca" "acb" "cab" "bac"  # every entrant in every place twice
    assert rows[2]["interleave"]["round_ms"] == [11.0] * 6 and rows[2]["interleave"]["order"] == ["a", "b", "c"]
    assert [interleave.order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"]] * 2


def _ar1(n: int, phi: float, rng: np.random.Generator) -> np.ndarray:
    x = np.zeros(n)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + rng.standard_normal()
    return 1.0 + 0.02 * x


def test_block_bootstrap_is_wider_than_iid_on_correlated_rounds() -> None:
    """Neighbouring rounds correlated (lag-1 ~ +0.5): resampling single rounds understates the
    interval; blocks of consecutive rounds do not."""
    def widening(n: int) -> float:
        rng = np.random.default_rng(7)
        wider = []
        for _ in range(100):
            v = _ar1(n, 0.5, rng)
            _, lo, hi = median_ci(v, n_boot=500)
            iid = np.median(np.random.default_rng(0).choice(v, (500, v.size)), axis=1)
            ilo, ihi = np.percentile(iid, [2.5, 97.5])
            wider.append((hi - lo) / (ihi - ilo))
        return float(np.mean(wider))

    assert widening(40) > 1.15  # blocks of 6
    assert widening(12) > 1.0  # blocks of 2: only a little wider with so few rounds


def test_block_resample_takes_consecutive_rounds() -> None:
    assert [interleave.block_len(n) for n in (3, 6, 12, 16, 40)] == [2, 2, 2, 4, 6]
    v = np.arange(12.0)
    got = interleave.block_resample(v, 50, np.random.default_rng(0))
    assert got.shape == (50, 12)
    pairs = got.reshape(50, 6, 2)
    assert np.all(pairs[:, :, 1] == (pairs[:, :, 0] + 1) % 12)  # blocks of 2, wrapping at the end
    _, lo, hi = interleave.ratio_ci(v + 10, 2 * (v + 10))
    assert lo < 2.0 < hi


def test_a_worker_answering_garbage_or_not_leaving_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    import tempfile

    def entrant(code: str) -> Entrant:
        e = Entrant("x", {})
        e.stderr = tempfile.TemporaryFile()
        e.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=e.stderr, bufsize=0)
        return e

    e = entrant("print('Traceback (most recent call last):')")
    with pytest.raises(interleave._Gone, match="not JSON"):
        e.ask(None, 10)
    e.stop()
    monkeypatch.setattr(interleave, "WAIT_S", 0.2)
    e = entrant("import os, time; os.close(1); time.sleep(60)")  # closes its answers, stays
    with pytest.raises(interleave._Gone):
        e.ask(None, 10)
    assert e.proc is not None and e.proc.returncode is not None  # killed, not waited on forever
    e.stop()


def test_a_command_is_written_whole() -> None:
    class Pipe:
        def __init__(self) -> None:
            self.got, self.flushed = b"", False

        def write(self, data: memoryview) -> int:
            self.got += bytes(data[:3])  # a raw pipe may take part of it
            return min(3, len(data))

        def flush(self) -> None:
            self.flushed = True

    p = Pipe()
    interleave._write_all(p, b'{"window": 0.3}\n')  # type: ignore[arg-type]
    assert p.got == b'{"window": 0.3}\n' and p.flushed


def test_unverified_runtimes_and_a_missing_baseline_are_said() -> None:
    def ents(*spec: tuple[str, str]) -> list[Entrant]:
        out = []
        for k, (lb, status) in enumerate(spec):
            row = {k2: v for k2, v in case(lb).items() if k2 in KEY}
            e = Entrant(lb, {}, row={**row, "status": status})
            e.round_ms = [10.0 * (k + 1)] * 6
            out.append(e)
        return out

    es = ents(("opencv", "ok"), ("torch", "unverified"))
    attach(es, 6, 0.3, "onnxruntime")  # asked for, but not timed (skipped)
    warn, line = describe([e.row for e in es])
    assert warn.startswith("warning: ") and "baseline onnxruntime was not timed" in warn and "opencv" in warn
    assert "torch (unverified) 0.50" in line and "against opencv [" in line, line
    es = ents(("opencv", "unverified"), ("torch", "ok"))
    attach(es, 6, 0.3, None)
    (line,) = describe([e.row for e in es])
    assert "against opencv (unverified)" in line and "torch 0.50" in line, line


def test_aa_check_needs_both_entrants_timed() -> None:
    from zoo.checks_harness import aa_failure

    timed = {"status": "ok", "interleave": {"baseline": "onnxruntime#1"}}
    assert aa_failure(timed, timed, "onnxruntime#1") is None
    err = {"status": "error", "reason": "worker exited with code -9"}
    why = aa_failure(err, timed, "onnxruntime#1")  # the first failed: b has no ratio to it
    assert why and "entrant 1: error: worker exited with code -9 (no interleaved timing)" in why
    assert "entrant 2: ok" in why
    assert aa_failure(timed, {"status": "ok", "interleave": {"baseline": "other"}}, "onnxruntime#1")


def test_sessions_open_fresh_processes_in_alternating_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds split over sessions: each entrant's worker opened anew each time, in alternating
    orders, handed the earlier samples; each round says its session."""
    opened: list[str] = []
    priors: dict[str, Any] = {}

    def ask(self: Entrant, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if "window" in msg:
            return {"samples_ms": [[10.0 if self.label == "a" else 20.0]]}
        if "prior" in msg:
            priors[self.label] = json.loads(json.dumps(msg["prior"]))  # as sent down the pipe, then
            return {"ok": True}
        return {"status": "ok", "forward": summarize([10.0])}

    monkeypatch.setattr(interleave, "_open", lambda e, timeout: opened.append(e.label))
    monkeypatch.setattr(Entrant, "ask", ask)
    rows = run_group([case("x"), case("y")], labels=["a", "b"], rounds=8)
    assert opened == ["a", "b", "b", "a"] * 2
    assert priors == {"a": [[10.0] * 6], "b": [[20.0] * 6]}  # the earlier sessions' windows, to the last worker
    i = rows[1]["interleave"]
    assert i["round_session"] == [0, 0, 1, 1, 2, 2, 3, 3] and i["ratio"] == pytest.approx(2.0)
    assert [k for k in range(1, 5) if 12 % (2 * k) == 0][-1] == 3  # --rounds 12 by hand: 3 sessions of 4


def test_a_steady_difference_between_sessions_widens_the_interval() -> None:
    """Processes of one runtime 2% apart, changing sign from session to session: the A/A interval
    over sessions contains 1; the same rounds taken as one series (blocks only) would give an
    interval that misses it."""
    rng = np.random.default_rng(1)
    ratios = np.concatenate([m + rng.normal(0, 0.002, 4) for m in (0.98, 1.02, 1.01, 0.985)])
    sessions = [k for k in range(4) for _ in range(4)]
    r, lo, hi = interleave.median_ci(ratios, sessions=sessions)
    assert lo < 1 < hi and 0.95 < lo and hi < 1.05
    _, lo1, hi1 = interleave.median_ci(ratios[:4])  # one pair of processes, as before sessions
    assert not lo1 < 1 < hi1


def test_rows_from_before_sessions_pair_only_within_a_precision() -> None:
    """Before sessions each precision had its own group, all with the same bare labels: such rows of
    two precisions never took turns, and are not paired round by round."""
    def r(prec: str, session: bool) -> dict[str, Any]:
        label = "torch" if prec == "fp32" or not session else f"torch {prec}"
        i = {"order": ["torch", "opencv"], "label": label, "round_ms": [1.0, 2.0]}
        return {"model": "m", "device": "cpu", "precision": prec, "run": "x",
                "interleave": {**i, "round_session": [0, 1]} if session else i}

    assert report._turns(r("fp32", False), r("fp16", False)) == ([], None)
    assert report._turns(r("fp32", True), r("fp16", True))[0] == [1.0, 1.0]
