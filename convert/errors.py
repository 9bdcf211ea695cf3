"""The one error hierarchy of the converter.

Every error a user's input can cause is a ``ConvertError``; the CLI prints ``str(err)`` as one line
and exits with code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class ConvertError(Exception):
    """A problem with the user's input, reported as one line."""


class BadModel(ConvertError):
    """The model file is malformed or inconsistent.

    ``where`` is a position ("12:5") or a layer ("layer 'conv1' (Convolution)").
    """

    def __init__(self, path: str, where: str, reason: str) -> None:
        self.path, self.where, self.reason = str(path), where, reason
        if re.fullmatch(r"\d+:\d+", where):  # a position: FILE:LINE:COL: reason
            super().__init__(f"{self.path}:{where}: {reason}")
        else:
            super().__init__(f"{self.path}: {where}: {reason}" if where else f"{self.path}: {reason}")


class Unsupported(ConvertError):
    """One or more layers (or modules) have no conversion; all of them are named at once."""

    def __init__(self, path: str, framework: str, items: list[tuple[str, str]], reason: str = "",
                 known: Iterable[str] = ()) -> None:
        """``known``: the supported names, for a "did you mean" on a typo."""
        self.path, self.framework, self.items = str(path), framework, items
        types: dict[str, list[str]] = {}
        for kind, layer in items:
            types.setdefault(kind, []).append(layer)
        known = list(known)
        listed = "; ".join(
            f"{_plain(kind)} ({', '.join(repr(n) for n in names[:3])}{', …' if len(names) > 3 else ''}"
            f"{did_you_mean(kind, known, '; ')})"
            for kind, names in types.items()
        )
        what = "layer type" if framework == "caffe" else "module class"
        plural = ("es" if what.endswith("s") else "s") if len(types) > 1 else ""
        tail = f" ({reason})" if reason else ""
        super().__init__(f"{self.path}: unsupported {framework} {what}{plural}: {listed}{tail}")


def did_you_mean(word: str, known: Iterable[str], sep: str = " ") -> str:
    """'; did you mean 'InnerProduct'?' for a near miss among ``known`` (a typo), else ''."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.8)
    return f"{sep}did you mean {close[0]!r}?" if close else ""


def _plain(kind: str) -> str:
    """A layer type or class name as written when it is a plain name, else quoted."""
    return kind if kind.replace(".", "").replace("_", "").isalnum() and kind.isascii() else repr(kind)


class ShapeError(ConvertError):
    """An op cannot take the shapes it is given; the frontend names the layer."""
