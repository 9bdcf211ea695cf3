"""Results files: one JSON document per run, ``{schema_version, env, rows}``, rewritten atomically
after every case so an interrupted sweep keeps what it finished (and ``--resume`` continues it).

No row is ever dropped: a new run never takes over an existing file (``--resume`` continues one),
and every save re-reads the file under a lock and merges by case key, so two runs writing to the
same file keep each other's rows. The lock is ``flock`` on the file's folder (the file itself is
replaced by each save, so it cannot carry the lock; a folder lock leaves no lock file behind).

Schema (version 1) — a row:
  model, source_format, runtime, device, precision, layout, batch, mode, protocol: the case
  status: ok | skipped | error | unverified;  reason: why (for the last three)
  verification: {max_rel, tolerance, ok} of this runtime+precision against the float64 reference
  forward, backward: statistics {median_ms, iqr_ms, p5_ms, p95_ms, p50_ms, p90_ms, p99_ms, mean_ms,
      std_ms, cv, n, samples_ms} per call (backward: null unless training; p50/p90/p99 since 2026-12)
  one_time: {load_s, first_iter_ms, warmup_iters, warmup_s, steady}
  images_per_s, gflops_per_image, achieved_tflops, pct_of_peak
  memory: {host_peak_rss_bytes, gpu_allocated_bytes, gpu_reserved_bytes}
  threads: {count, env (OMP_*/MKL_*), torch_intra_op, torch_inter_op, runtime (its own settings)}
      (an integer in files written before 2026-12); inputs: "random seed S" or "DIR (N files, sha256 ...)"
  load: {start, end: {loadavg, busy (top other processes by CPU%), time}, steal_pct, quiet, reasons};
      quiet (bool), quiet_reason (when not quiet); gemm_peak_tflops: {run, next_to_case}
  input_shapes, seconds (wall time of the case), finished (ISO time)
  interleave (timed in turns with other runtimes, bench/interleave.py): {rounds, window_s, order,
      entrants, label ("runtime", or "runtime precision" unless fp32), baseline (a label), round_ms,
      round_ratios, round_session (from 2026-12), ratio (this runtime's time over the baseline's:
      the geometric mean of the sessions' median ratios; before sessions, the median over rounds),
      ratio_ci (95%: a t interval over sessions; before sessions, a block bootstrap over rounds)}
  concurrency: requests in flight at once (only when above 1; it makes another case)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KEY = ("model", "runtime", "device", "precision", "layout", "batch", "mode", "protocol")
STATUSES = {"ok", "skipped", "error", "unverified"}
STATS = ("median_ms", "iqr_ms", "p5_ms", "p95_ms", "mean_ms", "std_ms", "cv", "n", "samples_ms")


class ResultsError(Exception):
    """A file that is not a (valid) results file; the message is one line."""


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    """The case of a row; requests in flight (--concurrency) make another case, older rows have none."""
    n = row.get("concurrency") or 1
    return tuple(row.get(k) for k in KEY) + ((n,) if n > 1 else ())


def validate(doc: Any, where: str = "results") -> dict[str, Any]:
    """Check a results document; raises ResultsError naming the first problem."""
    if not isinstance(doc, dict) or "rows" not in doc or "schema_version" not in doc:
        raise ResultsError(f"{where}: not a zoo results file (needs schema_version and rows)")
    v = doc["schema_version"]
    if not isinstance(v, int) or v < 1:
        raise ResultsError(f"{where}: bad schema_version {v!r}")
    if v > SCHEMA_VERSION:
        raise ResultsError(f"{where}: schema_version {v} is newer than this zoo understands "
                           f"({SCHEMA_VERSION}); upgrade zoo")
    if not isinstance(doc.get("env"), dict):
        raise ResultsError(f"{where}: env is missing")
    if not isinstance(doc["rows"], list):
        raise ResultsError(f"{where}: rows must be a list")
    for i, row in enumerate(doc["rows"]):
        _check_row(row, f"{where}: row {i}")
    return doc


def _check_row(row: Any, where: str) -> None:
    if not isinstance(row, dict):
        raise ResultsError(f"{where}: not an object")
    missing = [k for k in (*KEY, "status") if k not in row]
    if missing:
        raise ResultsError(f"{where}: missing {', '.join(missing)}")
    if row["status"] not in STATUSES:
        raise ResultsError(f"{where}: unknown status {row['status']!r}")
    if not isinstance(row["batch"], int) or row["batch"] <= 0:
        raise ResultsError(f"{where}: batch must be a positive integer")
    if row["status"] == "ok":
        for part in ("forward",) + (("backward",) if row["mode"] == "training" else ()):
            s = row.get(part)
            if not isinstance(s, dict) or any(k not in s for k in STATS):
                raise ResultsError(f"{where}: {part} statistics incomplete")
            if not s["samples_ms"] or s["median_ms"] <= 0:
                raise ResultsError(f"{where}: {part} has no positive samples")
    elif not row.get("reason"):
        raise ResultsError(f"{where}: a {row['status']} row needs a reason")


def read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path}: not readable as JSON ({type(e).__name__})") from None
    return validate(doc, str(path))


def umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _dump(doc: dict[str, Any], f: Any) -> None:
    json.dump(doc, f, indent=1, allow_nan=False)
    f.write("\n")


def write(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically and durably: a temporary file in the same folder, fsync, rename. The file
    gets the mode a plain open() would give (mkstemp's is 0600), or keeps the one it had."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = 0o666 & ~umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            _dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder; the rename is done anyway
        pass
    finally:
        os.close(fd)


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive lock among zoo's writers of results files in ``folder`` (held for one save)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:  # a file system without locks (some network ones): saves still merge
            if e.errno not in (errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


def check_writable(path: Path) -> None:
    """Create the folder and write and remove a probe file there, so that no sweep starts whose
    results could not be saved; ResultsError (one line) if that fails."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        try:
            os.write(fd, b"{}\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise ResultsError(f"{path}: cannot write results there: {e.strerror or e}") from None
    if path.is_dir():
        raise ResultsError(f"{path}: is a directory, not a results file")


def merge_row(doc: dict[str, Any], row: dict[str, Any]) -> None:
    """Add ``row`` to ``doc``, replacing a row of the same case."""
    k = key(row)
    rows = doc["rows"]
    i = next((i for i, r in enumerate(rows) if key(r) == k), None)
    if i is None:
        rows.append(row)
    else:
        rows[i] = row


class Recorder:
    """Adds rows case by case to one results file, merged with what other writers saved meanwhile."""

    def __init__(self, path: Path, env: dict[str, Any], resume: bool = False) -> None:
        self.path = Path(path)
        with self._saving("the results file"), locked(self.path.parent):
            if resume and self.path.exists():
                self.doc = read(self.path)
            elif os.path.lexists(self.path):
                raise ResultsError(f"{self.path} exists: continue it with --resume, or choose another --out file")
            else:  # the file is created now: it claims its name and proves the folder writable
                self.doc = {"schema_version": SCHEMA_VERSION, "env": env, "rows": []}
                write(self.path, self.doc)
        self.done = {key(r) for r in self.doc["rows"]}

    def add(self, row: dict[str, Any]) -> None:
        _check_row(row, f"{self.path}: new row")
        label = " ".join(str(row.get(k)) for k in ("model", "runtime", "device", "precision", "batch", "mode"))
        self._save(lambda doc: merge_row(doc, row), f"the row of {label}")
        self.done.add(key(row))

    def set_env(self, name: str, value: Any) -> None:
        self._save(lambda doc: doc["env"].__setitem__(name, value), f"env.{name}")

    def _save(self, update: Callable[[dict[str, Any]], None], what: str) -> None:
        """Re-read the file under the lock (another run may have added rows), update, write."""
        with self._saving(what), locked(self.path.parent):
            doc = read(self.path) if self.path.exists() else self.doc
            update(doc)
            write(self.path, doc)
            self.doc = doc

    @contextmanager
    def _saving(self, what: str) -> Iterator[None]:
        """An OSError (a full or read-only disk) becomes one line saying what is kept where."""
        try:
            yield
        except OSError as e:
            n = len(getattr(self, "doc", {}).get("rows", []))
            kept = (f"{n} row(s) saved before are kept in {self.path} (continue with --resume --out {self.path})"
                    if n else "no rows were saved")
            raise ResultsError(f"{self.path}: cannot save {what}: {e.strerror or e}; {kept}") from None
