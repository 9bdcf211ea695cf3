"""Running an artifact, for verification and timing alike: one file per runtime, one registry.

Importing this package registers every runtime; each imports its library only when used.
"""

from __future__ import annotations

from . import gemm_peak, opencv, ort, ov, torch_compile, torch_eager  # noqa: F401  (they register)
from .base import RUNTIMES, TOLERANCE, CannotRun, Runtime, cuda_index, register
from .torch_eager import import_model

__all__ = ["RUNTIMES", "TOLERANCE", "CannotRun", "Runtime", "cuda_index", "import_model", "register"]
