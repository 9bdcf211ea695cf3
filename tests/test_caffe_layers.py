"""Per Caffe layer type: a small net converts and verifies (float64 reference, PyTorch, ONNX Runtime,
and OpenCV where it loads the layer). Parametrized over the layer registry: a new layer type
without a case here fails ``test_every_layer_has_a_case``."""

from __future__ import annotations

from pathlib import Path

import pytest

from convert.api import convert
from convert.caffe.builder import LAYERS


def net(body: str, shape: str = "2 3 7 9", extra_inputs: str = "") -> str:
    return (f'name: "t"\nlayer {{ name: "input" type: "Input" top: "input" '
            f"input_param {{ shape {{ {' '.join('dim: ' + d for d in shape.split())} }} }} }}\n"
            + extra_inputs + body)


def one(typ: str, params: str = "", bottoms: str = '"input"', tops: str = '"output"') -> str:
    bl = "".join(f" bottom: {b}" for b in bottoms.split(","))
    tl = "".join(f" top: {t}" for t in tops.split(","))
    return f'layer {{ name: "l" type: "{typ}"{bl}{tl} {params} }}\n'


SECOND = 'layer { name: "in2" type: "Input" top: "in2" input_param { shape { dim: 3 dim: 7 } } }\n'
SAME = 'layer { name: "in2" type: "Input" top: "in2" input_param { shape { dim: 2 dim: 3 dim: 7 dim: 9 } } }\n'
SMALL = 'layer { name: "in2" type: "Input" top: "in2" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 5 } } }\n'

DETECTION_INPUTS = ('layer { name: "conf" type: "Input" top: "conf" input_param { shape { dim: 2 dim: 15 } } }\n'
                    'layer { name: "priors" type: "Input" top: "priors" '
                    'input_param { shape { dim: 1 dim: 2 dim: 20 } } }\n')

ROIS = 'layer { name: "rois" type: "Input" top: "rois" input_param { shape { dim: 5 dim: 5 } } }\n'
RPN = ('layer { name: "deltas" type: "Input" top: "deltas" input_param { shape { dim: 1 dim: 4 dim: 5 dim: 6 } } }\n'
       'layer { name: "info" type: "Input" top: "info" input_param { shape { dim: 1 dim: 3 } } }\n')

CASES: dict[str, list[str]] = {
    "Convolution": [
        net(one("Convolution", "convolution_param { num_output: 4 kernel_size: 3 pad: 1 }")),
        net(one("Convolution", "convolution_param { num_output: 6 kernel_h: 3 kernel_w: 2 stride_h: 2 "
                               "stride_w: 1 pad_h: 0 pad_w: 1 group: 3 bias_term: false dilation: 2 }")),
    ],
    "ConvolutionDepthwise": [net(one("ConvolutionDepthwise",
                                     "convolution_param { num_output: 3 kernel_size: 3 pad: 1 }"))],
    "Deconvolution": [
        net(one("Deconvolution", "convolution_param { num_output: 4 kernel_size: 4 stride: 2 pad: 1 }")),
        net(one("Deconvolution", "convolution_param { num_output: 6 kernel_size: 3 group: 3 "
                                 "bias_term: false dilation: 2 }")),
    ],
    "InnerProduct": [
        net(one("InnerProduct", "inner_product_param { num_output: 5 }")),
        net(one("InnerProduct", "inner_product_param { num_output: 5 axis: 2 transpose: true }")),
    ],
    "Pooling": [
        net(one("Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 }")),
        net(one("Pooling", "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }")),
        net(one("Pooling", "pooling_param { pool: MAX kernel_size: 2 stride: 3 pad_h: 1 pad_w: 0 }")),
        net(one("Pooling", "pooling_param { pool: AVE global_pooling: true }")),
        net(one("Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR }")),
    ],
    "LRN": [
        net(one("LRN", "lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 k: 2 }")),
        net(one("LRN", "lrn_param { local_size: 5 alpha: 0.1 beta: 0.75 norm_region: WITHIN_CHANNEL }")),
        net(one("LRN", "lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 k: 0 }")),  # ONNX Runtime's LRN needs k > 0
    ],
    "BatchNorm": [net(one("BatchNorm", "batch_norm_param { eps: 0.001 }")),
                  net(one("BatchNorm", "batch_norm_param { use_global_stats: false }"))],
    "Scale": [
        net(one("Scale", "scale_param { bias_term: true }")),
        net(one("Scale", "scale_param { axis: 1 num_axes: 2 }")),
        net(one("Scale", "scale_param { num_axes: 0 }")),
        net(one("Scale", "scale_param { bias_term: true }", '"input","in2"'), extra_inputs=SECOND),
    ],
    "Bias": [net(one("Bias", "bias_param { axis: 1 num_axes: 2 }")),
             net(one("Bias", "", '"input","in2"'), extra_inputs=SECOND)],
    "MVN": [net(one("MVN")), net(one("MVN", "mvn_param { across_channels: true normalize_variance: false }"))],
    "Normalize": [net(one("Normalize", "norm_param { across_spatial: false channel_shared: false }")),
                  net(one("Normalize"))],
    "ReLU": [net(one("ReLU")), net(one("ReLU", "relu_param { negative_slope: 0.1 }"))],
    "PReLU": [net(one("PReLU")), net(one("PReLU", "prelu_param { channel_shared: true }"))],
    "ELU": [net(one("ELU", "elu_param { alpha: 0.5 }"))],
    "Sigmoid": [net(one("Sigmoid"))], "TanH": [net(one("TanH"))], "AbsVal": [net(one("AbsVal"))],
    "BNLL": [net(one("BNLL"))],
    "Power": [net(one("Power", "power_param { power: 2 scale: 0.5 shift: 0.1 }")),
              net(one("Power", "power_param { power: 3 scale: 2 }"))],  # (2x)^3, not x * 2^3
    "Exp": [net(one("Exp", "exp_param { base: 2 scale: 0.5 }"))],
    "Log": [net(one("Log", "log_param { shift: 8 }"))],
    "Threshold": [net(one("Threshold", "threshold_param { threshold: 0.3 }"))],
    "Clip": [net(one("Clip", "clip_param { min: -0.5 max: 0.5 }"))],
    "Dropout": [net(one("Dropout", "dropout_param { dropout_ratio: 0.3 }"))],
    "Eltwise": [
        net(one("Eltwise", "eltwise_param { operation: SUM coeff: 0.5 coeff: -1 }", '"input","in2"'),
            extra_inputs=SAME),
        net(one("Eltwise", "eltwise_param { operation: PROD }", '"input","in2"'), extra_inputs=SAME),
        net(one("Eltwise", "eltwise_param { operation: MAX }", '"input","in2"'), extra_inputs=SAME),
    ],
    "Concat": [net(one("Concat", "concat_param { axis: 1 }", '"input","in2"'), extra_inputs=SAME),
               net(one("Concat", "concat_param { concat_dim: 0 }", '"input","in2"'), extra_inputs=SAME)],
    "Slice": [net(one("Slice", "slice_param { axis: 1 slice_point: 1 }", tops='"output","rest"')),
              net(one("Slice", "slice_param { slice_dim: 3 }", tops='"a","b","output"'))],
    "Split": [net(one("Split", tops='"a","b"') + one("Eltwise", "", '"a","b"').replace('"l"', '"sum"'))],
    "Flatten": [net(one("Flatten")), net(one("Flatten", "flatten_param { axis: 2 }"))],
    "Reshape": [net(one("Reshape", "reshape_param { shape { dim: 0 dim: -1 dim: 9 } }")),
                net(one("Reshape", "reshape_param { shape { dim: 63 } axis: 2 num_axes: 2 }")),
                net(one("Reshape", "reshape_param { shape { dim: 1 dim: -1 } axis: -1 }"))],
    "Crop": [net(one("Crop", "crop_param { axis: 2 offset: 1 offset: 2 }", '"input","in2"'),
                 extra_inputs=SMALL)],
    "Softmax": [net(one("Softmax")), net(one("Softmax", "softmax_param { axis: 3 }"))],
    "ArgMax": [net(one("ArgMax", "argmax_param { top_k: 2 }")),
               net(one("ArgMax", "argmax_param { axis: 1 out_max_val: true }"))],
    "Permute": [net(one("Permute", "permute_param { order: 0 order: 2 order: 3 order: 1 }"))],
    "PriorBox": [net(one("PriorBox", "prior_box_param { min_size: 3 max_size: 5 aspect_ratio: 2 clip: false "
                                     "variance: 0.1 step: 2 }", '"input","input"'))],
    "DetectionOutput": [net(one("DetectionOutput", "detection_output_param { num_classes: 3 background_label_id: 0 "
                                                   "keep_top_k: 4 confidence_threshold: 0.5 code_type: CORNER "
                                                   "nms_param { nms_threshold: 0.4 top_k: 5 } }",
                                '"input","conf","priors"'), shape="2 20", extra_inputs=DETECTION_INPUTS)],
    "Interp": [net(one("Interp", "interp_param { zoom_factor: 2 }")),
               net(one("Interp", "interp_param { height: 11 width: 4 }")),
               net(one("Interp", "interp_param { shrink_factor: 2 pad_beg: -1 pad_end: -1 }"))],
    # R-CNN and fork layers (convert/caffe/rcnn.py; tests/test_rcnn.py has their hand-computed cases)
    "ROIPooling": [net(one("ROIPooling", "roi_pooling_param { pooled_h: 2 pooled_w: 3 spatial_scale: 0.5 }",
                           '"input","rois"'), extra_inputs=ROIS)],
    "PSROIPooling": [net(one("PSROIPooling", "psroi_pooling_param { spatial_scale: 0.5 output_dim: 2 group_size: 2 }",
                             '"input","rois"'), shape="2 8 7 9", extra_inputs=ROIS)],
    "Proposal": [net(one("Proposal", "proposal_param { feat_stride: 4 ratio: 1 scale: 2 post_nms_topn: 5 }",
                         '"input","deltas","info"', '"rois","scores"'), shape="1 2 5 6", extra_inputs=RPN)],
    "Python.ProposalLayer": [net(one("Python", 'python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" '
                                     'param_str: "\'feat_stride\': 4, \'scales\': [2], \'ratios\': [1]" }',
                                     '"input","deltas","info"', '"rois"'), shape="1 2 5 6", extra_inputs=RPN)],
    "Upsample": [net(one("Upsample", "upsample_param { scale: 2 }"))],
    "ShuffleChannel": [net(one("ShuffleChannel", "shuffle_channel_param { group: 3 }"))],
    "ReLU6": [net(one("ReLU6"))],
    "Axpy": [net(one("Axpy", "", '"a","input","input"'), shape="1 3 7 9",
                 extra_inputs='layer { name: "a" type: "Input" top: "a" '
                              'input_param { shape { dim: 1 dim: 3 dim: 1 dim: 1 } } }\n')],
    "IntelPack": [net(one("IntelPack") + 'layer { name: "r" type: "ReLU" bottom: "output" top: "r" }\n')],
    "IntelUnpack": [net(one("IntelUnpack") + 'layer { name: "r" type: "ReLU" bottom: "output" top: "r" }\n')],
    "IntelLRN": [net(one("IntelLRN", "lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 }"))],
    "Tile": [net(one("Tile", "tile_param { tiles: 2 }")), net(one("Tile", "tile_param { axis: -2 tiles: 3 }"))],
    "Reduction": [net(one("Reduction")),  # axis 0: a 0-D output
                  net(one("Reduction", "reduction_param { operation: ASUM axis: 1 coeff: -0.5 }")),
                  net(one("Reduction", "reduction_param { operation: SUMSQ axis: -1 }")),
                  net(one("Reduction", "reduction_param { operation: MEAN axis: 2 coeff: 3 }"))],
}

CASE_LIST = [(t, i, text) for t, texts in CASES.items() for i, text in enumerate(texts)]


def test_every_layer_has_a_case() -> None:
    assert set(LAYERS) <= set(CASES)


@pytest.mark.parametrize("typ,i,text", CASE_LIST, ids=[f"{t}-{i}" for t, i, _ in CASE_LIST])
def test_layer_converts_and_verifies(typ: str, i: int, text: str, tmp_path: Path) -> None:
    src = tmp_path / f"{typ}.prototxt"
    src.write_text(text)
    res = convert(src, out=tmp_path / "out")
    v = res.report["verification"]["backends"]
    assert res.report["status"] == "verified", v
    assert v["pytorch"]["ok"] and v["onnxruntime"]["ok"]
    cv = v.get("opencv", {})
    assert cv.get("ok") is not False, cv  # OpenCV agrees, refuses the layer, or deviates (known)
