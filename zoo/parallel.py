"""Many conversions at once, each in its own fresh process (``--jobs N`` here, or Ray tasks with
``--cluster``), and the composition-root side of ``zoo bench --cluster`` (bench/cluster.py does the
placement; here: what each node builds, the files, the progress display).

A conversion's memory budget (convert/limits.py) is the machine's share per parallel job: with N
jobs each child gets 1/N of it, so N conversions at once fit where one did. A job whose result
mentions the memory budget (refused, or a check skipped for it) is run again after the others, alone
with the whole budget, so every result is the serial run's."""

from __future__ import annotations

import functools
import glob
import logging
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert import limits
from convert.errors import ConvertError
from convert.naming import printable

MEMORY = "over the memory budget"  # limits.over_budget's words: something refused for the budget


@dataclass(frozen=True)
class Failed:
    """A ConvertError raised in a child (its subclasses need not survive pickling: the text does)."""

    message: str


_RUNNING: Path | None = None  # in a child: the marker of the job it runs (see _died)


def _call(fn: Callable[[Any], Any], item: Any, marks: str, i: int) -> Any:
    """``fn(item)`` in a child; a file ``marks/i`` exists while it runs (a job whose process died
    leaves it behind)."""
    global _RUNNING
    _RUNNING = Path(marks) / str(i)
    _RUNNING.touch()
    try:
        return fn(item)
    except ConvertError as e:
        return Failed(str(e))
    finally:
        _RUNNING.unlink(missing_ok=True)
        _RUNNING = None


class _ChildLog(logging.Handler):
    """A child's log records as the parent's CLI shows them: ``warning: text``, the text printable
    (escape sequences from layer names removed)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = "warning" if record.levelno >= logging.WARNING else "info"
            sys.stderr.write(f"{level}: {printable(record.getMessage())}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 (logging's own rule: a handler never raises)
            self.handleError(record)


def _stopped(signum: int, frame: Any) -> None:
    """SIGTERM (the pool stops the other jobs when one died): not the job that died, its marker goes."""
    if _RUNNING is not None:
        _RUNNING.unlink(missing_ok=True)
    os._exit(128 + signum)


def _init_child(share: int, level: int) -> None:
    os.environ[limits.ENV] = str(share)
    root = logging.getLogger()
    root.handlers[:] = [_ChildLog()]
    root.setLevel(level)
    signal.signal(signal.SIGTERM, _stopped)


def _label(item: Any) -> str:
    """An item as the user knows it: a model's name for a conversion job, else the item itself."""
    if isinstance(item, tuple) and item and isinstance(item[0], tuple) and item[0]:
        first = item[0][0]
        return str(getattr(first, "name", first))
    return str(item)


def _died(items: list[Any], marks: str) -> str:
    """The one line for a child that died: the job it ran where that can be told."""
    try:
        running = sorted(int(p.name) for p in Path(marks).iterdir() if p.name.isdigit())
    except OSError:
        running = []
    stop = "the other jobs were stopped"
    if len(running) == 1:
        return printable(f"{_label(items[running[0]])}: its process died (killed: out of memory?); {stop}")
    if running:
        names = ", ".join(_label(items[i]) for i in running)
        return printable(f"a process died (killed: out of memory?) while {names} ran; which one could not "
                         f"be told; {stop}")
    return f"a process died (killed: out of memory?); which job it ran could not be told; {stop}"


def _run(fn: Callable[[Any], Any], items: list[Any], jobs: int, share: int) -> Iterator[tuple[int, Any]]:
    """(index, ``fn(item)``) in fresh spawned processes (one per item), ``jobs`` at a time, in order,
    each with ``share`` bytes of memory budget. A child killed (out of memory, a signal) is one line,
    not a hang."""
    fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # 3.10: processes are reused
    marks = tempfile.mkdtemp(prefix="zoo-jobs-")
    ex = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_child,
                             initargs=(share, logging.getLogger().getEffectiveLevel()), **fresh)
    try:
        futures = [ex.submit(_call, fn, it, marks, i) for i, it in enumerate(items)]
        for i, f in enumerate(futures):
            try:
                got = f.result()
            except BrokenProcessPool:
                ex.shutdown(wait=True, cancel_futures=True)  # the others stopped: only the dead one's marker is left
                raise ConvertError(_died(items, marks)) from None
            yield i, got
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(marks, ignore_errors=True)


def _mentions(x: Any, text: str) -> bool:
    """Whether a result (a Failed, a Converted's report, a row) holds ``text`` in any of its strings."""
    if isinstance(x, str):
        return text in x
    if isinstance(x, dict):
        return any(_mentions(v, text) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_mentions(v, text) for v in x)
    if hasattr(x, "__dict__"):
        return _mentions(vars(x), text)
    return False


def _in_order(got: Iterator[tuple[int, Any]], rerun: Callable[[int], Any] | None) -> Iterator[Any]:
    """Results in the order of the items; with ``rerun``, one that mentions the memory budget is run
    again (``rerun(index)``, alone with the whole budget) after all the others, and that result is its."""
    held: dict[int, Any] = {}
    again: list[int] = []
    nxt = 0
    for i, r in got:
        if rerun is not None and _mentions(r, MEMORY):
            again.append(i)
        else:
            held[i] = r
        while nxt in held:
            yield held.pop(nxt)
            nxt += 1
    for i in again:
        held[i] = rerun(i)  # type: ignore[misc]
    while nxt in held:
        yield held.pop(nxt)
        nxt += 1


def _pool(fn: Callable[[Any], Any], items: list[Any], jobs: int, shares: int = 0) -> Iterator[Any]:
    """``fn(item)`` in fresh processes, ``jobs`` at a time, in order, each with 1/``shares`` (default:
    1/``jobs``) of the memory budget; a job refused for its share runs again alone with all of it."""
    full = limits.memory_budget()
    share = max(full // (shares or jobs), 1)
    rerun = (lambda i: next(_run(fn, [items[i]], 1, full))[1]) if share < full else None
    yield from _in_order(_run(fn, items, jobs, share), rerun)


def _fresh(fn: Callable[[Any], Any], item: Any, shares: int) -> Any:
    """On a cluster node: one item in a fresh process there, with its share of the node's memory."""
    full = limits.memory_budget()
    return next(_run(fn, [item], 1, max(full // max(shares, 1), 1)))[1]


def map_jobs(fn: Callable[[Any], Any], items: list[Any], *, jobs: int = 1,
             cluster: str | None = None) -> Iterator[Any]:
    """``fn(item)`` for every item, each in its own process, results in the order of ``items``; a
    ConvertError in a child comes back as ``Failed``. ``cluster``: Ray tasks (one CPU each; a job
    refused for memory runs again holding all the CPUs of a node, with its whole budget)."""
    if jobs < 1:
        raise ConvertError(f"--jobs must be at least 1, got {jobs}")
    if cluster is None:
        yield from _pool(fn, items, min(jobs, max(len(items), 1)))
        return
    from bench.cluster import ClusterError, session

    try:
        with session(cluster) as ray:
            yield from _on_cluster(ray, fn, items)
    except ClusterError as e:
        raise ConvertError(str(e)) from None


def _on_cluster(ray: Any, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[Any]:
    from bench.cluster import _line

    def get(ref: Any) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # before ConvertError: Ray's class also derives from the cause's
            cause = getattr(e, "cause", None)
            if isinstance(cause, ConvertError):  # zoo's own one line (a job's process died there)
                raise ConvertError(str(cause)) from None
            raise ConvertError(f"--cluster: a task failed: {_line(cause or e)}") from None
        except ray.exceptions.RayError as e:
            raise ConvertError(f"--cluster: {_line(e)}") from None

    try:
        cpus = {n["NodeID"]: int(n["Resources"].get("CPU", 1)) for n in ray.nodes() if n.get("Alive")}
        most = max(max(cpus.values(), default=1), 1)  # a node runs up to its CPU count at once
        task = ray.remote(_fresh)
        refs = [task.options(num_cpus=1, max_retries=2).remote(fn, it, most) for it in items]
        alone = task.options(num_cpus=most, max_retries=2)  # all the CPUs of the largest node: nothing beside it
        rerun = (lambda i: get(alone.remote(fn, items[i], 1))) if most > 1 else None
        yield from _in_order(((i, get(r)) for i, r in enumerate(refs)), rerun)
    except ray.exceptions.RayError as e:
        raise ConvertError(f"--cluster: {_line(e)}") from None


def convert_one(job: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[Any, float]:
    """One target converted and verified: (Converted, seconds); ``job`` is convert_target's (args, kwargs)."""
    from .pipeline import convert_target

    t0 = time.perf_counter()
    res = convert_target(*job[0], **job[1])
    return res, time.perf_counter() - t0


def convert_on_node(job: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[Any, float]:
    """On a cluster node: a job of ``portable`` resolved in that node's checkout, then converted."""
    from .catalogue import ROOT
    from .pipeline import resolve

    os.chdir(ROOT)  # paths inside the checkout were sent relative to it
    (spec, out, weights, *rest), kw = job
    return convert_one(((resolve(spec), Path(out), Path(weights) if weights else None, *rest), kw))


def portable(job: tuple[tuple[Any, ...], dict[str, Any]]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A conversion job as every node can run it, resolved here on the driver: a zoo model by name, a
    model file relative to the checkout (it must be inside it, as with ``zoo bench --cluster``), --out
    and --weights relative to the checkout when inside it, else absolute."""
    (t, out, weights, *rest), kw = job
    spec = t.name if t.entry is not None else _portable(str(t.source))
    return (spec, _node_path(out), _node_path(weights) if weights else None, *rest), kw


def _node_path(p: Path | str) -> str:
    from .catalogue import ROOT

    full = Path(p).resolve()
    try:
        return str(full.relative_to(ROOT))
    except ValueError:
        return str(full)


def convert_many(jobs_args: list[tuple[tuple[Any, ...], dict[str, Any]]], jobs: int,
                 cluster: str | None) -> Iterator[tuple[Any, float]]:
    """(Converted, seconds) per target in order; serial in this process with one job and no cluster
    (a ConvertError then surfaces as it happens), else each in its own process."""
    if jobs == 1 and cluster is None:
        for a in jobs_args:
            yield convert_one(a)
        return
    if cluster is None:
        got = map_jobs(convert_one, jobs_args, jobs=jobs)
    else:
        got = map_jobs(convert_on_node, [portable(a) for a in jobs_args], cluster=cluster)
    for r in got:
        if isinstance(r, Failed):
            raise ConvertError(r.message)
        yield r


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
    taken = sorted(root.glob(f"*/{glob.escape(run_id)}.json"))  # the name is the user's, not a pattern
    if resume and not taken:
        raise ConvertError(f"{root}/*/{run_id}.json: no such run to continue (drop --resume to start one)")
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
        out.print(printable(f"results ({m}): {relative(rec.path)}"), highlight=False)


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
