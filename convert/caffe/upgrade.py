"""One pass from any prototxt generation (V0, V1, V2) to a list of V2-style layers.

V1 (``layers { type: CONVOLUTION }``) already uses V2's parameter messages, so its fields copy
over; V0 (``layers { layer { type: "conv" kernelsize: 11 } }``) keeps everything flat on the layer
and is mapped field by field. Layers that do not run in the TEST phase are dropped here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..errors import BadModel
from .schema import Msg

log = logging.getLogger(__name__)

V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DATA": "Data", "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}

V0_TYPES = {
    "accuracy": "Accuracy", "bnll": "BNLL", "concat": "Concat", "conv": "Convolution",
    "data": "Data", "dropout": "Dropout", "euclidean_loss": "EuclideanLoss", "flatten": "Flatten",
    "hdf5_data": "HDF5Data", "hdf5_output": "HDF5Output", "im2col": "Im2col",
    "images": "ImageData", "infogain_loss": "InfogainLoss", "innerproduct": "InnerProduct",
    "lrn": "LRN", "multinomial_logistic_loss": "MultinomialLogisticLoss", "pool": "Pooling",
    "relu": "ReLU", "sigmoid": "Sigmoid", "softmax": "Softmax", "softmax_loss": "SoftmaxWithLoss",
    "split": "Split", "tanh": "TanH", "window_data": "WindowData",
}

# V0 flat field -> (V2 parameter message, V2 field, repeated in V2)
V0_FIELDS = {
    "Convolution": ("convolution_param", {"num_output": "num_output", "biasterm": "bias_term",
                    "weight_filler": "weight_filler", "bias_filler": "bias_filler", "pad": "pad",
                    "kernelsize": "kernel_size", "group": "group", "stride": "stride"}),
    "Pooling": ("pooling_param", {"pool": "pool", "kernelsize": "kernel_size", "stride": "stride",
                "pad": "pad"}),
    "LRN": ("lrn_param", {"local_size": "local_size", "alpha": "alpha", "beta": "beta", "k": "k"}),
    "InnerProduct": ("inner_product_param", {"num_output": "num_output", "biasterm": "bias_term",
                     "weight_filler": "weight_filler", "bias_filler": "bias_filler"}),
    "Dropout": ("dropout_param", {"dropout_ratio": "dropout_ratio"}),
    "Concat": ("concat_param", {"concat_dim": "concat_dim"}),
}


@dataclass
class Layer:
    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    p: Msg  # a V2 LayerParameter
    param_names: list[str] = field(default_factory=list)

    @property
    def pos(self) -> str:
        return f"line {self.p.pos[0]}" if self.p.pos else ""

    def where(self) -> str:
        return f"layer {self.name!r} ({self.type})"


def _v1(L: Msg) -> Msg:
    if L.has("layer"):
        return _v0(L)
    p = Msg("LayerParameter", pos=L.pos)
    for name in ("name", "bottom", "top", "include", "exclude", "blobs", "loss_weight"):
        if L.has(name):
            p.set(name, getattr(L, name))
    p.set("type", V1_TYPES.get(L.type, L.type))
    for name in L._values:  # the *_param messages share names and types with V2
        if name.endswith("_param") and name != "param":
            p.set(name, getattr(L, name))
    if L.param:
        p.set("param", [Msg("ParamSpec", {"name": n}) for n in L.param])
    return p


def _v0(L: Msg) -> Msg:
    v0 = L.layer
    typ = V0_TYPES.get(v0.type, v0.type)
    p = Msg("LayerParameter", {"name": v0.name, "type": typ, "bottom": L.bottom, "top": L.top},
            pos=L.pos)
    if typ in V0_FIELDS:
        pname, mapping = V0_FIELDS[typ]
        sub = Msg(getattr(p, pname).type_name)
        for old, new in mapping.items():
            if v0.has(old):
                value = getattr(v0, old)
                sub.set(new, [value] if sub._type.fields[new].repeated else value)
        p.set(pname, sub)
    if v0.blobs:
        p.set("blobs", v0.blobs)
    return p


def _from_v1(entries: list[Msg], path: str) -> list[Msg]:
    """V1/V0 entries to V2; V0 "padding" layers are folded into the convolution they feed."""
    out: list[Msg] = []
    pending: dict[str, tuple[str, int]] = {}  # top of a padding layer -> (its bottom, pad)
    for L in entries:
        if L.has("layer") and L.layer.type == "padding":
            if len(L.bottom) != 1 or len(L.top) != 1:
                raise BadModel(path, f"layer {L.layer.name!r} (padding)", "a V0 padding layer needs one "
                                     f"bottom and one top, got {len(L.bottom)} and {len(L.top)}")
            pending[L.top[0]] = (L.bottom[0], L.layer.pad)
            continue
        p = _v1(L)
        if p.bottom and p.bottom[0] in pending:
            src, pad = pending.pop(p.bottom[0])
            if p.type != "Convolution":
                raise BadModel(path, f"layer {p.name!r}", "a V0 padding layer must feed a convolution")
            p.set("bottom", [src, *p.bottom[1:]])
            p.convolution_param.set("pad", [pad])
        out.append(p)
    return out


def _rule_met(rule: Msg, state: Msg) -> bool:
    if rule.has("phase") and rule.phase != state.phase:
        return False
    if rule.has("min_level") and state.level < rule.min_level:
        return False
    if rule.has("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    return all(s in stages for s in rule.stage) and not any(s in stages for s in rule.not_stage)


def runs_in(p: Msg, state: Msg) -> bool:
    """Caffe's rule: include rules must have one match; otherwise no exclude rule may match."""
    if p.include:
        return any(_rule_met(r, state) for r in p.include)
    return not any(_rule_met(r, state) for r in p.exclude)


def layers(net: Msg, path: str) -> list[Layer]:
    """All layers of the net in V2 form, TEST-phase ones only."""
    if net.layer and net.layers:
        raise BadModel(path, "", "mixes V2 'layer' and V1 'layers' entries")
    raw = list(net.layer) if net.layer else _from_v1(list(net.layers), path)
    state = net.state if net.has("state") else Msg("NetState")
    if not state.has("phase"):
        state.set("phase", "TEST")
    out = []
    for p in raw:
        if not runs_in(p, state):
            log.info("%s: layer %r does not run in the TEST phase; left out", path, p.name)
            continue
        out.append(Layer(p.name, p.type, list(p.bottom), list(p.top), p,
                         [ps.name for ps in p.param]))
    return out
