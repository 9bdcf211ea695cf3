"""A small writer of Torch7's binary serialization (``torch.save`` format, little-endian, 8-byte longs).

It writes the trees ``t7file.load`` returns (and the Lua runner records): ``TorchObject``, Lua tables
as dicts, numbers, strings, booleans, nil, and numpy arrays as tensors with their own contiguous
storage. The point is independence: a Lua definition run with random weights is saved as
``random.t7`` so that OpenCV's own Torch importer can check our conversion of it, as the Caffe
frontend writes ``random.caffemodel``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .t7file import TableKey, TorchObject

NIL, NUMBER, STRING, TABLE, TORCH, BOOLEAN = 0, 1, 2, 3, 4, 5

# Fields that nn keeps as torch.LongStorage, not LongTensor (View/Reshape sizes, Concat's
# outputSize...): the numpy arrays t7file returns don't say which, and readers such as OpenCV care
STORAGE_FIELDS = {"size", "batchsize", "outputSize", "inputSize", "totalOutputSize", "iSize"}

_ELEMENT = {"float32": "Float", "float64": "Double", "float16": "Half", "int64": "Long",
            "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte"}


@dataclass(eq=False)
class Strided:
    """A tensor written with explicit strides over a flat storage (Torch7's ``t()`` views):
    ``storage`` 1-D, ``offset`` 1-based as on disk."""

    storage: np.ndarray
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 1


@dataclass(eq=False)
class Storage:
    """A torch storage (1-D) rather than a tensor."""

    data: np.ndarray


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()
        self.memo: dict[int, int] = {}  # id(object) -> reference index (shared objects stay shared)
        self.keep: list[Any] = []  # objects referenced by id stay alive while writing

    def ints(self, *vals: int) -> None:
        self.out += struct.pack(f"<{len(vals)}i", *vals)

    def longs(self, *vals: int) -> None:
        self.out += struct.pack(f"<{len(vals)}q", *vals)

    def string(self, s: str) -> None:
        b = s.encode()
        self.ints(len(b))
        self.out += b

    def write(self, obj: Any) -> None:
        if isinstance(obj, TableKey):
            obj = obj.value
        if obj is None:
            self.ints(NIL)
        elif isinstance(obj, (bool, np.bool_)):
            self.ints(BOOLEAN, int(obj))
        elif isinstance(obj, (int, float, np.integer, np.floating)):
            self.ints(NUMBER)
            self.out += struct.pack("<d", float(obj))  # every Lua number is a double
        elif isinstance(obj, str):
            self.ints(STRING)
            self.string(obj)
        elif isinstance(obj, (dict, TorchObject, np.ndarray, Strided, Storage)):
            self.reference(obj)
        else:
            raise TypeError(f"cannot write a {type(obj).__name__} as Torch7 data")

    def reference(self, obj: Any) -> None:
        """Tables, objects and tensors carry a reference index; a repeat writes only the index."""
        self.ints(TABLE if isinstance(obj, dict) else TORCH)
        if id(obj) in self.memo:
            self.ints(self.memo[id(obj)])
            return
        self.memo[id(obj)] = len(self.memo) + 1
        self.keep.append(obj)
        self.ints(self.memo[id(obj)])
        if isinstance(obj, dict):
            self.ints(len(obj))
            for k, v in obj.items():
                self.write(k)
                self.write(v)
        elif isinstance(obj, TorchObject):
            if obj.version:
                self.string(f"V {obj.version}")
            self.string(obj.cls)
            self.write({k: Storage(v) if k in STORAGE_FIELDS and _is_long(v) else v
                        for k, v in obj.fields.items()})
        elif isinstance(obj, Strided):
            self.tensor(obj.storage, obj.sizes, obj.strides, obj.offset)
        elif isinstance(obj, Storage):
            self.storage(np.ascontiguousarray(obj.data).reshape(-1))
        else:
            a = np.ascontiguousarray(obj)
            strides = [s // a.itemsize for s in a.strides] if a.size else [1] * a.ndim
            self.tensor(a.reshape(-1), a.shape, strides, 1)

    def tensor(self, flat: np.ndarray, sizes: Any, strides: Any, offset: int) -> None:
        elem = _ELEMENT.get(flat.dtype.name)
        if elem is None:
            raise TypeError(f"no Torch7 tensor type for numpy {flat.dtype}")
        self.string("V 1")
        self.string(f"torch.{elem}Tensor")
        self.ints(len(sizes))
        if sizes:
            self.longs(*[int(s) for s in sizes])
            self.longs(*[int(s) for s in strides])
        self.longs(offset)
        if flat.size == 0:
            self.ints(NIL)  # an empty tensor has no storage
            return
        self.reference(Storage(flat))

    def storage(self, flat: np.ndarray) -> None:
        self.string("V 1")
        self.string(f"torch.{_ELEMENT[flat.dtype.name]}Storage")
        self.longs(flat.size)
        self.out += flat.astype(flat.dtype.newbyteorder("<"), copy=False).tobytes()


def _is_long(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu"


def dumps(obj: Any) -> bytes:
    """The binary Torch7 serialization of ``obj``."""
    w = _Writer()
    w.write(obj)
    return bytes(w.out)


def dump(obj: Any, path: str | Path) -> None:
    Path(path).write_bytes(dumps(obj))
