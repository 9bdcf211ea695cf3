"""Helpers of the ops' code emission: literal floats for generated code, and the registry of helper
functions and classes that a generated model.py may need."""

from __future__ import annotations

HELPERS: dict[str, str] = {}


def helper(name: str, source: str) -> str:
    """Register the source of a helper that generated model.py files may need."""
    HELPERS[name] = source.strip("\n") + "\n"
    return name


def fmt(v: float) -> str:
    """A float literal for generated code that round-trips exactly."""
    if v == float("inf"):
        return "math.inf"
    if v == float("-inf"):
        return "-math.inf"
    if v != v:
        return "math.nan"
    return repr(float(v))
