"""The memory budget: sizes a model file declares are checked against it before anything is allocated.

A model file can declare sizes far beyond its own bytes (a stride-0 tensor, an ``input_dim`` of
100000, a blob of 2^32 elements); readers call ``check_bytes`` before allocating, and
``check_graph_memory`` refuses a graph whose float64 verification would not fit. The budget is
half of the physical memory (or of the cgroup's limit, when lower), or ``ZOO_MEMORY_BUDGET`` bytes
when that environment variable is set (suffixes K, M, G, T in powers of 1024 are accepted).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BadModel, ConvertError

if TYPE_CHECKING:
    from .ir import Graph

__all__ = ["memory_budget", "over_budget", "check_bytes", "check_graph_memory", "ENV"]

ENV = "ZOO_MEMORY_BUDGET"
FALLBACK = 8 * 2**30  # when the machine does not say how much memory it has
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _physical() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = _meminfo()
    try:  # a container's limit (cgroup v2) when it is lower
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            total = min(total, int(text)) if total > 0 else int(text)
    except OSError:
        pass
    return total if total > 0 else FALLBACK


def _meminfo() -> int:
    try:
        m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return 0
    return int(m[1]) * 1024 if m else 0


def memory_budget() -> int:
    """Bytes a conversion may allocate for one model: ``ZOO_MEMORY_BUDGET``, else half the memory."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return _physical() // 2
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.I)
    if not m or float(m[1]) <= 0:
        raise ConvertError(f"{ENV}={text[:40]!r}: expected a number of bytes such as 8000000000 or 8G")
    return int(float(m[1]) * _UNITS[m[2].upper()])


def gib(n: int | float) -> str:
    """A byte count for messages: "12.6 GiB", "300 MiB"."""
    if n >= 2**30:
        return f"{n / 2**30:.3g} GiB"
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{int(n)} bytes"


def over_budget(nbytes: int, what: str) -> str | None:
    """The reason ``what`` cannot have ``nbytes`` (for readers with their own error class), or None."""
    budget = memory_budget()
    if nbytes <= budget:
        return None
    return f"{what} needs {gib(nbytes)}, over the memory budget of {gib(budget)} (set {ENV} to raise it)"


def check_bytes(nbytes: int, path: str | Path, where: str, what: str) -> None:
    """Raise a one-line ``BadModel`` when ``what`` needs more than the memory budget."""
    reason = over_budget(nbytes, what)
    if reason:
        raise BadModel(str(path), where, reason)


def graph_bytes(graph: Graph, shapes: dict[str, tuple[int, ...]] | None = None) -> int:
    """Memory to verify ``graph`` (at the value ``shapes`` of another input size when given): every
    value in float64 (the reference keeps them all) plus the weights."""
    values = sum(math.prod(s) for s in (graph.shapes if shapes is None else shapes).values())
    return 8 * values + sum(int(w.nbytes) for w in graph.weights.values())


def check_graph_memory(graph: Graph, path: str | Path) -> None:
    """Refuse a graph whose verification (the float64 reference run) would not fit the memory budget."""
    check_bytes(graph_bytes(graph), path, "", f"verifying at input shape "
                f"{', '.join(str(list(s)) for s in graph.inputs.values())}")
