"""torch.compile (Inductor) of the eager module; compile time lands in the first iteration."""

from __future__ import annotations

from typing import Any

from .base import register
from .torch_eager import TorchEager


@register
class TorchCompile(TorchEager):
    name = "torch-compile"

    def wrap(self, net: Any) -> Any:
        return self.torch.compile(net)
