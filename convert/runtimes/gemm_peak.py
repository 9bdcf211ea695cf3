"""A square matrix multiply in PyTorch: the device's achievable peak, measured in the same run
(FLOPs per "image" = 2 n^3)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Runtime, register
from .torch_eager import DTYPES


@register
class GemmPeak(Runtime):
    name = "gemm-peak"

    def load(self, case: dict[str, Any]) -> None:
        import torch

        self.torch, self.dev = torch, torch.device(case["device"])
        dtype = getattr(torch, DTYPES[case["precision"]])
        n = case["gemm_n"]
        self.a = torch.randn(n, n, device=self.dev).to(dtype)
        self.b = torch.randn(n, n, device=self.dev).to(dtype)

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        pass

    def forward(self, i: int) -> None:
        self.out = self.torch.matmul(self.a, self.b)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def outputs(self) -> list[np.ndarray]:
        return []
