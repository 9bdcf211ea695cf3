-- VGG-A (11 weight layers; Simonyan & Zisserman 2015), as convnet-benchmarks defined it in Torch7.
require 'nn'

local cfg = {64, 'M', 128, 'M', 256, 256, 'M', 512, 512, 'M', 512, 512, 'M'}
local features = nn.Sequential()
local planes = 3
for _, v in ipairs(cfg) do
   if v == 'M' then
      features:add(nn.SpatialMaxPooling(2, 2, 2, 2))
   else
      features:add(nn.SpatialConvolution(planes, v, 3, 3, 1, 1, 1, 1))
      features:add(nn.ReLU(true))
      planes = v
   end
end

local classifier = nn.Sequential()
classifier:add(nn.View(512 * 7 * 7))
classifier:add(nn.Linear(512 * 7 * 7, 4096))
classifier:add(nn.Threshold(0, 1e-6))
classifier:add(nn.Dropout(0.5))
classifier:add(nn.Linear(4096, 4096))
classifier:add(nn.Threshold(0, 1e-6))
classifier:add(nn.Dropout(0.5))
classifier:add(nn.Linear(4096, 1000))
classifier:add(nn.LogSoftMax())

return nn.Sequential():add(features):add(classifier)
