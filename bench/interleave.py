"""Interleaved timing: the runtimes (each at each precision) of one case take turns in rounds, so
drift hits all alike.

A shared machine moves the same loop by tens of percent between processes and over tens of seconds;
ratios between runtimes measured *interleaved* hold. Each runtime (an "entrant") lives in its own
long-lived worker process (``python -m bench.interleave``, fed the case on stdin): it loads the model
once, warms up (the policy's warm-up), then on each command of the parent times one short window
(one untimed call, then samples for ``window_s`` seconds, at least one) and sends the samples back.
The parent runs ``rounds`` rounds (at least 8, a multiple of 8), every entrant one window per round,
the order reversed every other round (AB, BA, ...); with three or more entrants the order also
rotates every two rounds (ABC, CBA, BCA, ACB, CAB, BAC, ...), so each takes every place alike.

The rounds are split over SESSIONS sessions, each with fresh worker processes, opened in
alternating orders (A then B, then B then A, ...). Two processes of the *same* runtime on the same
model differ steadily: measured here on AlexNet, ONNX Runtime and OpenCV ran 1-2% slower in the
process opened first (every time), OpenVINO by up to 5% either way; with the workers' memory on
huge pages (worker.HUGE_PAGES) about 0.5-1%, at random. One process per entrant would report that
as a difference between runtimes with a narrow interval (the A/A check failed so). Fresh
processes per session sample it, alternating opening orders cancel the order effect, and the
interval is a t interval over the sessions (session_ci): the spread between sessions, process
effects included, is what it is built from.
Each later session's worker is handed the samples of the earlier ones, and at the end the last
verifies its outputs and builds its results row from all of them (the same fields as a
one-case-per-process row), and the parent adds

  interleave: {rounds, window_s, order (first round; see order()), entrants, baseline,
               round_ms (this entrant's median step time per round), round_ratios (each round's
               median over the baseline's), round_session (each round's session), ratio (below 1
               is faster than the baseline) and ratio_ci (95%): session_ci over the sessions'
               median ratios (a single session, as in files written before 2026-12: the median of
               round_ratios with a percentile *block* bootstrap over consecutive rounds, fixed
               seed, as neighbouring rounds are correlated, see block_len), baseline_asked (only
               when the --baseline runtime was not timed and another stood in)}

Protocol: one JSON object per line; the worker answers every command with one line on its original
stdout (anything the runtime prints goes to stderr). Commands: ``{"window": seconds}``,
``{"prior": [samples per phase]}`` (an earlier session's samples), ``{"finish": true}``; first
answer: ``{"ready": ...}`` or a row (skipped / error).
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from convert.isolate import child_env, death, die_with_parent
from convert.runtimes import CannotRun

from .cases import Case
from .results import KEY, Recorder, key
from .sweep import SESSIONS, STARTUP_S, Progress, run_one, sessions, skip_row
from .timing import Policy, settled, start, window
from .worker import base_row, case_env, error_row, finish_row, open_case

ROUNDS = 16
QUICK_ROUNDS = 8
# SESSIONS (bench/sweep.py, for its estimates): fresh processes per entrant, opened in alternating
# orders (see the module's docstring)
MIN_ROUNDS = 2 * SESSIONS  # each session an order and its reverse
# the 97.5% quantile of Student's t by degrees of freedom (sessions - 1)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
WINDOW_S = 0.3
N_BOOT = 2000
WAIT_S = 10.0  # for a worker that closed its output to leave, before it is killed
TIMED = ("ok", "unverified")  # rows with timings


# ---- the worker process ---------------------------------------------------------------------


def serve(commands: IO[str], answer: Callable[[dict[str, Any]], None]) -> None:
    """The worker: the case on the first line, then one answer per command."""
    case = json.loads(commands.readline())
    started = time.perf_counter()
    try:
        opened = open_case(case)
        if isinstance(opened, str):
            return answer({**base_row(case), "status": "skipped", "reason": opened})
        rt, phases, inputs, load_s = opened
        policy = Policy(**case["policy"])
        t = start(phases, rt.sync, policy)
        answer({"ready": True, "load_s": load_s, "warmup_iters": t.warmup_iters, "load_start": case.get("_load_start")})
        step = t.warmup_iters + 1
        for line in commands:
            cmd = json.loads(line)
            if "window" in cmd:
                got = window(phases, rt.sync, float(cmd["window"]), step, policy.calls)
                step += len(got[0]) + 1
                for p, s in enumerate(got):
                    t.samples_ms[p].extend(s)
                answer({"samples_ms": got})
            elif "prior" in cmd:  # the earlier sessions: their samples, the first one's load and load record
                for p, s in enumerate(cmd["prior"]):
                    t.samples_ms[p].extend(float(x) for x in s)
                load_s = float(cmd.get("load_s") or load_s)
                case["_load_start"] = cmd.get("load_start") or case.get("_load_start")
                answer({"ok": True})
            elif cmd.get("finish"):
                t.stable = settled(t.samples_ms[0], policy.stable_tol)
                return answer(finish_row(case, rt, inputs[0], t, load_s, started))
    except CannotRun as e:
        answer({**base_row(case), "status": "skipped", "reason": str(e)})
    except Exception as e:  # an error row, with the one line that says what went wrong
        answer(error_row(case, e))


def _main() -> None:
    die_with_parent()
    out = os.fdopen(os.dup(1), "w")  # the answers' channel; fd 1 (prints, C libraries) -> stderr
    os.dup2(2, 1)

    def answer(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg, allow_nan=False) + "\n")
        out.flush()

    serve(sys.stdin, answer)


# ---- the parent ---------------------------------------------------------------------------


class _Gone(Exception):
    """A worker died or stopped answering; the message is one line."""


@dataclass
class Entrant:
    label: str
    case: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    stderr: IO[bytes] | None = None
    row: dict[str, Any] | None = None  # set once it ended (a skipped / error row, or its final row)
    round_ms: list[float] = field(default_factory=list)  # median step time per round
    round_session: list[int] = field(default_factory=list)  # the session of each of those rounds
    samples: list[list[float]] = field(default_factory=list)  # every window's samples, per phase
    first: dict[str, Any] = field(default_factory=dict)  # the first session's ready answer

    def ask(self, msg: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        assert self.proc and self.proc.stdin and self.proc.stdout
        try:
            if msg is not None:
                _write_all(self.proc.stdin, (json.dumps(msg) + "\n").encode())
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                raise _Gone(f"timed out after {timeout:.0f} s")
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            try:
                code = self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:  # closed its output but did not leave
                self.proc.kill()
                code = self.proc.wait()
            assert self.stderr
            self.stderr.seek(0)
            raise _Gone(death(code, self.stderr.read().decode(errors="replace")))
        try:
            return json.loads(line)
        except ValueError:
            text = line.decode(errors="replace").strip()
            raise _Gone(f"answered something that is not JSON: {text[:120]!r}") from None

    def stop(self) -> None:
        """End the worker: it leaves at the end of its input; killed if it does not."""
        if self.proc:
            try:
                assert self.proc.stdin
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if self.stderr:
            self.stderr.close()
        self.proc = self.stderr = None


def _write_all(pipe: IO[bytes], data: bytes) -> None:
    """Write all of ``data`` to an unbuffered pipe (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        n = pipe.write(view)
        view = view[n or 0:]
    pipe.flush()


def order(live: list[Any], r: int) -> list[Any]:
    """The entrants' order in round ``r``: reversed every other round; with three or more, also
    rotated by one every two rounds (ABC, CBA, BCA, ACB, CAB, BAC), so no entrant keeps a place."""
    k = (r // 2) % len(live) if len(live) > 2 else 0
    turn = live[k:] + live[:k]
    return turn if r % 2 == 0 else turn[::-1]


def run_group(cases: list[dict[str, Any]], *, rounds: int = ROUNDS, window_s: float = WINDOW_S,
              baseline: str | None = None, timeout_s: float = 900.0, labels: list[str] | None = None,
              on_round: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Time ``cases`` (one model, several runtimes, or one runtime entered twice with ``labels``)
    interleaved; returns their rows in the same order."""
    ents = [Entrant(lb, c) for lb, c in zip(labels or [label(c) for c in cases], cases)]
    n_sessions = sessions(all(c["device"] == "cpu" for c in cases), rounds)
    try:
        for s in range(n_sessions):
            for e in (ents if s % 2 == 0 else ents[::-1]):  # one at a time: a loading worker does
                if e.row is None:                           # not disturb another's warm-up
                    _open(e, timeout_s)
                if e.row is None and e.samples:
                    _call(e, {"prior": e.samples, "load_s": e.first.get("load_s"),
                              "load_start": e.first.get("load_start")}, timeout_s)
            for r in range(s * rounds // n_sessions, (s + 1) * rounds // n_sessions):
                for e in order([e for e in ents if e.row is None], r):
                    got = _call(e, {"window": window_s}, timeout_s)
                    if got:  # the median step (the phases summed) of this round
                        steps = np.asarray(got["samples_ms"], np.float64)
                        e.round_ms.append(float(np.median(np.sum(steps, axis=0))))
                        e.round_session.append(s)
                        e.samples = e.samples or [[] for _ in got["samples_ms"]]
                        for kept, new in zip(e.samples, got["samples_ms"]):
                            kept.extend(new)
                if on_round:
                    on_round(r + 1, rounds)
            if s < n_sessions - 1:
                for e in ents:
                    e.stop()  # (its samples go to the next session's worker)
        for e in ents:
            if e.row is None:
                _call(e, {"finish": True}, timeout_s)
    finally:
        for e in ents:
            e.stop()
    attach(ents, rounds, window_s, baseline)
    return [e.row or {} for e in ents]


def label(case: dict[str, Any]) -> str:
    """An entrant's name: its runtime, and its precision unless fp32 ("openvino bf16")."""
    return case["runtime"] if case["precision"] == "fp32" else f"{case['runtime']} {case['precision']}"


def _call(e: Entrant, msg: dict[str, Any] | None, timeout: float) -> dict[str, Any] | None:
    """Send ``msg`` (None: only read) and return the answer; when the answer is a row (skipped,
    error, or the final one) or the worker died or fell silent, that row is the entrant's: None."""
    t0 = time.perf_counter()
    try:
        answer = e.ask(msg, timeout)
    except _Gone as g:
        answer = {**base_row(e.case), "status": "error", "reason": str(g),
                  "seconds": round(time.perf_counter() - t0, 3)}
    if "status" not in answer:
        return answer
    e.row = answer
    e.stop()
    return None


def _open(e: Entrant, timeout: float) -> None:
    """Start the worker of ``e``, give it its case, wait until it has loaded and warmed up."""
    e.stderr = tempfile.TemporaryFile()
    e.proc = subprocess.Popen([sys.executable, "-m", "bench.interleave"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=e.stderr, bufsize=0,
                              env=child_env({**os.environ, **case_env(e.case)}))
    ready = _call(e, e.case, timeout)
    if ready and not e.first:
        e.first = ready


# ---- the statistics -----------------------------------------------------------------------


def block_len(n: int) -> int:
    """The block length of the bootstrap over ``n`` consecutive rounds: 2 up to 12 rounds, about
    sqrt(n) above. Neighbouring rounds are correlated (the reversed order runs one entrant twice in a
    row at each round boundary; a burst of load spans rounds): resampling single rounds as if they
    were independent gives intervals too narrow (by ~1.3x on the committed A/A data)."""
    return max(1, min(n, 2 if n <= 12 else round(math.sqrt(n))))


def block_resample(values: list[float] | np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` circular moving-block bootstrap resamples of the series ``values`` (in round
    order), each as long as it: blocks of block_len consecutive rounds, wrapping at the end."""
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    b = block_len(n)
    starts = rng.integers(0, n, (n_boot, -(-n // b)))
    idx = (starts[:, :, None] + np.arange(b)).reshape(n_boot, -1)[:, :n] % n
    return v[idx]


def median_ci(values: list[float] | np.ndarray, n_boot: int = N_BOOT, level: float = 0.95,
              seed: int = 0, sessions: list[int] | None = None) -> tuple[float, float, float]:
    """A series of rounds' ratio with its interval: session_ci when the rounds come from more
    than one session, else their median with a percentile block-bootstrap interval."""
    v = np.asarray(values, dtype=np.float64)
    if sessions is not None and len(set(sessions)) > 1 and len(sessions) == v.size and level == 0.95:
        return session_ci(v, sessions)
    boot = np.median(block_resample(v, n_boot, np.random.default_rng(seed)), axis=1)
    lo, hi = np.percentile(boot, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(np.median(v)), float(lo), float(hi)


def _session_logs(values: np.ndarray, sessions: list[int]) -> np.ndarray:
    """Each session's median ratio, in logs."""
    s = np.asarray(sessions)
    return np.log([np.median(values[s == k]) for k in sorted(set(sessions))])


def session_ci(values: np.ndarray, sessions: list[int]) -> tuple[float, float, float]:
    """The geometric mean of the sessions' median ratios and its 95% t interval (sessions - 1
    degrees of freedom): each session is a fresh set of processes, so a steady difference between
    processes is part of the spread the interval is built from, not hidden inside it."""
    logs = _session_logs(values, sessions)
    half = T975.get(logs.size - 1, 1.96) * logs.std(ddof=1) / np.sqrt(logs.size)
    return float(np.exp(logs.mean())), float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def ratio_ci(a: list[float] | np.ndarray, b: list[float] | np.ndarray, n_boot: int = N_BOOT,
             level: float = 0.95, seed: int = 0, sessions_a: list[int] | None = None,
             sessions_b: list[int] | None = None) -> tuple[float, float, float]:
    """The ratio of two runs' ratios (b's over a's): with sessions in both, their session means
    and a t interval (the fewer sessions' degrees of freedom); else medians of the rounds, each
    series block-resampled on its own."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    have = [s is not None and len(set(s)) > 1 and len(s) == v.size for s, v in ((sessions_a, a), (sessions_b, b))]
    if all(have) and level == 0.95:
        la, lb = _session_logs(a, sessions_a or []), _session_logs(b, sessions_b or [])
        se = np.sqrt(la.var(ddof=1) / la.size + lb.var(ddof=1) / lb.size)
        half = T975.get(min(la.size, lb.size) - 1, 1.96) * se
        d = lb.mean() - la.mean()
        return float(np.exp(d)), float(np.exp(d - half)), float(np.exp(d + half))
    rng = np.random.default_rng(seed)
    ra = np.median(block_resample(a, n_boot, rng), axis=1)
    rb = np.median(block_resample(b, n_boot, rng), axis=1)
    lo, hi = np.percentile(rb / ra, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(np.median(b) / np.median(a)), float(lo), float(hi)


def attach(ents: list[Entrant], rounds: int, window_s: float, baseline: str | None) -> None:
    """Add the ``interleave`` field to the timed rows: each entrant's ratio to the baseline."""
    timed = [e for e in ents if e.row and e.row.get("status") in TIMED and len(e.round_ms) == rounds]
    if not timed:
        return
    named = [e for e in timed if baseline is not None and baseline in (e.label, e.case.get("runtime"))]  # (--baseline torch: "torch bf16")
    base = next((e for e in named if e.label == baseline), named[0] if named else None) or \
        next((e for e in timed if e.label == "opencv"), timed[0])
    for e in timed:
        ratios = [a / b for a, b in zip(e.round_ms, base.round_ms)]
        r, lo, hi = median_ci(ratios, sessions=e.round_session)
        assert e.row is not None
        e.row["interleave"] = {
            "rounds": rounds, "window_s": window_s, "order": [x.label for x in ents],
            "entrants": [x.label for x in timed], "label": e.label, "baseline": base.label,
            "round_ms": [round(x, 6) for x in e.round_ms], "round_ratios": [round(x, 6) for x in ratios],
            "round_session": e.round_session, "ratio": r, "ratio_ci": [lo, hi]}
        if baseline is not None and baseline not in (base.label, base.case.get("runtime")):
            e.row["interleave"]["baseline_asked"] = baseline


def describe(rows: list[dict[str, Any]]) -> list[str]:
    """One line per interleaved group: each runtime's speed against the baseline, 95% intervals."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("interleave"):
            groups.setdefault((*(r.get(k) for k in KEY if k not in SPLIT), r["interleave"]["baseline"]), []).append(r)
    out = []
    for (model, device, _, batch, mode, _, base), rs in groups.items():
        i = rs[0]["interleave"]
        mark = lambda r: " (unverified)" if r.get("status") != "ok" else ""  # noqa: E731
        speeds = [f"{r['interleave']['label']}{mark(r)} {speed(r['interleave'])}" for r in rs
                  if r["interleave"]["label"] != base]
        base_row = next((r for r in rs if r["interleave"]["label"] == base), {"status": "ok"})
        case = f"{model} {device} b{batch} {mode}"
        if i.get("baseline_asked"):
            out.append(f"warning: {case}: the baseline {i['baseline_asked']} was not timed (skipped or "
                       f"failed); ratios are to {base} instead")
        out.append(f"{case}, in turns ({i['rounds']} rounds of {i['window_s']:g} s), speed against "
                   f"{base}{mark(base_row)} [95% interval]: {', '.join(speeds) or '-'}")
    return out


def speed(i: dict[str, Any]) -> str:
    lo, hi = i["ratio_ci"]
    return f"{1 / i['ratio']:.2f}× [{1 / hi:.2f}, {1 / lo:.2f}]"


# ---- a sweep ------------------------------------------------------------------------------


SPLIT = ("runtime", "precision")  # what the entrants of one group differ in


def group_key(case: Case) -> tuple[Any, ...]:
    """What the entrants of one interleaved group share: the case without its runtime, and on a CPU
    without its precision (a bf16 entrant takes turns with the fp32 ones, so its ratio to OpenCV
    fp32 has an interval; on a GPU each precision keeps its group, as its workers all hold the
    device at once)."""
    k = key(case.to_dict())
    split = {KEY.index(f) for f in (SPLIT if case.device == "cpu" else ("runtime",))}
    return tuple(v for i, v in enumerate(k) if i not in split)


def in_turns(cases: list[Case]) -> set[int]:
    """The ids of the cases that take turns: those sharing a group with another entrant, unless
    their protocol fixes its own count of samples (the seeds' protocols are reproduced as they were)."""
    groups: dict[tuple[Any, ...], list[Case]] = {}
    for c in cases:
        groups.setdefault(group_key(c), []).append(c)
    return {id(c) for g in groups.values() if len(g) > 1 and not Policy(**g[0].policy).fixed for c in g}


def even_rounds(rounds: int) -> int:
    """At least MIN_ROUNDS, rounded up to a multiple of 2 * SESSIONS (in each session, each order
    and its reverse alike often)."""
    rounds, step = max(MIN_ROUNDS, rounds), 2 * SESSIONS
    return -(-rounds // step) * step


def fit_rounds(rounds: int, budget_s: float, cases: list[Case]) -> int:
    """Fewer rounds (at least MIN_ROUNDS, see even_rounds) where a --budget leaves each case less time
    than ``rounds`` take."""
    per_case = budget_s / max(sum(not c.status for c in cases), 1) - STARTUP_S
    return even_rounds(min(rounds, int(per_case / (2 * WINDOW_S))))


def run(cases: list[Case], recorder: Recorder, *, rounds: int = ROUNDS, window_s: float = WINDOW_S,
        baseline: str | None = None, timeout_s: float = 900.0, progress: Progress | None = None,
        live: Callable[[Case], Case] | None = None) -> list[dict[str, Any]]:
    """Like ``sweep.run``, but the runtimes (and precisions) of each model/batch/layout/mode take turns
    (cases of a fixed-count protocol, and runtimes alone in their group, run one case per process)."""
    todo = [c for c in cases if key(c.to_dict()) not in recorder.done]
    groups: dict[tuple[Any, ...], list[Case]] = {}
    for c in todo:
        groups.setdefault(group_key(c), []).append(c)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for group in groups.values():
        group = [live(c) if live else c for c in group]
        ready = [c for c in group if skip_row(c) is None]
        if not in_turns(ready):
            new = [run_one(c, timeout_s=timeout_s) for c in group]
        else:
            new = _group_rows(group, ready, rounds, window_s, baseline, timeout_s, progress, len(rows),
                              len(todo), started)
        for row, c in zip(new, group):
            recorder.add(row)
            rows.append(row)
            if progress:
                progress(len(rows), len(todo), c, row, _eta(started, len(rows), len(todo)))
    return rows


def _group_rows(group: list[Case], ready: list[Case], rounds: int, window_s: float, baseline: str | None,
                timeout_s: float, progress: Progress | None, done: int, total: int,
                started: float) -> list[dict[str, Any]]:
    def on_round(r: int, n: int) -> None:
        if progress:
            progress(done, total, ready[0], None, _eta(started, done, total))

    timed = iter(run_group([c.to_dict() for c in ready], rounds=rounds, window_s=window_s, baseline=baseline,
                           timeout_s=timeout_s, on_round=on_round))
    ids = {id(c) for c in ready}
    return [next(timed) if id(c) in ids else skip_row(c) or {} for c in group]


def _eta(started: float, done: int, total: int) -> float:
    if done == 0:
        return float("nan")
    return (time.perf_counter() - started) / done * (total - done)


if __name__ == "__main__":
    _main()
