"""The timing loop against callables of known duration, synchronization, and the stop rules."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fake_runtimes import AsyncDevice

from bench.stats import ratio_ci, summarize, verdict
from bench.timing import Policy, measure

FAST = Policy(warmup_iters=2, warmup_s=0.0, warmup_max_s=1.0, min_iters=10, min_s=0.0, max_iters=40,
              max_s=3.0, stable_tol=0.05)


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


class FakeClock:
    """Time advances only when a phase 'runs' for a given number of milliseconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1000


def test_sleep_of_known_duration() -> None:
    t = measure([lambda i: time.sleep(0.02)], lambda: None, FAST)
    s = np.asarray(t.samples_ms[0])
    # never under-measured; the fastest sample shows the loop's own overhead (a loaded machine
    # inflates the median, not the minimum)
    assert np.median(s) >= 20.0 and 20.0 <= s.min() < 22.0, s


def test_busy_loop_of_known_duration() -> None:
    s = np.asarray(measure([lambda i: busy(5.0)], lambda: None, FAST).samples_ms[0])
    assert np.median(s) >= 5.0 and 5.0 <= s.min() < 5.5, s


def test_phases_are_timed_separately() -> None:
    t = measure([lambda i: busy(2.0), lambda i: busy(6.0)], lambda: None, FAST)
    f, b = (np.asarray(s) for s in t.samples_ms)
    assert 2.0 <= f.min() < 2.5 and 6.0 <= b.min() < 6.5, (f, b)
    assert np.median(f) < np.median(b)


def test_asynchronous_work_is_not_under_measured() -> None:
    dev = AsyncDevice()
    with_sync = measure([lambda i: dev.launch(0.015)], dev.synchronize, FAST)
    assert summarize(with_sync.samples_ms[0])["median_ms"] >= 15.0
    dev.synchronize()
    # the same runtime without a sync would look almost free: what the sync is there to prevent
    no_sync = measure([lambda i: dev.launch(0.015)], lambda: None,
                      Policy(warmup_iters=1, warmup_s=0, min_iters=5, min_s=0, max_iters=5))
    assert min(no_sync.samples_ms[0]) < 1.0
    dev.synchronize()


def test_blocks_of_calls_report_per_call_time() -> None:
    clock, calls = FakeClock(), []
    t = measure([lambda i: (calls.append(i), clock.spend(1.0))], lambda: None,
                Policy(fixed=3, dry=10, calls=10), clock=clock)
    assert len(t.samples_ms[0]) == 3 and np.median(t.samples_ms[0]) == pytest.approx(1.0)
    assert len(calls) == 1 + 10 + 30  # first call + dry runs + 3 blocks of 10


def test_fixed_count_with_the_first_discarded() -> None:
    t = measure([lambda i: None, lambda i: None], lambda: None, Policy(fixed=11, discard=1))
    assert [len(s) for s in t.samples_ms] == [10, 10]


def test_stops_as_soon_as_the_median_is_stable() -> None:
    clock = FakeClock()
    p = Policy(warmup_iters=3, warmup_s=0, steady_window=3, min_iters=10, min_s=0.0, max_iters=100)
    t = measure([lambda i: clock.spend(10.0)], lambda: None, p, clock=clock)
    assert len(t.samples_ms[0]) == 10 and t.stable and t.steady


def test_warm_up_waits_for_steady_state_and_caps() -> None:
    clock = FakeClock()
    durations = iter([50, 40, 30, 20, 10] + [10] * 1000)  # slow first iterations (e.g. autotuning)
    p = Policy(warmup_iters=2, warmup_s=0, steady_window=3, steady_tol=0.05, min_iters=5, min_s=0)
    t = measure([lambda i: clock.spend(next(durations))], lambda: None, p, clock=clock)
    assert t.steady and t.warmup_iters >= 6 and max(t.samples_ms[0]) == pytest.approx(10.0)
    growing = iter(np.arange(1.0, 10_000.0))  # never settles (e.g. thermal throttling)
    p = Policy(warmup_iters=2, warmup_s=0, warmup_max_s=0.5, min_iters=5, min_s=0, max_iters=30,
               max_s=100, stable_tol=0.001)
    t = measure([lambda i: clock.spend(next(growing))], lambda: None, p, clock=clock)
    assert not t.steady and not t.stable and len(t.samples_ms[0]) == 30


def test_statistics() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median_ms"] == 3.0 and s["iqr_ms"] == 2.0 and s["n"] == 5
    assert s["p95_ms"] > 4.0 and s["mean_ms"] == 22.0 and s["cv"] == pytest.approx(s["std_ms"] / 22.0)
    with pytest.raises(ValueError):
        summarize([])


def test_bootstrap_detects_a_known_difference() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(10, 0.3, 40)
    r, lo, hi = ratio_ci(a, a * 1.2)
    assert lo > 1.1 and verdict(r, lo, hi, 0.02) == "slower"
    r, lo, hi = ratio_ci(a * 1.2, a)
    assert verdict(r, lo, hi, 0.02) == "faster"


def test_bootstrap_false_positive_rate() -> None:
    rng = np.random.default_rng(2)
    flagged = 0
    for i in range(100):
        a, b = rng.normal(10, 0.5, 30), rng.normal(10, 0.5, 30)
        r, lo, hi = ratio_ci(a, b, n_boot=500, seed=i)
        flagged += verdict(r, lo, hi, 0.0) != "no significant difference"
    assert flagged <= 12  # a 95% interval: about 5 of 100 by chance


def test_tiny_real_difference_below_the_noise_floor() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(10, 0.01, 200)
    r, lo, hi = ratio_ci(a, a * 1.005)
    assert lo > 1  # real...
    assert verdict(r, lo, hi, 0.02) == "no significant difference"  # ...but below the floor


def test_throughput_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 GFLOP per image in 10 ms is 0.2 TFLOP/s; training counts forward + backward as 3x."""
    from bench import worker
    from bench.timing import Timing
    from bench.worker import _figures

    monkeypatch.setattr(worker, "gemm_next_to_case", lambda case: None)  # the run's peak, not one measured now

    class Rt:
        def memory(self) -> dict:  # type: ignore[type-arg]
            return {}

    case = {"batch": 4, "gflops_per_image": 0.5, "gemm_peak_tflops": 0.4}
    fig = _figures(case, Timing(samples_ms=[[10.0, 10.0, 10.0]]), 0.1, Rt())
    assert fig["achieved_tflops"] == pytest.approx(0.2) and fig["pct_of_peak"] == pytest.approx(50.0)
    assert fig["images_per_s"] == pytest.approx(400.0)
    fig = _figures(case, Timing(samples_ms=[[10.0] * 3, [20.0] * 3]), 0.1, Rt())
    assert fig["achieved_tflops"] == pytest.approx(0.2) and fig["images_per_s"] == pytest.approx(4 / 0.03)
    # without the data gradient (convnet-benchmarks) backward costs what the planner says it does
    fig = _figures({**case, "backward_gflops_per_image": 0.25}, Timing(samples_ms=[[10.0] * 3, [20.0] * 3]),
                   0.1, Rt())
    assert fig["achieved_tflops"] == pytest.approx(4 * 0.75 / 30)
    # two requests in flight: a sample is two batches
    fig = _figures({**case, "concurrency": 2}, Timing(samples_ms=[[10.0, 10.0, 10.0]]), 0.1, Rt())
    assert fig["images_per_s"] == pytest.approx(800.0) and fig["achieved_tflops"] == pytest.approx(0.4)


class _Session:
    """A runtime whose thread pool is per session: each request sleeps 20 ms (the GIL released)."""

    name = "onnxruntime"
    loaded: list[int] = []

    def skip_reason(self, case: dict) -> None:  # type: ignore[type-arg]
        return None

    def load(self, case: dict) -> None:  # type: ignore[type-arg]
        _Session.loaded.append(case["threads"])

    def set_inputs(self, inputs: list, grads: object) -> None:  # type: ignore[type-arg]
        self.x = inputs

    def forward(self, i: int) -> None:
        time.sleep(0.020)

    def sync(self) -> None:
        pass

    def settings(self) -> dict:  # type: ignore[type-arg]
        return {"intra_op_threads": _Session.loaded[-1]}


def test_concurrent_requests_are_in_flight_together() -> None:
    from bench.timing import Concurrent, runtime

    assert isinstance(runtime(_Session, 1), _Session)
    rt = runtime(_Session, 4)
    assert isinstance(rt, Concurrent) and rt.skip_reason({"mode": "inference"}) is None
    _Session.loaded.clear()
    rt.load({"threads": 8})
    assert _Session.loaded == [2, 2, 2, 2]  # the threads shared out between the sessions
    rt.set_inputs([{}], None)
    s = measure([rt.forward], rt.sync, FAST).samples_ms[0]
    assert 20.0 <= np.median(s) < 35.0, s  # four 20 ms requests at once, not 80 ms one after another
    assert rt.settings() == {"concurrent_requests": 4, "sessions": 4, "per_session": {"intra_op_threads": 2}}
    assert "training" not in (rt.skip_reason({"mode": "inference"}) or "")
    assert "inference requests only" in rt.skip_reason({"mode": "training"})


def test_concurrency_is_refused_where_the_thread_pool_is_the_process() -> None:
    from bench.timing import runtime

    torch_like = type("T", (_Session,), {"name": "torch"})
    assert "one per process" in runtime(torch_like, 2).skip_reason({"mode": "inference"})


def test_an_interleaved_window_refills_caches_then_times_enough_samples() -> None:
    from bench.timing import window

    clock, seen = FakeClock(), []
    step = lambda ms: lambda i: (seen.append(i), clock.spend(ms))  # noqa: E731
    out = window([step(10.0)], lambda: None, 0.095, start=7, clock=clock)
    assert len(out[0]) == 10 and seen[0] == 7 and seen[1:] == list(range(8, 18))  # one untimed, then ~0.1 s
    seen.clear()
    out = window([step(50.0)], lambda: None, 0.095, start=0, clock=clock)
    assert len(out[0]) == 3 and len(seen) == 4  # a slow model: at least three samples, not one
    out = window([step(1.0), step(2.0)], lambda: None, 0.0, start=0, at_least=1, rewarm=0, clock=clock)
    assert out == [[pytest.approx(1.0)], [pytest.approx(2.0)]]  # phases apart
