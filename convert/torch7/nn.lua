-- Recording stand-ins for Torch7's `nn`, `cudnn` and `torch` libraries, for running model
-- definitions (see lua.py). Nothing is computed: each constructor sets the same fields Torch7's own
-- constructor sets (names, defaults, tensor shapes), so the module tree matches what a .t7 file of
-- the same model holds. Tensors are descriptors {_size, _init, _fan}; lua.py fills them with seeded
-- random values. Buffers Torch allocates for forward/backward (output, gradInput, gradWeight,
-- gradBias, finput, indices, noise, outputSize, ...) are not recorded.
--
-- Loaded once per sandbox with the full standard library; returns {nn, cudnn, torch, describe}.

local setmetatable, getmetatable, rawget, rawset = setmetatable, debug.getmetatable, rawget, rawset
local type, select, ipairs, next, tostring, error, rawlen = type, select, ipairs, next, tostring, error, rawlen
local format, floor, tointeger = string.format, math.floor, math.tointeger
local insert, remove = table.insert, table.remove

local state = {default_type = "torch.DoubleTensor"}  -- Torch's default until setdefaulttensortype
local kinds = {}  -- class table -> {name = "nn.X", kind = "module" | "tensor" | "storage"}

local function fail(fmt, ...)
   error(format(fmt, ...), 0)  -- no position: the sandbox points at the script's line
end

local function new(cls, ...)
   local obj = setmetatable({}, cls)
   obj:__init(...)
   return obj
end

local function define(name, parent, kind)
   local cls = {__tostring = parent and parent.__tostring}  -- metamethods are not inherited
   cls.__index = cls
   setmetatable(cls, {__index = parent, __call = new})
   kinds[cls] = {name = name, kind = kind or (parent and kinds[parent].kind) or "module", parent = parent}
   return cls
end

local function typename(v)
   local info = type(v) == "table" and kinds[getmetatable(v)]
   return info and info.name or nil
end

local function torch_type(v)
   return typename(v) or type(v)
end

local function is_module(v)
   local info = type(v) == "table" and kinds[getmetatable(v)]
   return info and info.kind == "module" or false
end

-- ---------------------------------------------------------------- tensors and storages

local Storage = define("torch.LongStorage", nil, "storage")  -- values live in the array part

function Storage:__init(n)
   if type(n) == "table" then
      for i, v in ipairs(n) do self[i] = v end
   else
      for i = 1, tointeger(n or 0) or fail("torch.LongStorage: bad size %s", tostring(n)) do self[i] = 0 end
   end
end
function Storage:size() return #self end
function Storage:totable() return {table.unpack(self)} end

local Tensor = define("torch.Tensor", nil, "tensor")

-- Sizes as varargs (3, 4) or one table or LongStorage ({3, 4}); each a non-negative integer.
local function sizes_of(...)
   local n, list = select("#", ...), {...}
   if n == 1 and type(list[1]) == "table" then
      list = list[1]
      n = #list
   end
   local out = {}
   for i = 1, n do
      local s = list[i]
      out[i] = type(s) == "number" and tointeger(s)
      if not out[i] or out[i] < 0 then
         fail("torch.Tensor: size %d is %s, expected a non-negative integer", i, tostring(s))
      end
   end
   return out
end

local function tensor(tname, init, fan, ...)
   return setmetatable({_type = tname, _init = init, _fan = fan, _size = sizes_of(...)}, Tensor)
end

local function param(init, fan, ...)  -- a module's weight or buffer, of the default type
   return tensor(state.default_type, init, fan, ...)
end

local function flatten(data, out, sizes, depth)  -- torch.Tensor{{1, 2}, {3, 4}}
   sizes[depth] = #data
   for _, v in ipairs(data) do
      if type(v) == "table" then flatten(v, out, sizes, depth + 1) else out[#out + 1] = v end
   end
end

function Tensor:resize(...)
   self._size = sizes_of(...)
   return self
end
function Tensor:resizeAs(other) return self:resize(other._size) end
function Tensor:size(d)
   if d then return self._size[d] end
   return Storage(self._size)
end
function Tensor:dim() return #self._size end
Tensor.nDimension = Tensor.dim
function Tensor:nElement()
   local n = #self._size > 0 and 1 or 0
   for _, s in ipairs(self._size) do n = n * s end
   return n
end
Tensor.numel = Tensor.nElement
function Tensor:type(t)
   if t == nil then return self._type end
   self._type = t
   return self
end
function Tensor:cuda() return self:type("torch.CudaTensor") end
function Tensor:float() return self:type("torch.FloatTensor") end
function Tensor:double() return self:type("torch.DoubleTensor") end
function Tensor:clone() return tensor(self._type, self._init, self._fan, self._size) end
-- Value-changing methods are accepted and ignored: weights get seeded random values later (a
-- script's own init such as weight:normal(0, s) or bias:zero() would hide mapping bugs in checks).
for _, name in ipairs({"zero", "fill", "normal", "uniform", "bernoulli", "apply", "copy", "mul", "div",
                       "add", "cmul", "clamp", "abs", "sqrt", "pow", "exp", "log"}) do
   Tensor[name] = function(self) return self end
end

local function tensor_ctor(tname, init)  -- tname nil: the default type at call time
   return function(...)
      local first = ...
      if type(first) == "table" and not kinds[getmetatable(first)] then  -- torch.Tensor{1, 2, 3}
         local data, sizes = {}, {}
         flatten(first, data, sizes, 1)
         local t = tensor(tname or state.default_type, "data", nil, sizes)
         t._data = data
         return t
      end
      return tensor(tname or state.default_type, init or "zeros", nil, ...)
   end
end

-- ---------------------------------------------------------------- the module base classes

local nn, cudnn = {}, {}

local Module = define("nn.Module")
Module.__version = 1
Module.__tostring = function(self) return typename(self) end

function Module:__init() self._type = state.default_type end

function Module:apply(fn)
   fn(self)
   for _, m in ipairs(rawget(self, "modules") or {}) do m:apply(fn) end
   return self
end
function Module:type(t)
   if t == nil then return self._type end
   return self:apply(function(m) m._type = t end)
end
function Module:cuda() return self:type("torch.CudaTensor") end
function Module:float() return self:type("torch.FloatTensor") end
function Module:double() return self:type("torch.DoubleTensor") end
function Module:training() return self:apply(function(m) m.train = true end) end
function Module:evaluate() return self:apply(function(m) m.train = false end) end
for _, name in ipairs({"reset", "clearState", "zeroGradParameters", "updateParameters"}) do
   Module[name] = function(self) return self end
end
function Module:listModules()
   local out = {}
   self:apply(function(m) out[#out + 1] = m end)
   return out
end
function Module:findModules(name)
   local out = {}
   self:apply(function(m) if typename(m) == name then out[#out + 1] = m end end)
   return out
end
function Module:share(other, ...)
   for i = 1, select("#", ...) do
      local field = select(i, ...)
      if rawget(other, field) ~= nil then self[field] = other[field] end
   end
   local mine, theirs = rawget(self, "modules"), rawget(other, "modules")
   if mine and theirs then
      for i, m in ipairs(mine) do if theirs[i] then m:share(theirs[i], ...) end end
   end
   return self
end
local function deepcopy(v, seen)
   if type(v) ~= "table" then return v end
   if seen[v] then return seen[v] end
   local copy = {}
   seen[v] = copy
   for k, x in next, v do copy[deepcopy(k, seen)] = deepcopy(x, seen) end
   return setmetatable(copy, getmetatable(v))
end
function Module:clone(...)
   local copy = deepcopy(self, {})
   if select("#", ...) > 0 then copy:share(self, ...) end
   return copy
end
function Module:noBias()  -- SpatialConvolution, Linear
   self.bias = nil
   return self
end

local Container = define("nn.Container", Module)
nn.Module, nn.Container = Module, Container
function Container:__init()
   Module.__init(self)
   self.modules = {}
end
function Container:add(m, index)
   if kinds[m] then  -- model:add(nn.ReLU) instead of model:add(nn.ReLU())
      fail("%s:add(): got the class %s itself; call it: %s(...)", typename(self), kinds[m].name, kinds[m].name)
   elseif not is_module(m) then
      fail("%s:add(): expected an nn module, got %s", typename(self), torch_type(m))
   end
   self.modules = rawget(self, "modules") or {}
   if type(index) == "number" then insert(self.modules, index, m) else insert(self.modules, m) end
   return self
end
Container.insert = Container.add
function Container:get(i) return self.modules[i] end
function Container:size() return #self.modules end
function Container:remove(i)
   return remove(self.modules, i)
end

-- ---------------------------------------------------------------- nn classes

local function class(name, parent, init)
   local cls = define("nn." .. name, parent or Module)
   if init then cls.__init = init end
   nn[name] = cls
   return cls
end

local function number(v, what, cls)
   if type(v) ~= "number" then fail("nn.%s: %s must be a number, got %s", cls, what, tostring(v)) end
   return v
end

-- Containers
class("Sequential", Container)
class("ConcatTable", Container)
class("ParallelTable", Container)
local Concat = class("Concat", Container, function(self, dimension)
   Container.__init(self)
   self.dimension = dimension
end)
class("DepthConcat", Concat)
class("Parallel", Container, function(self, inputDimension, outputDimension)
   Container.__init(self)
   self.inputDimension, self.outputDimension = inputDimension, outputDimension
end)

-- Convolutions: weight fan-in for He init is nInputPlane*kH*kW (per group).
local Conv = class("SpatialConvolution", Module, function(self, nIn, nOut, kW, kH, dW, dH, padW, padH)
   Module.__init(self)
   for _, a in ipairs({{nIn, "nInputPlane"}, {nOut, "nOutputPlane"}, {kW, "kW"}, {kH, "kH"}}) do
      number(a[1], a[2], "SpatialConvolution")
   end
   self.nInputPlane, self.nOutputPlane, self.kW, self.kH = nIn, nOut, kW, kH
   self.dW, self.dH = dW or 1, dH or 1
   self.padW = padW or 0
   self.padH = padH or self.padW
   self.weight = param("he", nIn * kH * kW, nOut, nIn, kH, kW)
   self.bias = param("bias", nil, nOut)
end)
class("SpatialConvolutionMM", Conv, function(self, ...)
   Conv.__init(self, ...)
   self.weight:resize(self.nOutputPlane, self.nInputPlane * self.kH * self.kW)  -- Torch7's MM layout
end)
class("SpatialDilatedConvolution", Conv, function(self, nIn, nOut, kW, kH, dW, dH, padW, padH, dilW, dilH)
   Conv.__init(self, nIn, nOut, kW, kH, dW, dH, padW, padH)
   self.dilationW, self.dilationH = dilW or 1, dilH or 1
end)
class("SpatialFullConvolution", Module, function(self, nIn, nOut, kW, kH, dW, dH, padW, padH, adjW, adjH)
   Module.__init(self)
   self.nInputPlane, self.nOutputPlane = number(nIn, "nInputPlane", "SpatialFullConvolution"), nOut
   self.kW, self.kH, self.dW, self.dH = kW, kH, dW or 1, dH or 1
   self.padW, self.padH, self.adjW, self.adjH = padW or 0, padH or 0, adjW or 0, adjH or 0
   if self.adjW > self.dW - 1 or self.adjH > self.dH - 1 then
      fail("nn.SpatialFullConvolution: adjW and adjH must be smaller than dW and dH")
   end
   self.weight = param("he", nIn * kH * kW, nIn, nOut, kH, kW)
   self.bias = param("bias", nil, nOut)
end)
class("Linear", Module, function(self, inputSize, outputSize, bias)
   Module.__init(self)
   number(inputSize, "inputSize", "Linear")
   self.weight = param("he", inputSize, outputSize, inputSize)
   if bias ~= false then self.bias = param("bias", nil, outputSize) end
end)

-- Pooling and normalization
local MaxPool = class("SpatialMaxPooling", Module, function(self, kW, kH, dW, dH, padW, padH)
   Module.__init(self)
   self.kW, self.kH, self.dW, self.dH = kW, kH, dW or kW, dH or kH
   self.padW, self.padH = padW or 0, padH or 0
   self.ceil_mode = false
end)
function MaxPool:ceil() self.ceil_mode = true return self end
function MaxPool:floor() self.ceil_mode = false return self end
local AvgPool = class("SpatialAveragePooling", Module, function(self, kW, kH, dW, dH, padW, padH)
   Module.__init(self)
   self.kW, self.kH, self.dW, self.dH = kW, kH, dW or 1, dH or 1
   self.padW, self.padH = padW or 0, padH or 0
   self.ceil_mode, self.count_include_pad, self.divide = false, true, true
end)
AvgPool.ceil, AvgPool.floor = MaxPool.ceil, MaxPool.floor
function AvgPool:setCountIncludePad() self.count_include_pad = true return self end
function AvgPool:setCountExcludePad() self.count_include_pad = false return self end
class("SpatialLPPooling", nn.Sequential, function(self, nInputPlane, pnorm, kW, kH, dW, dH)
   Container.__init(self)  -- Torch7 builds it as a Sequential of these four modules
   self.kW, self.kH, self.dW, self.dH = kW, kH, dW or kW, dH or kH
   self:add(pnorm == 2 and nn.Square() or nn.Power(pnorm))
   self:add(nn.SpatialAveragePooling(kW, kH, self.dW, self.dH))
   self:add(nn.MulConstant(kW * kH))
   self:add(pnorm == 2 and nn.Sqrt() or nn.Power(1 / pnorm))
end)
class("SpatialCrossMapLRN", Module, function(self, size, alpha, beta, k)
   Module.__init(self)
   self.size, self.alpha, self.beta, self.k = size, alpha or 0.0001, beta or 0.75, k or 1
end)
local BN = class("BatchNormalization", Module, function(self, nOutput, eps, momentum, affine)
   Module.__init(self)
   number(nOutput, "nOutput", "BatchNormalization")
   self.affine = affine ~= false
   self.eps, self.momentum, self.train = eps or 1e-5, momentum or 0.1, true
   self.running_mean = param("zeros", nil, nOutput)
   self.running_var = param("ones", nil, nOutput)
   if self.affine then
      self.weight = param("bn_weight", nil, nOutput)
      self.bias = param("bias", nil, nOutput)
   end
end)
BN.__version = 2
class("SpatialBatchNormalization", BN)
class("Normalize", Module, function(self, p, eps)
   Module.__init(self)
   if number(p, "p", "Normalize") <= 0 then fail("nn.Normalize: %s-norm not supported", tostring(p)) end
   self.p, self.eps = p, eps or 1e-10
end)

-- Shapes
local function storage_args(...)
   local first = ...
   if select("#", ...) == 1 and kinds[getmetatable(first)] == kinds[Storage] then return Storage(first) end
   return Storage({...})
end
local View = class("View", Module, function(self, ...)
   Module.__init(self)
   self.size = storage_args(...)
   self.numElements = 1
   for i, s in ipairs(self.size) do
      if number(s, "size " .. i, "View") >= 0 then self.numElements = self.numElements * s end
   end
end)
function View:setNumInputDims(n) self.numInputDims = n return self end
local Reshape = class("Reshape", Module, function(self, ...)
   Module.__init(self)
   local args = {...}
   if type(args[#args]) == "boolean" then self.batchMode = remove(args) end
   self.size = storage_args(table.unpack(args))
   self.nelement = 1
   for i, s in ipairs(self.size) do self.nelement = self.nelement * number(s, "size " .. i, "Reshape") end
end)
Reshape.setNumInputDims = View.setNumInputDims  -- not in Torch7's Reshape; harmless
class("Narrow", Module, function(self, dimension, offset, length)
   Module.__init(self)
   if not dimension or not offset then fail("nn.Narrow(dimension, offset, length)") end
   self.dimension, self.index, self.length = dimension, offset, length or 1
end)
class("Transpose", Module, function(self, ...)
   Module.__init(self)
   self.permutations = {...}
end)
class("Padding", Module, function(self, dim, pad, nInputDim, value, index)
   Module.__init(self)
   self.dim, self.pad, self.nInputDim, self.value, self.index = dim, pad, nInputDim, value or 0, index or 1
end)
local ZeroPad = class("SpatialZeroPadding", Module, function(self, l, r, t, b)
   Module.__init(self)
   self.pad_l, self.pad_r, self.pad_t, self.pad_b = l, r or l, t or l, b or l
end)
class("SpatialReflectionPadding", ZeroPad)
class("SpatialReplicationPadding", ZeroPad)
class("SpatialUpSamplingNearest", Module, function(self, scale)
   Module.__init(self)
   if number(scale, "scale", "SpatialUpSamplingNearest") < 1 or floor(scale) ~= scale then
      fail("nn.SpatialUpSamplingNearest: scale must be an integer >= 1, got %s", tostring(scale))
   end
   self.scale_factor = scale
end)

-- Pointwise
local Threshold = class("Threshold", Module, function(self, th, v, ip)
   Module.__init(self)
   self.threshold, self.val, self.inplace = th or 1e-6, v or 0, ip or false
end)
class("ReLU", Threshold, function(self, ip) Threshold.__init(self, 0, 0, ip) end)
class("PReLU", Module, function(self, nOutputPlane)
   Module.__init(self)
   self.nOutputPlane = nOutputPlane or 0
   self.weight = param("prelu", nil, nOutputPlane or 1)
end)
class("ELU", Module, function(self, alpha, inplace)
   Module.__init(self)
   self.alpha, self.inplace = alpha or 1, inplace or false
end)
class("LeakyReLU", Module, function(self, negval, ip)
   Module.__init(self)
   self.negval, self.inplace = negval or 0.01, ip or false
end)
local function constant(name)
   class(name, Module, function(self, c, ip)
      Module.__init(self)
      self.constant_scalar, self.inplace = number(c, "constant_scalar", name), ip or false
   end)
end
constant("MulConstant")
constant("AddConstant")
class("Dropout", Module, function(self, p, v1, inplace, stochasticInference)
   Module.__init(self)
   self.p, self.train, self.inplace = p or 0.5, true, inplace
   self.stochastic_inference, self.v2 = stochasticInference or false, not v1
   if self.p >= 1 or self.p < 0 then fail("nn.Dropout: illegal percentage %s, must be 0 <= p < 1", self.p) end
end)
class("Power", Module, function(self, p)
   Module.__init(self)
   self.pow = number(p, "power", "Power")
end)
class("Sqrt", Module, function(self, eps)
   Module.__init(self)
   self.eps = eps or 0
end)
for _, name in ipairs({"Identity", "Tanh", "Sigmoid", "SoftMax", "LogSoftMax", "SpatialSoftMax",
                       "SpatialLogSoftMax", "Square", "Abs", "CMulTable", "Exp", "Log", "SoftPlus"}) do
   class(name)
end

-- Tables and reductions
class("CAddTable", Module, function(self, ip)
   Module.__init(self)
   self.inplace = ip
end)
class("JoinTable", Module, function(self, dimension, nInputDims)
   Module.__init(self)
   self.dimension, self.nInputDims = dimension, nInputDims
end)
class("SelectTable", Module, function(self, index)
   Module.__init(self)
   self.index = index
end)
local Sum = class("Sum", Module, function(self, dimension, nInputDims, sizeAverage, squeeze)
   Module.__init(self)
   self.dimension, self.nInputDims, self.sizeAverage = dimension or 1, nInputDims, sizeAverage or false
   if squeeze == nil then self.squeeze = true else self.squeeze = squeeze end
end)
class("Mean", Sum, function(self, dimension, nInputDims) Sum.__init(self, dimension, nInputDims, true) end)

-- The older classes (2013 demos, ENet): connection tables, fixed-structure convolutions, local contrast
-- normalization, unpooling, the nnx per-pixel classifier.
local function conn_table(pairs)  -- an N x 2 tensor of 1-based (input plane, output plane) pairs
   local t = tensor(state.default_type, "data", nil, #pairs, 2)
   t._data = {}
   for _, p in ipairs(pairs) do insert(t._data, p[1]); insert(t._data, p[2]) end
   return t
end
local function randperm(n)  -- the sandbox's seeded math.random stands in for torch.randperm
   local p = {}
   for i = 1, n do p[i] = i end
   for i = n, 2, -1 do
      local j = math.random(i)
      p[i], p[j] = p[j], p[i]
   end
   return p
end
nn.tables = {}
function nn.tables.full(nin, nout)
   local pairs = {}
   for o = 1, nout do for i = 1, nin do insert(pairs, {i, o}) end end
   return conn_table(pairs)
end
function nn.tables.oneToOne(n)
   local pairs = {}
   for i = 1, n do insert(pairs, {i, i}) end
   return conn_table(pairs)
end
function nn.tables.random(nin, nout, nto)  -- nn's scheme: each output reads nto inputs, chunks of permutations
   local pairs, perm, chunk, chunks = {}, randperm(nin), 0, floor(nin / nto)
   if chunks < 1 then fail("nn.tables.random: nto = %s exceeds nin = %s", tostring(nto), tostring(nin)) end
   for o = 1, nout do
      for j = 1, nto do insert(pairs, {perm[chunk * nto + j], o}) end
      chunk = chunk + 1
      if chunk == chunks then perm, chunk = randperm(nin), 0 end
   end
   return conn_table(pairs)
end
class("SpatialConvolutionMap", Module, function(self, conMatrix, kW, kH, dW, dH)
   Module.__init(self)
   local data = type(conMatrix) == "table" and rawget(conMatrix, "_data")
   if not data or #conMatrix._size ~= 2 or conMatrix._size[2] ~= 2 then
      fail("nn.SpatialConvolutionMap: the connection table must be an N x 2 tensor built from values "
           .. "(nn.tables.full/oneToOne/random or torch.Tensor{{...}})")
   end
   self.kW, self.kH = number(kW, "kW", "SpatialConvolutionMap"), number(kH, "kH", "SpatialConvolutionMap")
   self.dW, self.dH, self.connTable = dW or 1, dH or 1, conMatrix
   self.nInputPlane, self.nOutputPlane = 0, 0
   for i = 1, #data, 2 do
      self.nInputPlane, self.nOutputPlane = math.max(self.nInputPlane, data[i]), math.max(self.nOutputPlane, data[i + 1])
   end
   local n = conMatrix._size[1]
   self.weight = param("he", kW * kH * n / math.max(self.nOutputPlane, 1), n, kH, kW)
   self.bias = param("bias", nil, self.nOutputPlane)
end)
class("SpatialSubSampling", Module, function(self, nInputPlane, kW, kH, dW, dH)
   Module.__init(self)
   self.nInputPlane = number(nInputPlane, "nInputPlane", "SpatialSubSampling")
   self.kW, self.kH, self.dW, self.dH = kW, kH, dW or 1, dH or 1
   self.weight = param("he", kW * kH, nInputPlane)
   self.bias = param("bias", nil, nInputPlane)
end)
local function lcn_kernel(kernel, cls)  -- nn's default: a 9x9 kernel of ones
   if kernel == nil then return tensor(state.default_type, "ones", nil, 9, 9) end
   if torch_type(kernel) ~= "torch.Tensor" or not (rawget(kernel, "_data") or kernel._init == "ones") then
      fail("nn.%s: the kernel's values are not known in a definition: build it with torch.ones(...) or "
           .. "torch.Tensor{...} (values set by methods such as fill are not recorded)", cls)
   end
   return kernel
end
local function lcn(name, divisive)
   class(name, Module, function(self, nInputPlane, kernel, threshold, thresval)
      Module.__init(self)
      self.nInputPlane, self.kernel = nInputPlane or 1, lcn_kernel(kernel, name)
      if divisive then
         self.threshold = threshold or 1e-4
         self.thresval = thresval or threshold or 1e-4
      end
   end)
end
lcn("SpatialSubtractiveNormalization", false)
lcn("SpatialDivisiveNormalization", true)
lcn("SpatialContrastiveNormalization", true)
class("SpatialMaxUnpooling", Module, function(self, pooling)
   Module.__init(self)
   if typename(pooling) ~= "nn.SpatialMaxPooling" then
      fail("nn.SpatialMaxUnpooling: the argument must be an nn.SpatialMaxPooling module")
   end
   -- the two share one indices tensor, as after a forward in Torch7 (OpenCV pairs them by it)
   pooling.indices = rawget(pooling, "indices") or tensor("torch.LongTensor", "zeros", nil, 1)
   self.pooling, self.indices = pooling, pooling.indices
end)
local Classifier = class("SpatialClassifier", Container, function(self, classifier)
   Container.__init(self)
   self.classifier = classifier or nn.Sequential()
   self.spatialOutput = true
   self.modules = {self.classifier}
end)
function Classifier:add(m)
   self.classifier:add(m)
   return self
end

-- Any other class: recorded with its raw constructor arguments, so that the converter can name
-- every unsupported class of a model at once instead of failing at the first.
local function unknown(prefix)
   return function(t, key)
      if type(key) ~= "string" or not key:match("^%u") then return nil end
      local cls = define(prefix .. key, Container)
      cls.__init = function(self, ...) self._args = {...} end
      rawset(t, key, cls)
      return cls
   end
end
setmetatable(nn, {__index = unknown("nn.")})

-- ---------------------------------------------------------------- cudnn: same fields, own names

for _, name in ipairs({"SpatialConvolution", "SpatialFullConvolution", "SpatialDilatedConvolution",
                       "SpatialMaxPooling", "SpatialAveragePooling", "SpatialCrossMapLRN",
                       "BatchNormalization", "SpatialBatchNormalization", "ReLU", "Tanh", "Sigmoid",
                       "SoftMax", "LogSoftMax", "SpatialSoftMax", "SpatialLogSoftMax"}) do
   local cls = define("cudnn." .. name, nn[name])
   cudnn[name] = cls
end
cudnn.SpatialConvolution.__init = function(self, nIn, nOut, kW, kH, dW, dH, padW, padH, groups)
   groups = groups or 1
   if type(nIn) ~= "number" or nIn % groups ~= 0 or type(nOut) ~= "number" or nOut % groups ~= 0 then
      fail("cudnn.SpatialConvolution: nInputPlane and nOutputPlane must be numbers divisible by groups")
   end
   Conv.__init(self, nIn, nOut, kW, kH, dW, dH, padW, padH)
   self.groups = groups
   self.weight = param("he", nIn // groups * kH * kW, nOut, nIn // groups, kH, kW)
end
for _, name in ipairs({"SpatialConvolution", "SpatialFullConvolution", "SpatialDilatedConvolution"}) do
   cudnn[name].setMode = function(self) return self end
   cudnn[name].resetMode = cudnn[name].setMode
end
cudnn.version = 7005
cudnn.benchmark, cudnn.fastest, cudnn.verbose = false, false, false

-- cudnn.convert(model, nn | cudnn): switch every module whose class exists in the target library.
function cudnn.convert(model, target)
   if target ~= nn and target ~= cudnn then fail("cudnn.convert(model, nn | cudnn): bad target library") end
   local prefix = target == nn and "nn." or "cudnn."
   model:apply(function(m)
      local short = typename(m):match("^%w+%.(.+)$")
      local cls = short and rawget(target, short)
      if cls and kinds[cls] and typename(m) ~= prefix .. short then
         setmetatable(m, cls)
         if target == nn and m.groups == 1 then m.groups = nil end
         if target == cudnn and short == "SpatialConvolution" then m.groups = m.groups or 1 end
      end
   end)
   return model
end
setmetatable(cudnn, {__index = unknown("cudnn.")})

-- ---------------------------------------------------------------- torch

local torch = {}
torch.Tensor = tensor_ctor(nil)
for _, name in ipairs({"FloatTensor", "DoubleTensor", "CudaTensor", "LongTensor", "IntTensor", "ByteTensor"}) do
   torch[name] = tensor_ctor("torch." .. name)
end
torch.LongStorage = function(n) return Storage(n) end
torch.zeros, torch.ones = tensor_ctor(nil, "zeros"), tensor_ctor(nil, "ones")
torch.rand, torch.randn = tensor_ctor(nil, "uniform"), tensor_ctor(nil, "normal")
function torch.setdefaulttensortype(name)
   if name ~= "torch.FloatTensor" and name ~= "torch.DoubleTensor" then
      fail("torch.setdefaulttensortype: expected torch.FloatTensor or torch.DoubleTensor, got %s", tostring(name))
   end
   state.default_type = name
end
function torch.getdefaulttensortype() return state.default_type end
function torch.typename(v)
   if kinds[getmetatable(v)] and kinds[getmetatable(v)].kind == "tensor" then return v._type end
   return typename(v)
end
function torch.type(v) return torch.typename(v) or type(v) end
function torch.isTensor(v) return kinds[getmetatable(v)] ~= nil and kinds[getmetatable(v)].kind == "tensor" end
function torch.isTypeOf(v, name)
   local cls = getmetatable(v)
   while cls do
      if kinds[cls] and kinds[cls].name == name then return true end
      cls = (getmetatable(cls) or {}).__index
   end
   return false
end
for _, name in ipairs({"manualSeed", "seed", "setnumthreads"}) do torch[name] = function() end end
function torch.getnumthreads() return 1 end
-- torch.class('nn.Foo', 'nn.Module'): custom modules run their own __init and are recorded by name.
function torch.class(name, parentName)
   local lib, short = nil, nil
   if type(name) == "string" then
      local prefix
      prefix, short = name:match("^(%w+)%.(%w+)$")
      lib = prefix == "nn" and nn or prefix == "cudnn" and cudnn or nil
   end
   if not lib then fail("torch.class: only nn.* and cudnn.* classes can be defined, not %s", tostring(name)) end
   local parent = Module
   if parentName ~= nil then
      local pprefix, pshort = tostring(parentName):match("^(%w+)%.(%w+)$")
      parent = pprefix == "nn" and nn[pshort] or pprefix == "cudnn" and cudnn[pshort] or nil
      if not parent then fail("torch.class: unknown parent class %s", tostring(parentName)) end
   end
   local cls = define(name, parent)
   rawset(lib, short, cls)
   return cls, parent
end

-- ---------------------------------------------------------------- for the host

-- The returned model as plain data, read with raw access only: no metamethod the script set (on the
-- model, its classes, its tensors) runs, and the host never touches the script's own tables. It runs
-- inside the sandbox under its limits. Returns nil when root is not an nn module, else a list of nodes,
-- the root first; node i is {"module", class, version, keys, values} | {"table", false, false, keys,
-- values} | {"tensor", sizes, init, fan, data | false} | {"storage", values}. Keys and values are
-- numbers, strings, booleans or {j} (node j); functions and userdata are left out.
local function plain(x)
   local tx = type(x)
   if tx == "number" or tx == "string" or tx == "boolean" then return x end
   return false
end

local function version(cls)  -- __version as the class chain gives it, without __index
   while cls do
      local v = rawget(cls, "__version")
      if v ~= nil then return plain(v) end
      cls = kinds[cls] and kinds[cls].parent
   end
   return false
end

local function export(root, max_values)
   if not is_module(root) then return nil end
   local ids, todo, nodes, count = {[root] = 1}, {root}, {}, 0
   local function counted(n)
      count = count + n
      if count > max_values then fail("the model holds more than %d Lua values", max_values) end
   end
   local function ref(v)
      if type(v) == "table" then
         if not ids[v] then todo[#todo + 1] = v; ids[v] = #todo end
         return {ids[v]}
      end
      local tv = type(v)
      if tv == "number" or tv == "string" or tv == "boolean" then return v end
      return nil
   end
   local function list(t)  -- the array part, values only
      local out = {}
      if type(t) ~= "table" then return out end
      counted(rawlen(t))
      for i = 1, rawlen(t) do out[i] = plain(rawget(t, i)) end
      return out
   end
   local function entries(t)
      local keys, vals, n = {}, {}, 0
      for k, x in next, t do
         local rk, rx = ref(k), ref(x)
         if rk ~= nil and rx ~= nil then n = n + 1; keys[n] = rk; vals[n] = rx end
      end
      counted(n)
      return keys, vals
   end
   local i = 1
   while todo[i] do
      local v = todo[i]
      local info = kinds[getmetatable(v)]
      local kind = info and info.kind
      counted(1)
      if kind == "tensor" then
         local size, data = rawget(v, "_size"), rawget(v, "_data")
         nodes[i] = {"tensor", type(size) == "table" and list(size), plain(rawget(v, "_init")),
                     plain(rawget(v, "_fan")), type(data) == "table" and list(data)}
      elseif kind == "storage" then
         nodes[i] = {"storage", list(v)}
      else
         local keys, vals = entries(v)
         nodes[i] = {kind and "module" or "table", kind and info.name or false, kind and version(getmetatable(v)),
                     keys, vals}
      end
      i = i + 1
   end
   return nodes
end

return {nn = nn, cudnn = cudnn, torch = torch, export = export}
