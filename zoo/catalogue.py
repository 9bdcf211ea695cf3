"""The zoo: the seeds' networks, their definition files and the input sizes they were timed at."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOTXT = ROOT / "prototxt"
LUA = ROOT / "zoo" / "lua"


@dataclass(frozen=True)
class Entry:
    name: str
    source: Path
    input: tuple[int, int, int]  # C, H, W of one image
    convnet_batch: int | None = None  # the batch convnet-benchmarks timed it at
    args: dict[str, str] = field(default_factory=dict)  # --arg values for Lua definitions
    note: str = ""

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
        return Entry(f"resnet{depth}-lua", LUA / "resnet.lua", (3, hw, hw), None, {"depth": str(depth)}, note)
    return Entry(f"{name}-lua", LUA / f"{name}.lua", (3, hw, hw), convnet_batch, {}, "convnet-benchmarks style")


LUA_ENTRIES = [_lua("alexnet-owt", 224, 128), _lua("overfeat-fast", 231, 128), _lua("vgg-a", 224, 64),
               _lua("googlenet", 224, 128)] + [_lua("resnet", depth=d) for d in (18, 34, 50, 101, 152, 200)]

CATALOGUE: dict[str, Entry] = {e.name: e for e in CAFFE + LUA_ENTRIES}


def find(name: str) -> Entry | None:
    return CATALOGUE.get(name)
