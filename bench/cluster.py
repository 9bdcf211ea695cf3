"""A sweep on a Ray cluster: Ray places the work and watches the nodes; zoo decides what a case is
and what must be identical.

Each node first runs one set-up task: it builds the cases itself from a host-independent request
(model names and conversion arguments, converted and verified once on that node, cached by the
source and weights fingerprints), records its environment and measures its GEMM peak. The driver
then checks that every node's artifacts have the same fingerprint (a node whose conversion differs
times none of that model's cases) and hands out the cases one at a time per node: each case task
reserves all the node's CPUs and times its case in a fresh process there, exactly as a local sweep
(``sweep.run_one``). Every machine kind (an accelerator type, or the CPU model of a CPU-only node)
times the whole case set once; its rows stream into ``OUT/<machine>/<run>.json``. A node lost
mid-case: that case goes back to the queue for another node of its kind, or becomes an error row
when none is left; a finished row is saved as it arrives and is never lost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import env as benv
from . import sweep
from .cases import Case
from .results import Recorder, key
from .worker import base_row

log = logging.getLogger(__name__)
MISSING = "--cluster needs Ray, which is not installed: pip install -e '.[cluster]'"
# what a conversion produced (its graph, weights, ONNX and PyTorch code), compared across nodes
ARTIFACT_FILES = ("ir.json", "model.safetensors", "model.onnx", "model.py")
HOST_META = ("source", "weights")  # ir.json's meta fields that name this host's files: not compared
MAX_LOST = 2  # a case lost with its node this often is an error row, not retried again
Prepare = Callable[[int | None], list[Case]]  # (threads or None: the node's cores) -> the node's cases


class ClusterError(Exception):
    """The cluster cannot do what was asked; the message is one line."""


@dataclass
class Node:
    """One Ray node taking part in the sweep."""

    id: str
    cpus: int
    accelerator: str | None
    gpus: int = 0  # with --gpu: the node's GPUs, all reserved by each of its tasks
    machine: str = ""
    env: dict[str, Any] = field(default_factory=dict)
    cases: dict[tuple[Any, ...], Case] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    alive: bool = True
    refused: set[str] = field(default_factory=set)  # artifacts whose conversion differs here
    done: int = 0
    running: int = 0

    @property
    def label(self) -> str:
        return f"{self.machine} {self.id[:8]}"

    def may_run(self, k: tuple[Any, ...]) -> bool:
        c = self.cases.get(k)
        return self.alive and c is not None and _art(c) not in self.refused


@dataclass
class State:
    """What the progress display shows: per node (label, done, running, left for its machine), and
    all cases done, left, ETA."""

    nodes: list[tuple[str, int, int, int]]
    done: int
    left: int
    eta_s: float


@contextmanager
def session(address: str) -> Iterator[Any]:
    """Ray, connected to ``address`` (``local`` starts an instance here for the run); disconnected
    (and a local instance stopped) at the end."""
    try:
        import ray
    except ImportError:
        raise ClusterError(MISSING) from None
    kw: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False, **kw)  # never RAY_ADDRESS's cluster
        else:
            ray.init(address=address, **kw)
    except Exception as e:  # Ray's connection errors have no common class; the message says what failed
        raise ClusterError(f"--cluster {address}: cannot connect: {_line(e)}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def _art(c: Case) -> str:
    return Path(c.artifact).name if c.artifact else ""


def fingerprints(cases: list[Case]) -> dict[str, str]:
    """Each artifact's fingerprint (``artifact_fingerprint``), keyed by the artifact's folder name."""
    out: dict[str, str] = {}
    for c in cases:
        name = _art(c)
        if not name or name in out or c.status:
            continue
        out[name] = artifact_fingerprint(Path(c.artifact))
    return out


def artifact_fingerprint(d: Path) -> str:
    """sha256 of what a conversion produced, without what names the host: the graph (ir.json less
    meta.source and meta.weights), the weights, the ONNX model less its metadata_props (provenance,
    verification errors) and model.py less its header docstring (the source's path). Two checkouts
    at different paths agree; an older or different conversion does not."""
    h = hashlib.sha256()
    for f in ARTIFACT_FILES:
        p = d / f
        h.update(f"\0{f}\0".encode())
        if not p.is_file():
            h.update(b"missing")
        elif f == "ir.json":
            h.update(_ir_bytes(p))
        elif f == "model.onnx":
            h.update(_onnx_bytes(p))
        elif f == "model.py":
            h.update(_strip_docstring(p.read_text(errors="replace")).encode())
        else:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):  # noqa: B023
                    h.update(block)
    return h.hexdigest()


def _ir_bytes(p: Path) -> bytes:
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return p.read_bytes()
    if isinstance(doc, dict) and isinstance(doc.get("meta"), dict):
        doc["meta"] = {k: v for k, v in doc["meta"].items() if k not in HOST_META}
    return json.dumps(doc, sort_keys=True).encode()


def _onnx_bytes(p: Path) -> bytes:
    import onnx

    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception:  # noqa: BLE001 (not a model onnx can read: its bytes as they are)
        return p.read_bytes()
    del model.metadata_props[:]
    return model.SerializeToString(deterministic=True)


def _strip_docstring(text: str) -> str:
    """model.py without its leading docstring (it names the source file's path)."""
    body = text.lstrip()
    for q in ('"""', "'''"):
        if body.startswith(q):
            end = body.find(q, len(q))
            return body[end + len(q):] if end >= 0 else body
    return body


def accelerator(resources: dict[str, float]) -> str | None:
    """The node's accelerator type (Ray's ``accelerator_type:X`` resource), if any."""
    types = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
    return types[0] if types else None


def select(ray: Any, accelerators: list[str], all_accelerators: bool, gpu: bool = False) -> list[Node]:
    """The alive nodes with CPUs (and with ``gpu`` a GPU), narrowed to the accelerator types asked for."""
    nodes = [Node(n["NodeID"], int(n["Resources"].get("CPU", 0)), accelerator(n["Resources"]),
                  gpus=int(n["Resources"].get("GPU", 0)) if gpu else 0)
             for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1
             and (not gpu or n["Resources"].get("GPU", 0) >= 1)]
    present = sorted({n.accelerator for n in nodes if n.accelerator})
    for a in accelerators:
        if a not in present:
            raise ClusterError(f"--accelerator {a}: no node of that type in the cluster "
                               f"(present: {', '.join(present) or 'none'})")
    if accelerators:
        nodes = [n for n in nodes if n.accelerator in accelerators]
    elif all_accelerators:
        nodes = [n for n in nodes if n.accelerator]
    if not nodes:
        raise ClusterError("the cluster has no node to run on" + (" with a GPU" if gpu else "")
                           + (" with an accelerator" if all_accelerators else ""))
    return nodes


_REMOTE: dict[Any, Any] = {}  # each function exported to the cluster once


def _pinned(ray: Any, fn: Callable[..., Any], node: Node) -> Any:
    """``fn`` as a task on ``node`` only, holding all its CPUs (and with --gpu all its GPUs: nothing
    runs beside it, and Ray makes them visible to it); not retried there (a lost node's case is
    queued again for another node by ``run``)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if fn not in _REMOTE:
        _REMOTE[fn] = ray.remote(fn)
    return _REMOTE[fn].options(num_cpus=node.cpus, num_gpus=node.gpus, max_retries=0,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False))


def set_up_node(prepare: Prepare, threads: int | None, gpu: int | None, device: str, isolate: bool,
                node_id: str, resources: dict[str, float]) -> dict[str, Any]:
    """On the node: its cases (converted and verified there), its environment, its GEMM peak."""
    cases = prepare(threads)
    threads = threads or benv.physical_cores()
    env = benv.capture(threads, gpu)
    env["ray_node"] = {"id": node_id, "resources": resources}
    precisions = sorted({c.precision for c in cases if not c.status})
    env["gemm_peak"] = {device: {p: sweep.gemm_peak(device, p, threads, isolate) for p in precisions}}
    for c in cases:  # % of peak: against this node's own GEMM rate
        c.gemm_peak_tflops = env["gemm_peak"][device].get(c.precision, {}).get("tflops")
    return {"env": env, "cases": cases, "fingerprints": fingerprints(cases), "cwd": os.getcwd()}


def run_on_node(case: Case, cwd: str, isolate: bool, timeout_s: float) -> dict[str, Any]:
    """On the node: one case, in a fresh process, from the folder its set-up ran in."""
    os.chdir(cwd)
    return sweep.run_one(case, isolate, timeout_s)


def machine_of(node: Node, device: str = "cpu") -> str:
    """The results folder of a node: its accelerator type when the cases run on it (``device``
    cuda), else its CPU (as a local run names it): a GPU node timing CPU cases is a CPU machine."""
    if node.accelerator and device.startswith("cuda"):
        return benv.gpu_folder(node.accelerator)
    return benv.machine_name(node.env)


def set_up(ray: Any, nodes: list[Node], prepare: Prepare, *, threads: int | None, gpu: int | None,
           device: str, isolate: bool) -> list[Node]:
    """Every node set up at once; a node whose set-up fails is left out with a warning."""
    resources = {n["NodeID"]: n["Resources"] for n in ray.nodes()}
    refs = {_pinned(ray, set_up_node, n).remote(prepare, threads, gpu, device, isolate, n.id, resources[n.id]): n
            for n in nodes}
    ready = []
    for ref, n in refs.items():
        try:
            got = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # zoo's own failure on that node: the user's to see
            raise ClusterError(f"node {n.id[:8]}: {_line(e.cause if hasattr(e, 'cause') else e)}") from None
        except ray.exceptions.RayError as e:
            log.warning("node %s left out: its set-up failed (%s)", n.id[:8], _line(e))
            continue
        n.env, n.fingerprints, n.cwd = got["env"], got["fingerprints"], got["cwd"]
        n.cases = {key(c.to_dict()): c for c in got["cases"]}
        n.machine = machine_of(n, device)
        ready.append(n)
    if not ready:
        raise ClusterError("no node could be set up")
    _agree(ready)
    return ready


def _agree(nodes: list[Node]) -> None:
    """The fingerprint more than half the nodes (that have the model) share is the conversion; a node
    that differs is refused that model. Without such a majority (a tie) no node's is trusted: the
    model is refused on every node, saying so."""
    names = sorted({a for n in nodes for a in n.fingerprints})
    for a in names:
        votes: dict[str, int] = {}
        for n in nodes:
            if a in n.fingerprints:
                votes[n.fingerprints[a]] = votes.get(n.fingerprints[a], 0) + 1
        best = max(votes, key=lambda fp: votes[fp])
        if 2 * votes[best] <= sum(votes.values()):
            for n in nodes:
                if a in n.fingerprints:
                    n.refused.add(a)
            log.warning("the conversion of %s differs between the nodes with no majority (%s): it is not "
                        "timed on any node", a, ", ".join(f"{fp[:12]}... on {k} node(s)" for fp, k in votes.items()))
            continue
        for n in nodes:
            if n.fingerprints.get(a, best) != best:
                n.refused.add(a)
                log.warning("node %s: the conversion of %s differs from the other nodes' (%s... vs %s...): "
                            "its cases are not timed there", n.id[:8], a, n.fingerprints[a][:12], best[:12])


def recorders(nodes: list[Node], out_root: Path, run_id: str, resume: bool) -> dict[str, Recorder]:
    """One results file per machine, ``out_root/<machine>/<run_id>.json``, its env the first node's
    with every node's own environment under ``nodes``."""
    recs = {}
    for m in dict.fromkeys(n.machine for n in nodes):
        mine = [n for n in nodes if n.machine == m]
        path = Path(out_root) / m / f"{run_id}.json"
        env = {**mine[0].env, "machine": m, "run_id": run_id}
        rec = Recorder(path, env, resume=resume and path.exists())
        rec.set_env("nodes", {**rec.doc["env"].get("nodes", {}), **{n.id: n.env for n in mine}})
        recs[m] = rec
    return recs


def run(ray: Any, nodes: list[Node], recs: dict[str, Recorder], *, isolate: bool, timeout_s: float,
        progress: Callable[[State], None] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every machine's cases not yet in its file, one at a time per node; returns the new rows per machine."""
    todo = {m: deque(k for n in nodes if n.machine == m for k in n.cases) for m in recs}
    todo = {m: deque(dict.fromkeys(k for k in q if k not in recs[m].done)) for m, q in todo.items()}
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in recs}
    lost: dict[tuple[str, tuple[Any, ...]], int] = {}
    inflight: dict[Any, tuple[Node, tuple[Any, ...]]] = {}
    started = time.perf_counter()

    def record(n: Node, k: tuple[Any, ...], row: dict[str, Any]) -> None:
        row = {**row, "node": {"id": n.id, "hostname": n.env.get("hostname")}}
        recs[n.machine].add(row)
        rows[n.machine].append(row)
        n.done += 1

    while any(todo.values()) or inflight:
        for n in nodes:
            q = todo[n.machine]
            k = next((k for k in q if n.may_run(k)), None) if not n.running else None
            if k is not None:
                q.remove(k)
                ref = _pinned(ray, run_on_node, n).remote(n.cases[k], n.cwd, isolate, timeout_s)
                inflight[ref], n.running = (n, k), 1
        _orphans(nodes, todo, record)
        if inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                n, k = inflight.pop(ref)
                n.running = 0
                row = _result(ray, ref, n, k, lost, todo)
                if row is not None:
                    record(n, k, row)
        if progress:
            done = sum(len(r) for r in rows.values())
            left = sum(map(len, todo.values())) + len(inflight)
            eta = (time.perf_counter() - started) / done * left if done else float("nan")
            busy = {m: sum(1 for x, _ in inflight.values() if x.machine == m) for m in todo}
            progress(State([(n.label, n.done, n.running, len(todo[n.machine]) + busy[n.machine]) for n in nodes],
                           done, left, eta))
    return rows


def _result(ray: Any, ref: Any, n: Node, k: tuple[Any, ...], lost: dict[Any, int],
            todo: dict[str, deque[Any]]) -> dict[str, Any] | None:
    """A finished task's row; None when its node was lost and the case is queued again."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # zoo's code failed there (not the node): an error row
        return {**base_row(n.cases[k].to_dict()), "status": "error", "reason": f"on node {n.id[:8]}: {_line(e)}"}
    except ray.exceptions.RayError as e:
        if _node_alive(ray, n.id):
            return {**base_row(n.cases[k].to_dict()), "status": "error", "reason": f"on node {n.id[:8]}: {_line(e)}"}
        n.alive = False
        lost[(n.machine, k)] = lost.get((n.machine, k), 0) + 1
        log.warning("node %s lost (%s)", n.id[:8], _line(e))
        if lost[(n.machine, k)] > MAX_LOST:
            return {**base_row(n.cases[k].to_dict()), "status": "error",
                    "reason": f"lost with its node {lost[(n.machine, k)]} times"}
        todo[n.machine].appendleft(k)
        return None


def _node_alive(ray: Any, node_id: str, wait_s: float = 10.0) -> bool:
    """Whether Ray still counts the node alive (a task's failure and the node's death are seen a
    moment apart: wait a little for the death to show before calling the node alive)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(1.0)


def _orphans(nodes: list[Node], todo: dict[str, deque[Any]],
             record: Callable[[Node, tuple[Any, ...], dict[str, Any]], None]) -> None:
    """Cases that no node of their machine can run any more become error rows."""
    for m, q in todo.items():
        for k in list(q):
            mine = [n for n in nodes if n.machine == m]
            if any(n.may_run(k) for n in mine):
                continue
            q.remove(k)
            n = mine[0]
            c = next(x.cases[k] for x in mine if k in x.cases)
            why = ("its conversion is refused on every node that is left (it differs from the majority's, "
                   "or no majority of the nodes agrees)" if any(x.alive for x in mine)
                   else f"every node of {m} was lost")
            record(n, k, {**base_row(c.to_dict()), "status": "error", "reason": why})
