"""Our own reader for Caffe's text format (prototxt), typed by caffe.proto.

Written rather than borrowed from protobuf's text_format so that (1) errors say FILE:LINE:COL,
(2) the liberties real files take load: single-quoted strings, ``;`` or ``,`` after values,
``1.`` floats, and (3) fields of Caffe forks unknown to BVLC produce a warning naming the line
instead of a failure (or get their fork meaning where it is unambiguous).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from ..errors import BadModel, did_you_mean
from .schema import SCHEMA, Field, Msg

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\f\v]+) | (?P<newline>\n) | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?|[-+]?(?:inf|nan)\b)
  | (?P<ident>[A-Za-z_][\w.]*)
  | (?P<symbol>[{}<>\[\]:,;])
""", re.VERBOSE)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}

# Fork fields whose meaning is unambiguous: (message, field) -> handler(msg, value).
def _ceil_mode(msg: Msg, value: Any) -> None:
    msg.set("round_mode", "CEIL" if value else "FLOOR")


_MAX_NOTES = 100

FORK_FIELDS = {("PoolingParameter", "ceil_mode"): ("bool", _ceil_mode)}

# Scalar fields that real files fill with a V2-style block: read the block as this message.
BLOCK_AS = {("V1LayerParameter", "param"): ("ParamSpec", "name")}


class Tok:
    __slots__ = ("kind", "text", "line", "col")

    def __init__(self, kind: str, text: str, line: int, col: int) -> None:
        self.kind, self.text, self.line, self.col = kind, text, line, col


def tokenize(text: str, path: str) -> list[Tok]:
    out, pos, line, start = [], 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise BadModel(path, f"{line}:{pos - start + 1}", f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind == "newline":
            line, start = line + 1, m.end()
        elif kind not in ("space", "comment"):
            out.append(Tok(kind, m.group(), line, pos - start + 1))
        pos = m.end()
    out.append(Tok("eof", "", line, pos - start + 1))
    return out


class Parser:
    def __init__(self, text: str, path: str) -> None:
        self.path, self.toks, self.i = path, tokenize(text, path), 0
        self.notes: list[tuple[int, str, tuple[Any, ...]]] = []  # logged once the parse succeeds
        self.unknowns: list[Tok] = []  # names of unknown fields, in order

    def fail(self, tok: Tok, what: str) -> BadModel:
        return BadModel(self.path, f"{tok.line}:{tok.col}", what)

    def note(self, level: int, fmt: str, tok: Tok, *args: Any) -> None:
        """A warning for the log, held back until the whole file parsed: a deleted '}' makes every
        later field look unknown, and the one error line must not drown in their warnings."""
        self.notes.append((level, "%s:%d:%d: " + fmt, (self.path, tok.line, tok.col, *args)))

    def flush(self) -> None:
        for level, fmt, args in self.notes[:_MAX_NOTES]:
            log.log(level, fmt, *args)
        if len(self.notes) > _MAX_NOTES:
            log.warning("%s: %d more warnings not shown", self.path, len(self.notes) - _MAX_NOTES)

    def next(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def peek(self) -> Tok:
        return self.toks[self.i]

    def message(self, type_name: str, close: str | None, pos: tuple[int, int] | None) -> Msg:
        msg = Msg(type_name, pos=pos)
        mt = SCHEMA.messages[type_name]
        while True:
            t = self.next()
            if t.kind == "eof" and close is None:
                return msg
            if t.kind == "symbol" and t.text == close:
                return msg
            if t.kind == "symbol" and t.text in ",;":
                continue
            if t.kind == "eof" and pos is not None:
                raise self.fail(t, f"unclosed block: the '{{' at line {pos[0]}, column {pos[1]} "
                                   f"is never closed{self.hint(pos)}")
            if t.kind != "ident":
                want = f"a field name or '{close}'" if close else "a field name"
                raise self.fail(t, f"expected {want}, found {_show(t.text or 'end of file')}")
            f = mt.fields.get(t.text)
            if f is None:
                self.unknown(msg, t)
                continue
            self.field(msg, f, t)

    def field(self, msg: Msg, f: Field, name: Tok) -> None:
        colon = self.peek().kind == "symbol" and self.peek().text == ":"
        if colon:
            self.next()
        t = self.peek()
        block_as = BLOCK_AS.get((msg.type_name, f.name))
        if block_as and t.kind == "symbol" and t.text in "{<":
            self.next()
            sub = self.message(block_as[0], "}" if t.text == "{" else ">", (t.line, t.col))
            self.note(logging.WARNING, "a %s block in a %s; read as the newer format", name,
                      block_as[0], msg.type_name)
            self.add(msg, f, getattr(sub, block_as[1]))
            return
        if f.is_message:
            if t.kind != "symbol" or t.text not in "{<":
                raise self.fail(t, f"field '{f.name}' needs a {{ ... }} block")
            self.next()
            value: Any = self.message(f.type, "}" if t.text == "{" else ">", (t.line, t.col))
        elif t.kind == "symbol" and t.text == "[" and f.repeated:
            self.next()
            while not (self.peek().kind == "symbol" and self.peek().text == "]"):
                self.add(msg, f, self.scalar(f, self.next()))
                if self.peek().kind == "symbol" and self.peek().text == ",":
                    self.next()
            self.next()
            return
        else:
            if not colon:
                raise self.fail(t, f"expected ':' after '{f.name}'")
            value = self.scalar(f, self.next())
        self.add(msg, f, value, name)

    def add(self, msg: Msg, f: Field, value: Any, name: Tok | None = None) -> None:
        if f.repeated:
            if not msg.has(f.name):
                msg.set(f.name, [])
            getattr(msg, f.name).append(value)
        else:
            if msg.has(f.name) and name is not None:
                self.note(logging.WARNING, "'%s' given twice; the last value is used", name, f.name)
            msg.set(f.name, value)

    def scalar(self, f: Field, t: Tok) -> Any:
        try:
            return convert_scalar(f.type, t)
        except ValueError as e:
            if f.name == "engine" and f.is_enum and t.kind == "ident":  # fork engines (INTEL, MKL2017)
                self.note(logging.WARNING, "engine %s is fork-specific; the default is used", t, t.text)
                return f.default
            raise self.fail(t, f"bad value {_show(t.text)} for '{f.name}' ({e})") from None

    def hint(self, pos: tuple[int, int]) -> str:
        """Where a '}' is probably missing: before the first unknown field inside the open block."""
        after = [t for t in self.unknowns if (t.line, t.col) > pos]
        if not after:
            return ""
        t = after[0]
        return f" (a '}}' missing before {_show(t.text)} at line {t.line}, column {t.col}?)"

    def unknown(self, msg: Msg, name: Tok) -> None:
        """A field caffe.proto does not know: apply its fork meaning, or skip it with a warning."""
        self.unknowns.append(name)
        fork = FORK_FIELDS.get((msg.type_name, name.text))
        if self.peek().kind == "symbol" and self.peek().text == ":":
            self.next()
        t = self.peek()
        if t.kind == "symbol" and t.text in "{<":
            self.next()
            self.skip_block("}" if t.text == "{" else ">", t)
            value = None
        else:
            value = self.next()
            if value.kind not in ("number", "ident", "string"):
                raise self.fail(value, f"expected a value for {_show(name.text)}")
        if fork and value is not None:
            try:
                fork[1](msg, convert_scalar(fork[0], value))
                self.note(logging.INFO, "fork field '%s' read with its fork meaning", name, name.text)
                return
            except ValueError:
                pass
        typo = did_you_mean(name.text, SCHEMA.messages[msg.type_name].fields)
        self.note(logging.WARNING, "field '%s' is not in BVLC Caffe's %s (%s); ignored", name, name.text,
                  msg.type_name, typo.strip() if typo else "fork-specific?")

    def skip_block(self, close: str, start: Tok) -> None:
        depth = 1
        while depth:
            t = self.next()
            if t.kind == "eof":
                raise self.fail(t, f"unclosed block: the '{start.text}' at line {start.line}, column "
                                   f"{start.col} is never closed (expected '{close}')")
            if t.kind == "symbol" and t.text in "{<":
                depth += 1
            elif t.kind == "symbol" and t.text in "}>":
                depth -= 1


def convert_scalar(typ: str, t: Tok) -> Any:
    if typ in ("string", "bytes"):
        if t.kind != "string":
            raise ValueError("expected a quoted string")
        return _unquote(t.text)
    if typ == "bool":
        if t.text in ("true", "True", "t", "1"):
            return True
        if t.text in ("false", "False", "f", "0"):
            return False
        raise ValueError("expected true or false")
    if typ in ("float", "double"):
        if t.kind not in ("number", "ident"):
            raise ValueError("expected a number")
        return float(t.text.rstrip("fF")) if t.text.lower() not in ("inf", "-inf", "nan") \
            else float(t.text)
    if typ in SCHEMA.enums:
        return _enum(typ, t)
    if t.kind != "number" or not re.fullmatch(r"[-+]?\d+", t.text):
        raise ValueError("expected an integer")
    v = int(t.text) if len(t.text) <= 30 else 2**128  # no 10^5-digit conversions
    if typ.startswith("uint") and v < 0:
        raise ValueError("expected a non-negative integer")
    lo, hi = INT_RANGE[typ]
    if not lo <= v <= hi:  # Caffe's reader (protobuf) refuses these too
        raise ValueError(f"out of range for {typ}")
    return v


INT_RANGE = {"int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-2**63, 2**63 - 1),
             "uint64": (0, 2**64 - 1)}


def _enum(typ: str, t: Tok) -> str:
    values = SCHEMA.enums[typ]
    if t.kind == "ident" and t.text in values:
        return t.text
    if t.kind == "number" and re.fullmatch(r"-?\d{1,12}", t.text):
        name = SCHEMA.enum_name(typ, int(t.text))
        if isinstance(name, str):
            return name
    shown = list(values)[:8]
    typo = did_you_mean(t.text, values, "; ") if t.kind == "ident" else ""
    raise ValueError(f"expected one of {', '.join(shown)}{', …' if len(values) > len(shown) else ''}{typo}")


def _show(text: str, limit: int = 40) -> str:
    """A token for an error message: quoted, and cut when long."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _unquote(s: str) -> str:
    body = s[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def parse(text: str, path: str | Path, type_name: str = "NetParameter") -> Msg:
    """Parse prototxt text into a ``Msg`` of ``type_name``; raises BadModel with FILE:LINE:COL."""
    parser = Parser(text.removeprefix("\ufeff"), str(path))  # a byte-order mark some editors write
    msg = parser.message(type_name, None, (1, 1))
    parser.flush()
    return msg


def read(path: Path) -> Msg:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise BadModel(str(path), "", f"cannot read: {e.strerror}") from None
    return parse(text, path)
