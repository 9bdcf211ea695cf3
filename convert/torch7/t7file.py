"""Reader of Lua Torch7's serialization format (``torch.save`` / ``File:writeObject``), binary and ASCII.

Written from the format itself (Torch7's File.lua and THDiskFile.c): a stream of typed objects where
tables and torch objects carry a reference index so shared and cyclic structures survive a round trip.
Tensors and storages become numpy arrays, other torch classes become ``TorchObject``. Lua functions
cannot be turned into anything a converter could use, so they are refused with a one-line ``T7Error``.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np

from convert.errors import ConvertError
from convert.limits import over_budget

__all__ = ["TorchObject", "TableKey", "T7Error", "load", "loads"]

NIL, NUMBER, STRING, TABLE, TORCH, BOOLEAN, FUNCTION, LEGACY_RECUR_FUNCTION, RECUR_FUNCTION = range(9)

# Element types of storages/tensors on disk (little-endian). Cuda* classes are written like their CPU
# counterparts; a bare "Cuda" (torch.CudaTensor) is float32. "Long" is resolved per file (4 or 8 bytes).
_ELEMENTS = {"Double": "<f8", "Float": "<f4", "Half": "<f2", "Long": "<i8", "Int": "<i4", "Short": "<i2",
             "Char": "i1", "Byte": "u1"}
_ARRAY_CLASS = re.compile(r"torch\.(Cuda)?(Double|Float|Half|Long|Int|Short|Char|Byte)?(Tensor|Storage)")
_TOKEN = re.compile(rb"\s*(\S+)")
_NEWLINE = re.compile(rb"\n")
MAX_DEPTH = 200  # tables and objects inside each other (each level costs a few Python frames)
EXPAND_SLACK = 64 * 2**20  # bytes a file's tensors may grow by beyond the file (stride-0 expansions)


class T7Error(ConvertError):
    """Malformed or unsupported Torch7 content; the message is one line naming the byte offset."""


@dataclass(eq=False)  # identity semantics like Lua objects: hashable, so usable as table keys
class TorchObject:
    cls: str
    fields: dict = field(default_factory=dict)
    version: int = 0


@dataclass(eq=False, frozen=True)
class TableKey:
    """A Lua table (dict) or tensor used as a table key: Python can't hash those, so they are wrapped.

    nngraph does this (``node.data.mapindex[parent.data]``). Hash and equality are by identity, as in Lua.
    """

    value: Any

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableKey) and other.value is self.value


def _array_class(cls: str) -> tuple[str, str] | None:
    """("Tensor" | "Storage", element name) for torch array classes, None for anything else."""
    m = _ARRAY_CLASS.fullmatch(cls)
    if not m or not (m[1] or m[2]):  # "torch.Tensor" / "torch.Storage" are not real classes
        return None
    return m[3], m[2] or "Float"


class _Reader:
    def __init__(self, data: memoryview, ascii: bool, long_size: int) -> None:
        self.data, self.ascii, self.long_size = data, ascii, long_size
        self.pos = 0
        self.memo: dict[int, Any] = {}  # reference index -> object already read
        self.classes: list[str] = []  # torch classes being read, to say where a function sits
        self.depth = 0
        self.copied = 0  # bytes of tensor copies made so far (non-contiguous tensors)

    # ---- primitives: binary is struct/frombuffer at an offset; ASCII is whitespace-separated text ----

    def _take(self, n: int, what: str) -> int:
        """Advance over n raw bytes; returns where they start."""
        start = self.pos
        if n < 0:
            raise T7Error(f"bad Torch7 data: negative length {n} for {what} at byte {start}")
        if start + n > len(self.data):
            raise T7Error(f"unexpected end of file at byte {start} (reading {what}: {n} bytes wanted, "
                          f"{len(self.data) - start} left)")
        self.pos += n
        return start

    def _token(self, what: str) -> tuple[bytes, int]:
        m = _TOKEN.match(self.data, self.pos)
        if not m:
            raise T7Error(f"unexpected end of file at byte {len(self.data)} (reading {what})")
        if m.end() == len(self.data):  # Torch ends every write with "\n": a token touching EOF was cut
            raise T7Error(f"unexpected end of file at byte {m.end()} (reading {what}: {m[1][:20]!r} cut off)")
        self.pos = m.end()
        self._eat_newline()
        return m[1], m.start(1)

    def _eat_newline(self) -> None:
        # Torch's ASCII writer ends each write call with "\n" and its reader swallows exactly one.
        if self.pos < len(self.data) and self.data[self.pos] == 0x0A:
            self.pos += 1

    def read_int(self, what: str, size: int = 4) -> int:
        if not self.ascii:
            return struct.unpack_from("<q" if size == 8 else "<i", self.data, self._take(size, what))[0]
        tok, at = self._token(what)
        try:
            return int(tok)
        except ValueError:
            raise T7Error(f"bad {what} {tok[:20]!r} at byte {at}") from None

    def read_long(self, what: str) -> int:
        return self.read_int(what, self.long_size)

    def number(self) -> int | float:
        """A Lua number: int when the written value is exactly integral (table keys, sizes, flags)."""
        if not self.ascii:
            v = struct.unpack_from("<d", self.data, self._take(8, "number"))[0]
            return int(v) if v.is_integer() else v
        tok, at = self._token("number")
        try:
            return int(tok)
        except ValueError:
            pass
        try:
            v = float(tok)
            # "%.17g" may write an integral value in exponent form (1e+20); don't trust a rounded parse.
            return int(v) if v.is_integer() and Decimal(tok.decode()) == int(v) else v
        except (ValueError, InvalidOperation, UnicodeDecodeError):
            raise T7Error(f"bad number {tok[:20]!r} at byte {at}") from None

    def raw(self, n: int, what: str) -> memoryview:
        start = self._take(n, what)
        if self.ascii and n > 0:
            self._eat_newline()
        return self.data[start:start + n]

    def string(self) -> str:
        n = self.read_int("string length")
        return bytes(self.raw(n, "string")).decode("utf-8", errors="replace")

    def array(self, elem: str, n: int) -> np.ndarray:
        """n storage elements: a zero-copy view in binary (the buffer is writable), parsed text in ASCII."""
        dtype = np.dtype(_ELEMENTS[elem])
        if elem in ("Char", "Byte"):  # raw bytes in both modes
            return np.frombuffer(self.raw(n, f"{elem}Storage data"), dtype)
        if self.ascii:
            return self._ascii_array(dtype, n)
        if elem == "Long" and self.long_size == 4:
            return np.frombuffer(self.data, "<i4", n, self._take(4 * n, "LongStorage data")).astype(np.int64)
        return np.frombuffer(self.data, dtype, n, self._take(dtype.itemsize * n, f"{elem}Storage data"))

    def _ascii_array(self, dtype: np.dtype, n: int) -> np.ndarray:
        if n == 0:  # Torch writes nothing at all, not even the newline
            return np.empty(0, dtype)
        start = self.pos
        newline = _NEWLINE.search(self.data, start)
        if not newline:  # the line of values always ends with "\n": without it the last value may be cut
            raise T7Error(f"unexpected end of file at byte {len(self.data)} (storage of {n} elements)")
        end = newline.start()
        parse = np.float32 if dtype.kind == "f" and dtype.itemsize == 2 else dtype  # Half is text floats
        try:
            values = np.array(bytes(self.data[start:end]).split(), dtype=parse)
        except ValueError:
            raise T7Error(f"bad storage data at byte {start}") from None
        if len(values) != n:
            raise T7Error(f"storage at byte {start} has {len(values)} elements on its line, expected {n}")
        self.pos = end
        self._eat_newline()
        return values.astype(dtype, copy=False)

    # ---- objects ----

    def read(self) -> Any:
        at = self.pos
        tag = self.read_int("type tag")
        if tag == NIL:
            return None
        if tag == NUMBER:
            return self.number()
        if tag == STRING:
            return self.string()
        if tag == BOOLEAN:
            return self.read_int("boolean") == 1
        if tag in (FUNCTION, LEGACY_RECUR_FUNCTION, RECUR_FUNCTION):
            inside = f" inside {' > '.join(self.classes)}" if self.classes else ""
            raise T7Error(f"serialized Lua function (type {tag}) at byte {at}{inside}: "
                          "functions cannot be converted")
        if tag not in (TABLE, TORCH):
            prefix = "not a Torch7 file (" if at == 0 else "bad Torch7 data ("
            raise T7Error(f"{prefix}unknown type tag {tag} at byte {at})")
        index = self.read_int("reference index")
        if index in self.memo:  # a later occurrence: the very same object
            return self.memo[index]
        if self.depth >= MAX_DEPTH:
            inside = f" inside {self.classes[0]}" if self.classes else ""
            raise T7Error(f"bad Torch7 data: tables and objects nested deeper than {MAX_DEPTH} levels at byte "
                          f"{at}{inside}")
        self.depth += 1
        try:
            return self._table(index) if tag == TABLE else self._torch(index, at)
        finally:
            self.depth -= 1

    def _table(self, index: int) -> dict:
        table: dict = {}
        self.memo[index] = table  # before the contents, so a cycle finds it
        n = self.read_int("table size")
        for _ in range(n):
            key = self.read()
            try:
                hash(key)
            except TypeError:
                key = TableKey(key)
            table[key] = self.read()
        return table

    def _torch(self, index: int, at: int) -> Any:
        version, cls = 0, self.string()
        if cls.startswith("V "):
            try:
                version = int(float(cls[2:]))
                cls = self.string()
            except (ValueError, OverflowError):  # like Torch: "V " without a number is the class name
                pass
        kind = _array_class(cls)
        if kind is not None:
            storage = kind[0] == "Storage"
            arr = self.array(kind[1], self.read_long("storage size")) if storage else self._tensor(cls, at)
            self.memo[index] = arr
            return arr
        obj = TorchObject(cls, {}, version)
        self.memo[index] = obj  # before the fields: children may point back (nngraph, parent links)
        self.classes.append(cls)
        fields = self.read()
        self.classes.pop()
        if not isinstance(fields, dict):
            raise T7Error(f"{cls} at byte {at}: expected a table of fields, got {type(fields).__name__} "
                          "(a class with its own serializer is not supported)")
        obj.fields = fields
        return obj

    def _tensor(self, cls: str, at: int) -> np.ndarray:
        ndim = self.read_int("tensor dimension count")
        if ndim < 0 or ndim > 64:
            raise T7Error(f"{cls} at byte {at}: bad dimension count {ndim}")
        sizes = [self.read_long("tensor size") for _ in range(ndim)]
        strides = [self.read_long("tensor stride") for _ in range(ndim)]
        offset = self.read_long("tensor storage offset") - 1  # written 1-based
        storage = self.read()
        dtype = np.dtype(_ELEMENTS[_array_class(cls)[1]])  # type: ignore[index]
        if ndim == 0:
            return np.empty(0, dtype)
        if min(sizes) < 0 or max(sizes) >= 2**40:  # numpy refuses even an empty array with a 2^62 dim
            raise T7Error(f"{cls} at byte {at}: bad tensor sizes {sizes}")
        if min(sizes) == 0:
            return np.empty(sizes, dtype)
        if not isinstance(storage, np.ndarray):
            raise T7Error(f"{cls} at byte {at}: tensor of size {sizes} has no storage")
        last = offset + sum((s - 1) * st for s, st in zip(sizes, strides))
        if offset < 0 or min(strides) < 0 or last >= len(storage):
            raise T7Error(f"{cls} at byte {at}: sizes {sizes}, strides {strides}, offset {offset + 1} "
                          f"exceed its storage of {len(storage)} elements")
        if not _contiguous(sizes, strides):
            self._copy(math.prod(sizes) * dtype.itemsize, f"{cls} at byte {at}")
        return _view(storage, sizes, strides, offset)

    def _copy(self, nbytes: int, what: str) -> None:
        """Account for a compact copy of a strided tensor, before it is made."""
        self.copied += nbytes
        # transposed weights copy at most the file's own bytes; only repeated values (stride 0) grow past it
        if self.copied > len(self.data) + EXPAND_SLACK:
            raise T7Error(f"{what}: its strides repeat values (stride 0): {len(self.data)} bytes of file would "
                          f"expand to over {self.copied} bytes of tensors")
        reason = over_budget(self.copied, "the tensors of the file")
        if reason:
            raise T7Error(f"{what}: {reason}")


def _contiguous(sizes: list[int], strides: list[int]) -> bool:
    expected = 1
    for s, st in zip(reversed(sizes), reversed(strides)):
        if s != 1 and st != expected:  # size-1 dims may carry any stride
            return False
        expected *= s
    return True


def _view(storage: np.ndarray, sizes: list[int], strides: list[int], offset: int) -> np.ndarray:
    """The tensor's values: a plain view when they lie contiguously in the storage, else a compact copy."""
    if _contiguous(sizes, strides):
        return storage[offset:offset + math.prod(sizes)].reshape(sizes)
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], sizes, [st * item for st in strides],
                                           writeable=False)
    return np.ascontiguousarray(view)


def _looks_ascii(data: memoryview) -> bool:
    # ASCII files begin with a decimal type tag and a newline ("4\n"); binary ones with an int32 tag,
    # whose first byte would be an (invalid) tag 48..57 if it were a digit.
    return bool(re.match(rb"\s*-?\d+\s", data[:32]))


def loads(data: bytes, ascii: bool | None = None, long_size: int | None = None) -> Any:
    """Deserialize one Torch7 object from bytes (or any bytes-like). ascii/long_size None: detect them."""
    if long_size not in (None, 4, 8):
        raise ValueError(f"long_size must be 4, 8 or None, not {long_size!r}")
    buf = memoryview(data).cast("B")
    if buf.readonly:  # tensors are views of this buffer: copy read-only bytes so they come out writable
        buf = memoryview(bytearray(buf))
    if ascii is None:
        ascii = _looks_ascii(buf)
    if ascii or long_size is not None:
        return _Reader(buf, ascii, long_size or 8).read()
    try:  # Linux writes 8-byte longs, Windows 4: try the common one first
        return _Reader(buf, False, 8).read()
    except T7Error as err8:
        reader = _Reader(buf, False, 4)
        try:
            value = reader.read()
        except T7Error:
            raise err8 from None
        # A damaged 8-byte file can misparse as 4-byte garbage that stops early; a real one ends exactly.
        if reader.pos != len(buf):
            raise err8 from None
        return value


def load(path: str | Path, ascii: bool | None = None) -> Any:
    """Read a Torch7 file once into memory and deserialize it (tensors are views into that buffer)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        reason = over_budget(size, "reading the file")
        if reason:
            raise T7Error(reason)
        # np.empty, unlike bytearray(size), doesn't zero-fill first, which would cost as much as the read.
        view, done = memoryview(np.empty(size, np.uint8)), 0
        while done < size:  # read() may return less than asked for very large files
            n = f.readinto(view[done:])
            if not n:
                break
            done += n
    return loads(view[:done], ascii=ascii)
