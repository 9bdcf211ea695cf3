-- OverFeat "fast" (Sermanet et al. 2014) at 231x231, as convnet-benchmarks defined it in Torch7.
require 'nn'

local features = nn.Sequential()
features:add(nn.SpatialConvolution(3, 96, 11, 11, 4, 4))           -- 231 -> 56
features:add(nn.ReLU(true))
features:add(nn.SpatialMaxPooling(2, 2, 2, 2))                     -- 56 -> 28
features:add(nn.SpatialConvolution(96, 256, 5, 5, 1, 1))           -- 28 -> 24
features:add(nn.ReLU(true))
features:add(nn.SpatialMaxPooling(2, 2, 2, 2))                     -- 24 -> 12
for _, planes in ipairs({{256, 512}, {512, 1024}, {1024, 1024}}) do
   features:add(nn.SpatialConvolution(planes[1], planes[2], 3, 3, 1, 1, 1, 1))
   features:add(nn.ReLU(true))
end
features:add(nn.SpatialMaxPooling(2, 2, 2, 2))                     -- 12 -> 6

local classifier = nn.Sequential()
classifier:add(nn.View(1024 * 6 * 6))
classifier:add(nn.Dropout(0.5))
classifier:add(nn.Linear(1024 * 6 * 6, 3072))
classifier:add(nn.Threshold(0, 1e-6))
classifier:add(nn.Dropout(0.5))
classifier:add(nn.Linear(3072, 4096))
classifier:add(nn.Threshold(0, 1e-6))
classifier:add(nn.Linear(4096, 1000))
classifier:add(nn.LogSoftMax())

return nn.Sequential():add(features):add(classifier)
