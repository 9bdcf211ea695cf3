"""Check 'disk': what README command 1 (``zoo bench --all``) needs of a machine: peak disk, time, memory.

    python -m zoo.checks disk            # zoo bench --all
    python -m zoo.checks disk --quick    # zoo bench --quick (alexnet, googlenet, resnet18 on 3 runtimes)

The command runs in a fresh folder (its outputs/ there, TMPDIR inside it, the package itself as
installed) while the bytes on disk under that folder and the resident memory of the whole process
tree are sampled every 0.5 s. Writes outputs/checks/disk.json (disk-quick.json with --quick); the
folder is removed after.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .checks_common import OUT, ROOT

EVERY_S = 0.5


def disk_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (as du counts them), files vanishing meanwhile skipped."""
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                pass
    return total


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (Linux /proc), processes ending meanwhile skipped."""
    parent, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total = 0
    for p in rss:
        q = p
        while q not in (0, 1, pid) and q in parent:
            q = parent[q]
        if q == pid:
            total += rss[p]
    return total


def sample(cmd: list[str], work: Path, log: Path, every_s: float = EVERY_S) -> dict[str, Any]:
    """Run ``cmd`` in ``work`` (TMPDIR inside it), sampling disk under ``work`` and the tree's RSS."""
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    samples: list[tuple[float, int, int]] = []
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        while True:
            done = proc.poll() is not None
            samples.append((round(time.perf_counter() - t0, 1), disk_bytes(work), tree_rss_bytes(proc.pid)))
            if done:
                break
            time.sleep(every_s)
    at, peak_disk, _ = max(samples, key=lambda s: s[1])
    return {"command": cmd, "exit_code": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
            "peak_disk_bytes": peak_disk, "peak_disk_at_s": at, "final_disk_bytes": samples[-1][1],
            "peak_tree_rss_bytes": max(s[2] for s in samples),
            # the largest single process (children are waited for, so ru_maxrss covers them)
            "max_process_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "samples_every_s": every_s, "n_samples": len(samples),
            "samples": [list(s) for s in samples[::10]]}  # [t s, disk bytes, tree RSS bytes], every 10th


def _rows(work: Path) -> dict[str, int]:
    """Rows per status in the results file the run wrote."""
    counts: dict[str, int] = {}
    for f in (work / "outputs" / "results").rglob("*.json"):
        for r in json.loads(f.read_text()).get("rows", []):
            counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def disk(argv: list[str]) -> dict[str, Any]:
    quick = argv == ["--quick"]
    if argv and not quick:
        print("usage: python -m zoo.checks disk [--quick]")
        sys.exit(2)
    cmd = [sys.executable, "-m", "zoo.cli", "bench", "--quick" if quick else "--all"]
    work = Path(tempfile.mkdtemp(prefix="zoo-disk-check-", dir=ROOT / "outputs"))
    log = OUT / f"disk{'-quick' if quick else ''}.log"
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        result = sample(cmd, work, log)
        result.update(quick=quick, rows=_rows(work), cpus=os.cpu_count(), load_average_at_end=os.getloadavg(),
                      log=str(log.relative_to(ROOT)), finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["command"] = ["zoo", *cmd[3:]]
    name = f"disk{'-quick' if quick else ''}"
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    print(f"wrote {OUT / name}.json")
    if result["exit_code"] != 0:
        sys.exit(1)
    return result
