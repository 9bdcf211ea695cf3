"""The float64 NumPy interpreter of the IR: the reference every backend is compared against."""

from __future__ import annotations

from typing import Callable

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


def calibrate_batchnorm(g: Graph, seed: int) -> list[str]:
    """For random weights: give every batch norm that uses stored statistics the mean and variance
    its input really has (on a seeded random batch), in order, so that each one normalizes.

    Without this, random statistics let activations grow with depth (a ResNet's residual sums
    double the variance per block) until float32 overflows. Returns the attrs it set.
    """
    bns = [n for n in g.nodes if n.op.kind == "batchnorm" and not n.op.batch_stats]
    if not bns:
        return []
    rng = np.random.default_rng(seed + 1)
    feeds = {k: rng.standard_normal(s) for k, s in g.inputs.items()}

    def before(node: Node, xs: list[np.ndarray]) -> None:
        if node.op.kind == "batchnorm" and not node.op.batch_stats:
            axes = (0,) + tuple(range(2, xs[0].ndim))
            g.weights[f"{node.attr}.mean"][...] = xs[0].mean(axis=axes)
            g.weights[f"{node.attr}.var"][...] = xs[0].var(axis=axes)

    run(g, feeds, before=before)
    return [n.attr for n in bns]
