"""Harness accuracy: zoo's timing against a minimal hand-written loop, and zoo against itself.

    python -m zoo.checks harness

For AlexNet and ResNet-50, PyTorch eager and ONNX Runtime, batch 1 and 16, on this CPU, with the
cases exactly as ``zoo bench`` builds them (its CPU policy, its thread count):

* paired: in one process, on one loaded runtime, zoo's ``measure`` and a bare loop calling the
  session or module directly take turns in blocks of about 0.15 s (order alternating),
  until each side has 40 samples and 15 s. This is the harness's own error (the timing loop, the
  sync calls, the runtime wrapper, input rotation); the pairing cancels the machine's drift, which
  on a shared VM moves medians by 5-30% over tens of seconds.
* fresh: zoo's worker process, a hand-written loop in its own process (same iteration count),
  zoo's worker again, the hand loop again. The zoo-vs-zoo and hand-vs-hand differences are the
  repeatability of a sweep on this machine; the hand-vs-hand one is the machine's, not zoo's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

HAND_LOOP = r"""
import statistics, sys, time, json
import numpy as np
kind, art, batch, threads, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
info = json.load(open(art + "/convert.json"))
name, shape = next(iter(info["inputs"].items()))
x = np.random.default_rng(0).standard_normal([batch] + shape[1:]).astype(np.float32)
if kind == "torch":
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, art)
    import model
    net = model.load()
    xt = torch.from_numpy(x)
    def step():
        with torch.inference_mode():
            net(xt)
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(art + "/model.onnx", so, providers=["CPUExecutionProvider"])
    def step():
        sess.run(None, {name: x})
for _ in range(5):
    step()
times = []
for _ in range(iters):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(statistics.median(times) * 1000)
"""

PAIRED = r"""
import json, math, statistics, sys, time
from dataclasses import replace
from convert.runtimes import RUNTIMES
from bench.timing import Policy, measure
from bench.worker import make_inputs, set_threads
case, block_s, side_s, side_n = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
set_threads(case["threads"])
rt = RUNTIMES[case["runtime"]]()
rt.load(case)
inputs = make_inputs(case["input_shapes"], case["seed"], 3)
rt.set_inputs(inputs, None)
if case["runtime"] == "torch":
    import torch
    net, xs = rt.net, rt.inputs[0]
    def bare():
        with torch.inference_mode():
            net(*xs)
else:
    sess, feed = rt.sess, inputs[0]
    def bare():
        sess.run(None, feed)
t0 = time.perf_counter()
for _ in range(5):
    bare()
k = max(1, round(block_s / ((time.perf_counter() - t0) / 5)))
policy = replace(Policy(**case["policy"]), fixed=k, discard=0, dry=0)
def hand():
    bare()  # untimed, as zoo's first call of a block
    out = []
    for _ in range(k):
        t0 = time.perf_counter()
        bare()
        out.append((time.perf_counter() - t0) * 1000)
    return out
zoo, ours, r, start = [], [], 0, time.perf_counter()
while len(zoo) < side_n or time.perf_counter() - start < 2 * side_s:
    for who in (("zoo", "hand") if r % 2 == 0 else ("hand", "zoo")):
        if who == "zoo":
            zoo += measure([rt.forward], rt.sync, policy).samples_ms[0]
        else:
            ours += hand()
    r += 1
print(json.dumps({"zoo_ms": statistics.median(zoo), "hand_ms": statistics.median(ours), "block": k,
                  "blocks": r, "n": len(zoo)}))
"""


def _run(args: list[str], timeout: float = 1800) -> str:
    return subprocess.run([sys.executable, "-c", *args], check=True, capture_output=True, text=True,
                          timeout=timeout).stdout


def harness(block_s: float = 0.15, side_s: float = 15.0, side_n: int = 40) -> dict[str, Any]:
    from bench.env import physical_cores
    from bench.worker import isolated

    from . import benchmark
    from .checks import _save

    threads = physical_cores()
    cases = benchmark.build(["alexnet", "resnet50"], runtimes=["torch", "onnxruntime"], precisions=["fp32"],
                            layouts=["nchw"], batches=[1, 16], threads=threads)
    started = time.perf_counter()
    rows = []
    for c in cases:
        d = c.to_dict()
        paired = json.loads(_run([PAIRED, json.dumps(d), str(block_s), str(side_s), str(side_n)]))
        zoo, hand = [], []
        for _ in range(2):
            row = isolated(d, 900)
            if row["status"] != "ok":
                raise SystemExit(f"{c.model} {c.runtime} b{c.batch}: {row['status']}: {row.get('reason')}")
            zoo.append(row["forward"]["median_ms"])
            n = row["forward"]["n"]
            hand.append(float(_run([HAND_LOOP, c.runtime, c.artifact, str(c.batch), str(threads), str(n)])))
        r = {"model": c.model, "runtime": c.runtime, "batch": c.batch,
             "paired": {**paired, "zoo_vs_hand": paired["zoo_ms"] / paired["hand_ms"] - 1},
             "fresh": {"zoo_ms": zoo, "hand_ms": hand, "iterations": n,
                       "zoo_vs_hand": statistics.mean(zoo) / statistics.mean(hand) - 1,
                       "zoo_repeat": zoo[1] / zoo[0] - 1, "hand_repeat": hand[1] / hand[0] - 1}}
        rows.append(r)
        f = r["fresh"]
        print(f"{c.model:9s} {c.runtime:12s} b{c.batch:<3d} paired zoo {paired['zoo_ms']:8.2f} "
              f"hand {paired['hand_ms']:8.2f} ({r['paired']['zoo_vs_hand']:+.1%})  |  fresh zoo "
              f"{zoo[0]:8.2f} {zoo[1]:8.2f} ({f['zoo_repeat']:+.1%})  hand {hand[0]:8.2f} {hand[1]:8.2f} "
              f"({f['hand_repeat']:+.1%})  zoo/hand {f['zoo_vs_hand']:+.1%}", flush=True)

    def worst(path: tuple[str, str]) -> float:
        return max(abs(r[path[0]][path[1]]) for r in rows)

    result = {"threads": threads, "block_s": block_s, "side_s": side_s, "side_n": side_n, "policy": cases[0].policy,
              "seconds": round(time.perf_counter() - started), "rows": rows,
              "max_abs_paired_zoo_vs_hand": worst(("paired", "zoo_vs_hand")),
              "max_abs_fresh_zoo_vs_hand": worst(("fresh", "zoo_vs_hand")),
              "max_abs_zoo_repeat": worst(("fresh", "zoo_repeat")),
              "max_abs_hand_repeat": worst(("fresh", "hand_repeat"))}
    print(json.dumps({k: v for k, v in result.items() if k.startswith("max")}, indent=2))
    _save("harness", result)
    return result
