"""The artifact contract: ``<out>/<stem>/`` holds model.onnx, model.py, model.safetensors,
convert.json (inputs, outputs, verification, status) and ir.json (the graph, for ``zoo verify``).

Everything is written into a temporary sibling directory, verified there, then renamed into place,
so a failed run leaves nothing half-written. Nothing else is ever lost: a destination name that
could point elsewhere ('.', '..', '/', a leading '.' or '-') is refused, only a folder zoo wrote
(convert.json with zoo_version) is replaced, and the temporaries a killed run left
(``.NAME.zoo-tmp-HOST-PID-*``) are removed by the next run once their process is gone.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .errors import BadModel, ConvertError
from .fuse import folded
from .ir import Graph, Shape
from .isolate import clean_stale, peak_rss_bytes, temp_prefix
from .onnx_emit import check_structure, finish, write_onnx
from .torch_emit import model_source
from .verify import verify_sizes

ST_DTYPES = {"float32": "F32", "float16": "F16", "float64": "F64", "int64": "I64"}


def write_safetensors(weights: dict[str, np.ndarray], path: Path, meta: dict[str, str] | None = None) -> None:
    """safetensors, streamed from the arrays (the format: u64 header size, JSON header, data)."""
    header: dict[str, Any] = {"__metadata__": meta or {}}
    offset = 0
    arrays = {k: v if v.flags.c_contiguous else v.copy() for k, v in weights.items()}
    for k, a in arrays.items():
        header[k] = {"dtype": ST_DTYPES[a.dtype.name], "shape": list(a.shape),
                     "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in arrays.values():
            f.write(memoryview(a.astype(a.dtype.newbyteorder("<"), copy=False)).cast("B"))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


@dataclass
class Converted:
    dir: Path
    report: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.report["status"] == "verified"


def write(g: Graph, dest: Path, extra: Callable[[Path], None] | None = None,
          opencv_factory: Callable[[Path], Any] | None = None, known_opencv: list[str] | None = None,
          check: bool = True, title: str = "", fp16: bool = False, fold: bool = False) -> Converted:
    """Write, verify and move into place the artifacts of ``g`` at ``dest`` (``fp16``: and model.fp16.onnx;
    ``fold``: recorded in convert.json, the graph was loaded with conv + BN folding; without it,
    model.onnx alone is written from a folded copy)."""
    check_name(dest.name)
    check_replaceable(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(dest.parent)
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix("tmp", dest.name), dir=dest.parent))
    except OSError as e:
        raise _unwritable(dest, e) from None
    try:
        started = time.perf_counter()
        (tmp / "model.py").write_text(model_source(g, title or f"{g.meta.get('name', dest.name)}"))
        write_safetensors(g.weights, tmp / "model.safetensors", {"format": "pt"})
        onnx_graph = g if fold else folded(g)  # model.onnx: conv + BN folded (convert/fuse.py)
        write_onnx(onnx_graph, tmp / "model.onnx", g.meta.get("name", "zoo"))
        check_structure(onnx_graph)
        del onnx_graph
        (tmp / "ir.json").write_text(json.dumps(g.to_json(), indent=1))
        if extra:
            extra(tmp)
        write_seconds = time.perf_counter() - started
        report = verify_sizes(g, tmp, opencv_factory(tmp) if opencv_factory else None, known_opencv) \
            if check else {"status": "unverified"}
        info = summary(g, report, write_seconds) | {"fold": fold, "onnx_folded": True}
        finish(g, tmp, info, fp16)  # metadata (source, fingerprint, verification) into the ONNX
        (tmp / "convert.json").write_text(dump_json(info))
        tmp.chmod(0o755)
        _replace(tmp, dest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
            raise _unwritable(dest, e) from None
        raise
    return Converted(dest, info)


NAME_MAX = 180  # bytes: with the temporaries' ".NAME.zoo-tmp-HOST-PID-RANDOM" under the usual 255


def check_name(name: str) -> str:
    """A model's output folder name, or ConvertError: it must name one new folder inside --out."""
    try:
        size = len(os.fsencode(name))
    except UnicodeError:
        size = NAME_MAX + 1
    if name in ("", ".", "..") or name[0] in ".-" or "/" in name or "\0" in name or size > NAME_MAX:
        raise ConvertError(f"{name!r} cannot name an output folder (it must not be empty, '.' or '..', start "
                           f"with '.' or '-', contain '/' or NUL, or exceed {NAME_MAX} bytes); rename the model file")
    return name


def destination(out: Path, name: str) -> Path:
    """``out/name``, the name checked first (a path join would turn '.' into ``out`` itself)."""
    return Path(out) / check_name(name)


def is_model_dir(d: Path) -> bool:
    """A folder zoo wrote (convert.json with zoo_version): the only kind zoo ever replaces."""
    if d.is_symlink() or not d.is_dir():
        return False
    try:
        info = json.loads((d / "convert.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and "zoo_version" in info


def check_replaceable(dest: Path) -> None:
    if os.path.lexists(dest) and not is_model_dir(dest):
        raise ConvertError(f"{dest} exists and is not a zoo model folder; choose another --out or remove it")


# The output location's problems (not zoo's): a full disk, a quota, no permission, read-only.
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


def _unwritable(dest: Path, e: OSError) -> ConvertError:
    return ConvertError(f"{dest}: cannot write the output: {e.strerror or e}; nothing was written")


def _finite(obj: Any) -> Any:
    """JSON has no inf or nan: such values (a backend that produced garbage) become null."""
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def dump_json(obj: Any) -> str:
    return json.dumps(_finite(obj), indent=2, allow_nan=False) + "\n"


def fingerprint(path: str | None) -> str | None:
    """sha256 of a (small) definition file, or size and mtime of a large weights file."""
    if not path or not Path(path).is_file():
        return None
    p = Path(path)
    if p.stat().st_size > 64 << 20:
        return f"size={p.stat().st_size},mtime={int(p.stat().st_mtime)}"
    return hashlib.sha256(p.read_bytes()).hexdigest()


def summary(g: Graph, report: dict[str, Any], seconds: float = 0.0) -> dict[str, Any]:
    batch = next(iter(g.inputs.values()))[0]
    report = dict(report)
    sizes = report.pop("sizes", None)
    info = {
        "zoo_version": __version__,
        "name": g.meta.get("name"),
        "framework": g.meta.get("framework"),
        "source": g.meta.get("source"),
        "weights": g.meta.get("weights") or "random (seeded)",
        "seed": g.meta.get("seed"),
        "source_fingerprint": fingerprint(g.meta.get("source")),
        "weights_fingerprint": fingerprint(g.meta.get("weights")),
        "inputs": {k: list(v) for k, v in g.inputs.items()},
        "outputs": list(g.outputs),
        "dynamic_batch": g.dynamic_batch(),
        "dynamic": g.dynamic(),
        "params": g.param_count(),
        "macs_per_image": g.macs() // max(batch, 1),
        "layers": len(g.nodes),
        "status": report["status"],
        "verification": report,
        "write_seconds": round(seconds, 3),
        "peak_rss_bytes": peak_rss_bytes(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return info | ({"verification_sizes": sizes} if sizes is not None else {})


def _replace(tmp: Path, dest: Path) -> None:
    """Move ``tmp`` to ``dest``, replacing only a zoo model folder (checked again: time has passed)."""
    old = None
    if os.path.lexists(dest):
        check_replaceable(dest)
        old = dest.with_name(f"{temp_prefix('old', dest.name)}{secrets.token_hex(4)}")
        os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except OSError as e:
        if old and not os.path.lexists(dest):
            os.rename(old, dest)  # put the previous version back
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise ConvertError(f"{dest}: another run wrote it at the same time; this result was not kept") from None
    if old:
        shutil.rmtree(old, ignore_errors=True)


def load_graph(art: Path) -> Graph:
    """The IR graph of an artifact directory (ir.json + model.safetensors)."""
    try:
        d = json.loads((art / "ir.json").read_text())
        weights = read_safetensors(art / "model.safetensors")
    except (OSError, ValueError) as e:
        raise BadModel(str(art), "", f"not a zoo artifact directory ({e})") from None
    return Graph.from_json(d, weights)


def parse_shape(text: str) -> tuple[str, Shape]:
    """``NAME=N,C,H,W`` -> (name, shape)."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d <= 0 for d in shape):
        raise ConvertError(f"--input-shape {text!r}: expected NAME=N,C,H,W with positive sizes")
    return name, shape
