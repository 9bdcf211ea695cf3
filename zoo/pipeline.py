"""The composition root's work: resolve zoo names and files, convert and verify them, describe them."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert.api import convert, load
from convert.artifacts import Converted, is_model_dir
from convert.errors import ConvertError
from convert.ir import Graph, Shape

from .catalogue import CATALOGUE, Entry, entry_shapes, find

MODELS = Path("outputs/models")


@dataclass(frozen=True)
class Target:
    """A model to work on: a zoo entry or a user's file."""

    name: str
    source: Path
    args: dict[str, str]
    entry: Entry | None = None


def resolve(spec: str) -> Target:
    entry = find(spec)
    if entry is not None:
        return Target(entry.name, entry.source, dict(entry.args), entry)
    path = Path(spec)
    if path.is_file():
        return Target(path.stem, path, {})
    if path.is_dir():
        raise ConvertError(f"{spec}: is a directory; directories are not supported, name a model file"
                           f"{_model_files(path)}")
    raise ConvertError(f"{spec}: neither a file nor a zoo model (zoo list shows the zoo)")


def _model_files(folder: Path, shown: int = 5) -> str:
    """' (inside: a.prototxt, b.t7, and 3 more)': the model files a directory holds, for the error."""
    try:
        found = sorted(p.name for p in folder.iterdir() if p.suffix in (".prototxt", ".t7", ".lua") and p.is_file())
    except OSError:
        return ""
    if not found:
        return " (it holds no .prototxt, .t7 or .lua file)"
    more = f", and {len(found) - shown} more" if len(found) > shown else ""
    return f" (inside: {', '.join(found[:shown])}{more})"


def targets(specs: list[str], all_: bool) -> list[Target]:
    if all_:
        return [resolve(n) for n in CATALOGUE]
    if not specs:
        raise ConvertError("name a model file or a zoo model, or give --all")
    return [resolve(s) for s in specs]


def default_shapes(t: Target, shapes: dict[str, Shape] | None) -> dict[str, Shape] | None:
    """A Torch7 file carries no input shape: the zoo's own definitions take the catalogue's."""
    return shapes if shapes or t.entry is None else entry_shapes(t.entry)


def convert_target(t: Target, out: Path = MODELS, weights: Path | None = None,
                   shapes: dict[str, Shape] | None = None, seed: int = 0, check: bool = True,
                   args: dict[str, str] | None = None, fold: bool = False, fp16: bool = False) -> Converted:
    return convert(t.source, weights, out, default_shapes(t, shapes), seed, check, name=t.name,
                   args={**t.args, **(args or {})}, fold=fold, fp16=fp16)


def describe(t: Target, shapes: dict[str, Shape] | None = None) -> Graph:
    """The graph with placeholder weights: enough for shapes, parameters and multiply-adds."""
    return load(t.source, None, default_shapes(t, shapes), seed=None, args=t.args).graph


def layer_rows(g: Graph) -> list[dict[str, Any]]:
    rows = []
    for n in g.nodes:
        w = g.node_weights(n)
        stats = {f"{r}" for r in n.op.stats}
        row = {"layer": n.name, "op": n.op.kind, "output": list(g.shapes[n.outputs[0]]),
               "params": int(sum(a.size for r, a in w.items() if r not in stats)), "macs": g.node_macs(n)}
        if rows and rows[-1]["layer"] == n.name and rows[-1]["op"] == "reshape":
            # Caffe's InnerProduct flattens its input itself: one layer, its flatten noted
            row["op"] = f"{n.op.kind} (input flattened)"
            rows[-1] = row
        else:
            rows.append(row)
    return rows


def timed(fn: Any, *a: Any, **k: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    return fn(*a, **k), time.perf_counter() - t0


def converted_dirs(names: list[str], all_: bool, out: Path = MODELS,
                   cache: Path = Path("outputs/cache")) -> tuple[list[Path], list[Path]]:
    """What ``zoo clean`` removes, and what it leaves (with ``all_``: entries zoo did not write): ``out/NAME``
    and the benchmark's variants ``cache/NAME-NxCxHxW[-...]`` of each name, or every folder of both with
    ``all_``. Only folders zoo wrote: a named one it did not write is refused before anything is removed."""
    if not names and not all_:
        raise ConvertError("name the models to remove (zoo names or folder names under outputs/models), or give --all")
    found, left = [], []
    for p in [p for d in (out, cache) if d.is_dir() for p in _entries(d)]:
        if not (all_ or p.name in names or (p.parent == cache and any(is_variant(n, p.name) for n in names))):
            continue
        if is_model_dir(p):
            found.append(p)
        elif all_:
            left.append(p)
        else:
            raise ConvertError(f"{p} is not a folder zoo wrote (no zoo convert.json): nothing was removed")
    return found, left


def _entries(d: Path) -> list[Path]:
    try:
        return sorted(d.iterdir())
    except OSError as e:
        raise ConvertError(f"{d}: cannot read: {e.strerror or e}; nothing was removed") from None


def is_variant(name: str, folder: str) -> bool:
    """``resnet50-1x3x224x224`` and ``resnet50-64x3x224x224-dropout-softmax`` (NAME-<shape>, then the
    layer types stripped, each starting with a letter: benchmark.prepare's names) are resnet50's;
    ``resnet50-lua`` is not, nor ``net-3x3-1x3x8x8`` (model net-3x3's variant) net's."""
    return re.fullmatch(rf"{re.escape(name)}-\d+(x\d+)+(-[A-Za-z][A-Za-z0-9_]*)*", folder) is not None


def clean(dirs: list[Path]) -> int:
    """Remove converted model folders (checked again just before); returns the bytes freed."""
    freed = 0
    for d in dirs:
        if is_model_dir(d):
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
            try:
                shutil.rmtree(d)
            except OSError as e:
                raise ConvertError(f"{d}: cannot remove: {e.strerror or e}") from None
            freed += size
    return freed
