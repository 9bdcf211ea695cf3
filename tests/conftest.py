"""Shared test helpers: the read-only corpus (skipped when absent) and small graph builders."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("ZOO_CORPUS", ROOT.parent / "shared" / "corpus"))


def corpus(*parts: str) -> Path:
    """A path inside the shared corpus; the calling test is skipped when the corpus is absent."""
    p = CORPUS.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"corpus not available: {p}")
    return p


def corpus_files(sub: str, pattern: str) -> list[Path]:
    """Files for parametrization (empty when the corpus is absent: the tests then skip)."""
    base = CORPUS / sub
    return sorted(base.rglob(pattern)) if base.exists() else []


@pytest.fixture
def disk_heavy(tmp_path_factory: pytest.TempPathFactory):
    """Tests that write full-size weights (up to 0.8 GB each) take turns across xdist workers, so
    the suite needs one such test's disk at a time (a passed test's tmp_path is deleted at once)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(root / "disk-heavy.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield



def loopback_only() -> bool:
    """Whether this process's network has nothing up but loopback."""
    import psutil

    return all(name == "lo" or not st.isup for name, st in psutil.net_if_stats().items())


def enter_loopback_namespace() -> str | None:
    """Move this process into a new network namespace with only loopback, up (``unshare -n`` and
    ``ip link set lo up``, done in-process); None when done, else why it cannot be done."""
    import ctypes
    import socket
    import struct

    clone_newnet, siocsifflags, up_loopback_running = 0x40000000, 0x8914, 0x1 | 0x8 | 0x40
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(clone_newnet) != 0:
        return f"cannot create a network namespace ({os.strerror(ctypes.get_errno())}: needs root or CAP_SYS_ADMIN)"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", up_loopback_running))
    except OSError as e:  # in the new namespace, but loopback stays down: no network at all
        return f"cannot bring loopback up in the new network namespace ({e.strerror or e})"
    return None


@pytest.fixture(scope="module")
def ray_netns() -> None:
    """Ray binds to the host's address and probes external ones: the suite starts it only where the
    network is loopback only. Outside such a namespace, this test process (an xdist worker) moves
    into a new one for the rest of its session (the suite needs no network); where that is not
    permitted the Ray tests skip, saying so."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
    if not loopback_only():
        why = enter_loopback_namespace()
        if why or not loopback_only():
            pytest.skip(f"Ray tests need a loopback-only network: {why or 'interfaces still up'}; as root: "
                        "unshare -n sh -c 'ip link set lo up && pytest -m ray'")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """``pytest -n 2`` distributes as ``--dist loadgroup``: the same as ``load`` but tests marked
    ``xdist_group`` stay on one worker (the Ray tests share one local cluster, started once)."""
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"
