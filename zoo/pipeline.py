"""The composition root's work: resolve zoo names and files, convert and verify them, describe them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert.api import convert, load
from convert.artifacts import Converted
from convert.errors import ConvertError
from convert.ir import Graph, Shape

from .catalogue import CATALOGUE, ROOT, Entry, find

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
    raise ConvertError(f"{spec}: neither a file nor a zoo model (zoo list shows the zoo)")


def targets(specs: list[str], all_: bool) -> list[Target]:
    if all_:
        return [resolve(n) for n in CATALOGUE]
    if not specs:
        raise ConvertError("name a model file or a zoo model, or give --all")
    return [resolve(s) for s in specs]


def default_shapes(t: Target, shapes: dict[str, Shape] | None) -> dict[str, Shape] | None:
    """A Torch7 file carries no input shape: the zoo's own definitions take the catalogue's."""
    if shapes or t.entry is None or t.entry.framework != "torch7":
        return shapes
    return {"input": (1, *t.entry.input)}


def convert_target(t: Target, out: Path = MODELS, weights: Path | None = None,
                   shapes: dict[str, Shape] | None = None, seed: int = 0, check: bool = True,
                   args: dict[str, str] | None = None) -> Converted:
    return convert(t.source, weights, out, default_shapes(t, shapes), seed, check, name=t.name,
                   args={**t.args, **(args or {})})


def describe(t: Target, shapes: dict[str, Shape] | None = None) -> Graph:
    """The graph with placeholder weights: enough for shapes, parameters and multiply-adds."""
    return load(t.source, None, default_shapes(t, shapes), seed=None, args=t.args).graph


def layer_rows(g: Graph) -> list[dict[str, Any]]:
    rows = []
    for n in g.nodes:
        w = g.node_weights(n)
        stats = {f"{r}" for r in n.op.stats}
        rows.append({"layer": n.name, "op": n.op.kind, "output": list(g.shapes[n.outputs[0]]),
                     "params": int(sum(a.size for r, a in w.items() if r not in stats)),
                     "macs": g.node_macs(n)})
    return rows


def status_of(name: str, out: Path = MODELS) -> str:
    try:
        info = json.loads((out / name / "convert.json").read_text())
    except (OSError, ValueError):
        return "not converted"
    return str(info.get("status", "?"))


def catalogue_rows(out: Path = MODELS) -> list[dict[str, Any]]:
    rows = []
    for e in CATALOGUE.values():
        g = describe(Target(e.name, e.source, dict(e.args), e))
        batch = next(iter(g.inputs.values()))[0]
        rows.append({"name": e.name, "source": str(e.source.relative_to(ROOT)),
                     "input": "x".join(map(str, e.input)), "params": g.param_count(),
                     "gmacs": g.macs() / batch / 1e9, "status": status_of(e.name, out)})
    return rows


def timed(fn: Any, *a: Any, **k: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    return fn(*a, **k), time.perf_counter() - t0
