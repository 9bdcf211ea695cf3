"""Torch7 (.t7 file or Lua definition) -> IR graph.

Both inputs reach the same tree of ``TorchObject`` modules (``t7file.load`` or the sandboxed Lua
runner), so one mapping table (``modules.py``) serves both. ``load`` reads the tree, names every
class without a conversion at once, then runs the tree on the given input shape the way Torch7
would run it: each module function sees the value(s) flowing in and the static shapes, and decides
batch handling from the input's rank as Torch7 does at run time. Tables flow as lists of values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import BadModel, ConvertError, ShapeError, Unsupported
from ..ir import Graph, Node, Op, Shape
from ..limits import check_graph_memory
from ..ops.act import Power
from .t7file import T7Error, TorchObject

if TYPE_CHECKING:
    from ..api import Loaded

log = logging.getLogger(__name__)

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
        from .modules import MODULES

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
        if self.from_file and a.base is None and a.size > 1:
            # t7file copies tensors whose storage is not laid out contiguously (e.g. w:t() saved)
            self.notes.append(f"{m.where}: {key} is stored non-contiguously, which OpenCV misreads")
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            raise m.fail(f"{key} contains NaN or Inf")
        return a

    def note(self, m: Mod, text: str) -> None:
        self.notes.append(f"{m.where}: {text}")


# --- reading ---------------------------------------------------------------------------------

def _read(source: Path, lua: bool, args: dict[str, str], seed: int | None) -> Any:
    if lua:
        from .lua import run_definition

        return run_definition(source, args or None, 0 if seed is None else seed)
    try:
        from .t7file import load as load_t7

        return load_t7(source)
    except T7Error as e:
        raise T7Error(f"{source}: {e}") from None
    except OSError as e:
        raise ConvertError(f"{source}: cannot read: {e.strerror or e}") from None


def _root(tree: Any, source: Path) -> TorchObject:
    """The nn module in the file: the object itself, or the one module inside a saved table."""
    if isinstance(tree, TorchObject):
        return tree
    if isinstance(tree, dict):
        found = [v for v in tree.values() if isinstance(v, TorchObject)
                 and v.cls.split(".")[0] in ("nn", "cudnn", "cunn")]
        if len(found) == 1:
            return found[0]
        raise BadModel(str(source), "", f"the file holds a Lua table with {len(found)} nn modules, "
                                        "not one module")
    what = "a tensor" if isinstance(tree, np.ndarray) else f"a {type(tree).__name__}"
    raise BadModel(str(source), "", f"the file holds {what}, not an nn module")


def _input_shape(shapes: dict[str, Shape] | None, source: Path) -> Shape:
    if not shapes:
        raise ConvertError(f"{source}: a Torch7 model does not record its input size; give it with "
                           "--input-shape input=N,C,H,W")
    extra = [k for k in shapes if k != "input"]
    if extra:
        raise ConvertError(f"{source}: --input-shape names {extra[0]!r}, but a Torch7 model's "
                           "input is called 'input'")
    shape = tuple(int(d) for d in shapes["input"])
    if not shape or any(d <= 0 for d in shape):
        raise ConvertError(f"{source}: invalid input shape {list(shape)}")
    return shape


MAX_DEPTH = 100  # containers in containers; real models nest a handful
GMODULE = "nngraph models (nn.gModule) are not supported: rebuild it from nn containers"


def check_supported(root: TorchObject, file: str) -> None:
    """Every class without a conversion, named at once (containers are searched, the others not)."""
    from .modules import CONTAINERS, MODULES

    missing: list[tuple[str, str]] = []

    def walk(m: Mod, above: tuple[int, ...]) -> None:
        # the converter recurses into containers too: a cycle or a very deep tree stops here, cleanly
        if id(m.obj) in above:
            raise m.fail("contains itself (a container among its own children): a reference cycle")
        if len(above) >= MAX_DEPTH:
            raise m.fail(f"containers nested deeper than {MAX_DEPTH} levels")
        if m.cls not in MODULES:
            missing.append((m.cls, m.path or "root"))
        elif m.cls in CONTAINERS:
            for c in m.children():
                walk(c, (*above, id(m.obj)))

    walk(Mod(root, "", file), ())
    if missing:
        gm = any(c == "nn.gModule" for c, _ in missing)
        raise Unsupported(file, "torch7", missing, GMODULE if gm else "")


# --- the graph -------------------------------------------------------------------------------

def build(root: TorchObject, shape: Shape, file: str, from_file: bool = True) -> Builder:
    """The IR graph of ``root`` run on an input of ``shape`` (named ``input``)."""
    check_supported(root, file)
    b = Builder(file, from_file)
    x = b.g.add_input("input", shape)
    _set_outputs(b, b.run(Mod(root, "", file), x))
    return b


def _flatten(v: Value) -> list[str]:
    return [v] if isinstance(v, str) else [s for item in v for s in _flatten(item)]


def _set_outputs(b: Builder, out: Value) -> None:
    """Name the results ``output`` (``output1``, ``output2``... for a table)."""
    values = _flatten(out)
    if not values:
        raise BadModel(b.path, "", "the model outputs an empty table")
    names = ["output"] if len(values) == 1 else [f"output{i + 1}" for i in range(len(values))]
    renamed: dict[str, str] = {}
    for v, name in zip(values, names):
        if v in b.g.inputs or v in renamed:  # the input itself, or a value output twice: copy it
            b.g.add(Power(), [renamed.get(v, v)], [name], "output")
        else:
            _rename(b.g, v, name)
            renamed[v] = name
    b.g.outputs = names


def _rename(g: Graph, old: str, new: str) -> None:
    sub = lambda names: tuple(new if n == old else n for n in names)  # noqa: E731
    g.nodes = [Node(n.op, sub(n.inputs), sub(n.outputs), n.name, n.attr) for n in g.nodes]
    g.shapes[new] = g.shapes.pop(old)


def _evaluate(root: TorchObject) -> None:
    """Torch7's module:evaluate() on the tree: train = false everywhere (what was converted)."""
    todo, seen = [root], set()
    while todo:  # a loop, not recursion: the tree may be deep or share modules
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        obj.fields["train"] = False
        mods = obj.fields.get("modules")
        todo += [c for c in (mods.values() if isinstance(mods, dict) else ()) if isinstance(c, TorchObject)]


def _calibrate(b: Builder, seed: int) -> None:
    """Random weights made meaningful (calibrate_random: filters centred in place, branch ends damped,
    batch norms given real statistics); the statistics are written
    back into the tree too, so that random.t7 (read by OpenCV) holds the same numbers."""
    from ..reference import calibrate_random

    for attr in calibrate_random(b.g, seed):
        f = b.bn_trees[attr].fields
        mean, var = b.g.weights[f"{attr}.mean"], b.g.weights[f"{attr}.var"]
        dtype = f["running_mean"].dtype if isinstance(f.get("running_mean"), np.ndarray) else np.float32
        f["running_mean"] = mean.astype(dtype)
        if isinstance(f.get("running_std"), np.ndarray) and not isinstance(f.get("running_var"), np.ndarray):
            eps = float(f.get("eps") or 1e-5)
            f["running_std"] = (1 / np.sqrt(var.astype(np.float64) + eps)).astype(dtype)
        else:
            f["running_var"] = var.astype(dtype)


def load(source: Path, shapes: dict[str, Shape] | None, seed: int | None,
         args: dict[str, str]) -> Loaded:
    """Read a .t7 file (binary or ASCII) or run a Lua definition (seeded random weights)."""
    from ..api import Loaded, _opencv_available, source_kind
    from . import opencv, t7write

    source = Path(source)
    lua = source_kind(source) == "lua"
    if args and not lua:
        raise ConvertError(f"{source}: --arg applies to Lua definitions only")
    tree = _read(source, lua, args, seed)  # a broken file is the first thing to report
    shape = _input_shape(shapes, source)
    root = _root(tree, source)
    b = build(root, shape, str(source), from_file=not lua)
    if lua and seed is not None:
        check_graph_memory(b.g, source)  # calibration runs the graph in float64
        _calibrate(b, seed)
    g = b.g
    g.meta.update(framework="torch7", source=str(source.resolve()), seed=seed, name=source.stem,
                  weights=None if lua else str(source.resolve()), opencv_known=b.notes)

    def extra(d: Path) -> None:
        if lua:  # the definition's random weights as a .t7, for OpenCV and the benchmarks
            _evaluate(root)
            t7write.dump(tree, d / "random.t7")

    def runner(d: Path) -> Any:
        return opencv.runner(g, d) if _opencv_available() else None

    return Loaded(g, extra, runner, b.notes)
