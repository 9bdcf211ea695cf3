"""Robust statistics of timing samples, and the bootstrap that decides whether two runs differ."""

from __future__ import annotations

from typing import Any

import numpy as np


def summarize(samples_ms: list[float] | np.ndarray) -> dict[str, Any]:
    """median, IQR, p5/p95, the tail percentiles p50/p90/p99 (as onnxruntime_perf_test and OpenVINO's
    benchmark_app report them), mean, std, coefficient of variation (std/mean), n, raw samples.
    Percentiles interpolate linearly: with few samples p99 is close to the maximum."""
    s = np.asarray(samples_ms, dtype=np.float64)
    if s.size == 0:
        raise ValueError("no samples")
    p5, q1, med, q3, p90, p95, p99 = np.percentile(s, [5, 25, 50, 75, 90, 95, 99])
    mean, std = float(s.mean()), float(s.std(ddof=1)) if s.size > 1 else 0.0
    return {"median_ms": float(med), "iqr_ms": float(q3 - q1), "p5_ms": float(p5), "p95_ms": float(p95),
            "p50_ms": float(med), "p90_ms": float(p90), "p99_ms": float(p99),
            "mean_ms": mean, "std_ms": std, "cv": std / mean if mean > 0 else 0.0, "n": int(s.size),
            "samples_ms": [round(float(x), 6) for x in s]}


def tail(stats: dict[str, Any] | None) -> str:
    """'p50/p90/p99' of a statistics dict in compact form ('' when absent: older results files)."""
    if not stats or "p90_ms" not in stats:
        return ""
    return "/".join(_g3(stats[k]) for k in ("median_ms", "p90_ms", "p99_ms"))


def _g3(v: float) -> str:
    """Three significant digits, never in exponent form (1234.5 -> '1234', 0.01234 -> '0.0123')."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def ratio_ci(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, level: float = 0.95,
             seed: int = 0) -> tuple[float, float, float]:
    """Ratio of medians median(b)/median(a) with a percentile bootstrap interval (resampling each
    set with replacement)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ra = np.median(rng.choice(a, (n_boot, a.size)), axis=1)
    rb = np.median(rng.choice(b, (n_boot, b.size)), axis=1)
    ratios = rb / ra
    lo, hi = np.percentile(ratios, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(np.median(b) / np.median(a)), float(lo), float(hi)


def verdict(ratio: float, lo: float, hi: float, noise_floor: float) -> str:
    """'slower' / 'faster' only when the interval excludes 1 AND the change exceeds the noise floor
    (a relative change, e.g. 0.02); else 'no significant difference'."""
    if lo > 1 and ratio - 1 > noise_floor:
        return "slower"
    if hi < 1 and 1 - ratio > noise_floor:
        return "faster"
    return "no significant difference"
