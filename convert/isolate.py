"""Run a function in a fresh Python process.

The one child-process mechanism of zoo. Used for the independent importer (OpenCV): it can crash
on files it dislikes, and its own memory use (VGG-16: about 3x the caffemodel) should not add to
the converter's; and for every benchmark case (``call_json``), so that allocator state, autotuning
and compiled graphs never leak between cases and a crash, a timeout or an out-of-memory kill is
one line. Arrays travel as .npz files, other results as JSON; the child reports its peak RSS.

Also the one home of process ownership: children that die with their parent (a ``kill -9`` of zoo
must not orphan an OpenCV or benchmark worker), and temporaries named after their owner
(``zoo-KIND-HOST-PID-RANDOM``) so that a later run removes those whose process is gone.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
PARENT_ENV = "ZOO_PARENT_PID"  # the pid a child must die with
PR_SET_PDEATHSIG = 1
HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:10]  # whole name: no two hosts alike
# zoo's temporaries, optionally after a ".NAME." prefix (artifacts); nothing else ever matches
_TEMP = re.compile(r"(?:\.(?P<name>.+)\.)?zoo-(?P<kind>tmp|old|iso|case)-(?P<host>[A-Za-z0-9]*)"
                   r"-(?P<pid>\d{1,10})-[a-z0-9_]+", re.DOTALL)


class IsolatedError(Exception):
    """The function raised or the process died; the message is one line."""


def call(func: str, feeds: dict[str, np.ndarray], timeout: float = 900,
         **kwargs: Any) -> tuple[dict[str, np.ndarray], int]:
    """Run ``module:function(feeds, **kwargs)`` in a child; returns (outputs, child's peak RSS bytes)."""
    with tempfile.TemporaryDirectory(prefix=temp_prefix("iso")) as tmp:
        d = Path(tmp)
        _save(d / "in", feeds)
        meta = _run(func, d, kwargs, timeout, None)
        return _load(d / "out"), int(meta["peak_rss_bytes"])


def call_json(func: str, timeout: float, env: dict[str, str] | None = None, kind: str = "iso",
              **kwargs: Any) -> Any:
    """Run ``module:function(**kwargs)`` in a child (``env`` added to this process's environment);
    returns its JSON-able result. The benchmark runs each case this way."""
    with tempfile.TemporaryDirectory(prefix=temp_prefix(kind)) as tmp:
        return _run(func, Path(tmp), kwargs, timeout, env)["result"]


def _run(func: str, d: Path, kwargs: dict[str, Any], timeout: float, env: dict[str, str] | None) -> Any:
    clean_stale(Path(tempfile.gettempdir()))
    (d / "args.json").write_text(json.dumps(kwargs))
    try:
        p = subprocess.run([sys.executable, "-m", "convert.isolate", func, str(d)],
                           env=child_env({**os.environ, **(env or {})}), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise IsolatedError(f"timed out after {timeout:.0f} s ({func})") from None
    if (d / "error.txt").exists():
        raise IsolatedError((d / "error.txt").read_text().strip())
    if p.returncode != 0:
        raise IsolatedError(death(p.returncode, p.stderr))
    return json.loads((d / "out.json").read_text())


def death(code: int, stderr: str) -> str:
    """Why a child ended without a result, in one line."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    if code in (-9, 137):
        return "killed (out of memory?)"
    if "out of memory" in stderr.lower():
        return f"out of memory: {last[:200]}"
    if code < 0:
        return f"crashed (signal {-code}) {last[:200]}".strip()
    return f"crashed (exit code {code}) {last[:300]}".strip()


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child that calls ``die_with_parent``: it names this process."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """In a child, first thing: be killed when the parent dies (Linux's parent-death signal), and
    exit now if the parent died before that took effect (the child was then re-parented)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc symbol: the re-parenting check still runs
            pass
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


def temp_prefix(kind: str, name: str = "") -> str:
    """The prefix of a temporary owned by this process: ``[.NAME.]zoo-KIND-HOST-PID-``."""
    return f"{f'.{name}.' if name else ''}zoo-{kind}-{HOST}-{os.getpid()}-"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # someone else's, or not a pid: keep its files
        return True
    return True


def clean_stale(parent: Path) -> list[Path]:
    """Remove the directories in ``parent`` that zoo named as temporaries of a process on this host
    that is gone (a ``kill -9`` leaves them behind). Other names are never touched."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP.fullmatch(e.name)
        if not m or m["host"] != HOST or alive(int(m["pid"])) or not e.is_dir(follow_symlinks=False):
            continue
        if m["kind"] == "old" and m["name"] and not os.path.lexists(Path(parent) / m["name"]):
            os.rename(e.path, Path(parent) / m["name"])  # killed between the two renames: put it back
            log.info("restored %s, left by process %s", Path(parent) / m["name"], m["pid"])
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        log.info("removed %s, left by process %s", e.path, m["pid"])
        removed.append(Path(e.path))
    return removed


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
        kwargs = json.loads((d / "args.json").read_text())
        arrays = Path(str(d / "in") + ".npz").exists()
        res = fn(_load(d / "in"), **kwargs) if arrays else fn(**kwargs)
        if arrays:
            _save(d / "out", res)
        out = {"peak_rss_bytes": peak_rss_bytes(), **({} if arrays else {"result": res})}
        (d / "out.json").write_text(json.dumps(out, allow_nan=False))
    except Exception as e:  # reported to the parent as one line
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        msg = next((ln for ln in lines if "error:" in ln.lower()), lines[-1] if lines else "")
        (d / "error.txt").write_text(f"{type(e).__name__}: {msg[:300]}")
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    die_with_parent()
    _child(sys.argv[1], Path(sys.argv[2]))
