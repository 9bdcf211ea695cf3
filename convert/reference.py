"""The float64 NumPy interpreter of the IR: the reference every backend is compared against."""

from __future__ import annotations

import numpy as np

from .ir import Graph


def run(g: Graph, feeds: dict[str, np.ndarray], keep: bool = False,
        stop_after: int | None = None) -> dict[str, np.ndarray]:
    """Evaluate the graph in float64. Returns the outputs (every value when ``keep``).

    Values are freed after their last use unless ``keep``, so peak memory stays near the
    largest layer rather than the sum of all activations.
    """
    last_use: dict[str, int] = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last_use[v] = i
    env = {k: np.asarray(v, dtype=np.float64) for k, v in feeds.items()}
    for i, node in enumerate(g.nodes[:stop_after]):
        outs = node.op.reference([env[v] for v in node.inputs], g.node_weights(node))
        for name, val in zip(node.outputs, outs):
            env[name] = np.asarray(val, dtype=np.float64)
        if not keep:
            for v in set(node.inputs):
                if last_use.get(v) == i and v not in g.outputs:
                    env.pop(v, None)
    return env if keep else {o: env[o] for o in g.outputs}
