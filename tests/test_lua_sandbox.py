"""Lua model definitions: the recorded module tree, the script conventions, and the sandbox."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus

from convert.torch7 import t7file
from convert.torch7.lua import LuaError, run_definition
from convert.torch7.t7file import TorchObject

pytest.importorskip("lupa")


def run(tmp_path: Path, text: str, **kwargs) -> TorchObject:
    path = tmp_path / "model.lua"
    path.write_text(text)
    return run_definition(path, **kwargs)


def fails(tmp_path: Path, text: str, match: str, **kwargs) -> str:
    start = time.monotonic()
    with pytest.raises(LuaError, match=match) as err:
        run(tmp_path, text, **kwargs)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "model.lua"))
    assert time.monotonic() - start < 5
    return message


def children(obj: TorchObject) -> list[TorchObject]:
    mods = obj.fields["modules"]
    assert list(mods) == list(range(1, len(mods) + 1))  # a Lua list, as the .t7 reader gives it
    return list(mods.values())


VGG_LIKE = """
require 'nn'
local cfg = {16, 'M', 32, 32, 'M'}
local function block(model, nIn, nOut)
  model:add(nn.SpatialConvolution(nIn, nOut, 3, 3, 1, 1, 1, 1))
       :add(nn.SpatialBatchNormalization(nOut, 1e-3))
       :add(nn.ReLU(true))
  return nOut
end
local model = nn.Sequential()
local n = opt.channels or 3
for _, v in ipairs(cfg) do
  if v == 'M' then model:add(nn.SpatialMaxPooling(3, 3, 2, 2):ceil()) else n = block(model, n, v) end
end
model:add(nn.View(-1):setNumInputDims(3))
model:add(nn.Dropout(0.5))
model:add(nn.Linear(32 * 7 * 7, opt.classes or 10))
model:add(nn.LogSoftMax())
assert(#model.modules == model:size() and model:get(1).kW == 3)
return model
"""


def test_definition_tree(tmp_path):
    root = run(tmp_path, VGG_LIKE)
    assert root.cls == "nn.Sequential" and root.version == 1
    mods = children(root)
    assert [m.cls.split(".")[1] for m in mods] == (
        ["SpatialConvolution", "SpatialBatchNormalization", "ReLU", "SpatialMaxPooling"]
        + ["SpatialConvolution", "SpatialBatchNormalization", "ReLU"] * 2
        + ["SpatialMaxPooling", "View", "Dropout", "Linear", "LogSoftMax"])
    conv = mods[4].fields
    assert {k: conv[k] for k in ("nInputPlane", "nOutputPlane", "kW", "kH", "dW", "dH", "padW", "padH")} == \
        dict(nInputPlane=16, nOutputPlane=32, kW=3, kH=3, dW=1, dH=1, padW=1, padH=1)
    assert conv["weight"].shape == (32, 16, 3, 3) and conv["weight"].dtype == np.float32
    assert conv["bias"].shape == (32,)
    assert abs(conv["weight"].std() - np.sqrt(2 / (16 * 9))) < 0.02  # He normal
    assert np.abs(conv["bias"]).max() <= 0.1
    bn = mods[1]
    assert bn.version == 2 and bn.fields["eps"] == 0.001 and bn.fields["affine"] is True
    assert np.all(bn.fields["running_mean"] == 0) and np.all(bn.fields["running_var"] == 1)
    assert 0.5 <= bn.fields["weight"].min() and bn.fields["weight"].max() <= 1.5
    assert mods[2].fields == {"_type": "torch.DoubleTensor", "inplace": True, "threshold": 0, "val": 0}
    pool = mods[3].fields
    assert (pool["kW"], pool["dW"], pool["padW"], pool["ceil_mode"]) == (3, 2, 0, True)
    view = mods[11].fields
    assert list(view["size"]) == [-1] and view["numInputDims"] == 3
    assert mods[12].fields["p"] == 0.5 and mods[12].fields["v2"] is True
    assert mods[13].fields["weight"].shape == (10, 32 * 7 * 7)
    assert isinstance(conv["kW"], int) and isinstance(bn.fields["momentum"], float)


def test_seeded_weights(tmp_path):
    a, b, c = (run(tmp_path, VGG_LIKE, seed=s) for s in (0, 0, 1))
    wa, wb, wc = (children(m)[4].fields["weight"] for m in (a, b, c))
    assert np.array_equal(wa, wb) and not np.array_equal(wa, wc)
    assert np.array_equal(children(a)[13].fields["bias"], children(b)[13].fields["bias"])


def test_args_and_function_convention(tmp_path):
    text = """
    local function createModel(opt)
      assert(opt.depth == 18 and math.type(opt.depth) == 'integer', 'depth')
      assert(opt.lr == 0.5 and opt.cuda == true and opt.fast == false and opt.name == 'net18', 'args')
      local m = nn.Sequential():add(nn.Linear(opt.inputs, 4))
      m.name = opt.name
      return m
    end
    return createModel
    """
    args = {"depth": "18", "lr": "0.5", "cuda": "true", "fast": "false", "name": "net18", "inputs": "6"}
    root = run(tmp_path, text, args=args)
    assert root.fields["name"] == "net18"
    assert children(root)[0].fields["weight"].shape == (4, 6)


def test_global_model_convention(tmp_path):
    assert run(tmp_path, "model = nn.Sequential():add(nn.Tanh())").cls == "nn.Sequential"
    assert run(tmp_path, "net = nn.ReLU()").cls == "nn.ReLU"
    fails(tmp_path, "local x = 1", "returned no nn module")
    fails(tmp_path, "return {1, 2}", "returned no nn module")


def test_cudnn_aliases_and_idioms(tmp_path):
    text = """
    local nn = require 'nn'
    require 'cunn'
    local cudnn = require 'cudnn'
    torch.setdefaulttensortype('torch.FloatTensor')
    local Conv = cudnn.SpatialConvolution
    local m = nn.Sequential()
    m:add(Conv(4, 8, 3, 3, 1, 1, 1, 1, 2):noBias())
    m:add(cudnn.SpatialBatchNormalization(8)):add(cudnn.ReLU(true))
    m:add(cudnn.SpatialAveragePooling(2, 2, 2, 2):floor())
    m:add(nn.SpatialConvolution(8, 8, 1, 1))
    for _, c in ipairs(m:findModules('cudnn.SpatialConvolution')) do c.weight:normal(0, 0.01) end
    m:add(nn.View(8 * 2 * 2)):add(nn.Linear(32, 3)):add(cudnn.SoftMax())
    m:cuda():evaluate():reset()
    local t = torch.Tensor(2, 3)
    assert(t:size(2) == 3 and t:dim() == 2 and t:nElement() == 6)
    return m
    """
    root = run(tmp_path, text)
    mods = children(root)
    assert [m.cls for m in mods] == [
        "cudnn.SpatialConvolution", "cudnn.SpatialBatchNormalization", "cudnn.ReLU",
        "cudnn.SpatialAveragePooling", "nn.SpatialConvolution", "nn.View", "nn.Linear", "cudnn.SoftMax"]
    conv = mods[0].fields
    assert conv["groups"] == 2 and conv["weight"].shape == (8, 2, 3, 3) and "bias" not in conv
    assert mods[1].fields["train"] is False and mods[2].fields["threshold"] == 0
    assert mods[3].fields["count_include_pad"] is True and mods[3].fields["divide"] is True
    assert all(m.fields["_type"] == "torch.CudaTensor" for m in [root, *mods])
    assert list(mods[5].fields["size"]) == [32] and mods[5].fields["numElements"] == 32
    converted = run(tmp_path, text.replace("return m", "return cudnn.convert(m, nn)"))
    assert [m.cls.split(".")[0] for m in children(converted)] == ["nn"] * 8
    assert "groups" in children(converted)[0].fields  # grouped: kept, nn has no groups field to drop it to


RESNET = """
-- A residual network in the style of fb.resnet.torch's models/resnet.lua (createModel(opt)).
local nn = require 'nn'
require 'cunn'
local Convolution, Avg = cudnn.SpatialConvolution, cudnn.SpatialAveragePooling
local ReLU, Max, SBatchNorm = cudnn.ReLU, nn.SpatialMaxPooling, nn.SpatialBatchNormalization

local function createModel(opt)
  local depth, iChannels = opt.depth, 64
  local function shortcut(nIn, nOut, stride)
    if nIn ~= nOut then
      return nn.Sequential():add(Convolution(nIn, nOut, 1, 1, stride, stride)):add(SBatchNorm(nOut))
    end
    return nn.Identity()
  end
  local function basicblock(n, stride)
    local nIn = iChannels
    iChannels = n
    local s = nn.Sequential()
    s:add(Convolution(nIn, n, 3, 3, stride, stride, 1, 1)):add(SBatchNorm(n)):add(ReLU(true))
    s:add(Convolution(n, n, 3, 3, 1, 1, 1, 1)):add(SBatchNorm(n))
    return nn.Sequential():add(nn.ConcatTable():add(s):add(shortcut(nIn, n, stride)))
                          :add(nn.CAddTable(true)):add(ReLU(true))
  end
  local function layer(block, features, count, stride)
    local s = nn.Sequential()
    for i = 1, count do s:add(block(features, i == 1 and stride or 1)) end
    return s
  end
  local cfg = {[10] = {1, 1, 1, 1}, [18] = {2, 2, 2, 2}}
  assert(cfg[depth], 'Invalid depth: ' .. tostring(depth))
  local def = cfg[depth]
  local model = nn.Sequential()
  model:add(Convolution(3, 64, 7, 7, 2, 2, 3, 3)):add(SBatchNorm(64)):add(ReLU(true))
  model:add(Max(3, 3, 2, 2, 1, 1))
  model:add(layer(basicblock, 64, def[1])):add(layer(basicblock, 128, def[2], 2))
  model:add(layer(basicblock, 256, def[3], 2)):add(layer(basicblock, 512, def[4], 2))
  model:add(Avg(7, 7, 1, 1)):add(nn.View(512):setNumInputDims(3)):add(nn.Linear(512, 1000))
  for _, name in ipairs({'cudnn.SpatialConvolution', 'nn.SpatialConvolution'}) do
    for _, v in pairs(model:findModules(name)) do
      v.weight:normal(0, math.sqrt(2 / (v.kW * v.kH * v.nOutputPlane)))
      if cudnn.version >= 4000 then v.bias = nil; v.gradBias = nil else v.bias:zero() end
    end
  end
  model:type(opt.tensorType)
  if opt.cudnn == 'deterministic' then
    model:apply(function(m) if m.setMode then m:setMode(1, 1, 1) end end)
  end
  model:get(1).gradInput = nil
  return model
end
return createModel
"""


def test_resnet_style_definition(tmp_path):
    args = {"depth": "18", "tensorType": "torch.CudaTensor", "cudnn": "deterministic"}
    root = run(tmp_path, RESNET, args=args)
    mods = children(root)
    assert [len(children(m)) for m in mods[4:8]] == [2, 2, 2, 2]
    block = children(mods[5])[0]
    table, add, relu = children(block)
    assert (table.cls, add.cls, add.fields["inplace"], relu.cls) == ("nn.ConcatTable", "nn.CAddTable", True,
                                                                     "cudnn.ReLU")
    residual, short = children(table)
    assert [m.cls for m in children(short)] == ["cudnn.SpatialConvolution", "nn.SpatialBatchNormalization"]
    assert children(short)[0].fields["dW"] == 2
    assert children(residual)[0].fields["weight"].shape == (128, 64, 3, 3)
    assert "bias" not in children(residual)[0].fields  # the script removed it, as fb.resnet does
    convs = [m for m in _walk(root) if m.cls == "cudnn.SpatialConvolution"]
    assert len(convs) == 1 + 16 + 3 and all(m.fields["_type"] == "torch.CudaTensor" for m in convs)
    assert mods[-1].fields["weight"].shape == (1000, 512) and mods[-2].fields["numInputDims"] == 3
    fails(tmp_path, RESNET, r"model\.lua:\d+: Invalid depth: 7", args={"depth": "7"})


def _walk(obj: TorchObject):
    yield obj
    for m in obj.fields.get("modules", {}).values():
        yield from _walk(m)


def test_torch_idioms(tmp_path):
    text = """
    local Scale, parent = torch.class('nn.MyScale', 'nn.Module')
    function Scale:__init(s) parent.__init(self); self.scale = s end
    local v = nn.View(torch.LongStorage({2, 3}))
    local t = torch.Tensor({{1, 2, 3}, {4, 5, 6}})
    assert(torch.type(t) == 'torch.DoubleTensor' and torch.typename(v) == 'nn.View' and torch.isTensor(t))
    local m = nn.Sequential():add(v):add(nn.MyScale(2)):add(nn.SpatialConvolution(1, 2, 3, 3))
    m.table = {t, flag = true, [2.5] = 'x'}
    return cudnn.convert(m, cudnn)
    """
    mods = children(root := run(tmp_path, text))
    assert list(mods[0].fields["size"]) == [2, 3] and mods[0].fields["numElements"] == 6
    assert mods[1].cls == "nn.MyScale" and mods[1].fields["scale"] == 2
    assert mods[2].cls == "cudnn.SpatialConvolution" and mods[2].fields["groups"] == 1
    table = root.fields["table"]
    assert table["flag"] is True and table[2.5] == "x"
    assert table[1].tolist() == [[1, 2, 3], [4, 5, 6]] and table[1].dtype == np.float32


def test_unknown_classes_are_recorded(tmp_path):
    text = """
    local m = nn.Sequential():add(nn.SpatialConvolution(3, 4, 3, 3))
    m:add(nn.FancyNorm(4, 0.5, {k = 2})):add(cudnn.VolumetricThing()):add(nn.Tanh())
    return m
    """
    mods = children(run(tmp_path, text))
    assert mods[1].cls == "nn.FancyNorm" and mods[1].fields["_args"] == {1: 4, 2: 0.5, 3: {"k": 2}}
    assert mods[2].cls == "cudnn.VolumetricThing" and mods[2].fields == {"_args": {}}


def test_shared_and_cloned_modules(tmp_path):
    text = """
    local a = nn.Linear(3, 3)
    local b = a:clone('weight', 'bias')
    local c = a:clone()
    return nn.Sequential():add(a):add(b):add(c):add(a)
    """
    a, b, c, a2 = children(run(tmp_path, text))
    assert a2 is a and b is not a and b.fields["weight"] is a.fields["weight"]
    assert not np.array_equal(c.fields["weight"], a.fields["weight"])


def test_lp_pooling_is_recorded_as_torch_builds_it(tmp_path):
    lp = run(tmp_path, "return nn.SpatialLPPooling(4, 2, 3, 3, 2, 2)")
    assert [m.cls for m in children(lp)] == [
        "nn.Square", "nn.SpatialAveragePooling", "nn.MulConstant", "nn.Sqrt"]
    assert children(lp)[2].fields["constant_scalar"] == 9 and lp.fields["dW"] == 2


# ---------------------------------------------------------------- errors and the sandbox

def test_syntax_error_has_line(tmp_path):
    msg = fails(tmp_path, "local m = nn.Sequential()\n\nlocal = 3\n", r"model\.lua:3:")
    assert "near" in msg


def test_runtime_errors_have_line(tmp_path):
    fails(tmp_path, "local x = 1\nlocal y = nil\nreturn y.z", r"model\.lua:3: attempt to index")
    fails(tmp_path, "\nerror('custom failure')", r"model\.lua:2: custom failure")
    fails(tmp_path, "local m = nn.Sequential()\nm:add(nn.ReLU)", r"model\.lua:2: .*call it: nn\.ReLU")
    fails(tmp_path, "\n\nlocal c = nn.SpatialConvolution(3, nil, 3, 3)",
          r"model\.lua:3: .*nOutputPlane must be a number")
    fails(tmp_path, "local v = nn.View(2)\nv.size = nil\nreturn nn.Sequential():add(v):add(nn.Linear(2))",
          r"model\.lua:3: torch.Tensor: size 1 is nil")
    fails(tmp_path, "\nerror({})", r"model\.lua:2: \(error object is a table value\)")


ESCAPES = {
    "io.open": ("local f = io.open('/etc/passwd')", "io is not available"),
    "os.execute": ("os.execute('touch /tmp/pwned')", "os is not available"),
    "io.popen": ("io.popen('id')", "io is not available"),
    "require os": ("local os = require 'os'", "only nn, cudnn"),
    "require nngraph": ("require 'nngraph'", "nngraph graphs are not supported"),
    "dofile": ("dofile('/etc/passwd')", "dofile is not available"),
    "loadfile": ("loadfile('/etc/passwd')", "loadfile is not available"),
    "load string": ("load('return 1')()", "load is not available"),
    "loadstring": ("loadstring('return 1')()", "loadstring is not available"),
    "string.dump": ("string.dump(function() end)", "string.dump is not available"),
    "dump via metatable": ("local d = ('').dump\nreturn d(print)", "attempt to call a nil value"),
    "string metatable": ("getmetatable('').__index = {}", "attempt to index a boolean value"),
    "debug.getinfo": ("debug.getinfo(1)", "debug is not available"),
    "package.loadlib": ("package.loadlib('libc.so.6', 'system')", "package is not available"),
    "collectgarbage": ("collectgarbage('count')", "collectgarbage is not available"),
    "coroutine": ("coroutine.create(print)", "coroutine is not available"),
    "python global": ("python.eval('1')", "python is not available"),
    "rawget _G": ("local p = rawget(_G, 'python') or rawget(_G, 'io') or rawget(_G, 'debug')\n"
                  "return p.eval('1')", "model.lua:2: attempt to index a nil value"),
    "__gc": ("setmetatable({}, {__gc = function() end})", "__gc metamethods are not available"),
    "library upvalues": ("local f = nn.Sequential.add\nreturn f.debug", "attempt to index a function value"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_sandbox_escape_fails(tmp_path, name):
    text, match = ESCAPES[name]
    fails(tmp_path, text, match)


def test_no_python_object_is_reachable(tmp_path):
    # lupa wraps Python objects as userdata: walk everything the script can reach without debug.*
    text = """
    local seen, found = {}, {}
    local function walk(v, path)
      if type(v) == 'userdata' then found[#found + 1] = path end
      if (type(v) ~= 'table' and type(v) ~= 'string') or seen[v] then return end
      seen[v] = true
      local mt = getmetatable(v)
      if mt then walk(mt, path .. '<mt>') end
      if type(v) ~= 'table' then return end
      for k, x in next, v do walk(k, path .. '[k]'); walk(x, path .. '.' .. tostring(k)) end
    end
    walk(_G, '_G')
    walk(getmetatable(''), 'string mt')
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert(#found == 0 and n > 300, table.concat(found, ' '))
    return nn.Identity()
    """
    assert run(tmp_path, text).cls == "nn.Identity"


def test_bytecode_refused(tmp_path):
    path = tmp_path / "model.lua"
    path.write_bytes(b"\x1bLuaT\x00\x19\x93\r\n\x1a\n\x04\x08\x08xV\x00\x00")
    with pytest.raises(LuaError, match="bytecode is refused"):
        run_definition(path)


def test_source_handling(tmp_path):
    assert run(tmp_path, "#!/usr/bin/env th\nreturn nn.Tanh()").cls == "nn.Tanh"  # shebang skipped
    fails(tmp_path, "#!/usr/bin/env th\n\nerror('x')", r"model\.lua:3: x")  # line numbers kept
    with pytest.raises(LuaError, match="cannot read"):
        run_definition(tmp_path / "missing.lua")


def test_infinite_loop_stops(tmp_path):
    fails(tmp_path, "while true do end", r"ran longer than the limit \(100000 instructions",
          max_instructions=100_000)


def test_pcall_cannot_swallow_the_stop(tmp_path):
    text = "while true do pcall(function() while true do end end) end"
    fails(tmp_path, text, "ran longer than the limit", max_instructions=100_000)
    # The stop is raised inside the hook, where Lua runs message handlers with hooks off.
    text = "xpcall(function() while true do end end, function() while true do end end)\nwhile true do end"
    fails(tmp_path, text, "ran longer than the limit", max_instructions=100_000)


def test_wall_clock_limit(tmp_path):
    fails(tmp_path, "local t = {}\nwhile true do t[1] = string.rep('x', 10) end", r"/ 0\.2 s\)",
          max_seconds=0.2, max_instructions=10**15)


def test_c_level_cpu_bombs_are_bounded(tmp_path):
    # The count hook does not run inside C functions: backtracking patterns and table.move are bounded.
    fails(tmp_path, "local s = string.rep('a', 300)\nlocal i = s:find('.-.-.-.-b')",
          r"model\.lua:2: .*too costly")
    fails(tmp_path, "error(string.rep('long message ', 1000))", "long message long")
    fails(tmp_path, "local t = {}\ntable.move(t, 1, 1e15, 2)", r"model\.lua:2: table\.move")


def test_memory_bomb_stops(tmp_path):
    text = "local t = {}\nfor i = 1, 1e9 do t[i] = string.rep('x', 1000) .. i end"
    fails(tmp_path, text, "used more than 32 MiB of memory", max_memory=32 * 2**20)
    text = "while true do pcall(function() local t = {} for i = 1, 1e9 do t[i] = i end end) end"
    fails(tmp_path, text, "used more than 32 MiB of memory", max_memory=32 * 2**20)
    fails(tmp_path, "local s = string.rep('x', 2^40)", "memory", max_memory=32 * 2**20)


def test_print_is_captured(tmp_path, caplog):
    caplog.set_level("INFO", logger="convert.torch7.lua")
    run(tmp_path, "print('hello', 42, nil)\nreturn nn.Identity()")
    assert "hello\t42\tnil" in caplog.text


# ---------------------------------------------------------------- traps left behind in the returned model

LOOP = "function() while true do end end"
ALL = ", ".join(f"__{k} = {LOOP}" for k in ("index", "newindex", "len", "pairs", "eq", "lt", "le", "tostring",
                                             "call", "concat", "unm", "add"))
BUILD = """local conv = nn.SpatialConvolution(3, 4, 3, 3)
local m = nn.Sequential():add(conv):add(nn.ReLU())
m.extra = {1, 2, {3}}
"""
TRAPS = {
    "class metatable": f"setmetatable(getmetatable(m), {{__index = {LOOP}}})",
    "class __index": f"getmetatable(m).__index = {LOOP}",
    "base class": f"setmetatable(nn.Module, {{{ALL}}}); setmetatable(nn.Container, {{{ALL}}})",
    "module class": f"getmetatable(conv).__index = {LOOP}; setmetatable(getmetatable(conv), {{{ALL}}})",
    "modules table": f"setmetatable(m.modules, {{{ALL}}})",
    "plain field": f"setmetatable(m.extra, {{{ALL}}}); setmetatable(m.extra[3], {{{ALL}}})",
    "tensor class": f"setmetatable(getmetatable(conv.weight), {{{ALL}}})",
    "tensor sizes": f"setmetatable(conv.weight._size, {{{ALL}}})",
    "opt": f"setmetatable(opt, {{{ALL}}})",
    "field as key": f"m[setmetatable({{}}, {{{ALL}}})] = setmetatable({{}}, {{{ALL}}})",
    "nn library": f"setmetatable(nn, {{{ALL}}}); setmetatable(torch, {{{ALL}}})",
}


@pytest.mark.parametrize("trap", sorted(TRAPS))
def test_traps_after_return_never_run(tmp_path, trap):
    # The host reads the model with raw access only, under the script's limits: a trap set on its way out
    # does not run, so the model converts as it was built.
    start = time.monotonic()
    tree = run(tmp_path, BUILD + TRAPS[trap] + "\nreturn m", max_instructions=10**6, max_seconds=2)
    assert time.monotonic() - start < 5
    conv, relu = children(tree)
    assert (conv.cls, relu.cls) == ("nn.SpatialConvolution", "nn.ReLU")
    assert conv.fields["weight"].shape == (4, 3, 3, 3)


@pytest.mark.parametrize("trap", sorted(TRAPS))
def test_traps_hit_while_running_stop_at_the_limit(tmp_path, trap):
    # The script touching its own traps: whatever they do, it ends within the limits, in one line.
    text = BUILD + TRAPS[trap] + "\nlocal _ = #m.modules + #m.extra[3] + #opt + m.modules[1].weight:size(1)" \
        "\nfor _ in pairs(m) do end\nlocal s = tostring(m) .. tostring(conv.weight) .. tostring(opt.x)" \
        "\nlocal _ = m == conv, m.nothing, conv.weight.nothing, m.extra[3].nothing, opt.nothing" \
        "\nreturn m:add(nn.Tanh())"
    start = time.monotonic()
    try:
        run(tmp_path, text, max_instructions=10**6, max_seconds=2)
    except LuaError as err:
        assert "\n" not in str(err) and str(err).startswith(str(tmp_path / "model.lua"))
    assert time.monotonic() - start < 5


def test_returned_model_replaced_by_a_trap(tmp_path):
    fails(tmp_path, BUILD + f"return setmetatable({{}}, {{{ALL}}})", "returned no nn module",
          max_instructions=10**6, max_seconds=2)
    fails(tmp_path, BUILD + f"return setmetatable(m, {{{ALL}}})", "returned no nn module",
          max_instructions=10**6, max_seconds=2)


def test_cycles_and_deep_tables_from_lua(tmp_path):
    tree = run(tmp_path, "local m = nn.Sequential()\nm:add(m)\nm.me = m\nreturn m")
    assert tree.fields["modules"][1] is tree and tree.fields["me"] is tree
    text = "local t = {}\nfor i = 1, 5000 do t = {t} end\nlocal m = nn.Sequential()\nm.deep = t\nreturn m"
    fails(tmp_path, text, "nested deeper than")
    text = "local m = nn.ReLU()\nfor i = 1, 5000 do m = nn.Sequential():add(m) end\nreturn m"
    fails(tmp_path, text, "nested deeper than")


def test_huge_tensor_refused_before_allocation(tmp_path):
    fails(tmp_path, "local m = nn.Sequential()\nm.w = torch.Tensor(2^31, 2^31)\nreturn m", "memory budget")
    fails(tmp_path, "local m = nn.Linear(2^40, 2^40)\nreturn m", "memory budget|bad size")


# ---------------------------------------------------------------- against real Torch7 files

# Fields Torch7 allocates for forward/backward (or fills during it) that a definition does not record.
BUFFERS = {"output", "gradInput", "gradWeight", "gradBias", "finput", "fgradInput", "indices", "iheight",
           "iwidth", "save_mean", "save_std", "addBuffer", "ones", "noise", "outputSize", "inputSize",
           "totalOutputSize", "batchsize", "train"}

GOLDEN = {
    "net_conv_net.dat": "nn.Sequential():add(nn.SpatialConvolution(3, 64, 11, 7, 3, 4, 3, 2))",
    "net_simple_net.txt": """nn.Sequential():add(nn.ReLU())
        :add(nn.SpatialConvolution(3, 64, 11, 7, 3, 4, 3, 2))
        :add(nn.SpatialMaxPooling(4, 5, 3, 2, 1, 2)):add(nn.Sigmoid())""",
    "net_pool_max_net.txt": "nn.Sequential():add(nn.SpatialMaxPooling(4, 5, 3, 2, 1, 2):ceil())",
    "net_pool_ave_net.txt": "nn.Sequential():add(nn.SpatialAveragePooling(4, 5, 2, 1, 1, 2))",
    "net_batch_norm_net.dat": "nn.Sequential():add(nn.SpatialBatchNormalization(4, 1e-3))",
    "net_concat_net.txt": "nn.Concat(2):add(nn.ReLU()):add(nn.Tanh()):add(nn.Sigmoid())",
    "net_deconv_net.txt": "nn.Sequential():add(nn.SpatialFullConvolution(3, 9, 4, 5, 1, 2, 0, 1, 0, 1))",
    "net_linear_2d_net.txt": "nn.Linear(7, 3)",
    "net_cadd_table_net.txt": "nn.Sequential():add(nn.ConcatTable():add(nn.Identity()):add(nn.Identity()))"
                              ":add(nn.CAddTable())",
    "net_parallel_net.txt": "nn.Parallel(4, 2):add(nn.Sigmoid()):add(nn.Tanh())",
    "net_prelu_net.txt": "nn.Sequential():add(nn.PReLU(5))",
    "net_lp_pooling_square_net.dat": "nn.Sequential():add(nn.SpatialLPPooling(3, 2, 2, 2, 2, 2))"
                                     ":add(nn.Tanh())",
    "net_non_spatial_net.dat": """nn.Sequential():add(nn.Dropout(0.3)):add(nn.Linear(6, 5))
        :add(nn.Dropout(0.6, true)):add(nn.BatchNormalization(5)):evaluate()""",
    "net_padding_net.dat": """nn.Sequential():add(nn.Padding(2, 2, 4)):add(nn.Padding(1, -1, 2))
        :add(nn.Padding(3, -3, 3, 3)):add(nn.SpatialZeroPadding(3, 1, 2, 0))""",
    "net_reshape_batch_net.txt": "nn.Sequential():add(nn.Reshape(5, 4, 3, true))",
    "net_spatial_reflection_padding_net.dat": "nn.Sequential():add(nn.SpatialReflectionPadding(5, 5, 5, 5))",
    "net_spatial_upsampling_nearest_net.dat": "nn.Sequential():add(nn.SpatialUpSamplingNearest(2))",
    "net_softmax_net.txt": "nn.Sequential():add(nn.SoftMax())",
}


def same_tree(ours: TorchObject, real: TorchObject, where: str = "root") -> None:
    assert ours.cls == real.cls, where
    assert ours.version == real.version, where
    names = set(ours.fields) - BUFFERS
    assert names == set(real.fields) - BUFFERS, f"{where} {ours.cls}"
    for name in sorted(names - {"modules"}):
        a, b = ours.fields[name], real.fields[name]
        if isinstance(b, np.ndarray):
            if name in ("weight", "bias", "running_mean", "running_var"):
                assert a.shape == b.shape, f"{where}.{name}"
            else:  # sizes (View/Reshape size)
                assert list(a) == list(b), f"{where}.{name}"
        else:
            assert a == b and type(a) is type(b), f"{where}.{name}: {a!r} != {b!r}"
    if "modules" in names:
        assert len(ours.fields["modules"]) == len(real.fields["modules"])
        for i, m in ours.fields["modules"].items():
            same_tree(m, real.fields["modules"][i], f"{where}.{i}")


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_matches_real_torch7(tmp_path, name):
    real = t7file.load(corpus("torch7-golden", name))
    ours = run(tmp_path, "return " + GOLDEN[name])
    same_tree(ours, real)
