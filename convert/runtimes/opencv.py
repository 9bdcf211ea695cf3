"""OpenCV DNN on the original Caffe/Torch7 files: the baseline a user would otherwise use, and the
importer independent of zoo's parsers that verification compares against.

What OpenCV loads is described by a plain dict (it travels to child processes as JSON):
``{"framework": "caffe"|"torch7", "source": prototxt or .t7, "weights": caffemodel or None,
"outputs": {value: OpenCV layer name ("" = the net's last output)}, "inputs": {value: blob}}``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .base import CannotRun, Runtime, register


def reason(e: Exception) -> str:
    """OpenCV's error as one whole line without its file, code and function decorations: the part
    that says what is wrong comes first (a table shows only the start of it)."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    line = next((ln for ln in reversed(lines) if "error:" in ln), lines[-1] if lines else "")
    msg = re.sub(r"^\(-?\d+:[^)]*\)\s*", "", line.split("error: ")[-1].strip())
    msg = re.sub(r"\s+in function '[^']*'$", "", msg)
    m = re.fullmatch(r"Can't create layer \"(.*)\" of type \"(.*)\"", msg, re.DOTALL)
    return f"OpenCV has no {m[2]} layer ({m[1]!r})" if m else f"OpenCV cannot load this model: {msg}"


def t7_binary(path: str) -> bool:
    with open(path, "rb") as f:
        return not re.match(rb"\s*-?\d+\s", f.read(32))  # ASCII files start with "4\n"


def read_net(original: dict[str, Any], exact: bool = False) -> Any:
    """The OpenCV net of the original files, on OpenCV's own CPU backend; ``exact`` turns off the
    Winograd 3x3 convolutions (they lose ~1e-4 on a ResNet-50: verification wants the formula)."""
    import cv2

    try:
        if original["framework"] == "caffe":
            net = cv2.dnn.readNetFromCaffe(original["source"], original.get("weights"))
        else:
            t7 = original.get("weights") or original["source"]
            net = cv2.dnn.readNetFromTorch(t7, t7_binary(t7))
    except cv2.error as e:
        raise CannotRun(reason(e)) from None
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    if exact and hasattr(net, "enableWinograd"):
        net.enableWinograd(False)
    return net


def run_net(net: Any, original: dict[str, Any], x: dict[str, np.ndarray], layers: list[str]) -> list[Any]:
    """One forward pass; ``layers``: OpenCV layer names to return ("" or none: the last output)."""
    import cv2

    blobs = original.get("inputs") or {}
    for k, v in x.items():
        v = np.ascontiguousarray(v)
        if original["framework"] == "caffe":
            net.setInput(v, blobs.get(k, k))
        else:  # a Torch7 net's input has no name in OpenCV
            net.setInput(v)
    try:
        return net.forward(layers) if layers and all(layers) else [net.forward()]
    except cv2.error as e:  # layers are created at the first forward
        if "Can't create layer" in str(e):
            raise CannotRun(reason(e)) from None
        raise


def forward(feeds: dict[str, np.ndarray], original: dict[str, Any]) -> dict[str, np.ndarray]:
    """In a child process (convert.isolate): the outputs of ``original["outputs"]`` by value name,
    computed exactly (verification)."""
    outs = original["outputs"]
    res = run_net(read_net(original, exact=True), original, feeds, list(outs.values()))
    return {o: np.asarray(v) for o, v in zip(outs, res)}


def layer_values(nodes: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Value -> the Caffe layer whose output OpenCV gives under that layer's name, from the graph's
    (layer name, first output) pairs in order. One Caffe layer may be several consecutive nodes (the
    last holds the layer's output); a name that is empty or given to two layers is left out."""
    runs: list[list[str]] = []
    for name, value in nodes:
        if runs and runs[-1][0] == name:
            runs[-1][1] = value
        else:
            runs.append([name, value])
    count = Counter(name for name, _ in runs)
    return {v: name for name, v in runs if name and count[name] == 1}


def original(art: Path, info: dict[str, Any]) -> dict[str, Any] | None:
    """What OpenCV loads for an artifact directory (None for a stripped variant or a lost source)."""
    if info.get("stripped") or not info.get("source"):
        return None
    src = Path(info["source"])
    ir = json.loads((art / "ir.json").read_text())
    if info["framework"] == "caffe":
        w = info.get("weights")
        weights = w if w and w != "random (seeded)" else str(art / "random.caffemodel")
        values = layer_values((n["name"], n["outputs"][0]) for n in ir["nodes"])
        outs = {o: values[o] for o in info["outputs"] if o in values}
        return {"framework": "caffe", "source": str(src), "weights": weights, "outputs": outs,
                "inputs": ir.get("meta", {}).get("caffe_inputs", {})}
    t7 = str(src) if src.suffix != ".lua" else str(art / "random.t7")
    return {"framework": "torch7", "source": t7, "weights": None, "outputs": {info["outputs"][-1]: ""}}


@register
class OpenCV(Runtime):
    name = "opencv"

    def skip_reason(self, case: dict[str, Any]) -> str | None:
        try:
            import cv2
        except ImportError:
            return "opencv-python-headless is not installed (pip install 'zoo[reference]')"
        if reason := super().skip_reason(case):
            return reason
        if case["device"].startswith("cuda") and cv2.cuda.getCudaEnabledDeviceCount() == 0:
            return "this OpenCV build has no CUDA backend (the PyPI wheels have none)"
        if case["precision"] != "fp32":
            return "OpenCV's CPU target runs fp32 only"
        if case["layout"] != "nchw":
            return "OpenCV chooses its own layout"
        if not case.get("original"):
            return "no original model file to load"
        return None

    def load(self, case: dict[str, Any]) -> None:
        import cv2

        cv2.setNumThreads(case["threads"])
        self.original = case["original"]
        self.net = read_net(self.original)  # as a user gets it: Winograd on
        self.names = list(self.original.get("outputs", {}).values())

    def set_inputs(self, inputs: list[dict[str, np.ndarray]], grads: list[list[np.ndarray]] | None) -> None:
        self.inputs = [{k: np.ascontiguousarray(v) for k, v in x.items()} for x in inputs]

    def forward(self, i: int) -> None:
        self.out = run_net(self.net, self.original, self.inputs[i % len(self.inputs)], self.names)

    def outputs(self) -> list[np.ndarray]:
        return [np.asarray(o, np.float32) for o in self.out]

    def settings(self) -> dict[str, Any]:
        import cv2

        return {"threads": cv2.getNumThreads(), "backend": "DNN_BACKEND_OPENCV", "target": "CPU",
                "winograd": True}
