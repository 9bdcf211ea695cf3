"""The pipeline convert -> verify -> bench: artifacts per model and input shape (cached while the
source is unchanged), float64 reference outputs for the benchmark inputs, and the case matrix."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.cases import LAYER_BATCH, LAYERS, PROTOCOLS, Case, Protocol
from bench.cases import modes as mode_list
from bench.inputs import InputData, save_batches
from bench.timing import Policy
from bench.worker import make_inputs
from convert import __version__, artifacts, reference
from convert.api import load
from convert.errors import ConvertError
from convert.ir import Graph, Node
from convert.isolate import clean_stale, temp_prefix

from .catalogue import CATALOGUE, ROOT
from .pipeline import MODELS, Target, default_shapes, resolve

log = logging.getLogger(__name__)
CACHE = Path("outputs/cache")
RESULTS = Path("outputs/results")
BENCH_RUNTIMES = ["torch", "torch-compile", "onnxruntime", "onnxruntime-trt", "openvino", "opencv"]
QUICK_MODELS = ["alexnet", "googlenet", "resnet18"]


def default_runtimes(device: str, quick: bool = False) -> list[str]:
    """Every runtime, less those ``left_out`` on this device."""
    if quick:
        return ["torch", "onnxruntime", "opencv"]
    return [r for r in BENCH_RUNTIMES if r not in left_out(device)]


def left_out(device: str) -> dict[str, str]:
    """Runtimes the default set leaves out on ``device``, and why: a summary line each, not a row per case.
    On a CPU, TensorRT cannot run, and torch.compile spends about 50 s per model compiling on 2 cores
    (20 minutes for the zoo), so it runs when asked."""
    if device == "cpu":
        return {"onnxruntime-trt": "TensorRT needs CUDA",
                "torch-compile": "torch.compile takes about 50 s per model to compile on a CPU (ask: --runtime "
                                 "torch-compile)"}
    import onnxruntime

    out = {"openvino": "OpenVINO's GPU plugin runs on Intel GPUs only (its CPU plugin: without --gpu)"}
    if "TensorrtExecutionProvider" not in onnxruntime.get_available_providers():
        out["onnxruntime-trt"] = "this ONNX Runtime has no TensorRT provider (pip install onnxruntime-gpu)"
    return out
# zoo protocol on a CPU: enough samples for a stable median at 2 cores, a 20-minute --all.
CPU_POLICY = Policy(warmup_iters=2, warmup_s=0.2, warmup_max_s=4.0, min_iters=5, min_s=0.5,
                    max_iters=50, max_s=4.0, stable_tol=0.02)
QUICK_POLICY = Policy(warmup_iters=1, warmup_s=0.0, warmup_max_s=1.0, min_iters=3, min_s=0.1,
                      max_iters=10, max_s=1.0, stable_tol=0.05)


@dataclass
class Prepared:
    """A model ready to time at one input shape: its artifact dir and what the cases need."""

    target: Target
    art: Path
    info: dict[str, Any]
    status: str = ""  # "" ok; "unverified" / "error" with reason
    reason: str = ""


def layer_targets() -> list[Target]:
    """convnet-benchmarks' L1-L5 convolutions as one-layer prototxts (batch 128, stride 1, no pad)."""
    d = CACHE / "layers"
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for name, cin, cout, k, hw in LAYERS:
        p = d / f"{name}.prototxt"
        text = (f'name: "{name}"\ninput: "data" input_dim: {LAYER_BATCH} input_dim: {cin} input_dim: {hw} '
                f'input_dim: {hw}\nlayer {{ name: "conv" type: "Convolution" bottom: "data" '
                f'top: "conv" convolution_param {{ num_output: {cout} kernel_size: {k} }} }}\n')
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
        out.append(Target(name, p, {}))
    return out


def strip_ops(g: Graph, kinds: tuple[str, ...]) -> Graph:
    """The graph without single-input ops of ``kinds`` (convnet-benchmarks: no dropout, no softmax)."""
    rename: dict[str, str] = {}
    nodes: list[Node] = []
    for n in g.nodes:
        ins = tuple(rename.get(i, i) for i in n.inputs)
        if n.op.kind in kinds and len(ins) == 1 and len(n.outputs) == 1:
            rename[n.outputs[0]] = ins[0]
            continue
        nodes.append(Node(n.op, ins, n.outputs, n.name, n.attr))
    outs = [rename.get(o, o) for o in g.outputs]
    meta = {**g.meta, "stripped": list(kinds)}
    return Graph(dict(g.inputs), outs, nodes, g.weights, g.shapes, meta)


def _fresh(art: Path, source: Path, shapes: dict[str, list[int]], seed: int) -> dict[str, Any] | None:
    """convert.json of a cached artifact if it still matches the source, shapes and seed, and is the plain
    conversion bench makes: seeded random weights, no --fold (a convert.json without "fold" predates it),
    model.onnx folded (one without "onnx_folded" has its batch norms apart: converted before 2026-12-01)."""
    try:
        info = json.loads((art / "convert.json").read_text())
    except (OSError, ValueError):
        return None
    same = (info.get("source_fingerprint") == artifacts.fingerprint(str(source.resolve()))
            and info.get("zoo_version") == __version__ and info.get("seed") == seed
            and info.get("fold") is False and info.get("onnx_folded") is True and info.get("weights") == "random (seeded)"
            and info.get("weights_fingerprint") is None
            and all(info["inputs"].get(k) == list(v) for k, v in shapes.items()))
    return info if same else None


def prepare(t: Target, shape: tuple[int, ...] | None, strip: tuple[str, ...], seed: int,
            written: list[Path], private: Callable[[], Path], keep: bool = False) -> Prepared:
    """Convert (or reuse) the artifact of ``t`` at input ``shape`` (batch 1 unless the graph needs
    its real batch), verified; convnet-benchmarks variants are stripped. Its usual folder (outputs/models/NAME,
    or outputs/cache/NAME-NxCxHxW[-STRIPPED]) is reused when fresh and never written otherwise: a conversion
    goes into ``private()`` (this run's own folder) and is added to ``written``; with ``keep`` it is then
    moved to the usual folder when nothing is there (else it stays private, removed after its cases)."""
    if shape:
        first = next(iter(load(t.source, None, default_shapes(t, None), seed=None, args=t.args).graph.inputs))
        shapes = {first: shape}
    else:
        shapes = default_shapes(t, None)
    base = load(t.source, None, shapes, seed=None, args=t.args).graph  # shapes only: cheap
    shapes = {k: v for k, v in base.inputs.items()}
    dyn = base.dynamic_batch()
    if dyn:
        shapes = {k: (1, *v[1:]) for k, v in shapes.items()}
    default = _is_default(t, shapes) and not strip
    tag = "x".join(map(str, next(iter(shapes.values()))))
    art = MODELS / t.name if default else CACHE / f"{t.name}-{tag}{'-' + '-'.join(strip) if strip else ''}"
    info = _fresh(art, t.source, {k: list(v) for k, v in shapes.items()}, seed)
    if info is None:
        usual = art
        try:
            art = private() / art.name
            info = _convert(t, art, shapes, strip, seed)
        except ConvertError as e:
            return Prepared(t, art, {}, "error", f"conversion failed: {e}")
        except OSError as e:  # this run's own folder could not be made
            return Prepared(t, art, {}, "error", f"conversion failed: {CACHE}: {e.strerror or e}")
        written.append(art)
        if keep:
            art = _adopt(art, usual)
    if info["status"] != "verified":
        div = info["verification"].get("first_divergence") or {}
        where = f" (first divergence: layer {div.get('layer')!r})" if div else ""
        return Prepared(t, art, info, "unverified", f"conversion did not verify{where}")
    return Prepared(t, art, info)


def _adopt(art: Path, usual: Path) -> Path:
    """--keep: ``art`` (this run's) moved to ``usual`` when nothing is there; a folder there (the user's, a
    conversion with other options, another run's) is never replaced: ``art`` then stays where it is."""
    if not os.path.lexists(usual):
        try:
            usual.parent.mkdir(parents=True, exist_ok=True)
            os.rename(art, usual)  # a folder that appeared meanwhile (not empty) makes this fail: nothing lost
            return usual
        except OSError:
            pass
    log.warning("--keep: %s holds another conversion (other options, another run's, or not zoo's) and is "
                "left as it is; this run converts %s into a folder of its own, not kept", usual, art.name)
    return art


def _is_default(t: Target, shapes: dict[str, tuple[int, ...]]) -> bool:
    if t.entry is None:
        return False
    dims = next(iter(shapes.values()))
    return tuple(dims[1:]) == t.entry.input


def _convert(t: Target, art: Path, shapes: dict[str, tuple[int, ...]], strip: tuple[str, ...],
             seed: int) -> dict[str, Any]:
    from convert.api import convert
    from convert.api import load as load_full

    log.info("converting %s at %s", t.name, shapes)
    if not strip:
        return convert(t.source, None, art.parent, shapes, seed, name=art.name, args=t.args).report
    loaded = load_full(t.source, None, shapes, seed, t.args)
    g = strip_ops(loaded.graph, strip)
    # the stripped net is not the original file any more: no OpenCV comparison for it
    return artifacts.write(g, art, loaded.extra).report


def reference_outputs(p: Prepared, batch: int, seed: int, n_inputs: int,
                      real: tuple[str, dict[str, np.ndarray]] | None = None) -> Path:
    """Float64 outputs for the first benchmark input (its first two samples when the graph is
    batch-independent, which is all a check needs); cached beside the artifact. ``real``: the
    fingerprint and first batch of --input-data instead of the seeded input."""
    tag = f"d{real[0][:16]}" if real else f"s{seed}"
    path = p.art / f"bench-reference-b{batch}-{tag}-n{n_inputs}.npz"
    if path.exists():
        return path
    g = artifacts.load_graph(p.art)
    shapes = {k: [batch, *v[1:]] for k, v in g.inputs.items()}
    x = real[1] if real else make_inputs(shapes, seed, 1)[0]  # make_inputs(.., n)[0]: the same for any n
    if p.info.get("dynamic_batch"):  # converted at batch 1: run the first samples one by one
        runs = [reference.run(g, {n: v[i:i + 1] for n, v in x.items()}) for i in range(min(batch, 2))]
        outs = {o: np.concatenate([r[o] for r in runs]) for o in g.outputs}
    else:
        outs = reference.run(g, x)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")  # atomic: a killed run leaves no half file
    np.savez(tmp, **{f"o{i}": outs[o] for i, o in enumerate(g.outputs)})
    os.replace(tmp, path)
    return path


def original_files(p: Prepared) -> dict[str, Any] | None:
    """What OpenCV loads: the original definition and weights (None for stripped variants)."""
    from convert.runtimes.opencv import original

    return original(p.art, p.info)


def data_grad_macs_per_image(art: Path, ir: dict[str, Any]) -> int:
    """Multiply-adds per image of the input gradients autograd skips when the data needs none: those
    of the first layers with weights whose inputs depend on the data only (a convolution's or a
    linear layer's input gradient costs its forward's multiply-adds)."""
    from safetensors import safe_open

    with safe_open(str(art / "model.safetensors"), framework="numpy") as f:
        weights = {k: np.broadcast_to(np.float32(0), f.get_slice(k).get_shape()) for k in f.keys()}
    g = Graph.from_json(ir, weights)
    no_grad, skipped = set(g.inputs), 0
    for n in g.nodes:
        if all(i in no_grad for i in n.inputs):
            if n.weight_names():
                skipped += g.node_macs(n)
            else:
                no_grad.update(n.outputs)
    return skipped // next(iter(g.inputs.values()))[0]


def plan_cases(p: Prepared, proto: Protocol, *, device: str, runtimes: list[str],
               precisions: list[str], layouts: list[str], batch: int, modes: list[str],
               threads: int, seed: int, policy: Policy, dry: bool = False) -> list[Case]:
    """One case per runtime, precision, layout and mode (``dry``: listing only, nothing computed)."""
    common = _model_fields(p, proto, batch, seed, live=not p.status and not dry)
    return [Case(runtime=rt, device=device, precision=prec, layout=layout, batch=batch, mode=mode,
                 protocol=proto.name, threads=threads, policy=policy.__dict__, seed=seed,
                 n_inputs=proto.n_inputs, grad_input=proto.grad_input, out_grad=proto.out_grad,
                 retain_graph=proto.retain_graph, **common)
            for rt in runtimes for prec in precisions for layout in layouts for mode in modes]


def _model_fields(p: Prepared, proto: Protocol, batch: int, seed: int, live: bool,
                  data: InputData | None = None) -> dict[str, Any]:
    """What every case of ``p`` at ``batch`` shares: shapes, FLOPs, files (``live``: computed from the
    converted artifact; else from the shapes alone), and the status of its conversion."""
    info = p.info
    fmt = info.get("framework") or (p.target.entry.framework if p.target.entry else "")
    shapes = {k: [batch, *v[1:]] for k, v in info["inputs"].items()} if info else {}
    gflops = 2 * info["macs_per_image"] / 1e9 if info else None
    out_shapes, back, ref, original, real = [], None, None, None, {}
    if live:
        ir = json.loads((p.art / "ir.json").read_text())
        out_shapes = [[batch, *ir["shapes"][o][1:]] for o in info["outputs"]]
        if gflops is not None and not proto.grad_input:  # twice the forward, less the skipped data gradient
            back = 2 * gflops - 2 * data_grad_macs_per_image(p.art, ir) / 1e9
        real = _real_inputs(p, batch, data) if data else real
        ref = str(reference_outputs(p, batch, seed, real.get("n_inputs", proto.n_inputs), real.pop("first", None)))
        original = original_files(p)
    return dict(model=p.target.name, source_format=fmt, artifact=str(p.art), input_shapes=shapes, **real,
                output_shapes=out_shapes, gflops_per_image=gflops, backward_gflops_per_image=back,
                reference=ref, original=original, status=p.status, reason=p.reason)


def _preprocess(t: Target) -> Any:
    return t.entry.preprocess if t.entry else None


def _real_inputs(p: Prepared, batch: int, data: InputData) -> dict[str, Any]:
    """--input-data as this model's batches (an .npz beside the artifact, rewritten only when missing)
    and the Case fields that point to them; "first": the fingerprint and first batch for the reference."""
    (name, dims), = p.info["inputs"].items()
    chw = tuple(dims[1:])
    path = p.art / f"bench-inputs-b{batch}-{data.sha256[:16]}.npz"
    batches = data.batches(chw, batch, _preprocess(p.target))
    if not path.exists():
        save_batches(path, batches)
    return {"input_data": str(path), "inputs": data.describe(_preprocess(p.target)), "n_inputs": len(batches),
            "first": (data.sha256, {name: batches[0]})}


def check_input_data(data: InputData, t: Target, described: Prepared) -> None:
    """Before anything runs: the model has one input, and every file fits it (one line, exit 2)."""
    inputs = described.info.get("inputs") or {}
    if len(inputs) != 1:
        raise ConvertError(f"--input-data: {t.name} has {len(inputs)} inputs; real inputs are read for "
                           "single-input models only")
    (name, dims), = inputs.items()
    data.check(name, t.name, tuple(dims[1:]))


def targets_for(specs: list[str], all_: bool, proto: Protocol, layers: bool, quick: bool) -> list[Target]:
    if layers:  # MODEL names pick some of L1-L5
        ts = layer_targets()
        unknown = sorted(set(specs) - {t.name for t in ts})
        if unknown:
            raise ConvertError(f"--layers: unknown layer {unknown[0]!r} (the layers are "
                               f"{', '.join(t.name for t in ts)})")
        return [t for t in ts if t.name in specs] if specs else ts
    if all_:
        return [resolve(n) for n in (proto.models or CATALOGUE)]
    if specs:
        return _unique([resolve(s) for s in specs])
    if proto.models:
        return [resolve(n) for n in proto.models]
    if quick:
        return [resolve(n) for n in QUICK_MODELS]
    raise ConvertError("name models (zoo names or files), or give --all, --quick or --layers")


def _unique(ts: list[Target]) -> list[Target]:
    """``ts`` less exact repeats; two different models of one name (rows are keyed by it) -> ConvertError."""
    seen: dict[str, Target] = {}
    for t in ts:
        other = seen.setdefault(t.name, t)
        if other is not t and (other.source.resolve(), other.args) != (t.source.resolve(), t.args):
            raise ConvertError(f"two models named {t.name!r}: {other.source} and {t.source} (results are kept "
                               "by model name); rename one of the files")
    return list(seen.values())


def plan(specs: list[str], *, all_: bool = False, protocol: str = "zoo", layers: bool = False,
         device: str = "cpu", runtimes: list[str], precisions: list[str], layouts: list[str],
         batches: list[int], mode: str = "inference", threads: int = 1, seed: int = 0,
         quick: bool = False, keep: bool = False, progress: Any = None, input_data: Path | None = None) -> Plan:
    """All cases of a sweep, planned from the models' shapes alone: nothing is converted yet
    (``input_data``: a folder of real inputs, checked against every model now)."""
    proto = PROTOCOLS[protocol]
    ts = targets_for(specs, all_, proto, layers, quick)
    data = InputData.scan(input_data) if input_data else None
    policy = QUICK_POLICY if quick else (CPU_POLICY if proto.name == "zoo" and device == "cpu" else proto.policy)
    modes = [proto.mode] if proto.mode else mode_list(mode)
    out = Plan(proto, seed, keep, data=data)
    for i, t in enumerate(ts):
        if progress:
            progress(i, len(ts), t.name)
        # a layer's input is its own (channels, size, batch 128); a model's follows the protocol
        hw = None if layers else proto.hw_of(t.name)
        bs = [LAYER_BATCH] if layers else sorted({proto.batch_of(t.name, b) for b in batches})
        described = _describe_only(t, hw)
        if data:
            check_input_data(data, t, described)
        for b in bs:
            out.jobs[(t.name, b)] = (t, (b, 3, hw, hw) if hw else None)
            out.cases += plan_cases(described, proto, device=device, runtimes=runtimes, precisions=precisions,
                                    layouts=layouts, batch=b, modes=modes, threads=threads, seed=seed,
                                    policy=policy, dry=True)
    return out


def build(specs: list[str], *, dry_run: bool = False, **kw: Any) -> list[Case]:
    """All cases of a sweep, every model converted and verified first (unless ``dry_run``)."""
    p = plan(specs, keep=True, **kw)
    p.hold = True  # every case made live before any runs: its artifact must outlive the next model's start
    return p.cases if dry_run else [p.live(c) for c in p.cases]


@dataclass
class Plan:
    """A sweep planned model by model: ``live(case)`` converts (or takes from the cache) the case's model
    when its first case is about to run; when the next model starts, or at ``release()``, what this run
    wrote for the previous one is removed unless ``keep``: its converted folder (always in a folder of this
    run's own, see ``prepare``), and the original files OpenCV reads (seeded random caffemodel, .t7 of a Lua
    definition), regenerated exactly when missing. A folder that was there before stays (only a regenerated
    original file of it goes)."""

    proto: Protocol
    seed: int
    keep: bool = False
    data: InputData | None = None  # --input-data
    cases: list[Case] = field(default_factory=list)
    jobs: dict[tuple[str, int], tuple[Target, tuple[int, ...] | None]] = field(default_factory=dict)
    _model: str = ""
    _ready: dict[int, dict[str, Any]] = field(default_factory=dict)  # batch -> the live fields of its cases
    hold: bool = False  # build(): this run's own folders stay while it lives (the next run removes them)
    _written: list[Path] = field(default_factory=list)  # this run's files of the current model
    _private: Path | None = None  # this run's folder for the current model's conversions (outputs/cache/zoo-tmp-*)

    def live(self, case: Case) -> Case:
        """``case`` with its model converted and verified (the fields a worker needs filled in)."""
        if case.model != self._model:
            self.release()
            self._model = case.model
        if case.batch not in self._ready:
            p = self._prepare(*self.jobs[(case.model, case.batch)], case.batch)
            self._ready[case.batch] = _model_fields(p, self.proto, case.batch, self.seed, live=not p.status,
                                                    data=self.data)
        c = replace(case, **self._ready[case.batch])
        if c.runtime == "opencv" and c.original:
            self._original(c)
        return c

    def _prepare(self, t: Target, shape: tuple[int, ...] | None, batch: int) -> Prepared:
        p = prepare(t, shape, self.proto.strip, self.seed, self._written, self._folder, self.keep)
        dims = next(iter(p.info["inputs"].values()), None) if p.info else None
        if dims and not p.info.get("dynamic_batch") and dims[0] != batch:
            p = prepare(t, (batch, *dims[1:]), self.proto.strip, self.seed, self._written, self._folder, self.keep)
        return p

    def _folder(self) -> Path:
        """This run's own folder for conversions, made when first needed; named as a temporary of this
        process, so a later run removes it if this one is killed."""
        if self._private is None:
            CACHE.mkdir(parents=True, exist_ok=True)
            clean_stale(CACHE)
            self._private = Path(tempfile.mkdtemp(prefix=temp_prefix("tmp"), dir=CACHE))
        return self._private

    def _original(self, c: Case) -> None:
        """The original file OpenCV reads, written again (same seed, same numbers) when it is missing."""
        orig = c.original or {}
        art, path = Path(c.artifact), Path(orig["source" if orig["framework"] == "torch7" else "weights"])
        if path.parent != art or path.exists():
            return
        info = json.loads((art / "convert.json").read_text())
        t = self.jobs[(c.model, c.batch)][0]
        log.info("writing %s again for OpenCV", path)
        loaded = load(t.source, None, {k: tuple(v) for k, v in info["inputs"].items()}, info["seed"], t.args)
        clean_stale(art)  # what a killed run left here
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix("tmp", path.name), dir=art))  # a killed run: no half file
        try:
            loaded.extra(tmp)
            try:
                os.link(tmp / path.name, path)  # atomic, and never over a file another run wrote meanwhile
            except FileExistsError:
                return
            except OSError:  # no hard links here
                os.replace(tmp / path.name, path)
            self._written.append(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def release(self) -> None:
        """Remove what this run wrote for the current model (unless ``keep``) and its own folder: never a
        folder that was there before (the user's, or another run's)."""
        if not self.keep:
            for path in self._written:
                if not path.is_dir():
                    path.unlink(missing_ok=True)
        if self._private is not None and not self.hold:
            shutil.rmtree(self._private, ignore_errors=True)
        elif self._private is not None:
            with contextlib.suppress(OSError):
                self._private.rmdir()  # only when empty: every conversion in it went to its usual folder
        self._model, self._ready, self._written, self._private = "", {}, [], None


def _describe_only(t: Target, hw: int | None) -> Prepared:
    from .pipeline import describe

    g = describe(t)
    if hw:
        g = describe(t, {next(iter(g.inputs)): (1, 3, hw, hw)})
    batch = next(iter(g.inputs.values()))[0]
    info = {"inputs": {k: list(v) for k, v in g.inputs.items()}, "outputs": g.outputs,
            "macs_per_image": g.macs() // batch}
    return Prepared(t, MODELS / t.name, info)


def default_results_path(env: dict[str, Any]) -> Path:
    """A new file under outputs/results/MACHINE/, named by the time (and -2, -3... for a second run
    started in the same second: an existing file is never taken over)."""
    from bench.env import machine_name

    d, stamp = RESULTS / machine_name(env), time.strftime("%Y%m%d-%H%M%S")
    path, n = d / f"{stamp}.json", 1
    while os.path.lexists(path):
        n += 1
        path = d / f"{stamp}-{n}.json"
    return path


def relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
