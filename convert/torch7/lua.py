"""Run a Torch7 model *definition* (a Lua script) in a sandbox and record the module tree it builds.

``zoo convert model.lua`` gets the same tree a ``.t7`` file of the model would give (``TorchObject``s
from ``t7file``), so one mapping serves both. The script runs in an embedded Lua 5.4 (lupa) against
recording ``nn``/``cudnn``/``torch`` libraries (``nn.lua`` next to this file): each constructor sets
the fields Torch7's own constructor sets, and tensors are shape descriptors that this module fills
with seeded random values (numpy ``default_rng(seed)``, one generator walked depth-first in module
order, a module's ``weight`` before its ``bias``): conv/linear weights He-normal ``sqrt(2/fan_in)``,
biases U(-0.1, 0.1), BatchNorm running_mean 0 / running_var 1 / weight U(0.5, 1.5), PReLU U(0.05, 0.3).

Convention for scripts:
- ``opt`` is a global table of the ``--arg key=value`` pairs; values that look like numbers become
  Lua numbers, ``true``/``false`` booleans, anything else strings.
- The model is the value the script returns; if that is a function it is called with ``opt``
  (fb.resnet.torch's ``createModel(opt)``); if the script returns nothing, the global ``model``
  (or ``net``) is used. It must be an nn module.
- ``nn``, ``cudnn`` and ``torch`` are predefined globals; ``require`` accepts only nn, cudnn, cunn,
  cutorch and torch. ``print`` goes to ``logging.info``.

Sandbox: the script sees a fresh environment holding only the libraries above and the harmless part
of Lua's (no io, os, package, debug, coroutine, load/loadstring/dofile/loadfile, collectgarbage,
string.dump, ``__gc`` metamethods); it is loaded as text only (bytecode refused); a count hook,
installed by the host before the script starts, stops it after ``max_instructions`` or
``max_seconds`` (and ``pcall``/``xpcall`` cannot swallow that), and it still runs while ``nn.lua``'s
``export`` copies the returned model into plain tables with raw access only (rawget/rawlen/next), so a
metamethod the script leaves on the model, its classes, tensors or ``opt`` never runs outside the limits:
the host reads only those plain tables, iteratively, whatever their nesting or cycles; the C
functions the hook cannot interrupt and whose time is not bounded by memory (pattern matching,
table.move) refuse costly inputs; lupa's allocator caps its memory; no Python object is reachable from the script (no
``python`` global, no eval, attribute access refused).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from convert.errors import ConvertError
from convert.limits import over_budget
from convert.torch7.t7file import TableKey, TorchObject

__all__ = ["LuaError", "run_definition"]

log = logging.getLogger(__name__)

MAX_MEMORY = 512 * 2**20  # bytes of Lua heap
MAX_VALUES = 2_000_000  # Lua values converted to Python (tables, fields, list entries)
MAX_DEPTH = 200  # nesting of tables/modules
CHUNK = "<definition>"  # Lua's name for the script; Lua would truncate a long path in its messages
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INT = re.compile(r"[+-]?\d+")


class LuaError(ConvertError):
    """The definition failed to run or broke a sandbox rule; one line starting with the script path."""


# Runs inside Lua, with the full standard library, before the script: builds the script's environment,
# installs the limits and runs it. Returns status ("ok" | "error" | "syntax" | "limit" | "memory"), the
# result or message, and the printed lines.
_SANDBOX = r"""
local lib, source, opt, max_instructions, max_seconds, clock, seed, max_values = ...
local sethook, getinfo = debug.sethook, debug.getinfo
local load, pcall, xpcall, error, type, select, tostring = load, pcall, xpcall, error, type, select, tostring
local rawget, setmetatable, pairs, format, concat = rawget, setmetatable, pairs, string.format, table.concat
local CHUNK = "<definition>"

string.dump = nil  -- also reachable as ("").dump through the string metatable
getmetatable("").__metatable = false
math.randomseed(seed)
-- Defense in depth: the host globals lose the dangerous parts too (the library captured what it uses).
for _, k in pairs({"io", "os", "package", "debug", "dofile", "loadfile", "load", "require",
                   "collectgarbage"}) do
  _G[k] = nil
end

-- Limits. Once hit, every later hook call and every pcall/xpcall re-raises, so no script code can
-- catch the stop and carry on. Messages are built now: there may be no memory for them later.
local MEMORY = "not enough memory"
local LIMIT = format("the script ran longer than the limit (%d instructions / %g s)",
                     max_instructions, max_seconds)
local step = math.max(1, math.min(10000, max_instructions // 10))
local count, deadline, stopped = 0, clock() + max_seconds, nil
local function hook()
  count = count + step
  if stopped or count > max_instructions or clock() > deadline then
    stopped = stopped or LIMIT
    error(stopped, 0)
  end
end
local function settle(ok, ...)
  if stopped then error(stopped, 0) end
  if not ok and (...) == MEMORY then stopped = MEMORY; error(MEMORY, 0) end
  return ok, ...
end

-- C functions run without count hooks. Those whose time does not follow from the memory they use get
-- a bound: Lua's pattern matcher backtracks (("a"):rep(300):find(".-.-.-.-b") would take hours), so a
-- pattern with q repetitions (* + -) on an n-character subject is refused when (n+1)^(q+1) > 1e8;
-- table.move loops over its range even when nothing is there.
local raw_gsub, raw_match, raw_sub, raw_move = string.gsub, string.match, string.sub, table.move
local function bounded(name)
  local fn = string[name]
  return function(s, p, ...)
    local plain = name == "find" and select(2, ...)
    if type(s) == "string" and type(p) == "string" and not plain then
      local _, q = raw_gsub(raw_gsub(p, "%%.", ""), "[%*%+%-]", "")
      if (#s + 1) ^ (q + 1) > 1e8 then
        error(format("string.%s: a pattern with %d repetitions on a %d-character string is too costly in a "
                     .. "model definition", name, q, #s), 0)
      end
    end
    return fn(s, p, ...)
  end
end
for _, name in pairs({"find", "match", "gmatch", "gsub"}) do string[name] = bounded(name) end
local function move(a1, f, e, ...)
  if type(f) == "number" and type(e) == "number" and e - f > 1e7 then
    error("table.move: more than 1e7 elements in a model definition", 0)
  end
  return raw_move(a1, f, e, ...)
end

-- The script's environment: fresh copies of the safe libraries, nothing else.
local function copy(t, blocked, prefix)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return setmetatable(c, {__index = function(_, k)
    if blocked[k] then error(prefix .. k .. " is not available in a model definition", 0) end
  end})
end
local none = {}
local env = {
  assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, rawequal = rawequal,
  rawget = rawget, rawlen = rawlen, rawset = rawset, select = select, tonumber = tonumber,
  tostring = tostring, type = type, getmetatable = getmetatable, _VERSION = _VERSION,
  string = copy(string, {dump = true}, "string."), table = copy(table, none), math = copy(math, none),
  utf8 = copy(utf8, none), unpack = table.unpack,
  nn = lib.nn, cudnn = lib.cudnn, torch = lib.torch, opt = opt,
}
env._G = env
env.table.move = move
env.pcall = function(f, ...) return settle(pcall(f, ...)) end
-- A stop raised in the hook calls the message handler while hooks are off: never the script's then.
env.xpcall = function(f, h, ...)
  return settle(xpcall(f, function(m) if stopped then return m end return h(m) end, ...))
end
env.setmetatable = function(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("__gc metamethods are not available in a model definition", 0)
  end
  return setmetatable(t, mt)
end
local printed = {}
env.print = function(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
  if #printed < 10000 then printed[#printed + 1] = concat(parts, "\t") end
end
local stubs = {nn = lib.nn, cudnn = lib.cudnn, cunn = lib.nn, torch = lib.torch, cutorch = {}}
env.require = function(name)
  if name == "nngraph" then
    error("require 'nngraph': nngraph graphs are not supported in Lua definitions (build nn containers)", 0)
  elseif stubs[name] == nil then
    error(format("require '%s': only nn, cudnn, cunn, cutorch and torch can be required in a model "
                 .. "definition", tostring(name)), 0)
  end
  return stubs[name]
end
local blocked = {}
for _, k in pairs({"io", "os", "package", "debug", "coroutine", "load", "loadstring", "dofile", "loadfile",
                   "collectgarbage", "module", "python", "getfenv", "setfenv", "newproxy", "jit", "ffi"}) do
  blocked[k] = true
end
setmetatable(env, getmetatable(copy({}, blocked, "")))

-- One line "<definition>:LINE: message", LINE being the innermost line of the script on the stack (the
-- library and the sandbox raise their errors without a position: the script's line is what matters).
local function handler(msg)
  sethook()
  if stopped then return stopped end
  if type(msg) ~= "string" and type(msg) ~= "number" then
    msg = format("(error object is a %s value)", type(msg))
  end
  msg = tostring(msg)
  if raw_sub(msg, 1, #CHUNK + 1) == CHUNK .. ":" then return msg end
  local inner, rest = raw_match(msg, "^(nn%.lua:%d+): (.*)$")  -- a Lua error inside the library
  if inner then msg = rest .. " (in " .. inner .. ")" end
  for level = 2, 200 do
    local info = getinfo(level, "Sl")
    if not info then break end
    if info.source == "=" .. CHUNK and info.currentline > 0 then
      return format("%s:%d: %s", CHUNK, info.currentline, msg)
    end
  end
  return msg
end

local chunk, err = load(source, "=" .. CHUNK, "t", env)
if not chunk then return "syntax", err, printed end
-- The model is exported to plain tables under the same hook: the host never touches the script's objects
-- (whose metatables the script may have set to loop or fail in any access).
local export = lib.export
local function main()
  local result = chunk()
  if type(result) == "function" then result = result(opt) end
  if result == nil then result = rawget(env, "model") end
  if result == nil then result = rawget(env, "net") end
  return export(result, max_values)
end
sethook(hook, "", step)
local ok, result = xpcall(main, handler)
sethook()
if ok then return "ok", result, printed end
if stopped == MEMORY or result == MEMORY then return "memory", nil, printed end
if stopped then return "limit", nil, printed end
return "error", result, printed
"""


@lru_cache(maxsize=1)
def _library() -> bytes:
    return (Path(__file__).with_name("nn.lua")).read_bytes()


def _deny_attributes(obj: Any, name: Any, is_setting: bool) -> Any:
    raise AttributeError("Python attributes are not accessible from a model definition")


def _lua_value(text: str) -> Any:
    """An --arg value as Lua would want it: number, boolean or string."""
    if text in ("true", "false"):
        return text == "true"
    if _INT.fullmatch(text) and abs(int(text)) < 2**63:
        return int(text)
    if _NUMBER.fullmatch(text):
        return float(text)
    return text.encode()


def _source(path: Path, name: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise LuaError(f"{name}: cannot read the definition: {err.strerror}") from None
    if data.startswith(b"\x1b"):  # Lua's signature byte: a precompiled chunk
        raise LuaError(f"{name}: precompiled Lua bytecode is refused; a definition must be Lua source text")
    data = data.removeprefix(b"\xef\xbb\xbf")
    if data.startswith(b"#"):  # a shebang line, as the lua command skips it (keep the line count)
        data = data[data.find(b"\n"):] if b"\n" in data else b""
    return data


def run_definition(path: Path, args: dict[str, str] | None = None, seed: int | None = 0,
                   max_instructions: int = 200_000_000, max_seconds: float = 60.0,
                   *, max_memory: int = MAX_MEMORY) -> TorchObject:
    """Run the definition script at ``path`` in the sandbox; returns its root module. ``seed`` None:
    shapes only (zoo list/info), every tensor a read-only placeholder of its size that allocates
    nothing (``np.broadcast_to`` of one value), so a definition costs no weight memory or time."""
    import lupa.lua54 as lupa

    name = str(path)
    source = _source(Path(path), name)
    lua = lupa.LuaRuntime(register_eval=False, register_builtins=False, encoding=None,
                          attribute_filter=_deny_attributes, max_memory=max_memory)
    try:
        lib = lua.execute(_library(), name=b"=nn.lua", mode=b"t")
        opt = lua.table_from({k.encode(): _lua_value(v) for k, v in (args or {}).items()})
        lua.execute(b"python = nil")  # lupa's helper table in the host globals: not even there
        status, result, printed = lua.execute(_SANDBOX.encode(), lib, source, opt, int(max_instructions),
                                              float(max_seconds), time.monotonic, int(seed or 0), MAX_VALUES,
                                              name=b"=sandbox", mode=b"t")
        for line in _array(printed):
            log.info("%s: %s", name, _clean(_text(line))[:2000])
        status = _text(status)
        if status == "limit":
            raise LuaError(f"{name}: the script ran longer than the limit "
                           f"({int(max_instructions)} instructions / {max_seconds:g} s)")
        if status == "error" or status == "syntax":
            raise LuaError(_message(name, _text(result)))
        if status == "ok":
            if result is None:
                raise LuaError(f"{name}: the script returned no nn module (return the model, a function "
                               "building it, or set a global 'model')")
            rng = None if seed is None else np.random.default_rng(seed)
            return _Converter(rng, name).tree([_node(n) for n in _array(result)])
    except lupa.LuaMemoryError:
        pass
    raise LuaError(f"{name}: the script used more than {max_memory / 2**20:g} MiB of memory")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _clean(text: str, limit: int = 2000) -> str:
    """Script text for a message or a log line: no control characters (ANSI escapes), bounded length."""
    text = _CONTROL.sub("?", text[:limit])
    return text + "…" if len(text) == limit else text


def _message(name: str, msg: str) -> str:
    msg = _clean(" ".join(msg[:4000].split("\n")))
    if msg.startswith(CHUNK + ":"):
        return name + msg[len(CHUNK):]
    return f"{name}: {msg}"


def _array(t: Any) -> list:
    """A Lua list built by the sandbox (plain tables, no metatables) as a Python list."""
    return [t[i] for i in range(1, len(t) + 1)]


def _node(t: Any) -> tuple:
    """One exported node as Python: (kind, a, b, c, d) with Lua lists as Python lists and refs as _Ref."""
    kind = _text(t[1])
    if kind == "storage":
        return kind, _array(t[2]), None, None, None
    if kind == "tensor":
        return kind, _array(t[2]) if t[2] else None, t[3], t[4], _array(t[5]) if t[5] else None
    return kind, t[2], t[3], [_ref(k) for k in _array(t[4])], [_ref(x) for x in _array(t[5])]


@dataclass(frozen=True, slots=True)
class _Ref:
    """Node ``index`` (0-based) of the export: a table, module, tensor or storage."""

    index: int


def _ref(x: Any) -> Any:
    if isinstance(x, (bytes, int, float, bool)):
        return _plain(x)
    return _Ref(int(x[1]) - 1)


def _plain(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


class _Converter:
    """Exported nodes to Python: modules to TorchObject, tensors to float32 arrays, tables to dicts.

    Iterative throughout (no recursion, whatever the nesting); tensors get their random values in the
    order a depth-first walk in field order meets them (weight, then bias, then the rest by name)."""

    def __init__(self, rng: np.random.Generator | None, name: str) -> None:
        self.rng, self.name = rng, name
        self.elements = 0

    def fail(self, reason: str) -> LuaError:
        return LuaError(f"{self.name}: {reason}")

    def tree(self, nodes: list[tuple]) -> TorchObject:
        objs = [self.shell(n) for n in nodes]
        for i in self.walk(nodes):
            if nodes[i][0] == "tensor":
                objs[i] = self.tensor(*nodes[i][1:])
        for i, (kind, _, _, keys, vals) in enumerate(nodes):
            if kind in ("module", "table") and objs[i] is not None:
                fields = objs[i].fields if kind == "module" else objs[i]
                fields.update(self.fields(keys, vals, objs))
        return objs[0]

    def shell(self, node: tuple) -> Any:
        kind, a, b = node[:3]
        if kind == "module":
            version = int(b) if isinstance(b, (int, float)) and math.isfinite(b) else 1
            return TorchObject(_text(a), {}, version)
        if kind == "table":
            return {}
        if kind == "storage":
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer()
                       and abs(x) < 2**63 for x in a):
                raise self.fail("a torch.LongStorage holds something other than integers")
            return np.array([int(x) for x in a], np.int64)
        return None  # a tensor: filled in walk order

    def walk(self, nodes: list[tuple]) -> list[int]:
        """Node indices in the order a depth-first walk in field order first meets them."""
        order, seen, todo = [], set(), [(0, 0)]
        while todo:
            i, depth = todo.pop()
            if i in seen:
                continue
            if depth > MAX_DEPTH:
                raise self.fail(f"tables nested deeper than {MAX_DEPTH} levels")
            seen.add(i)
            order.append(i)
            kind, _, _, keys, vals = nodes[i]
            if kind in ("module", "table"):
                ordered = sorted(zip(keys, vals), key=_field_order)
                refs = [r for r in keys + [x for _, x in ordered] if isinstance(r, _Ref)]
                todo += [(r.index, depth + 1) for r in reversed(refs)]
        return order

    def fields(self, keys: list, vals: list, objs: list) -> dict:
        out: dict = {}
        for key, x in sorted(zip(keys, vals), key=_field_order):
            key = objs[key.index] if isinstance(key, _Ref) else key
            try:
                hash(key)
            except TypeError:
                key = TableKey(key)
            out[key] = objs[x.index] if isinstance(x, _Ref) else x
        return out

    def tensor(self, sizes: list | None, init: Any, fan: Any, data: list | None) -> np.ndarray:
        sizes = [0] if sizes is None else sizes
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**40 for s in map(_plain, sizes)):
            raise self.fail(f"a tensor has the bad size {[_plain(s) for s in sizes][:8]}")
        shape = tuple(int(s) for s in sizes)
        count = math.prod(shape)
        self.elements += count
        reason = over_budget(4 * self.elements, "the model's tensors")
        if reason:
            raise self.fail(reason)
        rng, init = self.rng, _text(init) if init else "zeros"
        if rng is None and init != "data":  # shapes only: no values drawn, no memory taken
            return np.broadcast_to(np.float32(0.0 if init == "zeros" else 1.0), shape)
        fan = fan if isinstance(fan, (int, float)) and not isinstance(fan, bool) else None
        if init == "he":
            weight = rng.standard_normal(shape, dtype=np.float32)
            weight *= np.float32(math.sqrt(2.0 / fan) if fan and fan > 0 else 0.0)
            return weight
        uniform = {"bias": (-0.1, 0.1), "bn_weight": (0.5, 1.5), "prelu": (0.05, 0.3), "uniform": (0.0, 1.0)}
        if init in uniform:
            return rng.uniform(*uniform[init], size=shape).astype(np.float32)
        if init == "normal":
            return rng.standard_normal(shape, dtype=np.float32)
        if init == "data" and data is not None and len(data) == count:
            values = [float(x) if isinstance(x, (int, float)) else 0.0 for x in data]
            return np.array(values, np.float32).reshape(shape)
        return np.full(shape, 1.0 if init == "ones" else 0.0, np.float32)


def _field_order(item: tuple) -> tuple:
    key = item[0]
    number = isinstance(key, (int, float)) and not isinstance(key, bool)
    text = str(key) if isinstance(key, (str, bool)) else ""
    return key != "weight", key != "bias", not number, key if number else 0, text
