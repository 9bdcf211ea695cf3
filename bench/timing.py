"""The one timing loop. Every runtime, protocol and device is timed by ``measure``.

A step is a list of phases (inference: [forward]; training: [forward, backward]). Each timed
sample brackets each phase with the runtime's ``sync`` (CUDA: a device synchronize), so work a
runtime merely enqueued is never missed. Warm-up runs until a minimum count and time are reached
and the median of the last window is within a tolerance of the window before (steady state);
measurement runs until a minimum count and time are reached and the median stops moving; a count
and a time cap that extension (the minimums always hold, however slow an iteration is).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

Phase = Callable[[int], object]


@dataclass(frozen=True)
class Policy:
    warmup_iters: int = 3
    warmup_s: float = 0.3
    steady_window: int = 3
    steady_tol: float = 0.1
    warmup_max_s: float = 20.0
    min_iters: int = 10
    min_s: float = 1.0
    max_iters: int = 200
    max_s: float = 20.0
    stable_tol: float = 0.01  # the median moved less than this (relative) over the last quarter
    calls: int = 1  # calls per timed sample (convnet-benchmarks: blocks of 10)
    fixed: int = 0  # protocols with a fixed count: exactly this many samples, no warm-up rules
    discard: int = 0  # leading samples dropped (cnn-benchmarks: the first of 11)
    dry: int = 0  # untimed runs before a fixed count (convnet-benchmarks: 10)

    def scaled(self, budget_s: float) -> Policy:
        """The same policy squeezed into ``budget_s`` seconds of measuring per case."""
        if self.fixed:
            return self
        f = min(1.0, budget_s / max(self.max_s + self.warmup_max_s, 1e-9))
        return replace(self, warmup_s=self.warmup_s * f, warmup_max_s=self.warmup_max_s * f,
                       min_s=self.min_s * f, max_s=max(self.max_s * f, 0.05),
                       min_iters=max(3, int(self.min_iters * max(f, 0.3))),
                       max_iters=max(5, int(self.max_iters * max(f, 0.3))))


@dataclass
class Timing:
    samples_ms: list[list[float]] = field(default_factory=list)  # per phase
    warmup_iters: int = 0
    warmup_s: float = 0.0
    first_ms: list[float] = field(default_factory=list)  # the very first call's phases
    steady: bool = True  # warm-up reached steady state (False: it ran into warmup_max_s)
    stable: bool = True  # the median settled before the caps


def _sample(phases: list[Phase], sync: Callable[[], None], i: int, calls: int,
            clock: Callable[[], float]) -> list[float]:
    out = []
    for phase in phases:
        sync()
        t0 = clock()
        for k in range(calls):
            phase(i * calls + k)
        sync()
        out.append((clock() - t0) * 1000.0 / calls)
    return out


def measure(phases: list[Phase], sync: Callable[[], None], policy: Policy,
            clock: Callable[[], float] = time.perf_counter) -> Timing:
    if not policy.fixed:
        return extend(start(phases, sync, policy, clock), phases, sync, policy, clock)
    t = Timing(samples_ms=[[] for _ in phases])
    t.first_ms = _sample(phases, sync, 0, 1, clock)
    for i in range(policy.dry):
        for phase in phases:
            phase(i)
    rows = [_sample(phases, sync, i + 1, policy.calls, clock) for i in range(policy.fixed)]
    for row in rows[policy.discard:]:
        for p, v in enumerate(row):
            t.samples_ms[p].append(v)
    return t


def start(phases: list[Phase], sync: Callable[[], None], policy: Policy,
          clock: Callable[[], float] = time.perf_counter) -> Timing:
    """The first call (its one-time costs kept apart) and the warm-up: a Timing with no samples yet."""
    t = Timing(samples_ms=[[] for _ in phases])
    t.first_ms = _sample(phases, sync, 0, 1, clock)
    t.warmup_iters, t.warmup_s, t.steady = warm_up(phases, sync, policy, clock)
    return t


def extend(t: Timing, phases: list[Phase], sync: Callable[[], None], policy: Policy,
           clock: Callable[[], float]) -> Timing:
    """Measure after the warm-up until the stop rules hold."""
    begin, i = clock(), 0
    while True:
        i += 1
        for p, v in enumerate(_sample(phases, sync, t.warmup_iters + i, policy.calls, clock)):
            t.samples_ms[p].append(v)
        elapsed = clock() - begin
        if i < policy.min_iters or elapsed < policy.min_s:  # the minimums always hold
            continue
        t.stable = settled(t.samples_ms[0], policy.stable_tol)
        if t.stable or i >= policy.max_iters or elapsed >= policy.max_s:  # the caps bound the extension
            return t


def warm_up(phases: list[Phase], sync: Callable[[], None], policy: Policy,
            clock: Callable[[], float] = time.perf_counter) -> tuple[int, float, bool]:
    """Run until the minimum count and time and a steady median; (iterations, seconds, steady)."""
    start, totals = clock(), []
    while True:
        totals.append(sum(_sample(phases, sync, len(totals) + 1, policy.calls, clock)))
        elapsed = clock() - start
        if len(totals) < policy.warmup_iters:  # the minimum count always holds
            continue
        if elapsed >= policy.warmup_max_s:
            return len(totals), elapsed, False
        w = policy.steady_window
        if len(totals) >= max(policy.warmup_iters, 2 * w) and elapsed >= policy.warmup_s:
            last, prev = np.median(totals[-w:]), np.median(totals[-2 * w:-w])
            if abs(last - prev) <= policy.steady_tol * prev:
                return len(totals), elapsed, True


def window(phases: list[Phase], sync: Callable[[], None], seconds: float, start: int, calls: int = 1,
           rewarm: int = 1, at_least: int = 3, clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """One short timed window (interleaved rounds): ``rewarm`` untimed steps first (the caches
    refilled after the other runtimes ran), then samples until ``seconds`` have passed and there are
    ``at_least`` (a round's median of one sample would be as noisy as one call on a busy machine).
    ``start`` numbers the first step (input rotation); returns the samples per phase."""
    for k in range(rewarm):
        for phase in phases:
            phase(start + k)
    sync()
    out: list[list[float]] = [[] for _ in phases]
    begin, i = clock(), start + rewarm
    while True:
        for p, v in enumerate(_sample(phases, sync, i, calls, clock)):
            out[p].append(v)
        i += 1
        if clock() - begin >= seconds and len(out[0]) >= at_least:
            return out


def settled(samples: list[float], tol: float) -> bool:
    """The median of all samples differs by less than ``tol`` from the median without the last quarter."""
    n = len(samples)
    if n < 4:
        return False
    head = np.median(samples[: n - max(1, n // 4)])
    return bool(abs(np.median(samples) - head) <= tol * head)


# ---- concurrent requests ---------------------------------------------------------------------

CONCURRENT = ("onnxruntime", "openvino")  # runtimes whose thread pool belongs to a session, not the process


def runtime(cls: Any, requests: int = 1) -> Any:
    """An instance of the runtime class ``cls``, or ``requests`` of them in flight at once."""
    return cls() if requests <= 1 else Concurrent(cls, requests)


class Concurrent:
    """``n`` inference requests in flight (throughput mode): ``n`` instances of one runtime, each
    its own session with ``threads // n`` threads (at least 1), driven by ``n`` Python threads;
    one step is one request on each, all at once, so a sample times ``n`` requests. Only for
    runtimes whose thread pool is per session (ONNX Runtime, OpenVINO): PyTorch's and OpenCV's are
    one per process, so their instances would share it rather than run side by side."""

    def __init__(self, cls: Any, n: int) -> None:
        self.name, self.n = cls.name, n
        self.rts = [cls() for _ in range(n)]
        self.pool = ThreadPoolExecutor(n)

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        if self.name not in CONCURRENT:
            return (f"--concurrency runs requests side by side on runtimes with a thread pool per session "
                    f"({', '.join(CONCURRENT)}); {self.name}'s is one per process")
        if case["mode"] != "inference":
            return "--concurrency times inference requests only"
        return self.rts[0].skip_reason(case)

    def load(self, case: dict[str, Any]) -> None:
        for rt in self.rts:
            rt.load({**case, "threads": max(1, case["threads"] // self.n)})

    def set_inputs(self, inputs: list[Any], grads: Any) -> None:
        for rt in self.rts:
            rt.set_inputs(inputs, grads)

    def forward(self, i: int) -> None:
        for f in [self.pool.submit(rt.forward, i + k) for k, rt in enumerate(self.rts)]:
            f.result()

    def sync(self) -> None:
        for rt in self.rts:
            rt.sync()

    def outputs(self) -> Any:
        return self.rts[0].outputs()

    def infer(self, x: Any) -> Any:
        return self.rts[0].infer(x)

    def memory(self) -> dict[str, int]:
        return self.rts[0].memory()

    def settings(self) -> dict[str, Any]:
        return {"concurrent_requests": self.n, "sessions": self.n, "per_session": self.rts[0].settings()}
