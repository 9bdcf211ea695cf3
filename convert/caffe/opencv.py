"""OpenCV 4.x's own Caffe importer as an independent check of a conversion."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ..ir import Graph


def known_deviations(g: Graph) -> list[str]:
    """Where OpenCV's Caffe importer is known to compute something else than Caffe."""
    notes = []
    if any(n.op.kind == "lrn" and n.op.region == "across" and n.op.k != 1 for n in g.nodes):
        notes.append("OpenCV ignores k of ACROSS_CHANNELS LRN")
    if any(n.op.kind == "pool" and (n.op.pad[0] == 0) != (n.op.pad[1] == 0) for n in g.nodes):
        notes.append("OpenCV keeps an extra last pooling window on an unpadded axis")
    return notes


def runner(g: Graph, prototxt: Path, caffemodel: Path | None) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A function running OpenCV's import of the original files on given inputs."""

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import cv2

        net = cv2.dnn.readNetFromCaffe(str(prototxt), str(caffemodel) if caffemodel else None)
        net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        for name, x in feeds.items():
            net.setInput(np.ascontiguousarray(x), name)
        producers = {o: n.name for n in g.nodes for o in n.outputs}
        names = [producers[o] for o in g.outputs]
        outs = net.forward(names)
        return {o: np.asarray(v) for o, v in zip(g.outputs, outs)}

    return run
