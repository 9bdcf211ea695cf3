"""ONNX emitter: walks the IR and asks each op for its nodes; writes weights without copying them.

The model is written as a protobuf skeleton (graph, no initializer data) followed by one
``graph { initializer { ... } }`` fragment per weight, streamed from the NumPy buffer; protobuf
merges repeated occurrences of a message field, so the file is an ordinary ModelProto. Above
``EXTERNAL_BYTES`` the raw bytes go to ``model.onnx.data`` instead (ONNX external data), because
protobuf cannot parse messages over 2 GB.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

from .ir import Graph, Shape

OPSET = 17
EXTERNAL_BYTES = 1_800_000_000  # stay clear of protobuf's 2 GB message limit

DTYPES = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("int64"): TensorProto.INT64,
          np.dtype("float16"): TensorProto.FLOAT16, np.dtype("float64"): TensorProto.DOUBLE}


class OnnxBuilder:
    """What an op's ``onnx`` method uses: add nodes, add constants, ask static shapes.

    Names it makes (nodes, intermediate values, constants) never take a name in ``taken`` (the
    IR's values and weights): a layer may call a blob anything, ``conv1/relu_3`` included."""

    def __init__(self, graph: Graph, taken: set[str], inits: dict[str, np.ndarray] | None = None) -> None:
        self.graph = graph
        self.taken = taken
        self.inits = inits or {}  # initializer name -> the IR weight
        self.shaped: dict[str, Shape] = {}  # initializers stored in another shape than the IR's
        self.nodes: list[onnx.NodeProto] = []
        self.consts: dict[str, np.ndarray] = {}
        self._n = 0
        self.layer = ""

    def fresh(self, hint: str = "t") -> str:
        while True:
            self._n += 1
            name = f"{self.layer}/{hint}_{self._n}" if self.layer else f"{hint}_{self._n}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def op(self, op_type: str, inputs: list[str], outputs: list[str] | None = None,
           **attrs: Any) -> str:
        """Append a node; returns its (first) output, created fresh unless given."""
        outs = outputs or [self.fresh(op_type.lower())]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(op_type), **attrs))
        return outs[0]

    def const(self, value: Any, dtype: str = "float32", hint: str = "const") -> str:
        name = self.fresh(hint)
        self.consts[name] = np.asarray(value, dtype=dtype)
        return name

    def shape(self, value: str) -> Shape:
        return self.graph.shapes[value]

    def param_shape(self, name: str) -> Shape:
        """The IR shape of the weight behind initializer ``name``."""
        return tuple(self.inits[name].shape)

    def param(self, name: str, shape: list[int] | tuple[int, ...]) -> str:
        """Initializer ``name`` stored in the shape an op needs (broadcastable, no Reshape node in the
        graph); a second use wanting another shape gets its own constant."""
        target = tuple(self.inits[name].reshape(shape).shape)
        if self.shaped.setdefault(name, target) == target:
            return name
        return self.const(self.inits[name].reshape(target), self.inits[name].dtype.name, "param")


def weight_names(g: Graph) -> dict[str, str]:
    """ONNX initializer name of each IR weight: its own, unless a value (a blob) has that name."""
    values = set(g.shapes) | set(g.inputs) | {o for n in g.nodes for o in n.outputs}
    taken = values | set(g.weights)
    names = {}
    for k in g.weights:
        name, i = k, 1
        while name in values or (name != k and name in taken):
            i += 1
            name = f"{k}_{i}"
        taken.add(name)
        names[k] = name
    return names


def build_skeleton(g: Graph, name: str = "zoo") -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """The ModelProto without weight data, the weights (IR weights and op constants) to stream,
    and which of them are IR weights (the rest are the ops' constants)."""
    wmap = weight_names(g)
    b = OnnxBuilder(g, set(g.shapes) | set(wmap.values()), {wmap[k]: v for k, v in g.weights.items()})
    for node in g.nodes:
        b.layer = label(node.name)
        node.op.onnx(b, list(node.inputs), list(node.outputs),
                     {r: wmap[n] for r, n in node.weight_names().items()})
    graph = helper.make_graph(b.nodes, label(name), *value_infos(g))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="zoo")
    model.ir_version = 8  # opset 17 needs IR >= 8; keep it low for older runtimes
    used = {i for n in b.nodes for i in n.input}
    weights = {wmap[k]: v.reshape(b.shaped.get(wmap[k], v.shape)) for k, v in g.weights.items() if wmap[k] in used}
    learned = set(weights)
    weights.update(b.consts)
    model.graph.value_info.extend(_inferred(model, weights, learned))
    return model, weights, learned


def _typed(model: onnx.ModelProto, weights: dict[str, np.ndarray], learned: set[str]) -> onnx.ModelProto:
    """A copy of the skeleton with the learned weights declared as typed, shaped graph inputs instead
    of data (the op constants are small and stay): checkable and shape-inferable without a second
    copy of the weights."""
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for k, w in weights.items():
        if k in learned:
            typed.graph.input.append(helper.make_tensor_value_info(k, DTYPES[w.dtype], list(w.shape)))
        else:
            typed.graph.initializer.append(onnx.numpy_helper.from_array(np.array(w), k))
    return typed


def _inferred(model: onnx.ModelProto, weights: dict[str, np.ndarray], learned: set[str]) -> list[onnx.ValueInfoProto]:
    """ONNX shape inference's result for every intermediate value, to be stored in the model."""
    done = onnx.shape_inference.infer_shapes(_typed(model, weights, learned))
    return list(done.graph.value_info)


def value_infos(g: Graph) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """Graph inputs and outputs with symbolic dims (N, H, W, ...) where the net takes other sizes:
    a dim is symbolic when it changes with the input size (the shapes at a probe size differ)."""
    dyn = g.dynamic()
    other = g.shapes
    if dyn["batch"] or dyn["spatial"]:
        other = g.infer_shapes(g.probe_inputs(spatial=dyn["spatial"], batch=dyn["batch"]))
    names: dict[tuple[str, int], str] = {}
    first = next(iter(g.inputs), None)
    batch = (g.shapes[first][0], other[first][0]) if first and g.shapes[first] else None
    for i, (k, s) in enumerate(g.inputs.items()):
        suffix = str(i + 1) if i else ""
        for axis in range(len(s)):
            names[(k, axis)] = "N" if axis == 0 else f"{'HW'[axis - len(s) + 2]}{suffix}" if axis >= len(s) - 2 else ""

    def vi(value: str) -> onnx.ValueInfoProto:
        dims: list[Any] = list(g.shapes[value])
        for axis, d in enumerate(dims):
            if other[value][axis] != d:
                same_n = axis == 0 and dyn["batch"] and (d, other[value][0]) == batch
                dims[axis] = names.get((value, axis)) or ("N" if same_n else f"{label(value, 60)}_d{axis}")
        return helper.make_tensor_value_info(value, TensorProto.FLOAT, dims)

    return [vi(k) for k in g.inputs], [vi(o) for o in g.outputs]


def label(text: str, limit: int = 120) -> str:
    """A name for ONNX metadata (graph and node names): valid UTF-8, bounded length."""
    return text.encode("utf-8", "replace").decode("utf-8")[:limit]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, length: int) -> bytes:
    return _varint((number << 3) | 2) + _varint(length)


def _write_tensor(f: BinaryIO, name: str, arr: np.ndarray, ext: BinaryIO | None,
                  ext_name: str) -> None:
    arr = arr if arr.flags.c_contiguous else arr.copy()  # (ascontiguousarray would make 0-d 1-d)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    t = TensorProto(name=name, dims=list(arr.shape), data_type=DTYPES[arr.dtype])
    raw = memoryview(arr).cast("B") if arr.size else b""
    if ext is not None:
        offset = ext.tell()
        ext.write(raw)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", ext_name), ("offset", str(offset)), ("length", str(len(raw)))):
            t.external_data.add(key=k, value=v)
        head, tail = t.SerializeToString(), b""
    else:
        head, tail = t.SerializeToString(), _len_field(9, len(raw))  # raw_data = 9
    tensor_len = len(head) + len(tail) + (0 if ext is not None else len(raw))
    init = _len_field(5, tensor_len)  # GraphProto.initializer = 5
    f.write(_len_field(7, len(init) + tensor_len))  # ModelProto.graph = 7
    f.write(init + head + tail)
    if ext is None and len(raw):
        f.write(raw)


def write_onnx(g: Graph, path: Path, name: str = "zoo") -> None:
    """Write the graph as ``path`` (plus ``path.data`` when the weights pass EXTERNAL_BYTES)."""
    model, weights, _ = build_skeleton(g, name)
    total = sum(w.nbytes for w in weights.values())
    ext_path = Path(str(path) + ".data")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
        ext = open(ext_path, "wb") if total > EXTERNAL_BYTES else None
        try:
            for k, w in weights.items():
                _write_tensor(f, k, w, ext, ext_path.name)
        finally:
            if ext is not None:
                ext.close()
    if total <= EXTERNAL_BYTES and ext_path.exists():
        os.remove(ext_path)


def check_onnx(path: Path) -> None:
    """The full ONNX checker (with shape inference) on a written file; loads all its weights."""
    onnx.checker.check_model(str(path), full_check=True)


def check_structure(g: Graph) -> None:
    """The full ONNX checker on the model as written, with the weight tensors declared as typed,
    shaped graph inputs instead of data: same nodes, attributes, constants and shape inference,
    without holding a second copy of the weights (a VGG-16 would need 0.5 GB more). ORT loading
    the real file in verification covers the weight bytes."""
    onnx.checker.check_model(_typed(*build_skeleton(g)), full_check=True)


def metadata(props: dict[str, str]) -> bytes:
    """``metadata_props`` entries as ModelProto bytes: appended to a model file they merge into it."""
    return onnx.ModelProto(metadata_props=[onnx.StringStringEntryProto(key=k, value=v)
                                           for k, v in props.items()]).SerializeToString()


def append_metadata(path: Path, props: dict[str, str]) -> None:
    """Add ``props`` to a model file zoo wrote without them (the graph and weights stay as written)."""
    with open(path, "ab") as f:
        f.write(metadata(props))


def replace_metadata(path: Path, props: dict[str, str]) -> None:
    """Rewrite a model file with ``props`` as its metadata, atomically (a temporary, then a rename);
    the graph and weights are unchanged (external data stays where it is)."""
    model = onnx.load(str(path), load_external_data=False)
    del model.metadata_props[:]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(model.SerializeToString())
            f.write(metadata(props))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- after verification: metadata, the fp16 variant -------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def provenance(info: dict[str, Any], params: Path, report: dict[str, Any] | None = None) -> dict[str, str]:
    """The metadata_props zoo stores: where the model came from, a fingerprint of the parameters
    (sha256 of model.safetensors), the zoo version and the verification result (``report``, else
    the one in ``info``): status and max relative error per backend."""
    report = report if report is not None else info.get("verification", {})
    errors = {k: v.get("max_rel") for k, v in report.get("backends", {}).items() if "max_rel" in v}
    props = {"zoo.version": str(info.get("zoo_version")), "zoo.source": Path(info.get("source") or "?").name,
            "zoo.source_sha256": str(info.get("source_fingerprint")),
            "zoo.weights": Path(str(info.get("weights"))).name, "zoo.parameters_sha256": sha256(params),
            "zoo.verification": str(report.get("status", "unverified")),
            "zoo.precision": str(report.get("precision", "fp32")),
            **({"zoo.verified_by": str(report["verified_by"])} if "verified_by" in report else {}),
            "zoo.max_rel_error": json.dumps({k: v if v is None or np.isfinite(v) else None for k, v in errors.items()})}
    return {k: label(v, 1000) for k, v in props.items()}  # a file name may not be valid UTF-8


FP32_ONLY = {("Resize", 2), ("Resize", 1)}  # inputs that stay float32 in the fp16 variant (scales, roi)


FLOAT_KINDS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
# ops that only move or select values: an index value passes through them still exact, in float32
MOVE = {"Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Slice", "Gather", "Expand",
        "Tile", "Split", "Concat"}


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of every value, by shape inference on the graph without the weights' data."""
    g = model.graph
    sk = helper.make_graph(list(g.node), g.name, list(g.input), list(g.output))
    sk.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer)
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(sk, opset_imports=model.opset_import))
    ig = inferred.graph
    return {v.name: v.type.tensor_type.elem_type for v in (*ig.input, *ig.value_info, *ig.output)
            if v.type.tensor_type.elem_type}


def write_fp16(src: Path, dst: Path) -> frozenset[str]:
    """``src`` with fp16 weights and compute, float32 inputs and outputs (a Cast at each end).

    A value cast to float from an integer (TopK/ArgMax indices, Range coordinates, counts) stays
    float32: fp16 holds integers exactly only up to 2048. It stays float32 through ops that only
    move it (an output made of indices is exact); where it enters arithmetic it is cast to fp16 there.
    Returns the outputs that are such index values (to be compared exactly)."""
    from onnx import numpy_helper

    model = onnx.load(str(src))
    g = model.graph
    types = value_types(model)
    keep = {n.input[i] for n in g.node for t, i in FP32_ONLY if n.op_type == t and len(n.input) > i}
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    casts, taken = [], {v for n in g.node for v in (*n.input, *n.output)}

    def fresh(name: str) -> str:
        half = f"{name}/fp16"
        while half in taken:
            half += "_"
        taken.add(half)
        return half

    def cast(name: str, to: int, nodes: list[Any]) -> str:
        out = fresh(name)
        nodes.append(helper.make_node("Cast", [name], [out], name=f"{out}/cast", to=to))
        return out

    wide: set[str] = set()  # float32 values holding integers
    nodes: list[Any] = []
    for n in g.node:
        to = next((a for a in n.attribute if a.name == "to"), None) if n.op_type == "Cast" else None
        if to is not None and to.i == TensorProto.FLOAT:
            src_type = types.get(n.input[0])
            if src_type == TensorProto.BOOL or (src_type in FLOAT_KINDS and n.input[0] not in wide):
                to.i = TensorProto.FLOAT16  # 0/1 (or a float value): exact in fp16
            else:  # an integer (or of unknown type): kept float32
                wide.update(n.output)
        elif any(i in wide for i in n.input):
            if n.op_type == "Concat":  # the fp16 parts join the float32 ones
                n.input[:] = [i if i in wide else cast(i, TensorProto.FLOAT, nodes) for i in n.input]
                wide.update(n.output)
            elif n.op_type in MOVE and n.input[0] in wide:
                wide.update(n.output)
            else:  # into fp16 arithmetic: rounded there, as fp16 compute does
                n.input[:] = [cast(i, TensorProto.FLOAT16, nodes) if i in wide else i for i in n.input]
        nodes.append(n)
    exact = frozenset(y.name for y in g.output if y.name in wide)
    for x in g.input:
        half = fresh(x.name)
        for n in nodes:
            n.input[:] = [half if i == x.name else i for i in n.input]
        casts.append(helper.make_node("Cast", [x.name], [half], name=f"{x.name}/to_fp16", to=TensorProto.FLOAT16))
    for y in g.output:
        half = fresh(y.name)
        for n in nodes:
            n.output[:] = [half if o == y.name else o for o in n.output]
            n.input[:] = [half if i == y.name else i for i in n.input]
        nodes.append(helper.make_node("Cast", [half], [y.name], name=f"{y.name}/to_fp32", to=TensorProto.FLOAT))
    nodes = casts + nodes  # the input casts first: topological order
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    del model.metadata_props[:]
    onnx.save(onnx.shape_inference.infer_shapes(model), str(dst))
    return exact


FP16_CPU = "OpenVINO CPU, INFERENCE_PRECISION_HINT f16"


def run_openvino_fp16(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Outputs of ``path`` computed in fp16 arithmetic by OpenVINO's CPU plugin; None where this
    machine (or this install) cannot compute in fp16."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    if "CPU" not in core.available_devices or "FP16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return None
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f16"})
    if compiled.get_property("INFERENCE_PRECISION_HINT") != ov.Type.f16:
        return None
    res = compiled(feeds)
    return {o.get_any_name(): np.asarray(res[o]) for o in compiled.outputs}


def verify_fp16(g: Graph, path: Path, seed: int = 0, exact: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fp16 variant against the float64 reference, with the fp16 tolerance; ``exact`` outputs
    (index values) must match exactly. Computed in fp16 by OpenVINO's CPU plugin where the CPU has
    fp16 arithmetic; else by ONNX Runtime's CPU provider, which computes fp16 graphs in float32
    (only the fp16 weights are checked then, and the report and status say so)."""
    from . import detections, reference
    from .verify import TOLERANCE, compare, run_onnx, seeded_inputs

    feeds = seeded_inputs(g.inputs, seed)
    tol = TOLERANCE["fp16"]
    report: dict[str, Any] = {"seed": seed, "precision": "fp16", "tolerance": tol, "backends": {},
                              "exact_outputs": sorted(exact)}
    ref = reference.run(g, feeds)
    outs, backend = None, "openvino"
    try:
        outs = run_openvino_fp16(path, feeds)
    except Exception as e:  # noqa: BLE001 -- OpenVINO refusing the graph: ONNX Runtime checks what it can
        report["backends"]["openvino"] = {"status": "refused", "reason": str(e).splitlines()[0][:300]}
    if outs is not None:
        report.update(runtime=FP16_CPU, compute="fp16", verified_by=f"computed in fp16 by {FP16_CPU}")
    else:
        backend = "onnxruntime"
        report.update(runtime="ONNX Runtime CPU", compute="fp32",
                      verified_by="fp16 weights; computed in fp32 by ONNX Runtime CPU (no fp16 arithmetic checked)")
        try:
            outs = run_onnx(path, feeds)
        except Exception as e:  # noqa: BLE001 -- a runtime refusing the fp16 graph is a finding, not a crash
            report["backends"]["onnxruntime"] = {"status": "refused", "reason": str(e).splitlines()[0][:300]}
            report["status"] = "refused"
            return report
    got = compare(ref, outs, tol, detections.outputs(g))
    differ = [k for k in sorted(exact) if not np.array_equal(np.asarray(ref[k], np.float64).reshape(-1),
                                                             np.asarray(outs[k], np.float64).reshape(-1))]
    if differ:
        got.update(ok=False, exact_mismatch=differ)
    report["backends"][backend] = got
    ok = "verified" if report["compute"] == "fp16" else "verified-fp32-compute"
    report["status"] = ok if got["ok"] else "mismatch"
    return report


def finish(g: Graph, art: Path, info: dict[str, Any], fp16: bool = False) -> None:
    """After verification, in the artifact's temporary folder: the fp16 variant when asked (verified,
    its report in ``info["fp16"]``), then the metadata into each ONNX file (the graphs unchanged)."""
    params = art / "model.safetensors"
    if fp16:
        half = art / "model.fp16.onnx"
        try:
            exact = write_fp16(art / "model.onnx", half)
        except Exception as e:  # noqa: BLE001 -- a graph the fp16 rewrite cannot take: said, not fatal
            half.unlink(missing_ok=True)
            info["fp16"] = {"status": "refused", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        else:
            if info.get("status") == "verified":
                info["fp16"] = verify_fp16(g, half, exact=exact or frozenset())
            else:  # fp16 against a reference that model.onnx itself does not match: no finding
                info["fp16"] = {"status": "unverified", "reason": f"model.onnx is {info.get('status', 'unverified')}"}
            append_metadata(half, provenance(info, params, info["fp16"]))
    append_metadata(art / "model.onnx", provenance(info, params))
