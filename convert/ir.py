"""The one intermediate representation: a dataflow graph of ops with named weights.

Ops hold their framework's shape rules, not sizes: ``Graph.shapes`` are the shapes at the declared
input size, ``Graph.infer_shapes`` gives them at any other.

Frontends (Caffe, Torch7) build a ``Graph`` with ``Graph.add``; emitters (PyTorch, ONNX) and the
float64 reference interpreter walk ``graph.nodes`` in order and ask each op for its part. An op
knows its own formula; the walkers know nothing about any op.

Naming: values (tensors flowing between nodes) keep the source framework's names where they are
unique, weights are named ``<attr>.<role>`` where ``attr`` is the node's module attribute in the
generated PyTorch code. The same weight names are the safetensors keys, the PyTorch state_dict
keys and the ONNX initializer names (in model.onnx a convolution with a batch norm folded into it
holds the folded values under the convolution's names, and the batch norm's are gone).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .errors import ShapeError
from .naming import MODULE_ATTRS, Names

Shape = tuple[int, ...]


class Op:
    """Base of every IR op (each a frozen dataclass in ``convert/ops``).

    Subclasses set ``kind`` (registry key) and ``roles`` (weight roles, e.g. ("weight", "bias")),
    and implement ``infer``, ``reference``, ``torch`` and ``onnx``.
    """

    kind: ClassVar[str] = ""
    stats: ClassVar[tuple[str, ...]] = ()  # roles that are statistics, not learned parameters
    registry: ClassVar[dict[str, type[Op]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("kind"):
            Op.registry[cls.kind] = cls

    def roles(self) -> tuple[str, ...]:
        """Names of the weights this op reads, in order."""
        return ()

    def infer(self, shapes: list[Shape], w: dict[str, Shape]) -> list[Shape]:
        raise NotImplementedError

    def weight_problem(self, w: dict[str, Shape]) -> str | None:
        """Why these weight shapes cannot belong to this op (checked before ``infer``)."""
        return None

    def reference(self, xs: list[np.ndarray], w: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def macs(self, shapes: list[Shape], outs: list[Shape], w: dict[str, Shape]) -> int:
        """Multiply-adds per forward pass (counted for convolutions and fully connected layers)."""
        return 0

    def batch_free(self, shapes: list[Shape]) -> bool:
        """True when the op treats axis 0 as an independent batch (so any batch size works)."""
        return True

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {"kind": self.kind, **d}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Op:
        d = dict(d)
        cls = Op.registry[d.pop("kind")]
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in d:
                v = d[f.name]
                kwargs[f.name] = tuple(_tuplify(x) for x in v) if isinstance(v, list) else v
        return cls(**kwargs)


def _tuplify(v: Any) -> Any:
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


@dataclass(frozen=True, slots=True)
class Node:
    op: Op
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str  # the source layer / module this node came from
    attr: str = ""  # PyTorch attribute owning the weights ("" when the op has none)

    def weight_names(self) -> dict[str, str]:
        return {r: f"{self.attr}.{r}" for r in self.op.roles()}


@dataclass
class Graph:
    inputs: dict[str, Shape] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # name, source, framework, ...
    _attrs: Names | None = field(default=None, repr=False, compare=False)
    _values: tuple[tuple[list[Node], int, int], set[str]] | None = field(default=None, repr=False, compare=False)

    def add_input(self, name: str, shape: Shape) -> str:
        if not name or name in self._defined():
            raise ShapeError(f"input name {name!r} is empty or already taken")
        self.inputs[name] = tuple(int(d) for d in shape)
        self.shapes[name] = self.inputs[name]
        self._defined_add(name)
        return name

    def add(
        self,
        op: Op,
        inputs: list[str] | tuple[str, ...],
        outputs: list[str] | tuple[str, ...],
        name: str,
        weights: dict[str, np.ndarray] | None = None,
        share: str = "",
    ) -> Node:
        """Append a node, inferring its output shapes; ``share`` reuses another node's attr."""
        attr = ""
        if op.roles():
            attr = share or self._fresh_attr(name)
            if not share:
                missing = [r for r in op.roles() if r not in (weights or {})]
                if missing:
                    raise ValueError(f"op {op.kind} of {name!r} lacks weights {missing}")
                for r in op.roles():
                    self.weights[f"{attr}.{r}"] = weights[r]  # type: ignore[index]
        node = Node(op, tuple(inputs), tuple(outputs), name, attr)
        defined = self._defined()
        for o in node.outputs:
            if not o or o in defined:  # a blob never merges with another
                raise ShapeError(f"value name {o!r} is empty or already taken")
        w = {r: self.weights[n].shape for r, n in node.weight_names().items()}
        problem = op.weight_problem(w)
        if problem:
            raise ShapeError(problem)
        outs = op.infer([self.shapes[i] for i in node.inputs], w)
        if len(outs) != len(node.outputs):
            raise ShapeError(f"{op.kind} gives {len(outs)} outputs, layer names {len(node.outputs)}")
        for o, s in zip(node.outputs, outs):
            if any(d <= 0 for d in s):
                raise ShapeError(f"output {o!r} would have shape {list(s)}")
            self.shapes[o] = tuple(int(d) for d in s)
        self.nodes.append(node)
        self._defined_add(*node.outputs)
        return node

    def _fresh_attr(self, name: str) -> str:
        """The PyTorch attribute (and weight-name prefix) of a new node with weights."""
        if self._attrs is None:
            self._attrs = Names(MODULE_ATTRS | {n.attr for n in self.nodes})
        return self._attrs.get(name, "layer")

    def _defined(self) -> set[str]:
        """Names of the inputs and node outputs, kept between calls while nodes are only added."""
        key = (self.nodes, len(self.nodes), len(self.inputs))  # the list itself: an id could be reused
        if self._values is None or not _same(self._values[0], key):
            self._values = key, set(self.inputs).union(*(n.outputs for n in self.nodes))
        return self._values[1]

    def _defined_add(self, *names: str) -> None:
        """After an input or a node was added: the new names join the kept set."""
        if self._values is None or self._values[0][0] is not self.nodes:
            self._values = None  # the node list was replaced: count afresh (the names are in it)
        else:
            self._values[1].update(names)
            self._values = (self.nodes, len(self.nodes), len(self.inputs)), self._values[1]

    def node_weights(self, node: Node) -> dict[str, np.ndarray]:
        return {r: self.weights[n] for r, n in node.weight_names().items()}

    def dynamic_batch(self) -> bool:
        """Whether the graph computes each sample independently (any batch size works)."""
        if not all(n.op.batch_free([self.shapes[i] for i in n.inputs]) for n in self.nodes):
            return False
        return self.fixed_by(self.probe_inputs(spatial=False)) is None

    def infer_shapes(self, inputs: dict[str, Shape]) -> dict[str, Shape]:
        """Every value's shape for other input shapes, by the ops' own rules; a ShapeError names
        the first node that cannot take them."""
        shapes = {k: tuple(int(d) for d in v) for k, v in inputs.items()}
        for n in self.nodes:
            w = {r: self.weights[k].shape for r, k in n.weight_names().items()}
            try:
                outs = n.op.infer([shapes[i] for i in n.inputs], w)
            except (ShapeError, ValueError, ArithmeticError, IndexError) as e:  # an op's rule refusing the size
                raise ShapeError(f"layer {n.name!r} ({n.op.kind}): {e}") from None
            for o, s in zip(n.outputs, outs):
                if any(d <= 0 for d in s):
                    raise ShapeError(f"layer {n.name!r} ({n.op.kind}): output {o!r} would have shape {list(s)}")
                shapes[o] = tuple(int(d) for d in s)
        return shapes

    def probe_inputs(self, spatial: bool = True, batch: bool = True, dh: int = 13, dw: int = 7) -> dict[str, Shape]:
        """The inputs at another size: batch + 1 (when ``batch``), H + dh and W + dw (the last two
        axes of inputs with at least three, when ``spatial``)."""
        res = {}
        for k, s in self.inputs.items():
            s = list(s)
            if batch and s:
                s[0] += 1
            if spatial and len(s) >= 3:
                s[-2] += dh
                s[-1] += dw
            res[k] = tuple(s)
        return res

    def fixed_by(self, inputs: dict[str, Shape]) -> str | None:
        """None when the graph takes these input shapes, else which layer refuses them."""
        try:
            self.infer_shapes(inputs)
        except ShapeError as e:
            return str(e).split(": ", 1)[0]
        return None

    def dynamic(self) -> dict[str, Any]:
        """Which input dims may change: {"batch", "spatial", "fixed_by" (the layer fixing them)}."""
        batch = self.dynamic_batch()
        if not any(len(s) >= 3 for s in self.inputs.values()):
            return {"batch": batch, "spatial": False, "fixed_by": "the inputs have no spatial axes"}
        fixed = self.fixed_by(self.probe_inputs(batch=False))
        if fixed is None:  # a second, larger probe: a size that happens to fit is no proof
            fixed = self.fixed_by(self.probe_inputs(batch=False, dh=max(self.spatial_sizes()) + 1,
                                                    dw=max(self.spatial_sizes()) + 3))
        return {"batch": batch, "spatial": fixed is None, "fixed_by": fixed}

    def spatial_sizes(self) -> list[int]:
        return [d for s in self.inputs.values() if len(s) >= 3 for d in s[-2:]] or [0]

    def node_macs(self, node: Node) -> int:
        w = {r: self.weights[n].shape for r, n in node.weight_names().items()}
        return node.op.macs([self.shapes[i] for i in node.inputs],
                            [self.shapes[o] for o in node.outputs], w)

    def macs(self) -> int:
        return sum(self.node_macs(n) for n in self.nodes)

    def param_count(self) -> int:
        """Learned parameters (statistics such as batch-norm means are not counted)."""
        stats = {f"{n.attr}.{r}" for n in self.nodes for r in n.op.stats}
        return int(sum(w.size for k, w in self.weights.items() if k not in stats))

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "outputs": list(self.outputs),
            "nodes": [
                {"op": n.op.to_json(), "inputs": list(n.inputs), "outputs": list(n.outputs),
                 "name": n.name, "attr": n.attr}
                for n in self.nodes
            ],
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "meta": self.meta,
        }

    @staticmethod
    def from_json(d: dict[str, Any], weights: dict[str, np.ndarray]) -> Graph:
        g = Graph(meta=dict(d.get("meta", {})), weights=dict(weights))
        g.inputs = {k: tuple(v) for k, v in d["inputs"].items()}
        g.outputs = list(d["outputs"])
        g.shapes = {k: tuple(v) for k, v in d["shapes"].items()}
        for n in d["nodes"]:
            g.nodes.append(Node(Op.from_json(n["op"]), tuple(n["inputs"]), tuple(n["outputs"]),
                                n["name"], n["attr"]))
        return g


def _same(a: tuple[list[Node], int, int], b: tuple[list[Node], int, int]) -> bool:
    return a[0] is b[0] and a[1:] == b[1:]


def release_mapped(g: Graph) -> None:
    """Drop the resident pages of weights that are views of a memory-mapped file (a caffemodel):
    they are read again from the file if touched, so the memory can go to the next backend."""
    import mmap

    seen = set()
    for w in g.weights.values():
        base = w
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        base = base.obj if isinstance(base, memoryview) else base
        if isinstance(base, mmap.mmap) and id(base) not in seen and not base.closed:
            seen.add(id(base))
            base.madvise(mmap.MADV_DONTNEED)


def check(g: Graph) -> list[str]:
    """Structural problems of a graph (empty when sound): SSA values, defined before use, weights."""
    problems = []
    defined = set(g.inputs)
    for n in g.nodes:
        for i in n.inputs:
            if i not in defined:
                problems.append(f"node {n.name!r} reads {i!r} before it is defined")
        for o in n.outputs:
            if o in defined:
                problems.append(f"value {o!r} is defined twice")
            defined.add(o)
        for wn in n.weight_names().values():
            if wn not in g.weights:
                problems.append(f"node {n.name!r} lacks weight {wn!r}")
    for o in g.outputs:
        if o not in defined:
            problems.append(f"output {o!r} is never computed")
    return problems
