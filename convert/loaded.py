"""The contract between the frontends and ``api``: what kind of model file a source is, and the
``Loaded`` result every frontend returns. It sits below both, so a frontend never imports ``api``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConvertError
from .ir import Graph


@dataclass
class Loaded:
    """A frontend's result: the graph (its ``meta`` says source, weights, seed and name) plus what
    verification against the original needs."""

    graph: Graph
    extra: Callable[[Path], None] | None = None  # writes extra files into the artifact dir
    opencv: Callable[[Path], Any] | None = None  # artifact dir -> runner (feeds -> outputs)
    known_opencv: list[str] = field(default_factory=list)  # where OpenCV is known to deviate


def opencv_available() -> bool:
    try:
        import cv2  # noqa: F401  (optional: verification against OpenCV is skipped without it)
    except ImportError:
        return False
    return True


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
