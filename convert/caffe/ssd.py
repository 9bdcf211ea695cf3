"""SSD layers of Wei Liu's Caffe fork: PriorBox and DetectionOutput (Permute, Flatten, Normalize,
Concat, Softmax and Reshape around them are in ``layers.py``)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import Unsupported
from ..ops.detect import CODES, DetectionOutput, PriorBox
from .builder import Builder, layer
from .upgrade import Layer


def _aspect_ratios(b: Builder, pp: Any) -> list[float]:
    """1, then each given ratio not seen yet (and its inverse when ``flip``), as Caffe lists them."""
    ars = [1.0]
    for ar in (float(a) for a in pp.aspect_ratio):
        if not ar > 0 or not math.isfinite(ar):
            raise b.fail(f"aspect_ratio {ar} must be positive")
        if any(abs(ar - a) < 1e-6 for a in ars):
            continue
        ars.append(ar)
        if pp.flip:
            ars.append(1.0 / ar)
    return ars


def _prior_sizes(b: Builder, pp: Any) -> tuple[tuple[float, float], ...]:
    """(width, height) of each prior of a cell: per min_size, the min box, the sqrt(min*max) box,
    then one box per aspect ratio other than 1."""
    mins, maxs = [float(v) for v in pp.min_size], [float(v) for v in pp.max_size]
    if not mins or not all(m > 0 and math.isfinite(m) for m in mins):
        raise b.fail(f"min_size must be given and positive, got {mins}")
    if maxs and (len(maxs) != len(mins) or not all(hi > lo and math.isfinite(hi) for lo, hi in zip(mins, maxs))):
        raise b.fail(f"max_size {maxs} must pair with min_size {mins}, each larger")
    ars = _aspect_ratios(b, pp)
    sizes = []
    for i, m in enumerate(mins):
        sizes.append((m, m))
        if maxs:
            sizes.append((math.sqrt(m * maxs[i]),) * 2)
        sizes += [(m * math.sqrt(ar), m / math.sqrt(ar)) for ar in ars if abs(ar - 1) >= 1e-6]
    return tuple(sizes)


def _pair(b: Builder, pp: Any, name: str, kind: type) -> tuple[Any, Any]:
    """Caffe's ``name_h``/``name_w`` or ``name`` (``img_size`` for img), 0 when none is given."""
    single = "img_size" if name == "img" else name
    if pp.has(f"{name}_h") or pp.has(f"{name}_w"):
        if pp.has(single) or not (pp.has(f"{name}_h") and pp.has(f"{name}_w")):
            raise b.fail(f"give either {single} or both {name}_h and {name}_w")
        v = (kind(getattr(pp, f"{name}_h")), kind(getattr(pp, f"{name}_w")))
    else:
        v = (kind(getattr(pp, single)),) * 2 if pp.has(single) else (kind(0), kind(0))
    if (pp.has(single) or pp.has(f"{name}_h")) and not (min(v) > 0 and math.isfinite(min(v))):
        raise b.fail(f"{single} must be positive, got {list(v)}")
    return v


@layer("PriorBox", bottoms=(2, 2))
def prior_box(b: Builder, L: Layer) -> None:
    pp = L.p.prior_box_param
    var = [float(v) for v in pp.variance] or [0.1]
    if len(var) not in (1, 4) or not all(v > 0 and math.isfinite(v) for v in var):
        raise b.fail(f"variance must be 1 or 4 positive values, got {var}")
    if not math.isfinite(pp.offset):
        raise b.fail(f"offset {pp.offset} is not finite")
    op = PriorBox(_prior_sizes(b, pp), tuple(var * (4 // len(var))), _pair(b, pp, "img", int),
                  _pair(b, pp, "step", float), float(pp.offset), bool(pp.clip))
    b.node(op)


@layer("DetectionOutput", bottoms=(3, 3))
def detection_output(b: Builder, L: Layer) -> None:
    dp = L.p.detection_output_param
    nms = dp.nms_param
    if not dp.has("num_classes") or dp.num_classes < 1:
        raise b.fail("num_classes must be given and at least 1")
    if not 0 < nms.eta <= 1:
        raise b.fail(f"nms_param eta {nms.eta} must be in (0, 1]")
    if not nms.nms_threshold >= 0:
        raise b.fail(f"nms_threshold {nms.nms_threshold} must be >= 0")
    code = CODES[["CORNER", "CENTER_SIZE", "CORNER_SIZE"].index(str(dp.code_type))]
    if not dp.normalized_bbox and code == "corner_size":
        raise Unsupported(b.path, "caffe", [("DetectionOutput", L.name)],
                          "normalized_bbox: false with CORNER_SIZE is not defined (OpenCV reads it as CORNER)")
    threshold = float(dp.confidence_threshold) if dp.has("confidence_threshold") else -math.inf
    if math.isnan(threshold):
        raise b.fail("confidence_threshold is NaN")
    b.node(DetectionOutput(
        int(dp.num_classes), bool(dp.share_location), int(dp.background_label_id), float(nms.nms_threshold),
        int(nms.top_k) if nms.has("top_k") else -1, float(nms.eta), threshold, int(dp.keep_top_k),
        code, bool(dp.variance_encoded_in_target), bool(dp.normalized_bbox)))
