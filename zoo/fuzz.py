"""A fuzzer of the ``zoo`` CLI: mutated and generated prototxts, caffemodels, .t7 files and Lua scripts.

Every input goes to the real commands (``convert`` with and without verification, ``info``, ``verify``)
in a forked child of one parent that imported torch and zoo once (a fresh interpreter per input would
spend its time importing). Outcomes: exit 0 (ok), 1 (mismatch), 2 (user error) are fine; a traceback,
a crash (signal), a hang past the time limit, memory past the limit, code execution (a canary file
named in hostile strings appears), a file written outside the output folder, or a leftover temporary
are findings. ``python -m zoo.checks fuzz --minutes N`` runs it; tests/test_fuzz.py runs a fixed budget.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: a forked child must not wait on pool threads

import hashlib  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
FATAL = ("traceback", "crash", "hang", "memory", "code-exec", "escape", "leftover")
MEMORY = 4 * 2**30  # RSS of a child and its children before it is killed
NOTABLE = ("mismatch", "unclean-output")  # recorded with a reproducer, not failures: worth a look
TB_CODE = 70  # the child's exit code when an exception other than SystemExit escaped

EXTREMES = ["0", "-1", "2147483648", "4294967296", "9223372036854775808", "18446744073709551616", "-2147483649",
            "nan", "inf", "-inf", "1e308", "1e-320", "100000", "0.5", "3"]


def hostile_strings(canary: str) -> list[str]:
    cmd = f"__import__('os').system('touch {canary}')"
    return ['"', "'", '"""', "'''", "\n", f"\n{cmd}", f'"""\n{cmd}\n"""', f"'''\n{cmd}\n'''", f"c\n    {cmd}",
            f"x')\n{cmd}\n#", f"\\n{cmd}", "[/x]", "[red]x[/red", "\x1b[31mred\x1b[0m\x1b[2J", "ﬁ", "fi", "x²",
            "Ａｂｃ", "forward", "training", "to", "cuda", "eval", "state_dict", "__init__", "self", "class", "None",
            "", "a@1", "1x", "x" * 3000, "\x00", "{", "#", "\\", "a b", "..", ".", "../escape", "/tmp/zoo-x"]


# ---------------------------------------------------------------- prototxt
TOKEN = re.compile(r"""\s+|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|#[^\n]*|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"""
                   r"""|\w+|\S""")


def quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def mutate_text(text: str, rng: random.Random, hostile: list[str]) -> str:
    """1-4 token edits: delete, duplicate, swap, number -> extreme, string -> hostile, insert."""
    toks = TOKEN.findall(text)
    idx = [i for i, t in enumerate(toks) if not t.isspace()]
    if not idx:
        return text + rng.choice(["{", "}", "x: 1"])
    for _ in range(rng.randint(1, 4)):
        i, j = rng.choice(idx), rng.choice(idx)
        t, op = toks[i], rng.random()
        if t[:1] in "\"'" and op < 0.6:
            h = rng.choice(hostile)
            toks[i] = quote(h) if rng.random() < 0.8 else f'"{h}"'
        elif re.fullmatch(r"[-+.\d].*", t) and op < 0.7:
            toks[i] = rng.choice(EXTREMES)
        elif op < 0.25:
            toks[i] = ""
        elif op < 0.45:
            toks[i] = f"{t} {t}"
        elif op < 0.65:
            toks[i], toks[j] = toks[j], toks[i]
        elif op < 0.85:
            toks[i] = f"{t} {toks[j]}"
        else:
            toks[i] = rng.choice(EXTREMES + [quote(rng.choice(hostile))])
    return "".join(toks)


def _name(rng: random.Random, base: str, hostile: list[str], p: float) -> str:
    return rng.choice(hostile) if rng.random() < p else base


def grammar_net(rng: random.Random, hostile: list[str], p: float = 0.1) -> str:
    """A small random Caffe net (mostly valid shapes) over the common layer types."""
    c, h, w = rng.randint(1, 4), rng.randint(1, 12), rng.randint(1, 12)
    data = _name(rng, "data", hostile, p)
    out = [f"name: {quote(_name(rng, 'net', hostile, p))}"]
    if rng.random() < 0.5:
        out.append(f"input: {quote(data)}\n" + "".join(f"input_dim: {d}\n" for d in (rng.randint(1, 2), c, h, w)))
    else:
        out.append(f'layer {{ name: "in" type: "Input" top: {quote(data)} input_param {{ shape {{ dim: '
                   f'{rng.randint(1, 2)} dim: {c} dim: {h} dim: {w} }} }} }}')
    blobs, cur = [(data, (c, h, w))], (data, (c, h, w))
    for i in range(rng.randint(1, 7)):
        kind = rng.choice(["Convolution", "Pooling", "ReLU", "InnerProduct", "Concat", "Eltwise", "BatchNorm",
                           "Scale", "Softmax", "Reshape", "Flatten", "Crop", "PReLU", "Deconvolution", "Slice",
                           "Split", "Dropout", "LRN"])
        name = _name(rng, f"{kind.lower()}{i}", hostile, p)
        top = _name(rng, name, hostile, p) if rng.random() < 0.8 else cur[0]  # sometimes in place
        (_, (c, h, w)), bottoms, params, top2 = cur, [cur[0]], "", None
        k, s, pad = rng.randint(1, 3), rng.randint(1, 2), rng.randint(0, 1)
        if kind in ("Convolution", "Deconvolution"):
            n, g = rng.randint(1, 6), rng.choice([1, 1, c])
            n = n * g if g > 1 else n
            extra = f" group: {g}" + (" bias_term: false" if rng.random() < 0.2 else "")
            extra += f" dilation: {rng.randint(1, 2)}" if rng.random() < 0.2 else ""
            params = f"convolution_param {{ num_output: {n} kernel_size: {k} stride: {s} pad: {pad}{extra} }}"
            shape = (n, (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1) if kind[0] == "C" else \
                (n, (h - 1) * s - 2 * pad + k, (w - 1) * s - 2 * pad + k)
        elif kind == "Pooling":
            glob = " global_pooling: true" if rng.random() < 0.15 else ""
            params = f"pooling_param {{ pool: {rng.choice(['MAX', 'AVE'])} kernel_size: {k} stride: {s} pad: " \
                     f"{min(pad, k - 1)}{glob} }}"
            shape = (c, 1, 1) if glob else (c, -(-(h + 2 * pad - k) // s) + 1, -(-(w + 2 * pad - k) // s) + 1)
        elif kind == "InnerProduct":
            n = rng.randint(1, 8)
            params, shape = f"inner_product_param {{ num_output: {n} }}", (n, 1, 1)
        elif kind in ("Concat", "Eltwise"):
            same = [x for x in blobs if x[1][1:] == (h, w) and (kind == "Concat" or x[1][0] == c)]
            other = rng.choice(same)
            bottoms.append(other[0])
            shape = (c + other[1][0], h, w) if kind == "Concat" else (c, h, w)
            if kind == "Eltwise":
                op = rng.choice(["SUM", "PROD", "MAX"])
                params = f"eltwise_param {{ operation: {op}{' coeff: 0.5 coeff: -1' if op == 'SUM' else ''} }}"
        elif kind in ("Reshape", "Flatten"):
            params = "reshape_param { shape { dim: 0 dim: -1 dim: 1 dim: 1 } }" if kind == "Reshape" else ""
            shape = (c * h * w, 1, 1)
        elif kind == "Crop":
            bottoms.append(cur[0])
            params, shape = "crop_param { axis: 2 offset: 0 }", (c, h, w)
        elif kind in ("Slice", "Split"):
            top2 = _name(rng, name + "_b", hostile, p)
            params = f"slice_param {{ axis: 1 slice_point: {max(1, c // 2)} }}" if kind == "Slice" else ""
            shape = (c - max(1, c // 2), h, w) if kind == "Slice" else (c, h, w)
        else:
            shared, region = rng.choice(["true", "false"]), rng.choice(["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
            params = {"ReLU": "relu_param { negative_slope: 0.1 }" if rng.random() < 0.3 else "",
                      "BatchNorm": "batch_norm_param { use_global_stats: true }",
                      "Scale": "scale_param { bias_term: true }",
                      "PReLU": f"prelu_param {{ channel_shared: {shared} }}",
                      "Dropout": "dropout_param { dropout_ratio: 0.3 }",
                      "LRN": f"lrn_param {{ local_size: {rng.choice([1, 3, 5])} alpha: 0.001 beta: 0.75 "
                             f"norm_region: {region} }}"}.get(kind, "")
            shape = (c, h, w)
        nums = list(re.finditer(r"\b\d+(?:\.\d+)?\b", params))
        if nums and rng.random() < 0.1:  # one parameter at an extreme (group 0, stride 2^63, nan...)
            m = rng.choice(nums)
            params = params[:m.start()] + rng.choice(EXTREMES) + params[m.end():]
        tops = f"{quote(top)} top: {quote(top2)}" if top2 is not None else quote(top)
        out.append(f"layer {{ name: {quote(name)} type: {quote(kind)} "
                   + " ".join(f"bottom: {quote(x)}" for x in bottoms) + f" top: {tops} {params} }}")
        cur = (top, shape)
        blobs.append(cur)
    return "\n".join(out) + "\n"


def prototxt_sources() -> list[Path]:
    """The zoo's own definitions and the corpus's small real ones."""
    found = sorted((ROOT / "prototxt").glob("*.prototxt"))
    found += sorted((CORPUS / "realworld").rglob("*.prototxt")) + sorted((CORPUS / "caffe-golden").glob("*.prototxt"))
    return [f for f in found if f.stat().st_size < 6000]


# ---------------------------------------------------------------- Lua and .t7
def grammar_lua(rng: random.Random) -> tuple[str, tuple[int, ...]]:
    """A small random Torch7 definition and its input shape."""
    c0, h0 = rng.randint(1, 4), rng.randint(2, 12)
    h = h0
    c, lines = c0, ["require 'nn'", "local m = nn.Sequential()"]
    for _ in range(rng.randint(1, 6)):
        k, n = rng.choice([1, 3]), rng.randint(1, 6)
        conv = f"nn.SpatialConvolution({c}, {n}, {k}, {k}, 1, 1, {k // 2}, {k // 2})"
        residual = (f"nn.Sequential():add(nn.ConcatTable():add(nn.Identity()):add(nn.SpatialConvolution({c}, {c}, 3, "
                    "3, 1, 1, 1, 1))):add(nn.CAddTable())")
        choice = rng.choice([(conv, n), ("nn.ReLU(true)", c), ("nn.SpatialMaxPooling(2, 2, 2, 2):ceil()", c),
                             ("nn.SpatialAveragePooling(3, 3, 1, 1, 1, 1)", c), ("nn.Dropout(0.5)", c),
                             (f"nn.SpatialBatchNormalization({c})", c), ("nn.Threshold(0, 1e-6)", c),
                             ("nn.SpatialSoftMax()", c), ("nn.Tanh()", c), ("nn.SpatialCrossMapLRN(3)", c),
                             (f"nn.Concat(2):add({conv}):add(nn.Identity())", n + c), (residual, c)])
        lines.append(f"m:add({choice[0]})")
        c = choice[1]
        h = (h + 1) // 2 if "MaxPooling" in choice[0] else h
    if rng.random() < 0.4:
        lines += [f"m:add(nn.View({c * h * h}):setNumInputDims(3))", f"m:add(nn.Linear({c * h * h}, 5))",
                  "m:add(nn.LogSoftMax())"]
    return "\n".join(lines + ["return m"]) + "\n", (1, c0, h0, h0)


def hostile_lua(canary: str) -> list[str]:
    touch = f"touch {canary}"
    return ["while true do end", "local t = {} while true do t[#t + 1] = string.rep('x', 1000000) end",
            "return string.rep('x', 2^40)", "local function f(n) return f(n + 1) + 1 end return f(1)",
            "local m = nn.Sequential() setmetatable(getmetatable(m), {__index = function() while true do end end})"
            " return m", "local m = nn.ReLU() setmetatable(m, {__index = function() while true do end end}) return m",
            f"os.execute('{touch}')", f"io.open('{canary}', 'w'):write('x')", f"python.eval(\"__import__('os')."
            f"system('{touch}')\")", f"require('os').execute('{touch}')", f"load(\"os.execute('{touch}')\")()",
            "dofile('/etc/passwd')", "error(string.rep('x', 10 * 2^20))", "error('\\27[31m[/x] red\\n\\r')",
            "local m = nn.Sequential() m:add(m) return m",
            "local m = nn.ReLU() for i = 1, 1000 do m = nn.Sequential():add(m) end return m",
            "return nn.SpatialConvolution(3, 2^31, 3, 3)", "return nn.Linear(1e9, 1e9)",
            "return nn.SpatialConvolution(0/0, 1/0, -1, 0)", "local co = coroutine.wrap(function() while true "
            "do coroutine.yield() end end) while true do co() end", "return getmetatable('').__index.rep('x', 1e10)",
            f"setmetatable({{}}, {{__gc = function() os.execute('{touch}') end}}) return nn.ReLU()",
            "return setmetatable({}, {__index = function() while true do end end})",
            "local m = nn.Sequential():add(nn.ReLU()) m.modules = setmetatable({}, {__len = function() while "
            "true do end end, __index = function() while true do end end}) return m",
            "local m = nn.Linear(2, 2) m.weight = setmetatable({}, {__index = function() error(string.rep('y', "
            "1e7)) end}) return m", "local m = nn.ReLU() m.__typename = '\\n__import__(\"os\").system(\""
            f"{touch}\")' return m", "collectgarbage('stop') local t = {} for i = 1, 1e9 do t[i] = {} end",
            "return nn.View(-1):setNumInputDims(1e300)", "return 42", "return nil", "return {}", "x = = 1",
            "\x1bLua"]


def _objects(tree: Any, seen: set[int] | None = None) -> list[Any]:
    """Every TorchObject of a tree, once each."""
    from convert.torch7.t7file import TorchObject

    seen = set() if seen is None else seen
    if id(tree) in seen or not isinstance(tree, (dict, TorchObject)):
        return []
    seen.add(id(tree))
    found = [tree] if isinstance(tree, TorchObject) else []
    for v in (tree.fields if isinstance(tree, TorchObject) else tree).values():
        found += _objects(v, seen)
    return found


def mutate_tree(tree: Any, rng: random.Random, hostile: list[str]) -> Any:
    """Structural edits: hostile class names, cycles, deep nesting, stride-0 and huge tensors, extreme fields."""
    from convert.torch7.t7file import TorchObject
    from convert.torch7.t7write import Strided

    objs = _objects(tree)
    for _ in range(rng.randint(1, 3)):
        o, op = rng.choice(objs), rng.randrange(7)
        arrays = [k for k, v in o.fields.items() if isinstance(v, np.ndarray)]
        if op == 0:
            o.cls = rng.choice([rng.choice(hostile), "nn." + rng.choice(hostile), "cudnn.Nope", "torch.FloatTensor"])
            o.fields[rng.choice(["name", "_type", rng.choice(hostile)])] = rng.choice(hostile)
        elif op == 1 and "modules" in o.fields:
            o.fields["modules"][len(o.fields["modules"]) + 1] = rng.choice([o, tree])
        elif op == 2:
            for _ in range(rng.choice([50, 400, 3000])):
                tree = TorchObject("nn.Sequential", {"modules": {1: tree}, "train": False})
        elif op == 3 and arrays:
            n = rng.choice([1, 2**20, 2**40])
            o.fields[rng.choice(arrays)] = Strided(np.ones(rng.choice([0, 1, 4]), np.float32), (n, n, 3, 3),
                                                   rng.choice([(0, 0, 0, 0), (1, 1, 1, 1), (-1, 1, 1, 1)]))
        elif op == 4:
            nums = [k for k, v in o.fields.items() if isinstance(v, (int, float))] or ["kW"]
            o.fields[rng.choice(nums)] = float(rng.choice(EXTREMES))
        elif op == 5 and o.fields:  # a field missing, or of another type (string, object, table, nil...)
            k = rng.choice(list(o.fields))
            o.fields.pop(k)
            if rng.random() < 0.7:
                o.fields[k] = rng.choice([rng.choice(hostile), TorchObject("torch.Nope"), {1: "x"}, {}, True, None,
                                          np.zeros((2, 2), np.int64), float(rng.choice(EXTREMES))])
        elif arrays:
            shape = rng.choice([(0,), (2, 2), (7,)])
            o.fields[rng.choice(arrays)] = np.zeros(shape, rng.choice([np.float32, np.int64]))
    return tree


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Flip bits, truncate, insert 0xFF runs, huge varints, wrong int32 lengths, random bytes."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i, op = rng.randrange(len(b) + 1), rng.randrange(6)
        if op == 0 and i < len(b):
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            del b[max(i, 1):]
        elif op == 2:
            b[i:i] = b"\xff" * rng.choice([1, 11, 1000, 2**20])
        elif op == 3:
            b[i:i] = rng.choice([b"\xff" * 9 + b"\x01", b"\x80" * 20, b"\x3a\xff\xff\xff\xff\x0f"])
        elif op == 4:
            b[i:i + 4] = int(rng.choice([-1, 0, 2**31 - 1, -(2**31), 65536])).to_bytes(4, "little", signed=True)
        elif i < len(b):
            b[i] = rng.randrange(256)
    return bytes(b)


# ---------------------------------------------------------------- cases
@dataclass
class Case:
    gen: str
    files: dict[str, bytes]  # file name in the input folder -> content; the first is the model
    cmds: list[list[str]] = field(default_factory=list)  # {in}/NAME, {out}, @OUTDIR (the converted folder)


STEMS = ["net", "net", "net", "..", ".", "", "forward", "x²", "ﬁ", "[red]x", '"""', "a b", "\x1b[31mx",
         "'''\n__import__('os').system('touch CANARY')\n'''", "\n__import__('os').system('touch CANARY')", "-rf"]


class Generators:
    def __init__(self, rng: random.Random, canary: str, scratch: Path) -> None:
        self.rng, self.hostile, self.scratch = rng, hostile_strings(canary), scratch
        self.lua_hostile, self.protos = hostile_lua(canary), prototxt_sources()
        self.golden = sorted((CORPUS / "caffe-golden").glob("*.caffemodel"))
        self.t7_golden = sorted((CORPUS / "torch7-golden").glob("*_net.*"))

    def commands(self, model: str, extra: list[str]) -> list[list[str]]:
        r, src = self.rng.random(), f"{{in}}/{model}"
        if r < 0.3:
            return [["info", src, *[a for a in extra if a != "--weights" and not a.startswith("{in}/w")]]]
        if r < 0.75:
            return [["convert", src, "--out", "{out}", "--no-verify", *extra]]
        cmds = [["convert", src, "--out", "{out}", *extra]]
        return cmds + [["verify", "@OUTDIR"]] * (self.rng.random() < 0.4)

    def stem(self, suffix: str) -> str:
        return self.rng.choice(STEMS) + suffix

    def proto_mutate(self) -> Case:
        src = self.rng.choice(self.protos)
        text = mutate_text(src.read_text(errors="replace"), self.rng, self.hostile)
        name = self.stem(".prototxt")
        big = src.parent.name == "prototxt" or src.stat().st_size > 2500  # full-size nets: shapes only
        cmds = [["info", f"{{in}}/{name}"]] if big else self.commands(name, [])
        return Case("prototxt-mutate", {name: text.encode()}, cmds)

    def proto_grammar(self) -> Case:
        text = grammar_net(self.rng, self.hostile, self.rng.choice([0.0, 0.05, 0.2]))
        if self.rng.random() < 0.3:
            text = mutate_text(text, self.rng, self.hostile)
        name = self.stem(".prototxt")
        return Case("prototxt-grammar", {name: text.encode()}, self.commands(name, []))

    def caffemodel(self) -> Case:
        from convert.caffe import binary, frontend

        if self.golden and self.rng.random() < 0.3:
            w = self.rng.choice(self.golden)
            proto, data = w.with_suffix(".prototxt").read_text(), w.read_bytes()
        else:
            proto, data = self._valid_net(binary, frontend)
        data = mutate_bytes(data, self.rng) if self.rng.random() < 0.8 else data
        proto = mutate_text(proto, self.rng, self.hostile) if self.rng.random() < 0.3 else proto
        args = ["--weights", "{in}/w.caffemodel"]
        return Case("caffemodel", {"net.prototxt": proto.encode(), "w.caffemodel": data},
                    self.commands("net.prototxt", args))

    def _valid_net(self, binary: Any, frontend: Any) -> tuple[str, bytes]:
        p = self.scratch / "net.prototxt"
        for _ in range(20):
            p.write_text(grammar_net(self.rng, [], 0.0))
            try:
                with _alarm(10):
                    model = frontend.read(p, seed=0)
                binary.write(self.scratch / "w.caffemodel", model.layers, "net")
                return p.read_text(), (self.scratch / "w.caffemodel").read_bytes()
            except Exception:  # an invalid random net: draw another
                continue
        raise RuntimeError("no valid grammar net in 20 draws")

    def t7(self) -> Case:
        name, shape = self.rng.choice(["net.t7"] * 4 + ["net.dat", "net.net", self.stem(".t7")]), None
        if self.t7_golden and self.rng.random() < 0.3:
            net = self.rng.choice(self.t7_golden)
            data, shape = net.read_bytes(), _golden_shape(net)
        else:
            data, shape = self._valid_t7()
        if self.rng.random() < 0.6:
            data = mutate_bytes(data, self.rng)
        extra = ["--input-shape", shape] if shape and self.rng.random() < 0.9 else []
        return Case("t7", {name: data}, self.commands(name, extra))

    def _valid_t7(self) -> tuple[bytes, str]:
        from convert.torch7 import lua, t7write

        script, shape = grammar_lua(self.rng)
        p = self.scratch / "def.lua"
        p.write_text(script)
        with _alarm(20):
            tree = lua.run_definition(p, max_seconds=10)
        if self.rng.random() < 0.5:
            tree = mutate_tree(tree, self.rng, self.hostile)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(30000)  # deep nesting is one of the mutations
        try:
            return t7write.dumps(tree), "input=" + ",".join(map(str, shape))
        except (RecursionError, TypeError, OverflowError, ValueError):
            return t7write.dumps(lua.run_definition(p, max_seconds=10)), "input=" + ",".join(map(str, shape))
        finally:
            sys.setrecursionlimit(limit)

    def lua(self) -> Case:
        if self.rng.random() < 0.35:
            prefix = "require 'nn'\n" * (self.rng.random() < 0.7)
            script, shape = prefix + self.rng.choice(self.lua_hostile), (1, 3, 8, 8)
        else:
            script, shape = grammar_lua(self.rng)
            if self.rng.random() < 0.3:
                script = mutate_text(script, self.rng, self.hostile)
        name = self.stem(".lua") if self.rng.random() < 0.3 else "def.lua"
        extra = ["--input-shape", "input=" + ",".join(map(str, shape))]
        return Case("lua", {name: script.encode()}, self.commands(name, extra))

    def draw(self) -> Case:
        gens = [self.proto_mutate, self.proto_grammar, self.caffemodel, self.t7, self.lua]
        return self.rng.choices(gens, weights=[3, 3, 1.5, 1.5, 1.5])[0]()


def _golden_shape(net: Path) -> str:
    """The input shape of a torch7-golden case, read from its ``_input`` file."""
    from convert.torch7 import t7file

    try:
        x = t7file.load(net.with_name(net.name.replace("_net.", "_input.")))
        return "input=" + ",".join(map(str, x.shape))
    except Exception:
        return "input=1,3,8,8"


class _alarm:
    """A time limit on generation work done in the parent (SIGALRM)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        def fire(*_: Any) -> None:
            raise TimeoutError("generation took too long")

        signal.signal(signal.SIGALRM, fire)
        signal.alarm(self.seconds)

    def __exit__(self, *_: Any) -> None:
        signal.alarm(0)


# ---------------------------------------------------------------- the fork server
def _child(argv: list[str], work: Path, logs: Path) -> None:
    """In the forked child: run the CLI in-process, exit with its code (TB_CODE for an escaped exception)."""
    code = TB_CODE
    try:
        os.setpgid(0, 0)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(logs / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.chdir(work)
        os.environ["TMPDIR"] = str(work / "tmp")
        os.environ["ZOO_MEMORY_BUDGET"] = str(MEMORY // 4)  # zoo refuses past this; the parent kills at MEMORY
        tempfile.tempdir = None
        import torch

        from zoo import cli

        torch.set_num_threads(1)
        try:
            cli.app(args=argv, prog_name="zoo")  # standalone: exit codes as a user sees them
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        (logs / "traceback").write_text(traceback.format_exc())
        code = TB_CODE
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _tree_rss(proc: Any) -> tuple[int, list[Any]]:
    import psutil

    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, []
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total, procs


def run_one(argv: list[str], work: Path, logs: Path, limit: float) -> tuple[str, float]:
    """One CLI call in a forked child; its outcome class and seconds."""
    import psutil

    for f in ("stdout", "stderr", "traceback"):
        (logs / f).unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(argv, work, logs)
    proc, t0, next_check, procs = psutil.Process(pid), time.monotonic(), 0.0, []
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        secs = time.monotonic() - t0
        if done:
            code = os.waitstatus_to_exitcode(status)
            return {0: "ok", 1: "mismatch", 2: "error", TB_CODE: "traceback"}.get(code, "crash"), secs
        verdict = "hang" if secs > limit else None
        if secs >= next_check:
            rss, found = _tree_rss(proc)
            procs = found or procs
            verdict = verdict or ("memory" if rss > MEMORY else None)
            next_check = secs + 0.5
        if verdict:
            _kill(pid, procs)
            return verdict, secs
        time.sleep(0.02)


def _kill(pid: int, procs: list[Any]) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), *[p.kill for p in procs]):
        try:
            target()
        except (OSError, Exception):
            pass
    os.waitpid(pid, 0)


def _snapshot(work: Path) -> set[str]:  # tmp/.ses: onnxruntime's telemetry session id, not zoo's
    return {str(p.relative_to(work)) for p in work.rglob("*")}


def run_case(case: Case, root: Path) -> list[tuple[str, list[str], float]]:
    """Every command of a case in a fresh work folder: (class, argv, seconds) per command run."""
    work, logs, canary = root / "w", root / "logs", root / "CANARY"
    shutil.rmtree(work, ignore_errors=True)
    for d in (work / "in", work / "out", work / "tmp", logs):
        d.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (work / "in" / name).write_bytes(data)
    before, results = _snapshot(work), []
    for cmd in case.cmds:
        argv = _resolve(cmd, work)
        if argv is None:
            continue
        limit = 60.0 if cmd[0] in ("convert", "verify") and "--no-verify" not in cmd else 20.0
        cls, secs = run_one(argv, work, logs, limit)
        cls = _judge(cls, work, before, logs, canary)
        results.append((cls, argv, secs))
        if cls != "ok" and cmd[0] == "convert":
            break
    return results


def _judge(cls: str, work: Path, before: set[str], logs: Path, canary: Path) -> str:
    """The exit's class, overridden by what the command left behind."""
    after = _snapshot(work)
    if canary.exists() or any(Path(p).name == "CANARY" for p in after):
        canary.unlink(missing_ok=True)
        return "code-exec"
    if any(not (p in before or p.startswith(("out/", "tmp/")) or p in ("out", "tmp")) for p in after):
        return "escape"
    left = [p for p in (work / "tmp").iterdir() if p.name != ".ses"]
    left += [p for p in (work / "out").iterdir() if p.name.startswith(".")]
    if left and cls in ("ok", "mismatch", "error"):
        return "leftover"
    return "unclean-output" if cls == "error" and _unclean(logs) else cls


def _unclean(logs: Path) -> bool:
    """Control characters (ANSI escapes) reached the terminal: hostile text went out unfiltered."""
    text = b"".join((logs / f).read_bytes() for f in ("stdout", "stderr") if (logs / f).exists())
    return re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", text) is not None


def _resolve(cmd: list[str], work: Path) -> list[str] | None:
    argv = []
    for a in cmd:
        if a == "@OUTDIR":
            dirs = [d for d in (work / "out").iterdir() if d.is_dir() and not d.name.startswith(".")]
            if not dirs:
                return None
            a = str(dirs[0])
        argv.append(a.replace("{in}", str(work / "in")).replace("{out}", str(work / "out")))
    return argv


# ---------------------------------------------------------------- the loop and its findings
def finding_key(cls: str, gen: str, logs: Path) -> str:
    """Findings are deduplicated by exception type and last frame (tracebacks), else class and generator."""
    tb = logs / "traceback"
    if cls != "traceback" or not tb.exists():
        return f"{cls} {gen}"
    lines = tb.read_text(errors="replace").strip().splitlines()
    frames = re.findall(r'File "([^"]+)", line (\d+)', "\n".join(lines))
    last = f"{Path(frames[-1][0]).relative_to(ROOT) if frames[-1][0].startswith(str(ROOT)) else frames[-1][0]}" \
           f":{frames[-1][1]}" if frames else "?"
    exc = next((ln.split(":")[0] for ln in reversed(lines) if ln and not ln.startswith(" ")), "?")
    return f"traceback {exc} {last}"


def _save(key: str, case: Case, argv: list[str], root: Path, dest: Path) -> str:
    slug = re.sub(r"[^\w.-]+", "_", key)[:80] + "-" + hashlib.sha1(key.encode()).hexdigest()[:6]
    d = dest / slug
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    names = {}
    for i, (name, data) in enumerate(case.files.items()):
        safe = name if re.fullmatch(r"[\w-][\w.-]*", name) else f"input{i}{Path(name).suffix[:10]}"
        names[name] = safe
        (d / safe).write_bytes(data)
    work_in = str(root / "w" / "in")
    cmd = [a.replace(work_in, "DIR") for a in argv]
    logs = [f"== {f}\n" + (root / "logs" / f).read_text(errors="replace")[-4000:]
            for f in ("traceback", "stderr") if (root / "logs" / f).exists()]
    (d / "repro.txt").write_text(f"key: {key}\ngenerator: {case.gen}\nfiles: {names!r}\ncommand (DIR = this "
                                 f"folder, original names above): zoo {cmd!r}\n\n" + "\n".join(logs))
    return str(d)


def run(seconds: float, seed: int = 0, max_inputs: int | None = None, dest: Path | None = None,
        log: Any = print) -> dict[str, Any]:
    """Fuzz for ``seconds`` (or ``max_inputs`` cases); returns counts per generator and class, and findings."""
    import torch  # noqa: F401  (imported once here, not in every child)

    import zoo.cli  # noqa: F401

    root = Path(tempfile.mkdtemp(prefix="zoo-fuzz-"))
    scratch = root / "scratch"
    scratch.mkdir()
    rng = random.Random(seed)
    gens = Generators(rng, str(root / "CANARY"), scratch)
    inputs, commands = Counter(), Counter()
    outcomes: dict[str, Counter] = {}
    findings: dict[str, dict[str, Any]] = {}
    t_end, n = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < t_end and (max_inputs is None or n < max_inputs):
            try:
                case = gens.draw()
            except Exception as e:  # a generator's own failure is not a finding of zoo
                log(f"generator failed: {type(e).__name__}: {e}")
                continue
            n += 1
            inputs[case.gen] += 1
            for cls, argv, secs in run_case(case, root):
                outcomes.setdefault(case.gen, Counter())[cls] += 1
                commands[argv[0] + " --no-verify" * ("--no-verify" in argv)] += 1
                if cls in FATAL or cls in NOTABLE:
                    key, size = finding_key(cls, case.gen, root / "logs"), sum(map(len, case.files.values()))
                    f = findings.setdefault(key, {"class": cls, "count": 0, "size": None})
                    f["count"] += 1
                    if dest is not None and (f["size"] is None or size < f["size"]):
                        f.update(size=size, reproducer=_save(key, case, argv, root, dest), command=argv[0],
                                 seconds=round(secs, 1))
                    log(f"[{n}] {cls}: {key} ({secs:.1f}s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fatal = sum(f["count"] for f in findings.values() if f["class"] in FATAL)
    return {"seed": seed, "seconds": seconds, "inputs": n, "inputs_per_generator": dict(inputs),
            "commands": dict(commands),
            "outcomes": {g: dict(c) for g, c in outcomes.items()},
            "totals": dict(sum(outcomes.values(), Counter())), "fatal": fatal, "findings": findings}
