"""Real benchmark inputs (``zoo bench --input-data DIR``): .npy arrays taken as they are, images
prepared as the model expects (size, channel order, scale, mean, std), rotated in batches like the
seeded inputs. The batches go to the workers as one .npz; rows name the folder, its file count and
a SHA-256 of its names and contents."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from convert.errors import ConvertError

IMAGES = (".jpg", ".jpeg", ".png", ".bmp")
MAX_BYTES = 256 * 2**20  # the rotated batches of one case, at most (at least one batch)


class Preprocess(Protocol):
    """How an image (pixels 0-255) becomes a model input: channels in ``order`` ("BGR" or "RGB"),
    times ``scale``, minus ``mean``, divided by ``std`` (per channel, in ``order``). The catalogue
    gives each zoo model its own (zoo.catalogue.Preprocess)."""

    order: str
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]


RAW = "raw pixels 0-255, BGR"  # a model zoo knows no preprocessing for: the pixels as OpenCV loads them


@dataclass(frozen=True)
class InputData:
    """The files of an --input-data folder, listed and fingerprinted once for the whole sweep."""

    folder: Path
    files: tuple[Path, ...]
    sha256: str

    @classmethod
    def scan(cls, folder: Path) -> InputData:
        folder = Path(folder)
        if not folder.is_dir():
            raise ConvertError(f"--input-data {folder}: not a folder")
        try:
            files = tuple(sorted(p for p in folder.iterdir()
                                 if p.is_file() and p.suffix.lower() in (".npy", *IMAGES)))
            if not files:
                raise ConvertError(f"--input-data {folder}: no .npy or image ({', '.join(IMAGES)}) files")
            h = hashlib.sha256()
            for p in files:
                h.update(p.name.encode() + b"\0")
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023 (f is this loop's)
                        h.update(block)
        except OSError as e:
            raise ConvertError(f"--input-data {e.filename or folder}: cannot read ({e.strerror or e})") from None
        return cls(folder, files, h.hexdigest())

    def describe(self, prep: Preprocess | None) -> str:
        images = any(p.suffix.lower() in IMAGES for p in self.files)
        how = f"; images: {prep or RAW}" if images else ""
        return f"{self.folder} ({len(self.files)} files, sha256 {self.sha256[:16]}{how})"

    def check(self, name: str, model: str, chw: tuple[int, ...]) -> None:
        """Every .npy holds one sample (C,H,W) or a batch (N,C,H,W) of the model's input; images need
        1 or 3 channels. ConvertError (one line, naming the file) otherwise."""
        for p in self.files:
            if p.suffix.lower() == ".npy":
                shape = _npy_shape(p)
                if tuple(shape[-len(chw):]) != tuple(chw) or len(shape) not in (len(chw), len(chw) + 1):
                    raise ConvertError(f"{p}: shape {tuple(shape)} does not fit input {name!r} of {model} "
                                       f"(one sample {tuple(chw)} or a batch (N, {', '.join(map(str, chw))}))")
            elif len(chw) != 3 or chw[0] not in (1, 3):
                raise ConvertError(f"{p}: images need an input of 1 or 3 channels; {model}'s {name!r} is {tuple(chw)}")
            else:
                _read_rgb(p, (chw[2], chw[1]))  # a broken image is refused before any work, not mid-sweep

    def samples(self, chw: tuple[int, ...], prep: Preprocess | None) -> np.ndarray:
        """All samples, (N, *chw) float32, in file order."""
        out = []
        for p in self.files:
            if p.suffix.lower() == ".npy":
                a = np.load(p, allow_pickle=False).astype(np.float32)
                out += list(a[None] if a.ndim == len(chw) else a)
            else:
                out.append(_image(p, chw, prep))
        return np.stack(out)

    def batches(self, chw: tuple[int, ...], batch: int, prep: Preprocess | None) -> list[np.ndarray]:
        """The samples in batches of ``batch`` (the last filled up from the first), as many as cover
        every sample, within MAX_BYTES."""
        s = self.samples(chw, prep)
        per = batch * math.prod(chw) * 4
        n = max(1, min(math.ceil(len(s) / batch), MAX_BYTES // per))
        return [s[np.arange(i * batch, (i + 1) * batch) % len(s)] for i in range(n)]


def _npy_shape(p: Path) -> tuple[int, ...]:
    try:
        a = np.load(p, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConvertError(f"{p}: not a readable .npy array ({str(e).splitlines()[0][:120]})") from None
    if a.dtype.kind not in "biuf":
        raise ConvertError(f"{p}: holds {a.dtype} values, not numbers")
    return a.shape


def _image(p: Path, chw: tuple[int, ...], prep: Preprocess | None) -> np.ndarray:
    """One image resized to the input's H x W (bilinear), in the model's channel order, normalized."""
    c, h, w = chw
    rgb = _read_rgb(p, (w, h))
    if prep is None:
        return np.ascontiguousarray(rgb[..., ::-1].transpose(2, 0, 1) if c == 3 else
                                    (rgb @ np.float32([0.299, 0.587, 0.114]))[None], np.float32)
    x = rgb if prep.order == "RGB" else rgb[..., ::-1]
    mean, std = np.asarray(prep.mean, np.float32), np.asarray(prep.std, np.float32)
    if c == 1:  # a grey model: the luma of the image, and the channels' mean normalization
        x, mean, std = (rgb @ np.float32([0.299, 0.587, 0.114]))[..., None], mean.mean(keepdims=True), \
            std.mean(keepdims=True)
    x = (x * np.float32(prep.scale) - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1), np.float32)


def _read_rgb(p: Path, size: tuple[int, int]) -> np.ndarray:
    """An image as float32 RGB (H, W, 3) of ``size`` (w, h), through OpenCV or else Pillow."""
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None:
        bgr = cv2.imread(str(p), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ConvertError(f"{p}: not a readable image")
        return cv2.resize(bgr, size, interpolation=cv2.INTER_LINEAR)[..., ::-1].astype(np.float32)
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ConvertError(f"{p}: reading images needs opencv-python-headless or pillow") from None
    try:
        with Image.open(p) as im:
            return np.asarray(im.convert("RGB").resize(size, Image.BILINEAR), np.float32)
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError):
        raise ConvertError(f"{p}: not a readable image") from None


def save_batches(path: Path, batches: list[np.ndarray]) -> None:
    """The batches as an .npz (b0, b1, ...), written atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **{f"b{i}": b for i, b in enumerate(batches)})
    tmp.replace(path)


def load_batches(path: str, name: str) -> list[dict[str, np.ndarray]]:
    """The rotated inputs of a case from its .npz: one {input name: batch} per batch."""
    with np.load(path) as z:
        return [{name: z[f"b{i}"]} for i in range(len(z.files))]
