"""Caffe's box decoding, written once for NumPy, torch and ONNX values (``detect.py`` runs it on
arrays, ``detect_onnx.py`` on graph values with arithmetic)."""

from __future__ import annotations


def decode(loc, prior, var, code, exp, stack, plus=0.0):  # type: ignore[no-untyped-def]
    """Caffe's DecodeBBox on the last axis (NumPy, torch or ONNX: ``exp`` and ``stack`` given).
    ``plus`` 1 is OpenCV's unnormalized center_size: prior sizes + 1, centres xmin + size / 2."""
    if code == "corner":
        return prior + var * loc
    pw, ph = prior[..., 2] - prior[..., 0], prior[..., 3] - prior[..., 1]
    if code == "corner_size":
        return prior + var * loc * stack([pw, ph, pw, ph], -1)
    if plus:
        pw, ph = pw + plus, ph + plus
        pcx, pcy = prior[..., 0] + pw / 2, prior[..., 1] + ph / 2
    else:
        pcx, pcy = (prior[..., 0] + prior[..., 2]) / 2, (prior[..., 1] + prior[..., 3]) / 2
    cx = var[..., 0] * loc[..., 0] * pw + pcx
    cy = var[..., 1] * loc[..., 1] * ph + pcy
    bw, bh = exp(var[..., 2] * loc[..., 2]) * pw, exp(var[..., 3] * loc[..., 3]) * ph
    return stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], -1)
