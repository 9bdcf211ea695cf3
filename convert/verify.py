"""Numerical verification: float64 reference vs PyTorch (model.py) vs ONNX Runtime (model.onnx) vs
OpenCV on the original files; names the first layer where a backend diverges."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import detections, reference
from .errors import ShapeError
from .ir import Graph, Shape, release_mapped
from .isolate import IsolatedError
from .limits import graph_bytes, over_budget
from .runtimes import TOLERANCE, import_model
from .runtimes.ort import session_options
from .torch_emit import variable_names

log = logging.getLogger(__name__)


def seeded_inputs(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def metrics(ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    if out.size != ref.size:
        return {"max_rel": float("inf"), "rel_l2": float("inf"),
                "reason": f"shape {list(out.shape)} instead of {list(ref.shape)}"}
    out = out.reshape(ref.shape)
    scale = float(np.max(np.abs(ref))) or 1.0
    diff = np.abs(ref - out)
    finite = bool(np.all(np.isfinite(out)) or np.array_equal(np.isnan(ref), np.isnan(out)))
    d = {"max_rel": float(np.nanmax(diff)) / scale if finite and diff.size else float("inf"),
         "rel_l2": float(np.linalg.norm(np.nan_to_num(ref - out)) / (np.linalg.norm(ref) or 1.0))}
    squeezed = ref.reshape(ref.shape[0], -1) if ref.ndim >= 2 else None
    if squeezed is not None and ref.ndim >= 2 and int(np.prod(ref.shape[2:])) == 1 and ref.shape[1] > 1:
        d["top1"] = float(np.mean(squeezed.argmax(1) == out.reshape(squeezed.shape).argmax(1)))
    return d


def compare(ref: dict[str, np.ndarray], outs: dict[str, np.ndarray], tol: float,
            dets: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``dets``: outputs that are detection lists (compared by ``detections.metrics``)."""
    per = {k: (detections.metrics if k in dets else metrics)(ref[k], outs[k]) for k in ref}
    agg: dict[str, Any] = {"max_rel": max(m["max_rel"] for m in per.values()),
                           "rel_l2": max(m["rel_l2"] for m in per.values())}
    tops = [m["top1"] for m in per.values() if "top1" in m]
    if tops:
        agg["top1"] = min(tops)
    agg["ok"] = bool(agg["max_rel"] <= tol)
    if dets & set(per):
        agg["compare"] = {k: f"{per[k]['compare']}, atol {tol:g}: {per[k]['detections']} found"
                          for k in per if k in dets}
    if len(per) > 1:
        agg["outputs"] = per
    return agg


# --- backends -------------------------------------------------------------------------------

def run_torch(model_py: Path, feeds: dict[str, np.ndarray], g: Graph | None = None,
              capture: bool = False) -> dict[str, np.ndarray]:
    """Outputs of the generated model.py; with ``capture``, every IR value (from forward's locals)."""
    import torch

    mod = import_model(model_py)
    net = mod.load()
    args = [torch.from_numpy(feeds[k]) for k in mod.INPUTS]
    captured: dict[str, Any] = {}

    def line(frame, event, arg):  # type: ignore[no-untyped-def]
        captured.update(frame.f_locals)  # before each line: forward deletes values after their last use
        return line

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        return line if frame.f_code is type(net).forward.__code__ else None

    old = sys.gettrace()
    if capture:
        sys.settrace(tracer)
    try:
        with torch.no_grad():
            res = net(*args)
    finally:
        sys.settrace(old)
    res = res if isinstance(res, tuple) else (res,)
    out = {k: v.numpy() for k, v in zip(mod.OUTPUTS, res)}
    if capture and g is not None:
        names = variable_names(g)
        out.update({v: captured[p].numpy() for v, p in names.items()
                    if p in captured and hasattr(captured[p], "numpy")})
    return out


def run_onnx(path: Path, feeds: dict[str, np.ndarray], values: list[str] | None = None,
             threads: int = 0) -> dict[str, np.ndarray]:
    """Outputs of model.onnx in ONNX Runtime (CPU); ``values`` adds intermediate values."""
    import onnxruntime as ort

    so = session_options(threads, **{"session.disable_prepacking": "1"})  # no second weight copy
    if values:
        import onnx

        model = onnx.load(str(path))
        known = {o.name for o in model.graph.output}
        made = {o for n in model.graph.node for o in n.output}  # (a value folded away is not there)
        for v in values:
            if v not in known and v in made:
                model.graph.output.add(name=v)
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        del model
    else:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, feeds)
    return dict(zip(names, res))


# --- the check ------------------------------------------------------------------------------

def second_size(g: Graph) -> tuple[dict[str, Shape] | None, str]:
    """The other input size verified (H + 13, W + 7, batch 2 where free), or None and why not."""
    dyn = g.dynamic()
    if not (dyn["batch"] or dyn["spatial"]):
        return None, f"the input size is fixed by {dyn['fixed_by']}"
    shapes = g.probe_inputs(spatial=dyn["spatial"], batch=False)
    if dyn["batch"]:
        shapes = {k: (1 if s[0] == 2 else 2, *s[1:]) for k, s in shapes.items()}
    where = ", ".join(str(list(s)) for s in shapes.values())
    try:  # batch and size were probed one at a time: a net may refuse them together
        values = g.infer_shapes(shapes)
    except ShapeError as e:
        return None, f"the net refuses input shape {where}: {e}"
    over = over_budget(graph_bytes(g, values), f"verifying at input shape {where}")
    return (None, over) if over else (shapes, "")


def verify_sizes(g: Graph, art: Path, opencv: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
                 known_opencv: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """``verify`` at the declared size, then at a second size where the net allows one; the report
    of the declared size gains ``sizes`` (each size with its per-backend result) and the status
    is "mismatch" when any size mismatches."""
    report = verify(g, art, opencv, known_opencv, seed)
    other, why = second_size(g)
    reports = [report] + ([verify(g, art, opencv, known_opencv, seed + 1, inputs=other)] if other else [])
    report["sizes"] = [_size_summary(r) for r in reports]
    if not other:
        report["second_size"] = why
    bad = [r["inputs"] for r in reports[1:] if r["status"] == "mismatch"]
    if bad:
        report["status"] = "mismatch"
        report["reason"] = f"mismatch at input shapes {bad}"
    return report


def _size_summary(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("ok", "status", "max_rel", "reason")
    res = {"inputs": r["inputs"], "status": r["status"],
           "backends": {k: {f: v[f] for f in keep if f in v} for k, v in r["backends"].items()}}
    return res | ({"first_divergence": r["first_divergence"]} if r.get("first_divergence") else {})


def verify(g: Graph, art: Path, opencv: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
           known_opencv: list[str] | None = None, seed: int = 0, precision: str = "fp32",
           inputs: dict[str, Shape] | None = None) -> dict[str, Any]:
    """Compare every backend with the float64 reference on a seeded input (of the declared shapes
    unless ``inputs``); returns the report."""
    tol = TOLERANCE[precision]
    inputs = inputs or g.inputs
    feeds = seeded_inputs(inputs, seed)
    ref = reference.run(g, feeds)
    release_mapped(g)  # the reference was the last reader of memory-mapped weights
    report: dict[str, Any] = {"seed": seed, "inputs": {k: list(v) for k, v in inputs.items()},
                              "precision": precision, "tolerance": tol,
                              "reference": "float64 NumPy interpreter", "backends": {}}
    backends: list[tuple[str, Callable[[], dict[str, np.ndarray]]]] = [
        ("onnxruntime", lambda: run_onnx(art / "model.onnx", feeds)),
        ("pytorch", lambda: run_torch(art / "model.py", feeds)),
    ]
    if opencv is not None:
        backends.append(("opencv", lambda: opencv(feeds)))
    declared = inputs == g.inputs  # at another size, a backend failing is a finding, not a crash
    for name, fn in backends:
        report["backends"][name] = _check_backend(name, fn, ref, tol, known_opencv or [], declared,
                                                    detections.outputs(g))
        gc.collect()
    if hasattr(opencv, "peak_rss_bytes"):  # its own process
        report["backends"]["opencv"]["peak_rss_bytes"] = opencv.peak_rss_bytes
    failed = [k for k, v in report["backends"].items() if v.get("ok") is False]
    report["status"] = "mismatch" if failed else "verified"
    if failed and not declared:
        report["first_divergence"] = _locate_quietly(g, art, feeds, tol, failed, opencv)
    elif failed:
        report["first_divergence"] = locate(g, art, feeds, tol, [f for f in failed if f != "opencv"]) \
            or (locate_opencv(g, feeds, tol, opencv) if "opencv" in failed else None)
    return report


def _locate_quietly(g: Graph, art: Path, feeds: dict[str, np.ndarray], tol: float, failed: list[str],
                    opencv: Any) -> dict[str, Any] | None:
    try:
        return locate(g, art, feeds, tol, [f for f in failed if f != "opencv"]) \
            or (locate_opencv(g, feeds, tol, opencv) if "opencv" in failed else None)
    except Exception as e:  # a backend that fails at this size has no intermediate values either
        return {"layer": None, "reason": f"{type(e).__name__}: {str(e)[:300]}"}


def _check_backend(name: str, fn: Callable[[], dict[str, np.ndarray]], ref: dict[str, np.ndarray],
                   tol: float, known: list[str], declared: bool = True,
                   dets: frozenset[str] = frozenset()) -> dict[str, Any]:
    try:
        outs = fn()
    except IsolatedError as e:  # the independent importer refused or crashed: reported, not fatal
        return {"status": "refused", "reason": str(e)}
    except Exception as e:
        if declared:
            raise
        return {"ok": False, "reason": f"fails at this size: {type(e).__name__}: {str(e)[:300]}"}
    missing = [k for k in ref if k not in outs]
    if missing and name != "opencv":
        return {"ok": False, "reason": f"outputs missing: {missing}"}
    if not outs:
        return {"status": "refused", "reason": "none of the outputs can be fetched"}
    res = compare({k: v for k, v in ref.items() if k in outs}, outs, tol, dets)
    if missing:
        res["not_compared"] = missing
    if name == "opencv" and not res["ok"] and known:
        res.update(ok=None, status="deviates (known)", reason="; ".join(known))
    return res


def locate_opencv(g: Graph, feeds: dict[str, np.ndarray], tol: float, opencv: Any) -> dict[str, Any]:
    """The first layer whose OpenCV output differs from the reference, when OpenCV can give
    every layer's output (its Caffe importer can; its Torch importer names layers its own way)."""
    nothing = {"backend": "opencv", "layer": None, "reason": "OpenCV gave no per-layer output"}
    if not hasattr(opencv, "layers"):
        return nothing
    try:
        got = opencv.layers(feeds)
    except IsolatedError as e:
        return {**nothing, "reason": f"OpenCV gave no per-layer output ({e})"}
    ref = reference.run(g, feeds, keep=True)
    for node in g.nodes:
        o = node.outputs[0]
        if o in got and metrics(ref[o], got[o])["max_rel"] > tol:
            return {"backend": "opencv", "layer": node.name, "op": node.op.kind, "value": o,
                    "max_rel": metrics(ref[o], got[o])["max_rel"]}
    return {**nothing, "reason": "every layer OpenCV gives agrees; the difference is in the outputs only"}


def locate(g: Graph, art: Path, feeds: dict[str, np.ndarray], tol: float,
           backends: list[str]) -> dict[str, Any] | None:
    """The first node (in order) whose output differs from the reference beyond ``tol``."""
    if not backends:
        return None
    ref = reference.run(g, feeds, keep=True)
    values = [o for n in g.nodes for o in n.outputs]
    got: dict[str, dict[str, np.ndarray]] = {}
    if "pytorch" in backends:
        got["pytorch"] = run_torch(art / "model.py", feeds, g, capture=True)
    if "onnxruntime" in backends:
        try:
            got["onnxruntime"] = run_onnx(art / "model.onnx", feeds, values)
        except Exception as e:  # e.g. a model over 2 GB cannot be re-serialized with extra outputs
            log.warning("cannot expose intermediate values to ONNX Runtime: %s", e)
    for node in g.nodes:
        for o in node.outputs:
            for b, vals in got.items():
                if o in vals:
                    m = metrics(ref[o], vals[o])
                    if m["max_rel"] > tol:
                        return {"backend": b, "layer": node.name, "op": node.op.kind, "value": o,
                                "max_rel": m["max_rel"]}
    return None
