"""OpenCV 4.x's own Torch7 importer (cv2.dnn.readNetFromTorch) as an independent check.

It reads the original .t7 (binary or ASCII), or for a Lua definition the ``random.t7`` written next
to the artifacts, in a child process (it can crash on files it dislikes). It returns only the net's
last output, so models with several outputs are reported as refused.

Where OpenCV departs from Torch7 the frontend records it in ``graph.meta["opencv_known"]`` (only
for the modules present). Each was confirmed with the float64 reference, PyTorch and ONNX Runtime
agreeing against OpenCV (tests/test_torch7_modules.py), Torch7's source, and where a golden output
of real Torch7 exists, that (net_batch_norm_train). Seen with OpenCV 4.14:
- SpatialAveragePooling without a ``count_include_pad`` field is read as false (Torch7: true), and
  ``divide = false`` (sum pooling) is ignored;
- tensors stored non-contiguously (a transposed weight saved as is) are misread;
- a batch norm saved in training mode is evaluated with its running statistics;
- pooling padded on one axis only keeps a last window on the other axis that THNN drops;
- JoinTable ignores ``nInputDims`` and negative dimensions; the legacy ``padding`` field of
  SpatialConvolution is ignored; Normalize(math.huge) is not the infinity norm;
- cudnn.SoftMax/LogSoftMax (cuDNN's INSTANCE mode, over a whole sample) are taken per pixel;
- LogSoftMax is log(softmax), -inf where a probability underflows float32;
- SpatialMaxUnpooling sizes its output (n - 1) * stride + kernel - 2 * pad from the pooled map, not
  the pooling's input size (Torch7's oheight/owidth): where they differ it fails an index
  assertion; it also takes a batch of one only (tests/test_torch7_classic.py).
It refuses, among others, Threshold, LeakyReLU, HardTanh, SoftPlus, Abs, AddConstant, Narrow,
Transpose, Mean/Sum, SelectTable, CMulTable, SpatialSoftMax, SpatialReplicationPadding,
cropping SpatialZeroPadding, Padding with an index, and files older than ``ceil_mode``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import isolate
from ..ir import Graph
from ..runtimes import opencv as ocv


def known_deviations(g: Graph) -> list[str]:
    return list(g.meta.get("opencv_known", []))


def original(g: Graph, art: Path) -> Path | None:
    """The .t7 OpenCV should read: the source itself, or random.t7 for a Lua definition."""
    source = Path(g.meta.get("source") or "")
    path = source if g.meta.get("weights") else art / "random.t7"  # a definition has no weights file
    return path if path.is_file() else None


def runner(g: Graph, art: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None:
    """A function running OpenCV's import of the original file (in a child process)."""
    t7 = original(g, art)
    if t7 is None:
        return None
    described = {"framework": "torch7", "source": str(t7), "weights": None, "outputs": {g.outputs[-1]: ""}}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if len(g.outputs) != 1:
            raise isolate.IsolatedError("several outputs: OpenCV's Torch importer gives only its last")
        outs, peak = isolate.call("convert.runtimes.opencv:forward", feeds, original=described)
        run.peak_rss_bytes = peak  # type: ignore[attr-defined]
        return outs

    return run


def forward_many(feeds: dict[str, np.ndarray], jobs: list[list]) -> dict[str, np.ndarray]:
    """In one child, several imports: jobs of [key, t7 path, binary], each run on ``feeds[key]``.
    A model OpenCV refuses gives a one-line message (a string array) under ``key + "!error"``.
    Checking many small models this way costs one process start instead of one each."""
    import cv2

    out: dict[str, np.ndarray] = {}
    for key, t7, _binary in jobs:  # the file says whether it is binary
        described = {"framework": "torch7", "source": t7, "weights": None, "outputs": {key: ""}}
        try:
            out.update(ocv.forward({key: feeds[key]}, described))
        except ocv.CannotRun as e:
            out[key + "!error"] = np.array(str(e)[:300])
        except cv2.error as e:
            out[key + "!error"] = np.array(ocv.reason(e)[:300])
    return out
