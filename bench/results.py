"""Results files: one JSON document per run, ``{schema_version, env, rows}``, rewritten atomically
after every case so an interrupted sweep keeps what it finished (and ``--resume`` continues it).

Schema (version 1) — a row:
  model, source_format, runtime, device, precision, layout, batch, mode, protocol: the case
  status: ok | skipped | error | unverified;  reason: why (for the last three)
  verification: {max_rel, tolerance, ok} of this runtime+precision against the float64 reference
  forward, backward: statistics {median_ms, iqr_ms, p5_ms, p95_ms, mean_ms, std_ms, cv, n,
      samples_ms} per call (backward: null unless training)
  one_time: {load_s, first_iter_ms, warmup_iters, warmup_s, steady}
  images_per_s, gflops_per_image, achieved_tflops, pct_of_peak
  memory: {host_peak_rss_bytes, gpu_allocated_bytes, gpu_reserved_bytes}
  threads, input_shapes, seconds (wall time of the case), finished (ISO time)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KEY = ("model", "runtime", "device", "precision", "layout", "batch", "mode", "protocol")
STATUSES = {"ok", "skipped", "error", "unverified"}
STATS = ("median_ms", "iqr_ms", "p5_ms", "p95_ms", "mean_ms", "std_ms", "cv", "n", "samples_ms")


class ResultsError(Exception):
    """A file that is not a (valid) results file; the message is one line."""


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in KEY)


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


def write(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically: a temporary file in the same directory, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


class Recorder:
    """Appends rows case by case to one results file."""

    def __init__(self, path: Path, env: dict[str, Any], resume: bool = False) -> None:
        self.path = Path(path)
        if resume and self.path.exists():
            self.doc = read(self.path)
        else:
            self.doc = {"schema_version": SCHEMA_VERSION, "env": env, "rows": []}
        self.done = {key(r) for r in self.doc["rows"]}

    def add(self, row: dict[str, Any]) -> None:
        _check_row(row, f"{self.path}: new row")
        self.doc["rows"].append(row)
        self.done.add(key(row))
        write(self.path, self.doc)

    def set_env(self, name: str, value: Any) -> None:
        self.doc["env"][name] = value
        write(self.path, self.doc)
