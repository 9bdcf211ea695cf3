"""What every runtime is: a class registered by the name used on the command line and in results.

A runtime loads an artifact directory (model.py / model.onnx / the original files) for a case,
takes inputs once (moved to the device, precision and layout of the case), and then runs
``forward(i)`` / ``backward(i)`` on the i-th rotated input; ``sync()`` waits for queued device
work; ``infer(x)`` gives the outputs for one input (verification). ``skip_reason`` says why a
combination cannot run (never a crash, never silently absent); ``CannotRun`` from ``load`` or
``forward`` says the same thing once the model is known.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

RUNTIMES: dict[str, type[Runtime]] = {}

# The one tolerance table, keyed by precision: max |a - b| / max |ref| against the float64 reference.
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 8e-2}


def register(cls: type[Runtime]) -> type[Runtime]:
    RUNTIMES[cls.name] = cls
    return cls


class CannotRun(Exception):
    """The runtime cannot load this model (e.g. OpenCV lacks one of its layers): a skipped row."""


class Runtime:
    name: ClassVar[str] = ""
    training: ClassVar[bool] = False  # can time forward + backward

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        if case["mode"] == "training" and not self.training:
            return f"{self.name} runs inference only"
        return None

    def load(self, case: dict[str, Any]) -> None:
        raise NotImplementedError

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        raise NotImplementedError

    def forward(self, i: int) -> None:
        raise NotImplementedError

    def backward(self, i: int) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def outputs(self) -> list[np.ndarray]:
        """Outputs of the last forward as float32 arrays."""
        raise NotImplementedError

    def infer(self, x: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Inference outputs for one input (verification; replaces the timed inputs)."""
        self.set_inputs([x], None)
        self.forward(0)
        self.sync()
        return self.outputs()

    def memory(self) -> dict[str, int]:
        return {}

    def settings(self) -> dict[str, Any]:
        """The runtime's own settings for the results row (threads, streams, optimisation level)."""
        return {}


def cuda_index(device: str) -> int | None:
    return int(device.split(":")[1]) if device.startswith("cuda") else None
