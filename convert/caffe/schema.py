"""caffe.proto, read at import time: field tables for our own text and wire parsers, and real
protobuf message classes built from a runtime descriptor (no generated code, so any protobuf
4.x-7.x works).

``Msg`` is the parsed form of a message: attribute access gives the field's value, its default
when unset, or an empty sub-message; ``msg.has(name)`` tells whether a field was given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

PROTO = Path(__file__).with_name("caffe.proto")
SCALARS = {"float", "double", "int32", "int64", "uint32", "uint64", "bool", "string", "bytes"}


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    number: int
    repeated: bool
    type: str  # a scalar name, or the full name of a message or enum
    default: Any = None
    packed: bool = False

    @property
    def is_message(self) -> bool:
        return self.type in SCHEMA.messages

    @property
    def is_enum(self) -> bool:
        return self.type in SCHEMA.enums


@dataclass
class MessageType:
    name: str
    fields: dict[str, Field] = field(default_factory=dict)
    by_number: dict[int, Field] = field(default_factory=dict)


@dataclass
class Schema:
    messages: dict[str, MessageType] = field(default_factory=dict)
    enums: dict[str, dict[str, int]] = field(default_factory=dict)

    def enum_name(self, enum: str, number: int) -> str | int:
        for k, v in self.enums[enum].items():
            if v == number:
                return k
        return number


_TOKEN = re.compile(r'\s+|//[^\n]*|"[^"]*"|[A-Za-z_][\w.]*|-?[\d.]+(?:[eE][-+]?\d+)?|[{}\[\]=;,]')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"caffe.proto: cannot read at offset {pos}: {text[pos:pos + 20]!r}")
        tok, pos = m.group(), m.end()
        if not tok.isspace() and not tok.startswith("//"):
            out.append(tok)
    return out


def parse_proto(text: str) -> Schema:
    """Read the proto2 subset caffe.proto is written in."""
    toks, schema = _tokens(text), Schema()
    raw: list[tuple[str, list[str], list[str]]] = []  # (message, scope, field tokens)
    i, scope = 0, []
    while i < len(toks):
        t = toks[i]
        if t in ("syntax", "package"):
            i = toks.index(";", i) + 1
        elif t in ("message", "enum"):
            name = ".".join(scope + [toks[i + 1]])
            if t == "enum":
                j, values = i + 3, {}
                while toks[j] != "}":
                    values[toks[j]] = int(toks[j + 2])
                    j += 4
                schema.enums[name] = values
                i = j + 1
            else:
                schema.messages[name] = MessageType(name)
                scope.append(toks[i + 1])
                i += 3
        elif t == "}":
            scope.pop()
            i += 1
        else:  # a field: label type name = number [options] ;
            j = toks.index(";", i)
            raw.append((".".join(scope), scope[:], toks[i:j]))
            i = j + 1
    for msg, scope, ft in raw:
        f = _field(schema, scope, ft)
        schema.messages[msg].fields[f.name] = f
        schema.messages[msg].by_number[f.number] = f
    return schema


def _resolve(schema: Schema, scope: list[str], name: str) -> str:
    if name in SCALARS:
        return name
    for k in range(len(scope), -1, -1):
        full = ".".join(scope[:k] + [name])
        if full in schema.messages or full in schema.enums:
            return full
    raise ValueError(f"caffe.proto: unknown type {name}")


def _field(schema: Schema, scope: list[str], ft: list[str]) -> Field:
    label, typ, name, number = ft[0], _resolve(schema, scope, ft[1]), ft[2], int(ft[4])
    opts = dict(zip(ft[6:-1:4], ft[8::4])) if len(ft) > 5 else {}
    default: Any = opts.get("default")
    if default is not None:
        default = _literal(schema, typ, default)
    elif label != "repeated":
        default = _zero(schema, typ)
    return Field(name, number, label == "repeated", typ, default, opts.get("packed") == "true")


def _literal(schema: Schema, typ: str, tok: str) -> Any:
    if typ in ("float", "double"):
        return float(tok)
    if typ == "bool":
        return tok == "true"
    if typ in ("string", "bytes"):
        return tok.strip('"')
    if typ in schema.enums:
        return tok
    return int(tok)


def _zero(schema: Schema, typ: str) -> Any:
    if typ in schema.enums:
        return next(iter(schema.enums[typ]))
    return {"float": 0.0, "double": 0.0, "bool": False, "string": "", "bytes": b""}.get(typ, 0)


SCHEMA = parse_proto(PROTO.read_text())


class Msg:
    """A parsed message. ``pos`` is (line, col) in the prototxt, or None for binary input."""

    __slots__ = ("_type", "_values", "pos")

    def __init__(self, type_name: str, values: dict[str, Any] | None = None,
                 pos: tuple[int, int] | None = None) -> None:
        self._type = SCHEMA.messages[type_name]
        self._values = values if values is not None else {}
        self.pos = pos

    @property
    def type_name(self) -> str:
        return self._type.name

    def has(self, name: str) -> bool:
        return name in self._values

    def set(self, name: str, value: Any) -> None:
        self._values[name] = value

    def items(self) -> list[tuple[Field, Any]]:
        """The fields that were given, with their values."""
        return [(self._type.fields[k], v) for k, v in self._values.items()]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            f = self._type.fields[name]
        except KeyError:
            raise AttributeError(f"{self._type.name} has no field {name}") from None
        if name in self._values:
            return self._values[name]
        if f.repeated:
            return []
        return Msg(f.type) if f.is_message else f.default

    def __repr__(self) -> str:
        return f"Msg({self._type.name}, {self._values})"


@cache
def message_class(name: str) -> type:
    """A real protobuf class for a caffe message, built from a runtime descriptor."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="zoo_caffe.proto", package="caffe", syntax="proto2")
    F = descriptor_pb2.FieldDescriptorProto
    scalar = {"float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE, "int32": F.TYPE_INT32,
              "int64": F.TYPE_INT64, "uint32": F.TYPE_UINT32, "uint64": F.TYPE_UINT64,
              "bool": F.TYPE_BOOL, "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES}
    protos = {mn: fdp.message_type.add(name=mn) for mn in SCHEMA.messages}  # all top-level
    for en, values in SCHEMA.enums.items():
        parent, _, short = en.rpartition(".")
        e = (protos[parent].enum_type if parent else fdp.enum_type).add(name=short)
        for k, v in values.items():
            e.value.add(name=k, number=v)
    for mn, mt in SCHEMA.messages.items():
        for f in mt.fields.values():
            fd = protos[mn].field.add(name=f.name, number=f.number,
                                      label=F.LABEL_REPEATED if f.repeated else F.LABEL_OPTIONAL)
            if f.type in scalar:
                fd.type = scalar[f.type]
            else:
                fd.type = F.TYPE_MESSAGE if f.is_message else F.TYPE_ENUM
                fd.type_name = ".caffe." + f.type
            if f.packed:
                fd.options.packed = True
            if not f.repeated and not f.is_message and f.default is not None:
                fd.default_value = (str(f.default).lower() if isinstance(f.default, bool)
                                    else repr(f.default) if isinstance(f.default, float)
                                    else str(f.default))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("caffe." + name)
    get = getattr(message_factory, "GetMessageClass", None)
    return get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)
