"""Caffe prototxt (+ caffemodel) -> IR graph.

``read`` reads the net, upgrades it to V2 layers, settles the inputs, checks that every layer type
has a conversion (naming all that do not), then walks the layers in order calling one small
function per type (``layers.py`` and its siblings, registered in ``builder.py``). ``load`` returns
that as the ``Loaded`` every frontend gives ``api``. Blob names become SSA values: the last write of a Caffe blob
keeps its name, earlier in-place versions are called ``blob@k``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadModel, ConvertError, Unsupported
from ..ir import Graph, Shape
from ..loaded import Loaded, opencv_available
from ..reference import calibrate_random
from . import binary, opencv, text, upgrade
from . import layers as _layers  # noqa: F401  (importing the layer files registers their functions)
from . import more as _more  # noqa: F401
from . import rcnn as _rcnn  # noqa: F401
from . import ssd as _ssd  # noqa: F401
from .builder import LAYERS, MAX_AXES, Builder, arity_error, bad_shape
from .schema import SCHEMA
from .upgrade import Layer

log = logging.getLogger(__name__)

DROPPED = {"SoftmaxWithLoss", "EuclideanLoss", "Accuracy", "SigmoidCrossEntropyLoss", "HingeLoss",
           "InfogainLoss", "MultinomialLogisticLoss", "ContrastiveLoss", "Silence", "HDF5Output"}
DATA = {"Input", "Data", "ImageData", "MemoryData", "DummyData", "HDF5Data", "WindowData",
        "AnnotatedData", "Python"}


@dataclass
class CaffeModel:
    graph: Graph
    layers: list[tuple[str, str, list[np.ndarray]]]  # Caffe-layout blobs, for writing a caffemodel
    random_weights: bool
    net_name: str = ""
    notes: list[str] = field(default_factory=list)


def _input_decls(net: Any, layers: list[Layer], path: str) -> dict[str, Shape | None]:
    """Declared inputs and their shapes (None: unknown, needs --input-shape)."""
    n, dims, shapes = len(net.input), len(net.input_dim), len(net.input_shape)
    if dims % 4 or dims > 4 * n:
        raise BadModel(path, "", f"{dims} input_dim values for {n} input{'s' * (n != 1)}: 4 per input expected")
    if shapes > n:
        raise BadModel(path, "", f"{shapes} input_shape blocks for {n} input{'s' * (n != 1)}: one per input expected")
    decl: dict[str, Shape | None] = {}
    for i, name in enumerate(net.input):
        if i < len(net.input_shape):
            decl[name] = tuple(int(d) for d in net.input_shape[i].dim)
        elif len(net.input_dim) >= 4 * (i + 1):
            decl[name] = tuple(int(d) for d in net.input_dim[4 * i:4 * i + 4])
        else:
            decl[name] = None
    for L in layers:
        if L.type in DATA:
            for t, s in zip(L.tops, _data_shapes(L, path)):
                decl[t] = s
    return decl


def _per_top(shapes: list[Shape], L: Layer, path: str) -> list[Shape | None]:
    """Caffe's Input and DummyData rule: one shape for all tops, one per top, or none."""
    if len(shapes) not in (0, 1, len(L.tops)):
        raise BadModel(path, L.where(), f"{len(shapes)} shapes for {len(L.tops)} tops: give one shape, "
                                          "one per top, or none")
    return shapes * len(L.tops) if len(shapes) == 1 else shapes + [None] * len(L.tops)


def _data_shapes(L: Layer, path: str) -> list[Shape | None]:
    p = L.p
    if L.type == "Input":
        return _per_top([tuple(int(d) for d in s.dim) for s in p.input_param.shape], L, path)
    if L.type == "DummyData":
        d = p.dummy_data_param
        if d.shape:
            return _per_top([tuple(int(x) for x in s.dim) for s in d.shape], L, path)
        return _per_top([tuple(int(v) for v in t) for t in zip(d.num, d.channels, d.height, d.width)], L, path)
    if L.type == "MemoryData":
        m = p.memory_data_param
        return [(m.batch_size, m.channels, m.height, m.width), (m.batch_size, 1, 1, 1)]
    if L.type == "ImageData":
        d, crop = p.image_data_param, p.transform_param.crop_size
        h, w = (crop, crop) if crop else (d.new_height, d.new_width)
        if h and w:
            return [(d.batch_size, 3 if d.is_color else 1, h, w), (d.batch_size, 1, 1, 1)]
    if L.type == "Data" and p.transform_param.crop_size and p.data_param.batch_size:
        crop, n = p.transform_param.crop_size, p.data_param.batch_size
        log.warning("layer %r (Data): assuming %dx3x%dx%d images (the database is not read); "
                    "override with --input-shape", L.name, n, crop, crop)
        return [(n, 3, crop, crop), (n, 1, 1, 1)]
    return [None] * len(L.tops)


def load(source: Path, weights: Path | None, shapes: dict[str, Shape] | None, seed: int | None) -> Loaded:
    """``read``, plus what verification needs: the random weights as a caffemodel (written into
    the artifact dir, for OpenCV and the benchmarks) and OpenCV's import of the original."""
    model = read(source, weights, shapes, seed)
    g = model.graph

    def extra(d: Path) -> None:
        if model.random_weights:
            binary.write(d / "random.caffemodel", model.layers, model.net_name)

    def runner(d: Path) -> Any:
        if not opencv_available():
            return None
        return opencv.runner(g, source, weights or d / "random.caffemodel")

    return Loaded(g, extra, runner, g.meta["opencv_known"])


def read(prototxt: Path, weights: Path | None = None,
         input_shapes: dict[str, Shape] | None = None, seed: int | None = 0) -> CaffeModel:
    """Read a Caffe net; without ``weights``, blobs are seeded random (``seed`` None: placeholders
    for shape and size queries only)."""
    path = str(prototxt)
    net = text.read(prototxt)
    layers = upgrade.layers(net, path)
    if not layers:
        raise BadModel(path, "", "no layers: is this a Caffe prototxt?")
    dropped = [L for L in layers if L.type in DROPPED]
    if dropped:
        log.warning("%s: training-only layers left out: %s", path,
                    ", ".join(f"{L.name} ({L.type})" for L in dropped))
    layers = [L for L in layers if L.type not in DROPPED]
    for L in layers:  # py-faster-rcnn's proposal layer computes (other Python layers feed data)
        if L.type == "Python" and L.p.python_param.layer == "ProposalLayer":
            L.type = "Python.ProposalLayer"
    untyped = [L for L in layers if not L.type]
    if untyped:
        raise BadModel(path, f"layer {untyped[0].name!r}", "no type given")
    unknown = [(L.type, L.name) for L in layers if L.type not in LAYERS and L.type not in DATA]
    if unknown:
        raise Unsupported(path, "caffe", unknown, known=[*LAYERS, *DATA])
    decl = _input_decls(net, layers, path)
    _check_net(layers, list(net.input), path)
    w = binary.read(weights) if weights else None
    consumed = {b for L in layers for b in L.bottoms}
    b = Builder(path, w, seed, _writes(layers))
    _add_inputs(b, decl, consumed, input_shapes or {}, path)
    for L in layers:
        if L.type in DATA:
            continue
        b.L = L
        missing = [x for x in L.bottoms if x not in b.cur]
        if missing:
            raise BadModel(path, L.where(), f"input blob {missing[0]!r} is not produced by any "
                                            f"earlier layer or input")
        LAYERS[L.type](b, L)
    b.g.outputs = _outputs(layers, b)
    if not b.g.outputs:
        raise BadModel(path, "", "the net has no outputs")
    if weights is None and seed is not None:
        _calibrate(b, seed)
    b.g.meta.update(framework="caffe", source=str(Path(prototxt).resolve()),
                    weights=str(Path(weights).resolve()) if weights else None, seed=seed,
                    name=net.name or Path(prototxt).stem, opencv_known=opencv.known_deviations(layers))
    return CaffeModel(b.g, b.caffe_blobs, weights is None, net.name)


def _check_net(layers: list[Layer], inputs: list[str], path: str) -> None:
    """What Caffe checks as it builds the net, before any layer runs: bottom and top counts,
    parameters (finite, known enum values), every bottom produced earlier, every top produced
    once (or in place: top i is bottom i)."""
    available: set[str] = set()
    for name in inputs:
        if name in available:
            raise BadModel(path, f"input {name!r}", "declared twice")
        available.add(name)
    for L in layers:
        if L.type not in DATA:
            reason = arity_error(L) or _param_error(L.p)
            missing = [x for x in L.bottoms if x not in available]
            if missing and not reason:
                reason = f"input blob {missing[0]!r} is not produced by any earlier layer or input"
            if reason:
                raise BadModel(path, L.where(), reason)
        for i, t in enumerate(L.tops):
            if t in available and not (i < len(L.bottoms) and L.bottoms[i] == t):
                raise BadModel(path, L.where(), f"top {t!r} is already produced by an earlier layer, an "
                                                "input or this layer (only in-place reuse is allowed)")
            available.add(t)
    inline = [L.name for L in layers if L.p.blobs]
    if inline:  # Caffe would start from them; a caffemodel replaces them there as here
        log.warning("%s: weights written inside the prototxt (layer %s) are not read; they come from the "
                    "caffemodel or are random", path, ", ".join(repr(n) for n in inline[:3]))


def _param_error(msg: Any, prefix: str = "") -> str | None:
    """The first parameter that is not finite or names no value of its enum (None: all fine)."""
    for f, value in msg.items():
        for v in value if isinstance(value, list) else [value]:
            if f.is_message:
                reason = _param_error(v, f"{prefix}{f.name}.")
                if reason:
                    return reason
            elif f.type in ("float", "double") and not math.isfinite(v):
                return f"{prefix}{f.name} is {v}: parameters must be finite numbers"
            elif f.is_enum and not isinstance(v, str):
                return f"{prefix}{f.name} is {v}, which is none of {', '.join(SCHEMA.enums[f.type])}"
    return None


def _calibrate(b: Builder, seed: int) -> None:
    """Random weights: filters centred, residual branches damped, batch norms given their inputs'
    real statistics (see calibrate_random); the Caffe blobs follow (convolution weights are the
    same arrays; batch-norm blobs are stored times their scale factor) for the caffemodel
    OpenCV reads."""
    for attr in calibrate_random(b.g, seed):
        mean, var, factor = b.bn_blobs[attr]
        mean[...] = b.g.weights[f"{attr}.running_mean"] * np.float32(factor)
        var[...] = b.g.weights[f"{attr}.running_var"] * np.float32(factor)


def _writes(layers: list[Layer]) -> dict[str, int]:
    writes: dict[str, int] = {}
    for L in layers:
        if L.type not in DATA:
            for t in L.tops:
                writes[t] = writes.get(t, 0) + 1
    return writes


def _add_inputs(b: Builder, decl: dict[str, Shape | None], consumed: set[str],
                given: dict[str, Shape], path: str) -> None:
    extra = [k for k in given if k not in decl]
    if extra:
        raise ConvertError(f"{path}: --input-shape names {extra[0]!r}, but the inputs are "
                           f"{', '.join(decl) or 'none'}")
    for name, shape in decl.items():
        if name not in consumed:
            continue
        shape = given.get(name, shape)
        if shape is None:
            raise BadModel(path, f"input {name!r}", "shape unknown (a data layer or an input "
                           f"without dimensions); give it with --input-shape {name}=N,C,H,W")
        if not shape or bad_shape(tuple(int(d) for d in shape)):
            shown = list(shape) if len(shape) <= MAX_AXES else f"of {len(shape)} axes (Caffe allows {MAX_AXES})"
            raise BadModel(path, f"input {name!r}", f"invalid shape {shown}")
        value = name or b._fresh("input")  # a value needs a name; Caffe's blob may have none
        b.g.add_input(value, shape)
        b.cur[name] = value
        if value != name:
            b.g.meta.setdefault("caffe_inputs", {})[value] = name
    if not b.g.inputs and decl:
        raise BadModel(path, "", f"no layer reads the input{'s' * (len(decl) > 1)} "
                                 f"{', '.join(repr(k) for k in list(decl)[:5])}")
    if not b.g.inputs:
        raise BadModel(path, "", "the net declares no input (input/input_dim, input_shape or an "
                                 "Input layer)")


def _outputs(layers: list[Layer], b: Builder) -> list[str]:
    """Caffe's rule: blobs produced and not consumed afterwards are the net's outputs."""
    available: dict[str, None] = {}
    for L in layers:
        for x in L.bottoms:
            available.pop(x, None)
        if L.type not in DATA:
            for t in L.tops:
                available[t] = None
    return [b.cur[t] for t in available if b.cur.get(t) not in b.g.inputs]
