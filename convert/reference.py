"""The float64 NumPy interpreter of the IR: the reference every backend is compared against."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .ir import Graph, Node


def run(g: Graph, feeds: dict[str, np.ndarray], keep: bool = False,
        before: Callable[[Node, list[np.ndarray]], None] | None = None) -> dict[str, np.ndarray]:
    """Evaluate the graph in float64. Returns the outputs (every value when ``keep``).

    Values are freed after their last use unless ``keep``, so peak memory stays near the
    largest layer rather than the sum of all activations. ``before(node, inputs)`` is called
    before each node runs (and may change the node's weights).
    """
    last_use: dict[str, int] = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last_use[v] = i
    env = {k: np.asarray(v, dtype=np.float64) for k, v in feeds.items()}
    for i, node in enumerate(g.nodes):
        xs = [env[v] for v in node.inputs]
        if before is not None:
            before(node, xs)
        outs = node.op.reference(xs, g.node_weights(node))
        for name, val in zip(node.outputs, outs):
            env[name] = np.asarray(val, dtype=np.float64)
        if not keep:
            for v in set(node.inputs):
                if last_use.get(v) == i and v not in g.outputs:
                    env.pop(v, None)
    return env if keep else {o: env[o] for o in g.outputs}


def calibrate_random(g: Graph, seed: int) -> list[str]:
    """Make random weights numerically meaningful, in place; returns the batch norms it set.

    1. Filters (convolution, fully connected) get zero sum each: a filter then responds to the
       structure of its input, not to the positive mean of ReLU outputs, which a following batch
       norm would centre away (each such centring multiplies relative rounding errors by about
       sqrt(pi / (pi - 1)); 200 of them make float32 miss 1e-4, and outputs barely depend on the
       input).
    2. Residual branches enter their sums damped (``_branch_ends``).
    3. Every batch norm with stored statistics gets the mean and variance its input really has
       on a seeded random batch, in order, so each one normalizes (random statistics would let
       activations grow with depth until float32 overflows).
    """
    for n in g.nodes:
        if n.op.kind in ("conv", "deconv", "linear"):
            w = g.weights[f"{n.attr}.weight"]
            out_axis = 1 if n.op.kind == "deconv" else 0
            w -= w.mean(axis=tuple(a for a in range(w.ndim) if a != out_axis), keepdims=True)
    damped = _branch_ends(g)
    for n in g.nodes:  # branches that end in a convolution (pre-activation ResNets)
        if n.attr in damped and n.op.kind in ("conv", "deconv", "linear"):
            for w in g.node_weights(n).values():
                w *= np.float32(DAMP)
    bns = [n for n in g.nodes if n.op.kind == "batchnorm" and not n.op.batch_stats]
    if not bns:
        return []
    rng = np.random.default_rng(seed + 1)
    feeds = {k: rng.standard_normal(s) for k, s in g.inputs.items()}

    def before(node: Node, xs: list[np.ndarray]) -> None:
        if node.op.kind == "batchnorm" and not node.op.batch_stats:
            axes = (0,) + tuple(range(2, xs[0].ndim))
            g.weights[f"{node.attr}.running_mean"][...] = xs[0].mean(axis=axes)
            # one variance for the whole layer (the channels' average): a nearly constant channel
            # would otherwise be scaled up by 1/sqrt(eps) and amplify rounding noise a hundredfold
            var = xs[0].var(axis=axes).mean()
            g.weights[f"{node.attr}.running_var"][...] = var / DAMP**2 if node.attr in damped else var

    run(g, feeds, before=before)
    return [n.attr for n in bns]


DAMP = 0.2


def _branch_ends(g: Graph) -> set[str]:
    """The last convolution or batch norm of every residual branch entering an elementwise sum
    (the input with more weighted layers since the fork than the sum's shortest input, which is
    the shortcut). Like the small final gammas of trained ResNets, they start damped, so that a
    random 150-layer ResNet is not chaotic (else float32 rounding alone grows past 1e-4)."""
    producer = {o: n for n in g.nodes for o in n.outputs}
    uses: dict[str, int] = {}
    for n in g.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    weighted = ("conv", "deconv", "linear", "batchnorm")

    def walk(value: str) -> tuple[int, str]:
        """(weighted layers since the fork, attr of the last weighted layer) going back from value."""
        depth, last = 0, ""
        while value in producer and (depth == 0 or uses.get(value, 0) == 1):
            n = producer[value]
            if n.op.kind in weighted:
                depth += 1
                last = last or n.attr
            if len(n.inputs) != 1:
                break
            value = n.inputs[0]
        return depth, last

    ends = set()
    for n in g.nodes:
        if n.op.kind == "eltwise" and n.op.mode == "sum" and len(n.inputs) > 1:
            chains = [walk(i) for i in n.inputs]
            shortest = min(d for d, _ in chains)
            ends |= {attr for d, attr in chains if d > shortest and attr}
    return ends
