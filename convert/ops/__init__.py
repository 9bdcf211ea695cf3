"""IR ops, one small family per file: each op is a frozen dataclass holding its formula (docstring),
its shape rule, its float64 NumPy kernel, its PyTorch emission and its ONNX emission.

PyTorch emission: ``torch_module(w)`` returns a constructor expression for an ``nn.Module`` attribute
whose state_dict keys are the op's roles (or None when the op has no weights), and
``torch(args, mod)`` returns the forward expression. Helper functions and classes used by the
generated code are registered with ``helper`` (codegen.py) and copied into model.py only when used.

ONNX emission: ``onnx(b, ins, outs, w)`` appends nodes through the ``OnnxBuilder`` ``b``; ``w``
maps roles to initializer names.
"""

from __future__ import annotations

# Import the families so that every op registers itself (Op.__init_subclass__); they take ``fmt`` and
# ``helper`` from codegen.py, not from this package, so that no op module imports its own package.
from . import act, conv, detect, eltwise, fork, lcn, linear, norm, pool, reduce, roi, shape, softmax, unpool  # noqa: F401
from .codegen import HELPERS, fmt, helper  # noqa: F401
