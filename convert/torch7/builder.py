"""What a Torch7 module function works with: ``Mod`` (a module of the tree and where it sits), the
``Builder`` (``node`` to add ops, ``run`` to convert a child) and the registry of module functions by
class name (``@module``), kept apart from the frontend so that the module files import this module
and never the frontend that walks them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadModel, ShapeError
from ..ir import Graph, Op, Shape
from .t7file import TorchObject

Value = str | list  # an IR value name, or a Lua table of them (nested lists)


@dataclass(frozen=True)
class Mod:
    """A module of the tree and where it sits: ``path`` is "" for the root, "2.1" for the first
    child of the root's second child (Lua's 1-based indices)."""

    obj: TorchObject
    path: str
    file: str

    @property
    def cls(self) -> str:
        return self.obj.cls

    @property
    def name(self) -> str:
        base = self.cls.rsplit(".", 1)[-1]
        return f"{base}_{self.path}" if self.path else base

    @property
    def where(self) -> str:
        return f"module {self.path or 'root'} ({self.cls})"

    def fail(self, reason: str) -> BadModel:
        return BadModel(self.file, self.where, reason)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.obj.fields.get(key)
        return default if v is None else v

    def num(self, key: str, default: float | None = None) -> float:
        v = self.get(key, default)
        if isinstance(v, np.ndarray) and v.size == 1:
            v = v.reshape(-1)[0]
        if not isinstance(v, (int, float, np.number, np.bool_)):
            raise self.fail(f"field {key!r} is missing or not a number")
        if v != v:  # math.huge (inf) has uses, such as Normalize's p; NaN has none
            raise self.fail(f"field {key!r} is NaN")
        return float(v)

    def int(self, key: str, default: int | None = None) -> int:
        v = self.num(key, default)
        if not v.is_integer():
            raise self.fail(f"field {key!r} = {v} is not an integer")
        return int(v)

    def children(self) -> list[Mod]:
        mods = self.get("modules", {})
        if not isinstance(mods, dict):
            raise self.fail("its 'modules' field is not a table")
        out = []
        for i in sorted(k for k in mods if isinstance(k, int)):
            child = mods[i]
            where = f"{self.path}.{i}" if self.path else str(i)
            if not isinstance(child, TorchObject):
                raise BadModel(self.file, f"module {where}", f"is a {type(child).__name__}, "
                                                            "not an nn module")
            out.append(Mod(child, where, self.file))
        return out


class Builder:
    """What a module function sees: ``node`` to add ops, ``run`` to convert a child, and accessors
    for values and tensors."""

    def __init__(self, path: str, from_file: bool) -> None:
        self.path, self.from_file = path, from_file
        self.g = Graph()
        self.notes: list[str] = []  # known OpenCV deviations, for the verify report
        self.bn_trees: dict[str, TorchObject] = {}  # batch-norm attr -> its module (calibration)
        self.shared: dict[tuple[int, Op], str] = {}  # (id(module), op) -> attr: shared modules

    def run(self, m: Mod, x: Value) -> Value:
        return MODULES[m.cls](self, m, x)

    # -- values --
    def shape(self, v: str) -> Shape:
        return self.g.shapes[v]

    def tensor(self, m: Mod, x: Value) -> str:
        if isinstance(x, list):
            raise m.fail(f"expects a tensor but receives a table of {len(x)}")
        return x

    def table(self, m: Mod, x: Value) -> list:
        if not isinstance(x, list):
            raise m.fail(f"expects a table but receives a tensor of shape {list(self.shape(x))}")
        return x

    def fresh(self, m: Mod) -> str:
        name, k = m.name, 1
        while name in self.g.shapes:
            k += 1
            name = f"{m.name}#{k}"
        return name

    def node(self, m: Mod, op: Op, inputs: list[str], weights: dict[str, np.ndarray] | None = None,
             outputs: int = 0) -> Any:
        """Add ``op``; returns its output name (a list of names when ``outputs`` > 0)."""
        names: list[str] = []
        for _ in range(max(outputs, 1)):
            names.append(self.fresh(m))
            self.g.shapes[names[-1]] = ()  # reserve the name until infer sets the shape
        # the same Lua object used twice (one module instance added twice): one set of weights
        share = self.shared.get((id(m.obj), op), "") if weights else ""
        try:
            node = self.g.add(op, inputs, names, m.name, weights, share=share)
        except ShapeError as e:
            for n in names:
                self.g.shapes.pop(n, None)
            raise m.fail(str(e)) from None
        if weights and not share:
            self.shared[(id(m.obj), op)] = node.attr
        return names if outputs else names[0]

    # -- tensors --
    def weight(self, m: Mod, key: str, required: bool = True) -> np.ndarray | None:
        """A tensor field as contiguous float32 (None when absent and not required)."""
        a = m.obj.fields.get(key)
        if not isinstance(a, np.ndarray) or a.size == 0:
            if required:
                raise m.fail(f"has no {key!r} tensor")
            return None
        if not self.from_file and a.size > 1 and not any(a.strides):
            # the Lua runner's size-only placeholder (seed None: zoo list/info): one value, kept as it is
            if not np.isfinite(a.flat[0]):
                raise m.fail(f"{key} contains NaN or Inf")
            return a.astype(np.float32, copy=False)
        if self.from_file and a.base is None and a.size > 1:
            # t7file copies tensors whose storage is not laid out contiguously (e.g. w:t() saved)
            self.notes.append(f"{m.where}: {key} is stored non-contiguously, which OpenCV misreads")
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            raise m.fail(f"{key} contains NaN or Inf")
        return a

    def note(self, m: Mod, text: str) -> None:
        self.notes.append(f"{m.where}: {text}")


Fn = Callable[[Builder, Mod, Value], Value]
MODULES: dict[str, Fn] = {}
CONTAINERS: set[str] = set()  # classes whose children are converted (and searched for support)


def module(*classes: str, container: bool = False) -> Callable[[Fn], Fn]:
    def reg(fn: Fn) -> Fn:
        for c in classes:
            MODULES[c] = fn
            if container:
                CONTAINERS.add(c)
        return fn
    return reg
