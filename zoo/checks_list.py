"""Check 'list': wall time and peak memory of `zoo list`, each in a fresh process as a user runs it:
cold (no cache of the user's: a fresh clone, the built-in zoo's shipped figures), warm (again), and
computed (every figure worked out by the converter, shipped figures and cache both ignored: what an
edited definition costs, and what `--regenerate` runs).

    python -m zoo.checks list               # measure, write outputs/checks/list.json
    python -m zoo.checks list --regenerate  # recompute zoo/zoo-list.json (after a converter change
                                            # that alters a figure: tests/test_catalogue.py says so)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from .catalogue import LIST_CACHE, STATIC, regenerate
from .checks_common import save as _save

GOAL = {"wall_s": 1.0, "max_rss_bytes": 150 * 2**20}  # issue 11, cold and warm
_COMPUTED = ("from pathlib import Path; from zoo.catalogue import list_rows; "
             "list_rows(Path(sys.argv[1]), Path(sys.argv[1]) / 'cache.json', static=None)")


def _run(cmd: list[str]) -> dict[str, Any]:
    """One command in a child process: its wall time and its own peak RSS (wait4, not the sum of
    all children), and whether it rewrote the user's cache."""
    before = _stamp()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {os.waitstatus_to_exitcode(status)}")
    return {"wall_s": round(time.perf_counter() - t0, 3), "max_rss_bytes": usage.ru_maxrss * 1024,
            "cache_rewritten": _stamp() != before}


def _stamp() -> int | None:
    try:
        return LIST_CACHE.stat().st_mtime_ns
    except OSError:
        return None


def _median(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in GOAL}


def list_speed(runs: int = 5) -> dict[str, Any]:
    zoo_list = [sys.executable, "-m", "zoo.cli", "list"]
    cold = []
    for _ in range(runs):
        LIST_CACHE.unlink(missing_ok=True)
        cold.append(_run(zoo_list))
    warm = [_run(zoo_list) for _ in range(runs)]
    with tempfile.TemporaryDirectory() as d:
        computed = [_run([sys.executable, "-c", f"import sys; {_COMPUTED}", d]) for _ in range(2)]
    med = {"cold": _median(cold), "warm": _median(warm), "computed": _median(computed)}
    result = {"median": med, "goal": GOAL, "meets_goal": {k: all(med[k][g] <= GOAL[g] for g in GOAL) for k in med},
              "rss_note": "wait4's ru_maxrss: an upper bound, Linux counts this checker's own RSS at the exec "
                          "(/usr/bin/time -v zoo list shows ~35 MB where this says ~56 MB)",
              "cold_runs": cold, "warm_runs": warm, "computed_runs": computed, "cpus": os.cpu_count(),
              "load_avg_1min": os.getloadavg()[0]}
    print(json.dumps(result, indent=2))
    _save("list", result)
    return result


def main(argv: list[str]) -> None:
    if argv == ["--regenerate"]:
        data = regenerate()
        print(f"wrote {STATIC}: {len(data['models'])} models")
    elif not argv:
        list_speed()
    else:
        print("usage: python -m zoo.checks list [--regenerate]")
        sys.exit(2)
