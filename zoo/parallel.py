"""Many conversions at once, each in its own fresh process (``--jobs N`` here, or Ray tasks with
``--cluster``), and the composition-root side of ``zoo bench --cluster`` (bench/cluster.py does the
placement; here: what each node builds, the files, the progress display).

A conversion's memory budget (convert/limits.py) is the machine's share per parallel job: with N
jobs each child gets 1/N of it, so N conversions at once fit where one did."""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert import limits
from convert.errors import ConvertError


@dataclass(frozen=True)
class Failed:
    """A ConvertError raised in a child (its subclasses need not survive pickling: the text does)."""

    message: str


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    try:
        return fn(item)
    except ConvertError as e:
        return Failed(str(e))


def _set_budget(share: int) -> None:
    os.environ[limits.ENV] = str(share)


def _pool(fn: Callable[[Any], Any], items: list[Any], jobs: int, shares: int = 0) -> Iterator[Any]:
    """``fn(item)`` in fresh spawned processes (one per item), ``jobs`` at a time, in order; each gets
    1/``shares`` (default: 1/``jobs``) of the memory budget. A child killed (out of memory, a signal)
    is one line, not a hang."""
    share = max(limits.memory_budget() // (shares or jobs), 1)
    fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # 3.10: processes are reused
    ex = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_set_budget,
                             initargs=(share,), **fresh)
    try:
        futures = [ex.submit(_call, fn, it) for it in items]
        for it, f in zip(items, futures):
            try:
                yield f.result()
            except BrokenProcessPool:
                raise ConvertError(f"{it}: its process died (killed: out of memory?); the other jobs were "
                                   "stopped") from None
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _fresh(fn: Callable[[Any], Any], item: Any, shares: int) -> Any:
    """On a cluster node: one item in a fresh process there, with its share of the node's memory."""
    return next(_pool(fn, [item], 1, shares))


def map_jobs(fn: Callable[[Any], Any], items: list[Any], *, jobs: int = 1,
             cluster: str | None = None) -> Iterator[Any]:
    """``fn(item)`` for every item, each in its own process, results in the order of ``items``; a
    ConvertError in a child comes back as ``Failed``. ``cluster``: Ray tasks (one CPU each)."""
    if jobs < 1:
        raise ConvertError(f"--jobs must be at least 1, got {jobs}")
    if cluster is None:
        yield from _pool(fn, items, min(jobs, max(len(items), 1)))
        return
    from bench.cluster import ClusterError, session

    try:
        with session(cluster) as ray:
            cpus = {n["NodeID"]: int(n["Resources"].get("CPU", 1)) for n in ray.nodes() if n.get("Alive")}
            share = max(max(cpus.values(), default=1), 1)  # a node runs up to its CPU count at once
            task = ray.remote(_fresh).options(num_cpus=1, max_retries=2)
            refs = [task.remote(fn, it, share) for it in items]
            for ref in refs:
                yield ray.get(ref)
    except ClusterError as e:
        raise ConvertError(str(e)) from None


def convert_one(job: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[Any, float]:
    """One target converted and verified: (Converted, seconds); ``job`` is convert_target's (args, kwargs)."""
    from .pipeline import convert_target

    t0 = time.perf_counter()
    res = convert_target(*job[0], **job[1])
    return res, time.perf_counter() - t0


def convert_many(jobs_args: list[tuple[tuple[Any, ...], dict[str, Any]]], jobs: int,
                 cluster: str | None) -> Iterator[tuple[Any, float]]:
    """(Converted, seconds) per target in order; serial in this process with one job and no cluster
    (a ConvertError then surfaces as it happens), else each in its own process."""
    if jobs == 1 and cluster is None:
        for a in jobs_args:
            yield convert_one(a)
        return
    for got in map_jobs(convert_one, jobs_args, jobs=jobs, cluster=cluster):
        if isinstance(got, Failed):
            raise ConvertError(got.message)
        yield got


# ---------------------------------------------------------------- zoo bench --cluster


def node_cases(threads: int | None, *, build_kw: dict[str, Any], budget: float | None) -> list[Any]:
    """On a node: every case of the request, each model converted and verified there (cached by
    fingerprint in that checkout's outputs/), with the node's cores as threads unless given."""
    from bench import env as benv
    from bench import sweep

    from . import benchmark
    from .catalogue import ROOT

    os.chdir(ROOT)  # each node works in its own checkout's outputs/, whatever folder Ray started in
    kw = dict(build_kw)
    cases = benchmark.build(kw.pop("models"), threads=threads or benv.physical_cores(), **kw)
    return sweep.fit_budget(cases, budget) if budget else cases


def bench_cluster(out: Any, err: Any, *, address: str, build_kw: dict[str, Any], threads: int | None,
                  gpu: int | None, device: str, accelerators: list[str], all_accelerators: bool,
                  out_file: Path | None, resume: bool, budget: float | None, isolate: bool, timeout: float,
                  one_line: Callable[[], Any], table: Callable[[list[dict[str, Any]]], Any]) -> None:
    """``zoo bench ... --cluster ADDRESS``: every machine kind of the cluster times the cases; one
    results file per machine, ``DIR/<machine>/<RUN>.json`` for ``--out DIR/RUN.json`` (default
    outputs/results/<machine>/<time>.json)."""
    from bench import cluster, results

    from .benchmark import RESULTS, relative

    build_kw = {**build_kw, "models": [_portable(m) for m in build_kw["models"]]}
    if resume and out_file is None:
        raise ConvertError("--resume needs --out DIR/RUN.json (the run to continue: each machine's "
                           "DIR/<machine>/RUN.json)")
    root = Path(out_file).parent if out_file else RESULTS
    run_id = Path(out_file).stem if out_file else time.strftime("%Y%m%d-%H%M%S")
    if resume and not any(root.glob(f"*/{run_id}.json")):
        raise ConvertError(f"{root}/*/{run_id}.json: no such run to continue (drop --resume to start one)")
    taken = sorted(root.glob(f"*/{run_id}.json"))
    if taken and not resume:  # before any work: an existing run is never taken over
        raise ConvertError(f"{taken[0]} exists: continue the run with --resume, or choose another --out")
    with one_line():
        results.check_writable(root / f"{run_id}.json")
    prepare = functools.partial(node_cases, build_kw=build_kw, budget=budget)
    err.print("--cluster: each case in its own fresh process on its node (the --no-interleave method)",
              highlight=False)
    try:
        with cluster.session(address) as ray, one_line():
            nodes = cluster.select(ray, accelerators, all_accelerators, gpu=gpu is not None)
            err.print(f"setting up {len(nodes)} node(s): converting, verifying, measuring the GEMM peak",
                      highlight=False)
            nodes = cluster.set_up(ray, nodes, prepare, threads=threads, gpu=gpu, device=device, isolate=isolate)
            recs = cluster.recorders(nodes, root, run_id, resume)
            with _Display(err) as show:
                rows = cluster.run(ray, nodes, recs, isolate=isolate, timeout_s=timeout, progress=show)
    except cluster.ClusterError as e:
        raise ConvertError(str(e)) from None
    out.print(table([r for rs in rows.values() for r in rs]))
    for m, rec in recs.items():
        out.print(f"results ({m}): {relative(rec.path)}", highlight=False)


def _portable(spec: str) -> str:
    """A model as every node can find it: a zoo name, or a file inside the zoo checkout, relative to it."""
    from .catalogue import ROOT, find

    if find(spec) is not None or not Path(spec).is_file():
        return spec
    try:
        return str(Path(spec).resolve().relative_to(ROOT))
    except ValueError:
        raise ConvertError(f"{spec}: with --cluster a model file must be inside the zoo checkout ({ROOT}), "
                           "where every node has its own copy") from None


class _Display:
    """One progress display on the driver: a bar for all cases, a line per node (done, running)."""

    def __init__(self, err: Any) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err)
        self.all = self.bar.add_task("all nodes", total=None, info="")
        self.per: dict[str, Any] = {}

    def __enter__(self) -> _Display:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, s: Any) -> None:
        eta = "?" if math.isnan(s.eta_s) else f"{s.eta_s:.0f}s"
        self.bar.update(self.all, completed=s.done, total=s.done + s.left,
                        info=f"{s.done}/{s.done + s.left} done, {s.left} left, ETA {eta}")
        for label, done, running, left in s.nodes:
            if label not in self.per:
                self.per[label] = self.bar.add_task(label, total=None, info="")
            self.bar.update(self.per[label], completed=done, total=s.done + s.left,
                            info=f"{done} done, {'1 running' if running else 'idle'}, {left} left on its machine kind")
