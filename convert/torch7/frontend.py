"""Torch7 (.t7 file or Lua definition) -> IR graph.

Both inputs reach the same tree of ``TorchObject`` modules (``t7file.load`` or the sandboxed Lua
runner), so one mapping table (``modules.py``) serves both. ``load`` reads the tree, names every
class without a conversion at once, then runs the tree on the given input shape the way Torch7
would run it: each module function sees the value(s) flowing in and the static shapes, and decides
batch handling from the input's rank as Torch7 does at run time. Tables flow as lists of values.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadModel, ConvertError, Unsupported
from ..ir import Graph, Node, Shape
from ..limits import check_graph_memory
from ..loaded import Loaded, opencv_available, source_kind
from ..ops.act import Power
from ..reference import calibrate_random
from . import classic as _classic  # noqa: F401  (importing the module files registers their functions)
from . import modules as _modules  # noqa: F401
from . import opencv, t7write
from .builder import CONTAINERS, MODULES, Builder, Mod, Value
from .lua import run_definition
from .t7file import T7Error, TorchObject
from .t7file import load as load_t7

log = logging.getLogger(__name__)

# --- reading ---------------------------------------------------------------------------------

def _read(source: Path, lua: bool, args: dict[str, str], seed: int | None) -> Any:
    if lua:
        return run_definition(source, args or None, seed)  # seed None: size-only tensors
    try:
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
    for attr in calibrate_random(b.g, seed):
        f = b.bn_trees[attr].fields
        mean, var = b.g.weights[f"{attr}.running_mean"], b.g.weights[f"{attr}.running_var"]
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
        return opencv.runner(g, d) if opencv_available() else None

    return Loaded(g, extra, runner, b.notes)
