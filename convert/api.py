"""Entry points: convert a model file into verified artifacts, or re-verify existing artifacts."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import artifacts
from .errors import BadModel, ConvertError
from .ir import Graph, Shape
from .limits import check_graph_memory

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """A frontend's result: the graph plus what verification against the original needs."""

    graph: Graph
    extra: Callable[[Path], None] | None = None  # writes extra files into the artifact dir
    opencv: Callable[[Path], Any] | None = None  # artifact dir -> runner (feeds -> outputs)
    known_opencv: list[str] = field(default_factory=list)


_TEXT_SUFFIX = {".prototxt": "prototxt", ".pbtxt": "prototxt", ".lua": "lua"}
_T7_SUFFIX = (".t7", ".net", ".dat", ".th", ".ascii")
_PROTOTXT_LINE = re.compile(r"[A-Za-z_]\w*\s*(:|\{)")  # name: "x" | layer {
# a statement: a keyword, an assignment, a call or a method call (m:add(...)); prototxt has no "=", "(" or "["
_LUA_LINE = re.compile(r"(require|local|return|function|if|for|do|while)\b"
                       r"""|[A-Za-z_][\w.]*\s*(=|\(|\[|:\w+\s*[({"'])""")


def source_kind(source: Path) -> str:
    """"prototxt", "t7" or "lua": by the suffix for .prototxt/.pbtxt/.lua, else by the content."""
    known = _TEXT_SUFFIX.get(source.suffix.lower())
    if known:
        return known
    try:
        with open(source, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise ConvertError(f"{source}: cannot read: {e.strerror or e}") from None
    kind = _sniff(head)
    if kind:
        return kind
    if source.suffix.lower() in _T7_SUFFIX:
        return "t7"  # the reader says what is wrong with it
    if not head:
        raise ConvertError(f"{source}: the file is empty")
    hint = " (a .caffemodel holds weights: give its .prototxt, and the caffemodel with --weights)" \
        if source.suffix.lower() == ".caffemodel" else ""
    raise ConvertError(f"{source}: unknown model format: the content is neither a Caffe prototxt, a Torch7 "
                       f"file nor a Lua definition{hint}")


def _sniff(head: bytes) -> str | None:
    # binary .t7: an int32 little-endian type tag 0..8 (04 00 00 00 a torch object, 03 00 00 00 a table)
    if len(head) >= 4 and head[1:4] == b"\0\0\0" and head[0] <= 8:
        return "t7"
    if re.match(rb"\s*\d\s*\n", head):  # ASCII .t7: the decimal type tag on its own line
        return "t7"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:  # a cut multi-byte character at the end of the 4096 bytes is fine
        text = head[:-3].decode("utf-8", "replace")
    if "\0" in text:
        return None
    lua = re.sub(r"--\[(=*)\[.*?(\]\1\]|\Z)|--[^\n]*", "", re.sub(r"\A#[^\n]*", "", text), flags=re.S)
    if _first_line(lua, _LUA_LINE):
        return "lua"
    return "prototxt" if _first_line(re.sub(r"#[^\n]*", "", text), _PROTOTXT_LINE) else None


def _first_line(text: str, pattern: re.Pattern) -> bool:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return bool(pattern.match(line))


def framework(source: Path) -> str:
    """"caffe" or "torch7"."""
    return "caffe" if source_kind(Path(source)) == "prototxt" else "torch7"


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
        loaded = load_caffe(source, weights, shapes, seed)
    else:
        from .torch7 import frontend as t7

        if weights is not None:
            raise ConvertError(f"{source}: --weights applies to Caffe models only")
        loaded = t7.load(source, shapes, seed, args or {})
    if seed is not None:  # verification runs the graph in float64: refuse it now, before any work
        check_graph_memory(loaded.graph, source)  # (seed None: shapes only, for info and planning)
    return loaded


def convert(source: Path, weights: Path | None = None, out: Path = Path("outputs/models"),
            shapes: dict[str, Shape] | None = None, seed: int = 0, check: bool = True,
            name: str | None = None, args: dict[str, str] | None = None) -> artifacts.Converted:
    """Convert ``source`` into ``out/<name or stem>/`` and verify it."""
    loaded = load(Path(source), weights, shapes, seed, args)
    try:
        dest = artifacts.destination(Path(out), name or Path(source).stem)
    except ConvertError as e:
        raise ConvertError(f"{source}: {e}") from None
    return artifacts.write(loaded.graph, dest, loaded.extra, loaded.opencv, loaded.known_opencv,
                           check=check)


def reverify(art: Path) -> artifacts.Converted:
    """Re-run verification of an artifact directory and update its convert.json."""
    from .verify import verify_sizes

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
        os.replace(tmp, info_path)
    finally:
        tmp.unlink(missing_ok=True)
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
