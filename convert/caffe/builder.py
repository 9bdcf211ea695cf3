"""What a Caffe layer function works with: the ``Builder`` (its inputs, outputs, blobs and
``node``) and the registry of layer functions by type (``@layer``), kept apart from the frontend so
that the layer files import this module and never the frontend that walks them."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

from ..errors import BadModel, ShapeError
from ..ir import Graph, Node, Op, Shape
from ..limits import check_bytes
from . import binary
from .upgrade import Layer

log = logging.getLogger(__name__)

MAX_AXES = 32  # Caffe's kMaxBlobAxes
MAX_ELEMENTS = 2**40  # far beyond any real tensor; keeps sizes and operation counts in int64


def bad_shape(shape: Shape) -> str | None:
    """Why Caffe (or any sane use) could not hold a blob of this shape; None when it can."""
    if len(shape) > MAX_AXES:
        return f"would have {len(shape)} axes (Caffe allows {MAX_AXES})"
    if any(d <= 0 for d in shape):
        return f"would have shape {list(shape)}"
    if math.prod(shape) > MAX_ELEMENTS:
        return f"would have shape {list(shape)}: too large"
    return None


class Builder:
    """What a layer function sees: its inputs, its output names, its blobs, and ``node``."""

    def __init__(self, path: str, weights: binary.Weights | None, seed: int | None,
                 writes: dict[str, int]):
        self.path, self.weights = path, weights
        self.rng = np.random.default_rng(seed) if seed is not None else None
        self.g = Graph()
        self.cur: dict[str, str] = {}  # Caffe blob -> current value
        self.writes, self.done = writes, {k: 0 for k in writes}
        self.caffe_blobs: list[tuple[str, str, list[np.ndarray]]] = []
        self.shared: dict[tuple[str, ...], tuple[str, Op]] = {}
        self.bn_blobs: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}  # attr -> Caffe blobs
        self.L: Layer | None = None
        self._tmp = 0
        self._random_bytes = 0

    # -- values --
    def x(self, i: int = 0) -> str:
        return self.cur[self.L.bottoms[i]]  # type: ignore[union-attr]

    def shape(self, i: int = 0) -> Shape:
        return self.g.shapes[self.x(i)]

    def out(self, i: int = 0) -> str:
        """The value name for top ``i`` (call once per top and layer)."""
        blob = self.L.tops[i]  # type: ignore[union-attr]
        self.done[blob] += 1
        k = self.done[blob]
        last = blob and k == self.writes[blob] and blob not in self.g.inputs
        name = blob if last else self._fresh(f"{blob}@{k}")
        self.cur[blob] = name
        return name

    def alias(self, i: int, value: str) -> None:
        self.cur[self.L.tops[i]] = value  # type: ignore[union-attr]

    def tmp(self, hint: str) -> str:
        self._tmp += 1
        return self._fresh(f"{self.L.name}#{hint}{self._tmp}")  # type: ignore[union-attr]

    def _fresh(self, base: str) -> str:
        """A value name that no blob of the net has and no value has taken (a blob may itself be
        called ``a@1`` next to an in-place ``a``)."""
        name, k = base, 1
        while name in self.writes or name in self.g.shapes:
            k += 1
            name = f"{base}'{k}"
        self.g.shapes[name] = ()  # reserved until the node that computes it is added
        return name

    def fail(self, reason: str) -> BadModel:
        return BadModel(self.path, self.L.where(), reason)  # type: ignore[union-attr]

    # -- nodes --
    def node(self, op: Op, inputs: list[str] | None = None, outputs: list[str] | None = None,
             weights: dict[str, np.ndarray] | None = None) -> Node:
        L = self.L
        assert L is not None
        inputs = inputs if inputs is not None else [self.x(i) for i in range(len(L.bottoms))]
        outputs = outputs if outputs is not None else [self.out(i) for i in range(len(L.tops))]
        share = ""
        key = tuple(L.param_names)
        if weights and key and all(key):
            if key in self.shared and self.shared[key][1] == op:
                share = self.shared[key][0]
            elif key in self.shared:
                log.warning("%s: %s shares weights with a different layer configuration; "
                            "the weights are copied", self.path, L.where())
        try:
            node = self.g.add(op, inputs, outputs, L.name, weights, share=share)
        except ShapeError as e:
            raise self.fail(str(e)) from None
        for o in node.outputs:
            shape_error = bad_shape(self.g.shapes[o])
            if shape_error:
                raise self.fail(f"its output {o!r} {shape_error}")
        if weights and key and all(key) and key not in self.shared:
            self.shared[key] = (node.attr, op)
        return node

    # -- blobs --
    def blobs(self, specs: list[tuple[str, Shape, float]]) -> list[np.ndarray]:
        """The layer's blobs: loaded (checked against ``specs``) or seeded random.

        specs: (kind, shape, fan_in); kinds: weight, bias, mean, var, factor, gamma, beta,
        slope, scale.
        """
        L = self.L
        assert L is not None
        if self.weights is None:
            self._check_sizes([shape for _, shape, _ in specs])
            arrays = [self._random(kind, shape, fan) for kind, shape, fan in specs]
        else:
            found, wname = self.weights.blobs.get(L.name), self.weights.path.name
            if found is None:
                raise self.fail(f"no weights for this layer in {wname!r}")
            if len(found) != len(specs):
                raise self.fail(f"expects {len(specs)} blob{'s' * (len(specs) != 1)}, {wname!r} has {len(found)}")
            arrays = [self._fit(i, a, tuple(s)) for i, (a, (_, s, _)) in enumerate(zip(found, specs))]
            # one float64 sum per blob: no copy of a mapped blob, and NaN or Inf always shows in it
            if not all(np.isfinite(a.sum(dtype=np.float64)) for a in arrays):
                raise self.fail("weights contain NaN or Inf")
        self.caffe_blobs.append((L.name, L.type, arrays))
        return arrays

    def _check_sizes(self, shapes: list[Shape]) -> None:
        """Random blobs: refuse sizes numpy cannot hold, and, when they are really drawn, more
        than the memory budget (all the net's blobs together)."""
        sizes = [math.prod(s) for s in shapes]
        if any(n > MAX_ELEMENTS for n in sizes):
            raise self.fail(f"a blob of shape {list(shapes[sizes.index(max(sizes))])} is too large")
        if self.rng is not None:
            self._random_bytes += 4 * sum(sizes)
            check_bytes(self._random_bytes, self.path, self.L.where(),  # type: ignore[union-attr]
                        "drawing random weights up to this layer")

    def _fit(self, i: int, a: np.ndarray, shape: Shape) -> np.ndarray:
        if a.shape == shape:
            return a
        strip = lambda s: tuple(s[next((j for j, d in enumerate(s) if d != 1), len(s)):])  # noqa: E731
        if a.size == int(np.prod(shape)) and strip(a.shape) == strip(shape):
            return a.reshape(shape)  # legacy 4-D blob shapes, e.g. (1, 1, N, K)
        raise self.fail(f"blob {i} has shape {list(a.shape)} but the layer expects {list(shape)}")

    def _random(self, kind: str, shape: Shape, fan: float) -> np.ndarray:
        r = self.rng
        if r is None:  # shapes only (zoo info/list): zero-cost placeholders
            return np.broadcast_to(np.float32(1.0), shape)
        if kind == "weight":  # variance preserving (He); see reference.calibrate_random
            return r.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / max(fan, 1)))
        if kind in ("bias", "beta", "mean"):
            return r.uniform(-0.1, 0.1, shape).astype(np.float32)
        if kind in ("var", "gamma"):
            return r.uniform(0.5, 1.5, shape).astype(np.float32)
        if kind == "factor":
            return np.full(shape, 999.982, np.float32)
        if kind == "slope":
            return r.uniform(0.05, 0.3, shape).astype(np.float32)
        if kind == "scale":
            return r.uniform(1.0, 20.0, shape).astype(np.float32)
        raise ValueError(kind)


LAYERS: dict[str, Callable[[Builder, Layer], None]] = {}
Count = tuple[int, int | None]  # (least, most); None: no limit
ARITY: dict[str, tuple[Count, Count]] = {}  # type -> (bottoms, tops), as Caffe's layer checks them


def layer(*types: str, bottoms: Count = (1, 1), tops: Count = (1, 1)
          ) -> Callable[[Callable[[Builder, Layer], None]], Callable[[Builder, Layer], None]]:
    def reg(fn: Callable[[Builder, Layer], None]) -> Callable[[Builder, Layer], None]:
        for t in types:
            LAYERS[t] = fn
            ARITY[t] = (bottoms, tops)
        return fn
    return reg


def arity_error(L: Layer) -> str | None:
    """Why the layer's number of bottoms or tops does not fit its type (None when it does)."""
    for what, n, (lo, hi) in zip(("bottom", "top"), (len(L.bottoms), len(L.tops)), ARITY[L.type]):
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
            return f"{L.type} takes {want} {what} blob{'' if want[-1] == '1' else 's'}, got {n}"
    return None
