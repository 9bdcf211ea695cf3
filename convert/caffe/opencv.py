"""OpenCV 4.x's own Caffe importer as an independent check of a conversion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import isolate
from ..ir import Graph
from ..runtimes import opencv as ocv
from .upgrade import Layer


def known_deviations(layers: list[Layer]) -> list[str]:
    """Where OpenCV's Caffe importer computes something else than Caffe, for the layers present.

    Each was confirmed against Caffe's formulas with the float64 reference, PyTorch and ONNX
    Runtime agreeing (tests/test_caffe_layers.py)."""
    notes = []
    made = {t for L in layers for t in L.tops if L.type != "Input"}
    for L in layers:
        p = L.p
        if L.type in ("ROIPooling", "PSROIPooling") and len(L.bottoms) > 1 and L.bottoms[1] not in made:
            notes.append(f"{L.name}: OpenCV reads outside the feature map for a roi whose batch index is "
                         "not in [0, N) (Caffe aborts, zoo gives 0); seeded random rois have such indices")
        if L.type == "Proposal":  # tests/test_rcnn.py::test_opencv_proposal_keeps_small_boxes
            notes.append(f"{L.name}: OpenCV keeps proposals smaller than min_size (py-faster-rcnn drops them) "
                         "and gives none for an im_info of negative sizes")
        if L.type == "Axpy":  # Caffe (hujie's axpy_layer.cpp): bottom[0] * bottom[1] + bottom[2]
            notes.append(f"{L.name}: OpenCV computes Axpy as bottom[0] * bottom[2] + bottom[1]")
        if L.type == "LRN" and p.lrn_param.norm_region == "ACROSS_CHANNELS" and p.lrn_param.k != 1:
            notes.append(f"{L.name}: OpenCV ignores k of an ACROSS_CHANNELS LRN")
        pp = p.pooling_param
        if L.type == "Pooling" and (pp.pad_h == 0) != (pp.pad_w == 0):
            notes.append(f"{L.name}: OpenCV keeps an extra last pooling window on the unpadded axis")
        if L.type == "InnerProduct" and p.inner_product_param.transpose:
            notes.append(f"{L.name}: OpenCV ignores InnerProduct transpose")
        if L.type == "Scale" and len(L.bottoms) == 2 and p.scale_param.bias_term:
            notes.append(f"{L.name}: OpenCV drops the bias of a two-input Scale")
        lp = p.log_param
        if L.type == "Log" and (lp.base != -1 or lp.scale != 1 or lp.shift != 0):
            notes.append(f"{L.name}: OpenCV ignores base, scale and shift of Log")
        cp = p.concat_param
        if L.type == "Concat" and cp.has("concat_dim") and not cp.has("axis") and cp.concat_dim != 1:
            notes.append(f"{L.name}: OpenCV ignores the legacy concat_dim")
        cv = p.convolution_param
        if L.type == "Deconvolution" and any(d != 1 for d in cv.dilation):
            notes.append(f"{L.name}: OpenCV ignores the dilation of a Deconvolution")
        if L.type == "Deconvolution" and _crops_past_kernel(cv):
            notes.append(f"{L.name}: OpenCV misplaces a Deconvolution whose pad exceeds kernel - 1")
        if L.type == "PriorBox" and not p.prior_box_param.has("clip"):
            notes.append(f"{L.name}: OpenCV clips prior boxes when clip is not given (Caffe's default is false)")
        if L.type == "PriorBox" and any(p.prior_box_param.has(f) for f in ("img_size", "img_h", "img_w")):
            notes.append(f"{L.name}: OpenCV normalizes prior boxes by the image input's size, not img_size/img_h/img_w")
    return notes


def _crops_past_kernel(cv: Any) -> bool:
    """A Deconvolution pad beyond kernel - 1 (the output is cropped inside the first window)."""
    kernel = [cv.kernel_h, cv.kernel_w] if cv.kernel_h else _hw(cv.kernel_size, 1)
    pads = [cv.pad_h, cv.pad_w] if cv.pad_h or cv.pad_w else _hw(cv.pad, 0)
    return any(p > k - 1 for p, k in zip(pads, kernel))


def _hw(values: Any, default: int) -> list[int]:
    v = list(values) or [default]
    return v * 2 if len(v) == 1 else v


Feeds = dict[str, np.ndarray]


def layer_values(g: Graph) -> dict[str, str]:
    """Value -> the Caffe layer whose output OpenCV gives under that layer's name."""
    return ocv.layer_values((n.name, n.outputs[0]) for n in g.nodes)


def runner(g: Graph, prototxt: Path, caffemodel: Path | None) -> Callable[[Feeds], Feeds]:
    """A function running OpenCV's import of the original files (in a child process); its
    ``layers`` attribute gives every layer's output instead, to find where OpenCV diverges."""
    values = layer_values(g)
    original = {"framework": "caffe", "source": str(prototxt), "weights": str(caffemodel) if caffemodel else None,
                "inputs": g.meta.get("caffe_inputs", {})}  # inputs whose value name is not the Caffe blob's

    def call(feeds: Feeds, wanted: dict[str, str]) -> Feeds:
        outs, peak = isolate.call("convert.runtimes.opencv:forward", feeds, original={**original, "outputs": wanted})
        run.peak_rss_bytes = peak  # type: ignore[attr-defined]
        return outs

    def run(feeds: Feeds) -> Feeds:
        return call(feeds, {o: values[o] for o in g.outputs if o in values})

    run.layers = lambda feeds: call(feeds, values)  # type: ignore[attr-defined]
    return run


def forward(feeds: Feeds, prototxt: str, caffemodel: str | None, outputs: dict[str, str]) -> Feeds:
    """In a child: ``outputs`` (value -> layer) of readNetFromCaffe's net, feeds keyed by blob name."""
    return ocv.forward(feeds, {"framework": "caffe", "source": prototxt, "weights": caffemodel, "outputs": outputs})
