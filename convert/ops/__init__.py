"""IR ops, one small family per file: each op is a frozen dataclass holding its formula (docstring),
its shape rule, its float64 NumPy kernel, its PyTorch emission and its ONNX emission.

PyTorch emission: ``torch_module(w)`` returns a constructor expression for an ``nn.Module`` attribute
whose state_dict keys are the op's roles (or None when the op has no weights), and
``torch(args, mod)`` returns the forward expression. Helper functions and classes used by the
generated code are registered here with ``helper`` and copied into model.py only when used.

ONNX emission: ``onnx(b, ins, outs, w)`` appends nodes through the ``OnnxBuilder`` ``b``; ``w``
maps roles to initializer names.
"""

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


# Import the families so that every op registers itself (Op.__init_subclass__).
from . import act, conv, detect, eltwise, fork, lcn, linear, norm, pool, reduce, roi, shape, softmax, unpool  # noqa: E402,F401
