"""Fake runtimes for the benchmark harness tests (imported by worker processes as a plugin)."""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

import numpy as np

from convert.runtimes import Runtime, register


class _Base(Runtime):
    training = True

    def load(self, case: dict[str, Any]) -> None:
        self.case = case

    def set_inputs(self, inputs, grads) -> None:  # type: ignore[no-untyped-def]
        self.x = inputs

    def outputs(self) -> list[np.ndarray]:
        return [np.zeros((1, 2), np.float32)]


@register
class Sleeper(_Base):
    """Each forward sleeps 20 ms, each backward 30 ms."""

    name = "test-sleep"

    def forward(self, i: int) -> None:
        time.sleep(0.020)

    def backward(self, i: int) -> None:
        time.sleep(0.030)


@register
class Crasher(_Base):
    name = "test-crash"

    def forward(self, i: int) -> None:
        os._exit(3)


@register
class Hanger(_Base):
    name = "test-hang"

    def forward(self, i: int) -> None:
        time.sleep(3600)


class AsyncDevice:
    """A fake accelerator: work is queued and done by another thread, like a CUDA stream."""

    def __init__(self) -> None:
        self.q: queue.Queue[float] = queue.Queue()
        threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self) -> None:
        while True:
            secs = self.q.get()
            time.sleep(secs)
            self.q.task_done()

    def launch(self, secs: float) -> None:
        self.q.put(secs)

    def synchronize(self) -> None:
        self.q.join()


@register
class FakeAsync(_Base):
    """forward() only enqueues 15 ms of work; sync() waits for it."""

    name = "test-async"

    def load(self, case: dict[str, Any]) -> None:
        super().load(case)
        self.device = AsyncDevice()

    def forward(self, i: int) -> None:
        self.device.launch(0.015)

    def backward(self, i: int) -> None:
        self.device.launch(0.015)

    def sync(self) -> None:
        self.device.synchronize()
