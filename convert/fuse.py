"""IR-level fusion, run on every converted graph before emission, so that the float64 reference,
model.py and model.onnx all see the same graph.

- A batch norm followed by a channel affine (Caffe BatchNorm + Scale, Torch7's BN weight and bias)
  whose only reader is that affine becomes one ``BatchNorm(affine=True)``: ``nn.BatchNorm2d`` in
  PyTorch, one BatchNormalization in ONNX.
- With ``fold``: a convolution whose only reader is a batch norm with stored statistics is folded
  into it: w' = w * g, b' = (b - mean) * g + beta with g = gamma / sqrt(var + eps). model.onnx is
  always written from a folded copy (``folded``), as torch.onnx.export writes an eval-mode module:
  the ONNX is the inference artifact; model.py keeps nn.BatchNorm2d (fine-tuning, fx, quantizers)
  unless ``--fold`` asks otherwise. Verification runs the folded ONNX against the float64 reference
  of the unfolded graph, so the folding itself is checked.

A fused node takes the name of the last layer it replaces (its output is that layer's output, which
is where OpenCV compares it) and the PyTorch attribute of the first (its weights' names);
``graph.meta["fused"]`` maps its output value to every source layer it stands for.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .ir import Graph, Node
from .ops.conv import Conv
from .ops.norm import Affine, BatchNorm


def fuse(g: Graph, fold: bool = False) -> Graph:
    """Apply the fusions to ``g`` in place (callers may hold it); returns it."""
    _pairs(g, _affine_into_bn)
    if fold:
        _pairs(g, _bn_into_conv)
    return g


def folded(g: Graph) -> Graph:
    """A copy of ``g`` with conv + BN folded (``g`` and its arrays untouched; the copy shares the
    arrays it does not fold)."""
    meta = {**g.meta, "fused": {k: list(v) for k, v in g.meta.get("fused", {}).items()}}
    copy = dataclasses.replace(g, nodes=list(g.nodes), weights=dict(g.weights), shapes=dict(g.shapes), meta=meta,
                               _attrs=None, _values=None)
    _pairs(copy, _bn_into_conv)
    return copy


def _pairs(g: Graph, rule) -> None:  # type: ignore[no-untyped-def]
    """Replace each node pair (a, b), b the only reader of a's single output, for which ``rule``
    gives a fused node."""
    readers: dict[str, list[Node]] = {}
    for n in g.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    attrs: dict[str, int] = {}
    for n in g.nodes:
        attrs[n.attr] = attrs.get(n.attr, 0) + 1
    out, gone = [], set()
    for a in g.nodes:
        if id(a) in gone:
            continue
        r = readers.get(a.outputs[0], []) if len(a.outputs) == 1 else []
        b = r[0] if len(r) == 1 and a.outputs[0] not in g.outputs and len(r[0].inputs) == 1 else None
        shared = b is None or any(n.attr and attrs[n.attr] > 1 for n in (a, b))  # weights used twice
        fused = None if shared else rule(g, a, b)
        if fused is None:
            out.append(a)
            continue
        gone.add(id(b))
        out.append(fused)
        sources = g.meta.setdefault("fused", {})
        sources[fused.outputs[0]] = sources.pop(a.outputs[0], [a.name]) + sources.pop(b.outputs[0], [b.name])
        g.shapes.pop(a.outputs[0], None)
    g.nodes = out


def _take(g: Graph, node: Node) -> dict[str, np.ndarray]:
    """The node's weights, removed from the graph (the fused node stores its own)."""
    return {r: g.weights.pop(k) for r, k in node.weight_names().items()}


def _affine_into_bn(g: Graph, a: Node, b: Node) -> Node | None:
    bn, aff = a.op, b.op
    if not (isinstance(bn, BatchNorm) and isinstance(aff, Affine)) or bn.affine or aff.axis != 1:
        return None
    c = g.shapes[a.inputs[0]][1]
    if any(tuple(g.weights[k].shape) != (c,) for k in b.weight_names().values()):
        return None
    w = _take(g, a)
    p = _take(g, b)
    w["weight"] = p.get("weight", np.ones(c, np.float32))
    w["bias"] = p.get("bias", np.zeros(c, np.float32))
    return _store(g, Node(dataclasses.replace(bn, affine=True), a.inputs, b.outputs, b.name, a.attr or b.attr),
                  w)


def _bn_into_conv(g: Graph, a: Node, b: Node) -> Node | None:
    conv, bn = a.op, b.op
    if not (isinstance(conv, Conv) and isinstance(bn, BatchNorm)) or bn.batch_stats:
        return None
    c = g.weights[a.weight_names()["weight"]].shape[0]
    stats = {r: g.weights[k] for r, k in b.weight_names().items()}
    with np.errstate(all="ignore"):
        gain = stats.get("weight", np.ones(c)).astype(np.float64) / np.sqrt(stats["running_var"].astype(np.float64) + bn.eps)
    if not np.all(np.isfinite(gain)) or np.abs(gain).max(initial=0) > 1e6:  # kept apart: float32 would lose it
        return None
    w, s = _take(g, a), _take(g, b)
    bias = w.get("bias", np.zeros(c)).astype(np.float64) - s["running_mean"]
    folded = {"weight": (w["weight"] * gain.reshape(-1, 1, 1, 1)).astype(np.float32),
              "bias": (bias * gain + s.get("bias", np.zeros(c))).astype(np.float32)}
    return _store(g, Node(dataclasses.replace(conv, bias=True), a.inputs, b.outputs, b.name, a.attr), folded)


def _store(g: Graph, node: Node, w: dict[str, np.ndarray]) -> Node:
    for r in node.op.roles():
        g.weights[f"{node.attr}.{r}"] = w[r]
    return node


def sources(g: Graph, node: Node) -> list[str]:
    """The source layers a node stands for (more than one when fused)."""
    return g.meta.get("fused", {}).get(node.outputs[0], [node.name]) if node.outputs else [node.name]
