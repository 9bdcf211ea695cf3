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
    """Whether this process's network has nothing up but loopback (a namespace made by
    ``unshare -n``): the only place the suite starts Ray, so that no test traffic leaves the host."""
    import psutil

    return all(name == "lo" or not st.isup for name, st in psutil.net_if_stats().items())


RAY_NETNS = "unshare -n sh -c 'ip link set lo up && python -m pytest -m ray'"


@pytest.fixture(scope="module")
def ray_netns() -> None:
    """Skip a Ray test unless Ray is installed and the network is loopback only (.ci/run runs the
    Ray tests that way: ``RAY_NETNS``)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
    if not loopback_only():
        pytest.skip(f"Ray tests start Ray only in a loopback-only network namespace: {RAY_NETNS}")
