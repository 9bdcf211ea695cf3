-- ResNet in fb.resnet.torch's style: ConcatTable + CAddTable shortcuts (projection only where the
-- shape changes), batch norm after every convolution, convolutions without bias.
-- Depth by argument: zoo convert zoo/lua/resnet.lua --arg depth=50   (18, 34, 50, 101, 152, 200)
-- 18/34: basic blocks; 50/101/152: bottlenecks, stride on the 3x3 convolution (as fb.resnet.torch;
-- KaimingHe's Caffe release strides the first 1x1, hence ~6% fewer multiply-adds there);
-- 200: pre-activation bottlenecks (He et al., Identity Mappings, 2016; fb.resnet.torch's preresnet).
require 'nn'

local function conv(nIn, nOut, k, stride, pad)
   return nn.SpatialConvolution(nIn, nOut, k, k, stride, stride, pad, pad):noBias()
end

return function(opt)
   local depth = opt.depth or 50
   local cfg = ({[18] = {'basic', {2, 2, 2, 2}}, [34] = {'basic', {3, 4, 6, 3}},
                 [50] = {'bottleneck', {3, 4, 6, 3}}, [101] = {'bottleneck', {3, 4, 23, 3}},
                 [152] = {'bottleneck', {3, 8, 36, 3}}, [200] = {'preact', {3, 24, 36, 3}}})[depth]
   assert(cfg, 'depth must be one of 18, 34, 50, 101, 152, 200')
   local kind, counts = cfg[1], cfg[2]
   local planes = 64

   local function shortcut(nIn, nOut, stride, withBN)
      if nIn == nOut and stride == 1 then return nn.Identity() end
      local s = nn.Sequential():add(conv(nIn, nOut, 1, stride, 0))
      if withBN then s:add(nn.SpatialBatchNormalization(nOut)) end
      return s
   end

   local function basic(n, stride)
      local nIn = planes
      planes = n
      local s = nn.Sequential()
      s:add(conv(nIn, n, 3, stride, 1)):add(nn.SpatialBatchNormalization(n)):add(nn.ReLU(true))
      s:add(conv(n, n, 3, 1, 1)):add(nn.SpatialBatchNormalization(n))
      return nn.Sequential()
         :add(nn.ConcatTable():add(s):add(shortcut(nIn, n, stride, true)))
         :add(nn.CAddTable(true)):add(nn.ReLU(true))
   end

   local function bottleneck(n, stride)
      local nIn = planes
      planes = n * 4
      local s = nn.Sequential()
      s:add(conv(nIn, n, 1, 1, 0)):add(nn.SpatialBatchNormalization(n)):add(nn.ReLU(true))
      s:add(conv(n, n, 3, stride, 1)):add(nn.SpatialBatchNormalization(n)):add(nn.ReLU(true))
      s:add(conv(n, n * 4, 1, 1, 0)):add(nn.SpatialBatchNormalization(n * 4))
      return nn.Sequential()
         :add(nn.ConcatTable():add(s):add(shortcut(nIn, n * 4, stride, true)))
         :add(nn.CAddTable(true)):add(nn.ReLU(true))
   end

   local function preact(n, stride, first)  -- first: 'no_preact' | 'both_preact' | nil
      local nIn = planes
      planes = n * 4
      local block, s = nn.Sequential(), nn.Sequential()
      if first == 'both_preact' then
         block:add(nn.SpatialBatchNormalization(nIn)):add(nn.ReLU(true))
      elseif first ~= 'no_preact' then
         s:add(nn.SpatialBatchNormalization(nIn)):add(nn.ReLU(true))
      end
      s:add(conv(nIn, n, 1, 1, 0)):add(nn.SpatialBatchNormalization(n)):add(nn.ReLU(true))
      s:add(conv(n, n, 3, stride, 1)):add(nn.SpatialBatchNormalization(n)):add(nn.ReLU(true))
      s:add(conv(n, n * 4, 1, 1, 0))
      return block:add(nn.ConcatTable():add(s):add(shortcut(nIn, n * 4, stride, false)))
                  :add(nn.CAddTable(true))
   end

   local function stage(n, count, stride, index)
      local s = nn.Sequential()
      for i = 1, count do
         local st = i == 1 and stride or 1
         if kind == 'basic' then s:add(basic(n, st))
         elseif kind == 'bottleneck' then s:add(bottleneck(n, st))
         else
            local first = nil
            if i == 1 then first = index == 1 and 'no_preact' or 'both_preact' end
            s:add(preact(n, st, first))
         end
      end
      return s
   end

   local model = nn.Sequential()
   model:add(conv(3, 64, 7, 2, 3)):add(nn.SpatialBatchNormalization(64)):add(nn.ReLU(true))
   model:add(nn.SpatialMaxPooling(3, 3, 2, 2, 1, 1))
   for i, n in ipairs({64, 128, 256, 512}) do
      model:add(stage(n, counts[i], i == 1 and 1 or 2, i))
   end
   if kind == 'preact' then
      model:add(nn.SpatialBatchNormalization(planes)):add(nn.ReLU(true))
   end
   model:add(nn.SpatialAveragePooling(7, 7, 1, 1))
   model:add(nn.View(planes):setNumInputDims(3))
   model:add(nn.Linear(planes, 1000))
   return model
end
