"""caffemodel reading and writing on the protobuf wire format, typed by caffe.proto.

Reading memory-maps the file and walks the wire format; packed float data becomes a NumPy view
of the mapped bytes (no Python object per value, no copy, no 2 GB protobuf message limit).
Writing streams each blob from its NumPy buffer.
"""

from __future__ import annotations

import logging
import math
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import BadModel
from .schema import SCHEMA, Msg, message_class

log = logging.getLogger(__name__)

WIRE = {"int32": 0, "int64": 0, "uint32": 0, "uint64": 0, "bool": 0, "float": 5, "double": 1,
        "string": 2, "bytes": 2}
PACKED = {"float": "<f4", "double": "<f8"}


MAX_VARINT = 10  # bytes of a 64-bit varint
MAX_MESSAGES = 200_000  # a real caffemodel has a few per layer, and at most thousands of layers


class Truncated(Exception):
    """Malformed wire data: args are (byte offset, what is wrong there)."""

    def __init__(self, pos: int, what: str = "data past the end of its message") -> None:
        super().__init__(pos, what)


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    if pos < end and buf[pos] < 0x80:  # the common one-byte case, fast
        return buf[pos], pos + 1
    # At most 10 bytes: without the bound a run of 0xFF bytes is one huge integer, built in quadratic time.
    result = shift = 0
    stop, start = min(end, pos + MAX_VARINT), pos
    while pos < stop:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, pos
        shift += 7
    raise Truncated(start, "varint longer than 10 bytes" if stop < end else "varint cut off by the end")


def _field(buf: Any, pos: int, end: int, key: int) -> tuple[Any, int]:
    """The raw value of the field whose key was read before ``pos``: an int (varint) or a (start, end) span."""
    wt = key & 7
    if wt == 0:
        return _varint(buf, pos, end)
    if wt == 2:
        size, pos = _varint(buf, pos, end)
    elif wt == 1 or wt == 5:
        size = 8 if wt == 1 else 4
    else:  # groups (3/4) and the undefined 6/7 never occur in a caffemodel
        raise Truncated(pos, f"wire type {wt} (field {key >> 3})")
    if pos + size > end:
        raise Truncated(pos, f"length {size} runs past the end of its message")
    return (pos, pos + size), pos + size


def _signed(v: int, typ: str) -> int:
    """Negative int32/int64 values travel as 64-bit two's complement varints."""
    return v - (1 << 64) if typ in ("int32", "int64") and v >= 1 << 63 else v


def decode(buf: Any, start: int, end: int, type_name: str, count: list[int] | None = None) -> Msg:
    """Decode one message from ``buf[start:end]``; ``count`` counts the messages decoded so far."""
    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_MESSAGES:  # thousands of empty layers cost far more memory than their bytes
        raise Truncated(start, f"more than {MAX_MESSAGES} messages (layers, blobs...)")
    mt, msg, pos = SCHEMA.messages[type_name], Msg(type_name), start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        raw, pos = _field(buf, pos, end, key)
        number, wt = key >> 3, key & 7
        f = mt.by_number.get(number)
        if f is None:
            continue
        try:
            value = _value(buf, f, wt, raw, count)
        except _WrongWire:
            _warn_once(number, type_name)
            continue
        if f.repeated:
            if not msg.has(f.name):
                msg.set(f.name, [])
            lst = getattr(msg, f.name)
            lst.extend(value) if isinstance(value, list) else lst.append(value)
        else:
            msg.set(f.name, value)
    return msg


class _WrongWire(Exception):
    pass


_warned: set[tuple[int, str]] = set()


def _warn_once(number: int, type_name: str) -> None:
    # random bytes can hold thousands of such fields: one line each per process
    if (number, type_name) not in _warned and len(_warned) < 20:
        _warned.add((number, type_name))
        log.warning("caffemodel: field %d of %s has an unexpected encoding (fork-specific?); ignored",
                    number, type_name)


def _value(buf: Any, f: Any, wt: int, raw: Any, count: list[int]) -> Any:
    if f.is_message:
        if wt != 2:
            raise _WrongWire
        return decode(buf, raw[0], raw[1], f.type, count)
    typ = "int32" if f.is_enum else f.type
    if wt == 2 and typ in PACKED:  # packed floats: a view of the mapped file
        a, b = raw
        return _Array(np.frombuffer(buf, dtype=PACKED[typ], count=(b - a) // np.dtype(PACKED[typ]).itemsize, offset=a))
    if wt == 2 and typ not in ("string", "bytes"):  # packed varints (BlobShape.dim)
        out, p = [], raw[0]
        while p < raw[1]:
            v, p = _varint(buf, p, raw[1])
            out.append(_scalar(typ, v, f))
        return out
    if wt != WIRE.get(typ, -1):
        raise _WrongWire
    if typ in ("string", "bytes"):
        data = bytes(buf[raw[0]:raw[1]])
        return data.decode("utf-8", "replace") if typ == "string" else data
    if typ in PACKED:
        return float(np.frombuffer(buf, PACKED[typ], count=1, offset=raw[0])[0])
    return _scalar(typ, raw, f)


def _scalar(typ: str, v: int, f: Any) -> Any:
    if f.is_enum:
        return SCHEMA.enum_name(f.type, _signed(v, "int32"))
    if typ == "bool":
        return bool(v)
    return _signed(v, typ)


class _Array(list):  # type: ignore[type-arg]
    """Marks a packed numeric run so repeated fields can hold it as one chunk."""

    def __init__(self, arr: np.ndarray) -> None:
        super().__init__([arr])


@dataclass
class Weights:
    """Blobs of a caffemodel by layer name (first layer of a name wins, as in Caffe)."""

    path: Path
    blobs: dict[str, list[np.ndarray]]
    types: dict[str, str]


def _blob_array(b: Msg, path: Path, layer: str) -> np.ndarray:
    if any(b.has(k) for k in ("num", "channels", "height", "width")):  # legacy 4-D blobs
        shape = (b.num, b.channels, b.height, b.width)
    else:  # an absent or empty shape is a 0-d blob holding one value
        shape = tuple(int(d) for d in b.shape.dim)
    bad = [d for d in shape if not isinstance(d, int) or not 0 <= d < 2**31]
    if bad:  # Caffe's dims are int32 and non-negative; a wrong one must not reach numpy
        raise BadModel(str(path), f"layer {layer!r}", f"blob shape {list(shape)} has the bad dimension {bad[0]}")
    chunks = b.data if b.data else b.double_data
    data = _join(chunks)
    if data.size != math.prod(shape):
        raise BadModel(str(path), f"layer {layer!r}",
                       f"blob holds {data.size} values but its shape {list(shape)} needs {math.prod(shape)}")
    return data.reshape(shape)


def _join(chunks: list[Any]) -> np.ndarray:
    if not any(isinstance(c, np.ndarray) for c in chunks):  # unpacked values (rare)
        return np.asarray(chunks, dtype=np.float32)
    arrays = [c if isinstance(c, np.ndarray) else np.asarray([c]) for c in chunks]
    if len(arrays) == 1:
        return arrays[0].astype(np.float32, copy=False)
    return np.concatenate(arrays).astype(np.float32, copy=False)


def read(path: Path) -> Weights:
    """Read a caffemodel (V2 ``layer`` or V1/V0 ``layers``) into blobs keyed by layer name."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise BadModel(str(path), "", f"cannot read weights: {e.strerror}") from None
    with f:
        size = path.stat().st_size
        if size == 0:
            raise BadModel(str(path), "", "weights file is empty")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    blobs: dict[str, list[np.ndarray]] = {}
    types: dict[str, str] = {}
    try:
        net = decode(buf, 0, size, "NetParameter")
    except Truncated as t:
        raise BadModel(str(path), "", f"truncated or not a caffemodel ({t.args[1]} at byte "
                                      f"{t.args[0]} of {size})") from None
    layers = [(L.name, L.type, L.blobs) for L in net.layer]
    for L in net.layers:
        if L.has("layer"):  # V0 wrapped in V1
            layers.append((L.layer.name or L.name, L.layer.type, L.layer.blobs))
        else:
            layers.append((L.name, str(L.type), L.blobs))
    if not layers:
        raise BadModel(str(path), "", "no layers found: not a caffemodel")
    for name, typ, bl in layers:
        if name not in blobs:
            blobs[name] = [_blob_array(b, path, name) for b in bl]
            types[name] = typ
    return Weights(path, blobs, types)


# --- writing --------------------------------------------------------------------------------

def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def _len_tag(number: int, length: int) -> bytes:
    return _varint_bytes(number << 3 | 2) + _varint_bytes(length)


def _blob_parts(arr: np.ndarray) -> tuple[bytes, memoryview]:
    dims = b"".join(_varint_bytes(int(d)) for d in arr.shape)
    shape = _len_tag(1, len(dims)) + dims  # BlobShape.dim, packed
    data = memoryview(np.ascontiguousarray(arr, dtype="<f4")).cast("B")
    head = _len_tag(7, len(shape)) + shape + _len_tag(5, len(data))  # shape = 7, data = 5
    return head, data


def write(path: Path, layers: list[tuple[str, str, list[np.ndarray]]], name: str = "") -> None:
    """Write a V2 caffemodel: one LayerParameter (name, type, blobs) per entry, streamed."""
    Layer = message_class("LayerParameter")
    with open(path, "wb") as f:
        if name:
            f.write(message_class("NetParameter")(name=name).SerializeToString())
        for lname, ltype, blobs in layers:
            head = Layer(name=lname, type=ltype).SerializeToString()
            parts = [_blob_parts(b) for b in blobs]
            body = sum(len(h) + len(d) + len(_len_tag(7, len(h) + len(d))) for h, d in parts)
            f.write(_len_tag(100, len(head) + body) + head)  # NetParameter.layer = 100
            for h, d in parts:
                _write_blob(f, h, d)


def _write_blob(f: BinaryIO, head: bytes, data: memoryview) -> None:
    f.write(_len_tag(7, len(head) + len(data)))  # LayerParameter.blobs = 7
    f.write(head)
    f.write(data)
