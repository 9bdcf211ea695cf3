"""Entry points: convert a model file into verified artifacts, or re-verify existing artifacts."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import artifacts
from .errors import BadModel, ConvertError
from .ir import Graph, Shape

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """A frontend's result: the graph plus what verification against the original needs."""

    graph: Graph
    extra: Callable[[Path], None] | None = None  # writes extra files into the artifact dir
    opencv: Callable[[Path], Any] | None = None  # artifact dir -> runner (feeds -> outputs)
    known_opencv: list[str] = field(default_factory=list)


def framework(source: Path) -> str:
    suffix = source.suffix.lower()
    if suffix in (".prototxt", ".pbtxt"):
        return "caffe"
    if suffix in (".t7", ".lua", ".net", ".dat"):
        return "torch7"
    raise ConvertError(f"{source}: unknown model format '{suffix}' (expected .prototxt, .t7 or .lua)")


def _opencv_available() -> bool:
    try:
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def load_caffe(source: Path, weights: Path | None, shapes: dict[str, Shape] | None,
               seed: int) -> Loaded:
    from .caffe import binary, frontend, opencv

    model = frontend.load(source, weights, shapes, seed)
    g = model.graph

    def extra(d: Path) -> None:
        if model.random_weights:  # the weights as a caffemodel, for OpenCV and the benchmarks
            binary.write(d / "random.caffemodel", model.layers, model.net_name)

    def runner(d: Path) -> Any:
        if not _opencv_available():
            return None
        return opencv.runner(g, source, weights or d / "random.caffemodel")

    return Loaded(g, extra, runner, g.meta["opencv_known"])


def load(source: Path, weights: Path | None = None, shapes: dict[str, Shape] | None = None,
         seed: int = 0, args: dict[str, str] | None = None) -> Loaded:
    source = Path(source)
    if not source.is_file():
        raise ConvertError(f"{source}: no such file")
    if weights is not None and not Path(weights).is_file():
        raise ConvertError(f"{weights}: no such weights file")
    kind = framework(source)
    if kind == "caffe":
        if args:
            raise ConvertError(f"{source}: --arg applies to Lua definitions only")
        return load_caffe(source, weights, shapes, seed)
    from .torch7 import frontend as t7

    if weights is not None:
        raise ConvertError(f"{source}: --weights applies to Caffe models only")
    return t7.load(source, shapes, seed, args or {})


def convert(source: Path, weights: Path | None = None, out: Path = Path("outputs/models"),
            shapes: dict[str, Shape] | None = None, seed: int = 0, check: bool = True,
            name: str | None = None, args: dict[str, str] | None = None) -> artifacts.Converted:
    """Convert ``source`` into ``out/<name or stem>/`` and verify it."""
    loaded = load(Path(source), weights, shapes, seed, args)
    dest = Path(out) / (name or Path(source).stem)
    return artifacts.write(loaded.graph, dest, loaded.extra, loaded.opencv, loaded.known_opencv,
                           check=check)


def reverify(art: Path) -> artifacts.Converted:
    """Re-run verification of an artifact directory and update its convert.json."""
    from .verify import verify

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
    report = verify(g, art, runner, known)
    info.update(status=report["status"], verification=report)
    info_path.write_text(artifacts.dump_json(info))
    return artifacts.Converted(art, info)


def _original_runner(g: Graph, art: Path) -> tuple[Any, list[str]]:
    """OpenCV on the original files, when they are still where convert.json says."""
    source = Path(g.meta.get("source") or "")
    if not source.is_file() or not _opencv_available():
        return None, []
    if g.meta.get("framework") == "caffe":
        from .caffe import opencv

        weights = Path(g.meta["weights"]) if g.meta.get("weights") else art / "random.caffemodel"
        return opencv.runner(g, source, weights if weights.is_file() else None), \
            g.meta.get("opencv_known", [])
    from .torch7 import opencv as t7cv

    return t7cv.runner(g, art), t7cv.known_deviations(g)
