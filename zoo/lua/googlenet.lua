-- GoogLeNet / Inception-v1 (Szegedy et al. 2015) in the style convnet-benchmarks used for Torch7:
-- inception blocks are nn.Concat(2) (the channel axis of a batch) of four columns. Same
-- convolutions as BVLC's deploy net, without its two LRN layers (they have no weights).
require 'nn'

local function inception(input, cfg)  -- cfg: 1x1, {3x3 reduce, 3x3}, {5x5 reduce, 5x5}, pool proj
   local depth = nn.Concat(2)
   local c1 = nn.Sequential()
   c1:add(nn.SpatialConvolution(input, cfg[1], 1, 1)):add(nn.ReLU(true))
   depth:add(c1)
   local c3 = nn.Sequential()
   c3:add(nn.SpatialConvolution(input, cfg[2][1], 1, 1)):add(nn.ReLU(true))
   c3:add(nn.SpatialConvolution(cfg[2][1], cfg[2][2], 3, 3, 1, 1, 1, 1)):add(nn.ReLU(true))
   depth:add(c3)
   local c5 = nn.Sequential()
   c5:add(nn.SpatialConvolution(input, cfg[3][1], 1, 1)):add(nn.ReLU(true))
   c5:add(nn.SpatialConvolution(cfg[3][1], cfg[3][2], 5, 5, 1, 1, 2, 2)):add(nn.ReLU(true))
   depth:add(c5)
   local pool = nn.Sequential()
   pool:add(nn.SpatialMaxPooling(3, 3, 1, 1, 1, 1))
   pool:add(nn.SpatialConvolution(input, cfg[4], 1, 1)):add(nn.ReLU(true))
   depth:add(pool)
   return depth
end

local model = nn.Sequential()
model:add(nn.SpatialConvolution(3, 64, 7, 7, 2, 2, 3, 3)):add(nn.ReLU(true))
model:add(nn.SpatialMaxPooling(3, 3, 2, 2):ceil())
model:add(nn.SpatialConvolution(64, 64, 1, 1)):add(nn.ReLU(true))
model:add(nn.SpatialConvolution(64, 192, 3, 3, 1, 1, 1, 1)):add(nn.ReLU(true))
model:add(nn.SpatialMaxPooling(3, 3, 2, 2):ceil())
model:add(inception(192, {64, {96, 128}, {16, 32}, 32}))       -- 3a
model:add(inception(256, {128, {128, 192}, {32, 96}, 64}))     -- 3b
model:add(nn.SpatialMaxPooling(3, 3, 2, 2):ceil())
model:add(inception(480, {192, {96, 208}, {16, 48}, 64}))      -- 4a
model:add(inception(512, {160, {112, 224}, {24, 64}, 64}))     -- 4b
model:add(inception(512, {128, {128, 256}, {24, 64}, 64}))     -- 4c
model:add(inception(512, {112, {144, 288}, {32, 64}, 64}))     -- 4d
model:add(inception(528, {256, {160, 320}, {32, 128}, 128}))   -- 4e
model:add(nn.SpatialMaxPooling(3, 3, 2, 2):ceil())
model:add(inception(832, {256, {160, 320}, {32, 128}, 128}))   -- 5a
model:add(inception(832, {384, {192, 384}, {48, 128}, 128}))   -- 5b
model:add(nn.SpatialAveragePooling(7, 7, 1, 1))
model:add(nn.View(1024):setNumInputDims(3))
model:add(nn.Dropout(0.4))
model:add(nn.Linear(1024, 1000))
model:add(nn.LogSoftMax())
return model
