"""Comparing detection lists (SSD DetectionOutput): what matters is which boxes were found, with
which label and score, not the row order or the padding.

A list is (..., 7) rows [image, label, score, xmin, ymin, xmax, ymax]; rows with label -1 are
padding (zoo's fixed-size output) or Caffe's "nothing found" row, and all-zero rows after the image
id are OpenCV 4.x's padding (it gives N * keep_top_k rows, best score first): both are dropped. Rows are matched
within each (image, label) by the nearest score and box, so that two scores equal to rounding do
not swap rows; counts and labels must agree exactly, scores and (normalized) coordinates within
the tolerance, absolute (relative for coordinates far outside the image).
"""

from __future__ import annotations

from typing import Any

import numpy as np

COMPARE = "detections (rows matched per image and label, count and labels exact)"


def outputs(g: Any) -> frozenset[str]:
    """The graph's values that are detection lists."""
    return frozenset(o for n in g.nodes if n.op.kind == "detection_output" for o in n.outputs)


def rows(a: np.ndarray) -> np.ndarray:
    """The detections of a list, sorted by image, label, score descending."""
    r = np.asarray(a, dtype=np.float64).reshape(-1, 7)
    r = r[(r[:, 1] >= 0) & np.any(r[:, 1:] != 0, axis=1)]
    return r[np.lexsort((-r[:, 2], r[:, 1], r[:, 0]))]


def metrics(ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    """Like ``verify.metrics``: max_rel is the largest absolute score difference or coordinate
    difference (normalized boxes: [0, 1] in the image; coordinates relative to the largest one
    where that is beyond 1, as pixel boxes are); inf when counts or labels differ."""
    a = rows(ref)
    if np.asarray(out).size % 7:
        return _bad(a, f"shape {list(np.shape(out))} is not a list of 7-value rows")
    b = rows(out)
    d: dict[str, Any] = {"compare": COMPARE, "detections": len(a)}
    if len(a) != len(b):
        return _bad(a, f"{len(b)} detections instead of {len(a)}")
    diff = np.zeros((len(a), 5))
    used = np.zeros(len(b), dtype=bool)
    for i, r in enumerate(a):
        same = np.flatnonzero((b[:, 0] == r[0]) & (b[:, 1] == r[1]) & ~used)
        if not same.size:
            return _bad(a, f"no detection of label {int(r[1])} in image {int(r[0])} matches")
        dist = np.abs(b[same, 2:] - r[2:]).max(axis=1)
        j = same[int(np.argmin(dist))]
        used[j] = True
        diff[i] = np.abs(b[j, 2:] - r[2:])
    finite = bool(np.all(np.isfinite(diff)))
    # scores absolutely; coordinates relative to the largest when boxes are in pixels or far outside
    scale = max(1.0, float(np.abs(a[:, 3:]).max())) if len(a) else 1.0
    worst = max(float(diff[:, 0].max()), float(diff[:, 1:].max()) / scale) if diff.size else 0.0
    d["max_rel"] = worst if finite else float("inf")
    d["rel_l2"] = float(np.linalg.norm(diff) / (np.linalg.norm(a[:, 2:]) or 1.0)) if finite else float("inf")
    return d


def _bad(a: np.ndarray, reason: str) -> dict[str, Any]:
    return {"compare": COMPARE, "detections": len(a), "max_rel": float("inf"), "rel_l2": float("inf"),
            "reason": reason}
