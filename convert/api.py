"""Entry points: convert a model file into verified artifacts, or re-verify existing artifacts."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from . import artifacts
from .caffe import frontend as caffe
from .caffe import opencv as caffe_cv
from .errors import BadModel, ConvertError
from .fuse import fuse
from .ir import Graph, Shape
from .limits import check_graph_memory
from .loaded import Loaded, opencv_available, source_kind
from .onnx_emit import provenance, replace_metadata
from .torch7 import frontend as t7
from .torch7 import opencv as t7cv
from .verify import verify_sizes

log = logging.getLogger(__name__)


def framework(source: Path) -> str:
    """"caffe" or "torch7"."""
    return "caffe" if source_kind(Path(source)) == "prototxt" else "torch7"


def load(source: Path, weights: Path | None = None, shapes: dict[str, Shape] | None = None,
         seed: int = 0, args: dict[str, str] | None = None, fold: bool = False) -> Loaded:
    """The frontend's graph, fused (BatchNorm + Scale; with ``fold`` conv + BN too, see convert/fuse.py)."""
    source = Path(source)
    if not source.is_file():
        raise ConvertError(f"{source}: no such file")
    if weights is not None and not Path(weights).is_file():
        raise ConvertError(f"{weights}: no such weights file")
    kind = framework(source)
    if kind == "caffe":
        if args:
            raise ConvertError(f"{source}: --arg applies to Lua definitions only")
        loaded = caffe.load(source, weights, shapes, seed)
    else:
        if weights is not None:
            raise ConvertError(f"{source}: --weights applies to Caffe models only")
        loaded = t7.load(source, shapes, seed, args or {})
    fuse(loaded.graph, fold)
    if seed is not None:  # verification runs the graph in float64: refuse it now, before any work
        check_graph_memory(loaded.graph, source)  # (seed None: shapes only, for info and planning)
    return loaded


def convert(source: Path, weights: Path | None = None, out: Path = Path("outputs/models"),
            shapes: dict[str, Shape] | None = None, seed: int = 0, check: bool = True,
            name: str | None = None, args: dict[str, str] | None = None, fold: bool = False,
            fp16: bool = False) -> artifacts.Converted:
    """Convert ``source`` into ``out/<name or stem>/`` and verify it (``fp16``: model.fp16.onnx too)."""
    loaded = load(Path(source), weights, shapes, seed, args, fold)
    try:
        dest = artifacts.destination(Path(out), name or Path(source).stem)
    except ConvertError as e:
        raise ConvertError(f"{source}: {e}") from None
    return artifacts.write(loaded.graph, dest, loaded.extra, loaded.opencv, loaded.known_opencv,
                           check=check, fp16=fp16, fold=fold)


def reverify(art: Path) -> artifacts.Converted:
    """Re-run verification of an artifact directory and update its convert.json."""
    info_path = art / "convert.json"
    missing = [f for f in ("model.py", "model.onnx", "model.safetensors", "ir.json") if not (art / f).is_file()]
    if missing:
        raise BadModel(str(art), "", f"not a zoo artifact directory (missing {', '.join(missing)})")
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError):
        raise BadModel(str(art), "", "no readable convert.json: not a zoo artifact directory") from None
    g = artifacts.load_graph(art)
    runner, known = _original_runner(g, art)
    report = verify_sizes(g, art, runner, known)
    sizes = report.pop("sizes")
    info.update(status=report["status"], verification=report, verification_sizes=sizes, dynamic=g.dynamic(),
                dynamic_batch=g.dynamic_batch())
    tmp = info_path.with_name(f".convert.json.{os.getpid()}.tmp")  # a crash or full disk loses nothing
    try:
        tmp.write_text(artifacts.dump_json(info))
        replace_metadata(art / "model.onnx", provenance(info, art / "model.safetensors"))
        os.replace(tmp, info_path)
    finally:
        tmp.unlink(missing_ok=True)
    return artifacts.Converted(art, info)


def _original_runner(g: Graph, art: Path) -> tuple[Any, list[str]]:
    """OpenCV on the original files, when they are still where convert.json says."""
    source = Path(g.meta.get("source") or "")
    if not source.is_file() or not opencv_available():
        return None, []
    if g.meta.get("framework") == "caffe":
        weights = Path(g.meta["weights"]) if g.meta.get("weights") else art / "random.caffemodel"
        return caffe_cv.runner(g, source, weights if weights.is_file() else None), \
            g.meta.get("opencv_known", [])
    return t7cv.runner(g, art), t7cv.known_deviations(g)
