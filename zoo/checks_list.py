"""Check 'list': wall time and peak memory of `zoo list`, cold (no cache of the catalogue's figures)
and warm (the cache written by the cold run), each in a fresh process as a user runs it."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from .catalogue import LIST_CACHE
from .checks_common import save as _save

GOAL = {"wall_s": 1.0, "max_rss_bytes": 150 * 2**20}  # issue 11, warm


def _run() -> dict[str, Any]:
    """One `zoo list` in a child process: its wall time and its own peak RSS (wait4, not the sum of
    all children), and whether it rewrote the cache (a miss: the converter's sources changed)."""
    before = _stamp()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "zoo.cli", "list"], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"zoo list exited with {p.returncode}")
    return {"wall_s": round(time.perf_counter() - t0, 3), "max_rss_bytes": usage.ru_maxrss * 1024,
            "cache_rewritten": _stamp() != before}


def _stamp() -> int | None:
    try:
        return LIST_CACHE.stat().st_mtime_ns
    except OSError:
        return None


def list_speed(warm_runs: int = 5) -> dict[str, Any]:

    LIST_CACHE.unlink(missing_ok=True)
    cold = _run()
    warm = [_run() for _ in range(warm_runs)]
    hits = [w for w in warm if not w["cache_rewritten"]] or warm  # misses: sources edited meanwhile
    med = {k: statistics.median(w[k] for w in hits) for k in ("wall_s", "max_rss_bytes")}
    result = {"cold": cold, "warm_median": med, "warm_runs": warm, "goal_warm": GOAL,
              "warm_meets_goal": all(med[k] <= GOAL[k] for k in GOAL), "cpus": os.cpu_count(),
              "load_avg_1min": os.getloadavg()[0]}
    print(json.dumps(result, indent=2))
    _save("list", result)
    return result
