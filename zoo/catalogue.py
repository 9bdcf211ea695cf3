"""The zoo: the seeds' networks, their definition files and the input sizes they were timed at."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
PROTOTXT = ROOT / "prototxt"
LUA = ROOT / "zoo" / "lua"


@dataclass(frozen=True, slots=True)
class Preprocess:
    """How an image (pixels 0-255) becomes the model's input (zoo bench --input-data): channels in
    ``order``, times ``scale``, minus ``mean``, divided by ``std`` (per channel, in ``order``)."""

    order: str
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    def __str__(self) -> str:
        return (f"{self.order}, x{self.scale:g}, mean {'/'.join(f'{v:g}' for v in self.mean)}, "
                f"std {'/'.join(f'{v:g}' for v in self.std)}")


# Caffe's ImageNet models: BGR pixels 0-255 minus BVLC's per-channel mean (ilsvrc_2012_mean.npy
# averaged; KaimingHe's ResNets use the same values). fb.resnet.torch (the -lua models): RGB in [0, 1],
# the ImageNet mean and std.
CAFFE_IMAGENET = Preprocess("BGR", 1.0, (104.0, 117.0, 123.0))
TORCH_IMAGENET = Preprocess("RGB", 1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass(frozen=True)
class Entry:
    name: str
    source: Path
    input: tuple[int, int, int]  # C, H, W of one image
    convnet_batch: int | None = None  # the batch convnet-benchmarks timed it at
    args: dict[str, str] = field(default_factory=dict)  # --arg values for Lua definitions
    note: str = ""
    preprocess: Preprocess = CAFFE_IMAGENET

    @property
    def framework(self) -> str:
        return "caffe" if self.source.suffix == ".prototxt" else "torch7"


def _caffe(name: str, hw: int = 224, convnet_batch: int | None = None) -> Entry:
    return Entry(name, PROTOTXT / f"{name}.prototxt", (3, hw, hw), convnet_batch)


CAFFE = [
    _caffe("alexnet", 227), _caffe("alexnet-owt", 224, 128), _caffe("overfeat-fast", 231, 128),
    _caffe("vgg-a", 224, 64), _caffe("vgg16"), _caffe("vgg19"), _caffe("googlenet", 224, 128),
    _caffe("resnet18"), _caffe("resnet34"), _caffe("resnet50"), _caffe("resnet101"),
    _caffe("resnet152"), _caffe("resnet200"),
]

def _lua(name: str, hw: int = 224, convnet_batch: int | None = None, depth: int = 0) -> Entry:
    if depth:
        note = "fb.resnet.torch style" + ("; stride on the 3x3 (Caffe: on the 1x1)" if 50 <= depth <= 152 else "")
        return Entry(f"resnet{depth}-lua", LUA / "resnet.lua", (3, hw, hw), None, {"depth": str(depth)}, note,
                     TORCH_IMAGENET)
    return Entry(f"{name}-lua", LUA / f"{name}.lua", (3, hw, hw), convnet_batch, {}, "convnet-benchmarks style",
                 TORCH_IMAGENET)


LUA_ENTRIES = [_lua("alexnet-owt", 224, 128), _lua("overfeat-fast", 231, 128), _lua("vgg-a", 224, 64),
               _lua("googlenet", 224, 128)] + [_lua("resnet", depth=d) for d in (18, 34, 50, 101, 152, 200)]

CATALOGUE: dict[str, Entry] = {e.name: e for e in CAFFE + LUA_ENTRIES}


def find(name: str) -> Entry | None:
    return CATALOGUE.get(name)


# `zoo list`: the figures of each entry are static (they follow from its definition file and the
# converter). Those of the built-in zoo ship with the package (STATIC, keyed by the definition's bytes
# and the entry's arguments only: tests/test_catalogue.py recomputes them, so a converter change that
# alters one fails there); anything else (an edited definition) is computed once and kept in the
# user's cache (keyed by the converter's sources too). Either way `zoo list` then imports neither
# torch nor the converter, and runs no Lua definition.
STATIC = Path(__file__).with_name("zoo-list.json")
LIST_CACHE = ROOT / "outputs" / "cache" / "zoo-list.json"
REGENERATE = "python -m zoo.checks list --regenerate"


def status_of(name: str, out: Path) -> str:
    try:
        info = json.loads((out / name / "convert.json").read_text())
    except (OSError, ValueError):
        return "not converted"
    return str(info.get("status", "?"))


def _code_key() -> str:
    """zoo's version and the converter's sources: a change in either may change the figures."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        h = hashlib.sha256(version("zoo").encode())
    except PackageNotFoundError:
        h = hashlib.sha256(b"?")
    for p in sorted((ROOT / "convert").rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()


def _key(e: Entry, code: str = "") -> str:
    """The definition's bytes and the entry's arguments (and ``code``, for the user's cache)."""
    h = hashlib.sha256(e.source.read_bytes())
    h.update(json.dumps([code, e.args, e.input] if code else [e.args, e.input]).encode())
    return h.hexdigest()


def entry_shapes(e: Entry) -> dict[str, tuple[int, ...]] | None:
    """A Torch7 file carries no input shape: the zoo's own definitions take the catalogue's."""
    return {"input": (1, *e.input)} if e.framework == "torch7" else None


def _figures(e: Entry) -> dict[str, Any]:
    from convert.api import load  # the converter: only for a definition the shipped figures do not cover

    g = load(e.source, None, entry_shapes(e), seed=None, args=dict(e.args)).graph
    batch = next(iter(g.inputs.values()))[0]
    return {"params": g.param_count(), "macs": g.macs() // batch}


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _hit(data: dict[str, Any], name: str, key: str) -> dict[str, Any] | None:
    hit = data.get(name)
    return hit if isinstance(hit, dict) and hit.get("key") == key else None


def list_rows(out: Path, cache: Path | None = None, static: Path | None = STATIC) -> list[dict[str, Any]]:
    """name, source, input, params, macs (per image), status of every entry; figures from the shipped
    ones (``static``) or the user's ``cache`` where their key matches, computed (and the cache
    rewritten) where neither does."""
    cache = cache or LIST_CACHE
    shipped = _read(static).get("models") if static else {}
    shipped = shipped if isinstance(shipped, dict) else {}
    old = _read(cache)
    code, new, rows = "", {}, []
    for e in CATALOGUE.values():
        figures = _hit(shipped, e.name, _key(e))
        if figures is None:
            code = code or _code_key()  # hashed only when needed: the shipped figures usually cover all
            k = _key(e, code)
            new[e.name] = figures = _hit(old, e.name, k) or {"key": k, **_figures(e)}
        source = e.source.relative_to(ROOT) if e.source.is_relative_to(ROOT) else e.source
        rows.append({"name": e.name, "source": str(source), "input": "x".join(map(str, e.input)),
                     "params": figures["params"], "macs": figures["macs"], "status": status_of(e.name, out)})
    if new and new != old:
        _save(cache, new)
    return rows


def regenerate(static: Path = STATIC) -> dict[str, Any]:
    """Recompute the built-in zoo's figures and write them to ``static`` (``REGENERATE``)."""
    data = {"about": f"zoo list's figures of the built-in zoo; tests/test_catalogue.py checks them; {REGENERATE}",
            "models": {e.name: {"key": _key(e), **_figures(e)} for e in CATALOGUE.values()}}
    static.write_text(json.dumps(data, indent=1) + "\n")
    return data


def _save(cache: Path, data: dict[str, Any]) -> None:
    """Atomically; a cache that cannot be written is only slower next time."""
    tmp = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}.", dir=cache.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, cache)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        log.info("zoo list cache not saved: %s", e)
