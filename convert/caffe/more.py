"""Caffe's Tile and Reduction layers."""

from __future__ import annotations

from ..ops.reduce import Reduction, Tile
from .builder import Builder, layer
from .layers import _axis
from .upgrade import Layer


@layer("Tile")
def tile(b: Builder, L: Layer) -> None:
    tp = L.p.tile_param
    if tp.tiles < 1:
        raise b.fail(f"tiles must be at least 1, got {tp.tiles}")
    b.node(Tile(_axis(b, tp.axis, len(b.shape())), int(tp.tiles)))


@layer("Reduction")
def reduction(b: Builder, L: Layer) -> None:
    rp = L.p.reduction_param
    # a non-finite coeff is refused with every other non-finite parameter (frontend._param_error)
    # Caffe reduces every axis from `axis` to the end: axis 0 gives a 0-D blob (one value for the batch)
    b.node(Reduction(str(rp.operation).lower(), _axis(b, rp.axis, len(b.shape())), float(rp.coeff)))
