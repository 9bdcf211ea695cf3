"""Run a function in a fresh Python process.

Used for the independent importer (OpenCV): it can crash on files it dislikes, and its own
memory use (VGG-16: about 3x the caffemodel) should not add to the converter's. Arrays travel
as .npz files; the child reports its own peak RSS.
"""

from __future__ import annotations

import importlib
import json
import resource
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np


class IsolatedError(Exception):
    """The function raised or the process died; the message is one line."""


def call(func: str, feeds: dict[str, np.ndarray], timeout: float = 900,
         **kwargs: Any) -> tuple[dict[str, np.ndarray], int]:
    """Run ``module:function(feeds, **kwargs)`` in a child; returns (outputs, child's peak RSS bytes)."""
    with tempfile.TemporaryDirectory(prefix="zoo-iso-") as tmp:
        d = Path(tmp)
        _save(d / "in", feeds)
        (d / "args.json").write_text(json.dumps(kwargs))
        try:
            p = subprocess.run([sys.executable, "-m", "convert.isolate", func, str(d)],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise IsolatedError(f"{func} did not finish within {timeout:.0f} s") from None
        if (d / "error.txt").exists():
            raise IsolatedError((d / "error.txt").read_text().strip())
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or [""])[-1]
            raise IsolatedError(f"crashed (exit code {p.returncode}) {tail}".strip())
        meta = json.loads((d / "out.json").read_text())
        return _load(d / "out"), int(meta["peak_rss_bytes"])


def peak_rss_bytes() -> int:
    """This process's peak resident memory. VmHWM, because ru_maxrss survives exec: a process
    started from a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _save(base: Path, arrays: dict[str, np.ndarray]) -> None:
    names = list(arrays)
    np.savez(str(base) + ".npz", **{f"a{i}": np.asarray(arrays[n]) for i, n in enumerate(names)})
    Path(str(base) + ".names.json").write_text(json.dumps(names))


def _load(base: Path) -> dict[str, np.ndarray]:
    names = json.loads(Path(str(base) + ".names.json").read_text())
    with np.load(str(base) + ".npz") as z:
        return {n: z[f"a{i}"] for i, n in enumerate(names)}


def _child(func: str, d: Path) -> None:
    try:
        module, _, name = func.partition(":")
        fn = getattr(importlib.import_module(module), name)
        outs = fn(_load(d / "in"), **json.loads((d / "args.json").read_text()))
        _save(d / "out", outs)
        peak = peak_rss_bytes()
        (d / "out.json").write_text(json.dumps({"peak_rss_bytes": peak}))
    except Exception as e:  # reported to the parent as one line
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        msg = next((ln for ln in lines if "error:" in ln.lower()), lines[-1] if lines else "")
        (d / "error.txt").write_text(f"{type(e).__name__}: {msg[:300]}")
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]))
