"""Tests of convert.torch7.t7file: files built by hand with a small Torch7 writer, then the corpus."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import CORPUS, corpus, corpus_files

from convert.torch7.t7file import T7Error, TableKey, TorchObject, load, loads

# ---------------------------------------------------------------- a minimal Torch7 writer (tests only)


@dataclass(eq=False)
class Storage:
    """A torch storage to write; the same instance written twice is one shared storage."""

    cls: str  # "torch.FloatStorage", "torch.CudaStorage", ...
    data: np.ndarray


@dataclass(eq=False)
class Tensor:
    cls: str  # "torch.FloatTensor", ...
    storage: Storage | None
    sizes: list[int]
    strides: list[int]
    offset: int = 1  # 1-based, as on disk


class Func:
    """Stands for a serialized Lua function (tag 6: size, bytecode, upvalue table)."""


class Tag:
    """A raw type tag with nothing after it (for bad-tag tests)."""

    def __init__(self, tag: int) -> None:
        self.tag = tag


def tensor(arr: np.ndarray, cls: str) -> Tensor:
    """A contiguous tensor owning a storage of the matching class."""
    arr = np.ascontiguousarray(arr)
    strides = [s // arr.itemsize for s in arr.strides]
    return Tensor(cls, Storage(cls.replace("Tensor", "Storage"), arr.ravel()), list(arr.shape), strides)


_TEXT_FMT = {"f": ".9g", "d": ".17g", "e": ".9g"}


class Writer:
    def __init__(self, ascii: bool = False, long_size: int = 8) -> None:
        self.ascii, self.long_size = ascii, long_size
        self.out = bytearray()
        self.memo: dict[int, int] = {}
        self.keep: list[object] = []  # keeps ids unique while writing

    def ints(self, *vals: int, long: bool = False) -> None:
        if self.ascii:
            if vals:
                self.out += (" ".join(str(v) for v in vals) + "\n").encode()
        else:
            fmt = "q" if long and self.long_size == 8 else "i"
            self.out += struct.pack(f"<{len(vals)}{fmt}", *vals)

    def double(self, v: float) -> None:
        self.out += (format(v, ".17g") + "\n").encode() if self.ascii else struct.pack("<d", v)

    def raw(self, b: bytes) -> None:
        self.out += b + (b"\n" if self.ascii and b else b"")

    def string(self, s: str | bytes) -> None:
        b = s.encode() if isinstance(s, str) else s
        self.ints(len(b))
        self.raw(b)

    def storage_data(self, a: np.ndarray) -> None:
        if a.dtype.itemsize == 1:
            self.raw(a.tobytes())
        elif self.ascii:
            fmt = _TEXT_FMT.get(a.dtype.char, "d")
            if len(a):
                self.out += (" ".join(format(x, fmt) for x in a.tolist()) + "\n").encode()
        elif a.dtype.kind == "i" and a.dtype.itemsize == 8 and self.long_size == 4:
            self.out += a.astype("<i4").tobytes()
        else:
            self.out += a.astype(a.dtype.newbyteorder("<")).tobytes()

    def write(self, obj: object) -> Writer:
        if isinstance(obj, TableKey):  # lets a test use a table (dict) as a table key
            obj = obj.value
        if obj is None:
            self.ints(0)
        elif isinstance(obj, Tag):
            self.ints(obj.tag)
        elif isinstance(obj, Func):
            self.ints(6)
            self.string(b"\x1bLuaJ fake bytecode")
            self.write({})
        elif isinstance(obj, bool):
            self.ints(5, int(obj))
        elif isinstance(obj, (int, float)):
            self.ints(1)
            self.double(obj)
        elif isinstance(obj, (str, bytes)):
            self.ints(2)
            self.string(obj)
        else:
            self.ints(3 if isinstance(obj, dict) else 4)
            if id(obj) in self.memo:
                self.ints(self.memo[id(obj)])
                return self
            self.memo[id(obj)] = len(self.memo) + 1
            self.keep.append(obj)
            self.ints(self.memo[id(obj)])
            self.body(obj)
        return self

    def body(self, obj: object) -> None:
        if isinstance(obj, dict):
            self.ints(len(obj))
            for k, v in obj.items():
                self.write(k)
                self.write(v)
        elif isinstance(obj, TorchObject):
            if obj.version:
                self.string(f"V {obj.version}")
            self.string(obj.cls)
            self.write(obj.fields)
        elif isinstance(obj, Tensor):
            self.string("V 1")
            self.string(obj.cls)
            self.ints(len(obj.sizes))
            self.ints(*obj.sizes, long=True)
            self.ints(*obj.strides, long=True)
            self.ints(obj.offset, long=True)
            self.write(obj.storage)
        elif isinstance(obj, Storage):
            self.string("V 1")
            self.string(obj.cls)
            self.ints(len(obj.data), long=True)
            self.storage_data(obj.data)
        else:
            raise TypeError(type(obj))


def dump(obj: object, ascii: bool = False, long_size: int = 8) -> bytes:
    return bytes(Writer(ascii, long_size).write(obj).out)


def roundtrip(obj: object, ascii: bool = False, long_size: int = 8) -> object:
    return loads(dump(obj, ascii, long_size))


WEIGHT = np.arange(24, dtype=np.float32).reshape(4, 3, 2) / 7


def small_module() -> TorchObject:
    weight = tensor(WEIGHT, "torch.FloatTensor")
    bias = tensor(np.ones(4, np.float32), "torch.FloatTensor")
    conv = TorchObject("nn.SpatialConvolution", {"weight": weight, "bias": bias, "kW": 3, "padW": 0,
                                                 "train": False, "_type": "torch.FloatTensor"}, version=1)
    view = TorchObject("nn.View", {"size": Storage("torch.LongStorage", np.array([-1, 12]))}, version=1)
    fields = {"modules": {1: conv, 2: view}, "_type": "torch.FloatTensor"}
    return TorchObject("nn.Sequential", fields, version=1)


MODES = pytest.mark.parametrize("ascii", [False, True], ids=["binary", "ascii"])

# ---------------------------------------------------------------- values


@MODES
def test_scalars(ascii: bool) -> None:
    cases = [(None, type(None)), (True, bool), (False, bool), (0, int), (3, int), (-7, int), (2.0, int),
             (1e20, int), (1.5, float), (1e-05, float), (0.41977345198392868, float), ("", str),
             ("héllo", str), (" lead\nnew line ", str),
             ("\nstarts with a newline\n", str)]
    for value, typ in cases:
        got = roundtrip(value, ascii)
        assert got == value and type(got) is typ, (value, got)
    assert math.isnan(roundtrip(float("nan"), ascii))
    assert roundtrip(float("inf"), ascii) == math.inf and roundtrip(-math.inf, ascii) == -math.inf
    assert roundtrip(b"bad \xff utf8", ascii) == "bad \ufffd utf8"


@MODES
def test_nested_tables(ascii: bool) -> None:
    value = {"a": {1: "x", 2: {"b": True, "c": None}}, 3.5: "float key", 4: -1.25, "empty": {}}
    got = roundtrip(value, ascii)
    assert got == {"a": {1: "x", 2: {"b": True, "c": None}}, 3.5: "float key", 4: -1.25, "empty": {}}
    assert all(type(k) is int for k in got["a"])


@MODES
def test_shared_references_and_cycles(ascii: bool) -> None:
    shared = {"x": 1}
    mod = TorchObject("nn.ReLU", {"inplace": True})
    cyc: dict = {"name": "loop"}
    cyc["self"] = cyc
    parent = TorchObject("nn.Sequential", {})
    parent.fields["modules"] = {1: TorchObject("nn.Identity", {"parent": parent})}
    got = roundtrip({1: shared, 2: shared, "m1": mod, "m2": mod, "cyc": cyc, "p": parent}, ascii)
    assert got[1] is got[2] and got[1] == {"x": 1}
    assert got["m1"] is got["m2"] and isinstance(got["m1"], TorchObject)
    assert got["cyc"]["self"] is got["cyc"]
    p = got["p"]
    assert p.fields["modules"][1].fields["parent"] is p


def test_table_and_object_keys() -> None:
    # nngraph keys tables by tables (node.data.mapindex[parent.data]); Lua compares them by identity.
    data = {"module": "x"}
    node = TorchObject("nngraph.Node", {"data": data})
    got = roundtrip({"mapindex": {TableKey(data): 1}, "node": node, "by_node": {node: 2}})
    (key,) = got["mapindex"].keys()
    assert isinstance(key, TableKey) and key.value is got["node"].fields["data"]
    assert got["by_node"][got["node"]] == 2


def test_torch_object_version() -> None:
    assert roundtrip(TorchObject("nn.Linear", {"a": 1}, version=3)).version == 3
    old = roundtrip(TorchObject("nn.Linear", {"a": 1}))  # written before Torch had versions
    assert (old.cls, old.version, old.fields) == ("nn.Linear", 0, {"a": 1})


# ---------------------------------------------------------------- tensors


@MODES
def test_strided_tensor_with_offset(ascii: bool) -> None:
    st = Storage("torch.FloatStorage", np.arange(30, dtype=np.float32))
    t = Tensor("torch.FloatTensor", st, sizes=[2, 3], strides=[1, 4], offset=3)
    got = roundtrip(t, ascii)
    expected = np.array([[2 + i + 4 * j for j in range(3)] for i in range(2)], np.float32)
    np.testing.assert_array_equal(got, expected)
    assert got.flags.c_contiguous and got.flags.writeable


@MODES
def test_tensors_sharing_a_storage(ascii: bool) -> None:
    st = Storage("torch.DoubleStorage", np.arange(30, dtype=np.float64))
    whole = Tensor("torch.DoubleTensor", st, [5, 6], [6, 1])
    part = Tensor("torch.DoubleTensor", st, [2, 2], [6, 1], offset=8)
    column = Tensor("torch.DoubleTensor", st, [5], [6], offset=2)
    got = roundtrip({"whole": whole, "part": part, "column": column, "again": whole}, ascii)
    np.testing.assert_array_equal(got["whole"], np.arange(30).reshape(5, 6))
    np.testing.assert_array_equal(got["part"], [[7, 8], [13, 14]])
    np.testing.assert_array_equal(got["column"], [1, 7, 13, 19, 25])
    assert got["again"] is got["whole"]


ELEMENT_TYPES = [
    ("torch.DoubleTensor", np.float64), ("torch.FloatTensor", np.float32), ("torch.HalfTensor", np.float16),
    ("torch.LongTensor", np.int64), ("torch.IntTensor", np.int32), ("torch.ShortTensor", np.int16),
    ("torch.CharTensor", np.int8), ("torch.ByteTensor", np.uint8), ("torch.CudaTensor", np.float32),
    ("torch.CudaHalfTensor", np.float16), ("torch.CudaDoubleTensor", np.float64),
    ("torch.CudaLongTensor", np.int64),
]


@MODES
@pytest.mark.parametrize("cls,dtype", ELEMENT_TYPES, ids=[c for c, _ in ELEMENT_TYPES])
def test_element_types(cls: str, dtype: type, ascii: bool) -> None:
    values = (np.arange(-6, 6) if np.dtype(dtype).kind != "u" else np.arange(250, 262) % 256).astype(dtype)
    if np.dtype(dtype).kind == "f":
        values = values / 4
    got = roundtrip(tensor(values.reshape(3, 4), cls), ascii)
    assert got.dtype == dtype and got.shape == (3, 4)
    np.testing.assert_array_equal(got, values.reshape(3, 4))
    storage = roundtrip(Storage(cls.replace("Tensor", "Storage"), values), ascii)
    assert storage.dtype == dtype and storage.shape == (12,)


@MODES
def test_empty_tensors(ascii: bool) -> None:
    got = roundtrip({"a": Tensor("torch.FloatTensor", None, [], []),
                     "b": Tensor("torch.FloatTensor", Storage("torch.FloatStorage", np.zeros(0, np.float32)),
                                 [0, 3], [3, 1])}, ascii)
    assert got["a"].shape == (0,) and got["a"].dtype == np.float32
    assert got["b"].shape == (0, 3)


def test_contiguous_tensor_is_a_writable_view() -> None:
    got = roundtrip(tensor(np.arange(6, dtype=np.float32).reshape(2, 3), "torch.FloatTensor"))
    assert got.flags.writeable and got.base is not None  # no copy of the file's bytes
    got[0, 0] = 5


def test_bad_tensors() -> None:
    with pytest.raises(T7Error, match="no storage"):
        roundtrip(Tensor("torch.FloatTensor", None, [2], [1]))
    st = Storage("torch.FloatStorage", np.zeros(4, np.float32))
    with pytest.raises(T7Error, match="exceed its storage of 4 elements"):
        roundtrip(Tensor("torch.FloatTensor", st, [2, 3], [3, 1]))


@pytest.mark.parametrize("sizes, strides", [([-1, 3], [3, 1]), ([2**63 - 1, 0], [1, 1]), ([0, 2**62], [1, 1])])
def test_bad_tensor_sizes(sizes, strides) -> None:
    st = Storage("torch.FloatStorage", np.zeros(4, np.float32))
    with pytest.raises(T7Error, match="bad tensor sizes"):
        roundtrip(Tensor("torch.FloatTensor", st, sizes, strides))


def test_stride_zero_expansion_bounded() -> None:
    # A few hundred bytes must not grow into gigabytes: stride 0 repeats one value over 2^30 elements.
    st = Storage("torch.FloatStorage", np.ones(1, np.float32))
    data = dump({"w": Tensor("torch.FloatTensor", st, [2**15, 2**15], [0, 0])})
    assert len(data) < 1000
    with pytest.raises(T7Error, match="repeat values"):
        loads(data)
    with pytest.raises(T7Error, match="repeat values"):  # 2^62 elements never reach numpy
        roundtrip(Tensor("torch.FloatTensor", st, [2**31, 2**31], [0, 0]))
    small = roundtrip(Tensor("torch.FloatTensor", st, [4, 5], [0, 0]))  # a small expansion is fine
    assert small.shape == (4, 5) and small.sum() == 20


def test_copies_checked_against_the_budget(monkeypatch) -> None:
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    transposed = Tensor("torch.FloatTensor", Storage("torch.FloatStorage", w.ravel()), [64, 64], [1, 64])
    assert roundtrip(transposed).shape == (64, 64)
    monkeypatch.setenv("ZOO_MEMORY_BUDGET", "1000")
    with pytest.raises(T7Error, match="over the memory budget"):
        roundtrip(transposed)


def test_deep_nesting_is_an_error_not_a_recursion_error() -> None:
    data = b"".join(struct.pack("<iii", 3, i + 1, 1) + struct.pack("<id", 1, 1.0) for i in range(100_000))
    with pytest.raises(T7Error, match="nested deeper than 200 levels at byte"):
        loads(data + struct.pack("<i", 0))
    nested: dict = {}
    for _ in range(150):  # deep but within the limit
        nested = {1: nested}
    assert roundtrip(nested)[1][1][1] is not None


# ---------------------------------------------------------------- file flavours


def test_four_byte_longs_auto_detected() -> None:
    data = dump(small_module(), long_size=4)
    for got in (loads(data), loads(data, long_size=4)):
        conv, view = got.fields["modules"][1], got.fields["modules"][2]
        np.testing.assert_array_equal(conv.fields["weight"], WEIGHT)
        np.testing.assert_array_equal(view.fields["size"], [-1, 12])
        assert view.fields["size"].dtype == np.int64
    with pytest.raises(T7Error):
        loads(data, long_size=8)
    with pytest.raises(ValueError):
        loads(data, long_size=2)


def test_ascii_matches_binary(tmp_path) -> None:
    (tmp_path / "m.t7").write_bytes(dump(small_module(), ascii=True))
    (tmp_path / "b.t7").write_bytes(dump(small_module()))
    a, b = load(tmp_path / "m.t7"), load(tmp_path / "b.t7")
    assert dump(small_module(), ascii=True).startswith(b"4\n1\n3\nV 1\n13\nnn.Sequential\n")
    ca, cb = a.fields["modules"][1], b.fields["modules"][1]
    assert {k: v for k, v in ca.fields.items() if not isinstance(v, np.ndarray)} == \
        {k: v for k, v in cb.fields.items() if not isinstance(v, np.ndarray)}
    np.testing.assert_array_equal(ca.fields["weight"], cb.fields["weight"])
    assert load(tmp_path / "m.t7", ascii=True).cls == "nn.Sequential"
    assert cb.fields["weight"].flags.writeable and ca.fields["weight"].flags.writeable


@MODES
def test_truncated_at_every_byte(ascii: bool) -> None:
    values = tensor(np.arange(50) / 3, "torch.DoubleTensor")
    data = dump({"m": small_module(), "s": "tail", "t": values}, ascii)
    assert loads(data)["s"] == "tail"
    for cut in range(len(data)):
        with pytest.raises(T7Error, match="unexpected end of file"):
            loads(data[:cut])


def test_unknown_type_tag() -> None:
    with pytest.raises(T7Error, match=r"not a Torch7 file \(unknown type tag 77 at byte 0\)"):
        loads(struct.pack("<i", 77) + b"\0" * 8)
    data = dump({"x": Tag(9)})
    with pytest.raises(T7Error, match=f"unknown type tag 9 at byte {len(data) - 4}"):
        loads(data)
    with pytest.raises(T7Error, match="unknown type tag"):
        loads(b"PK\x03\x04 a zip file, not a t7")


@MODES
def test_lua_function_refused(ascii: bool) -> None:
    with pytest.raises(T7Error, match=r"serialized Lua function \(type 6\) at byte 0"):
        roundtrip(Func(), ascii)
    module = TorchObject("nn.Sequencer", {"module": TorchObject("nn.Linear", {"updateOutput": Func()})})
    with pytest.raises(T7Error, match="function .* inside nn.Sequencer > nn.Linear: functions cannot be"):
        roundtrip(module, ascii)


# ---------------------------------------------------------------- the corpus

GOLDEN = [p for p in corpus_files("torch7-golden", "*") if p.suffix in (".t7", ".txt", ".dat")]


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_files_parse(path) -> None:
    got = load(path)
    if "_net" in path.stem:
        assert isinstance(got, TorchObject) and got.cls.startswith("nn."), got
    else:  # network inputs and outputs
        assert isinstance(got, np.ndarray) and 0 < got.size < 10_000_000 and got.ndim >= 1
        if got.dtype.kind == "f":
            assert np.isfinite(got).all()


def test_golden_ascii_and_binary_agree() -> None:
    base = corpus("torch7-golden")
    for name in ("net_conv_net", "net_conv_input", "net_conv_output"):
        a, b = load(base / f"{name}.dat"), load(base / f"{name}.txt")
        if isinstance(a, TorchObject):
            a, b = a.fields["modules"][1].fields["weight"], b.fields["modules"][1].fields["weight"]
        np.testing.assert_array_equal(a, b)


def test_realworld_cuda_sequential() -> None:
    got = load(corpus("realworld", "henlisp", "DeepLearning_HW1", "model.t7"))
    assert got.cls == "nn.Sequential" and got.fields["_type"] == "torch.CudaTensor"
    linear = got.fields["modules"][2]
    assert linear.cls == "nn.Linear" and linear.fields["weight"].shape == (64, 784)
    assert linear.fields["weight"].dtype == np.float32


def test_realworld_nngraph() -> None:
    got = load(corpus("realworld", "Cadene", "AS_Exam", "model.t7"))
    assert got.cls == "nn.gModule"
    nodes = got.fields["forwardnodes"]
    assert nodes and all(isinstance(n, TorchObject) and n.cls == "nngraph.Node" for n in nodes.values())


def test_realworld_rnn_functions_refused() -> None:
    with pytest.raises(T7Error, match="function"):
        load(corpus("realworld", "apsvvfb", "compress", "model.t7"))


REALWORLD = sorted(CORPUS.glob("realworld/*/*/model.t7"))


@pytest.mark.parametrize("path", REALWORLD, ids=[p.parent.name for p in REALWORLD])
def test_realworld_load_or_refuse_functions(path) -> None:
    try:
        got = load(path)
    except T7Error as err:
        assert "function" in str(err) and "\n" not in str(err)
    else:
        assert isinstance(got, TorchObject)
