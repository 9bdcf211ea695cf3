"""Fuzzing stays in the suite: a fixed seed and a fixed budget of inputs (about a minute on 2 cores).

Every mutated or generated prototxt, caffemodel, .t7 file and Lua script fed to ``zoo convert``,
``info`` and ``verify`` must end in exit 0, 1 or 2: never a traceback, a crash, a hang past its
limit, memory past its limit, code execution, a file outside the output folder or a leftover
temporary. The fuzzer runs in one fresh interpreter (its fork server must not inherit this process's
torch threads). Longer runs: ``python -m zoo.checks fuzz --minutes N``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from zoo.fuzz import FATAL

ROOT = Path(__file__).resolve().parents[1]
INPUTS, SEED = 60, 0
RUN = """
import json, sys
from pathlib import Path
from zoo import fuzz
res = fuzz.run(float(sys.argv[1]), seed=int(sys.argv[2]), max_inputs=int(sys.argv[3]), dest=Path(sys.argv[4]),
               log=lambda m: print(m, file=sys.stderr, flush=True))
Path(sys.argv[5]).write_text(json.dumps(res))
"""


def test_fuzz_inputs_end_in_exit_0_1_or_2(tmp_path: Path) -> None:
    findings, out = tmp_path / "findings", tmp_path / "fuzz.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the time cap is a safety valve against a slow machine; the budget is the input count
    proc = subprocess.run([sys.executable, "-c", RUN, "420", str(SEED), str(INPUTS), str(findings), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["inputs"] >= INPUTS // 2, f"only {res['inputs']} inputs ran: {res}"
    assert set(res["inputs_per_generator"]) == {"prototxt-mutate", "prototxt-grammar", "caffemodel", "t7", "lua"}
    bad = {k: f for k, f in res["findings"].items() if f["class"] in FATAL}
    assert not bad, "\n" + "\n".join(f"{f['count']}x {k}\n    {f.get('reproducer')}" for k, f in bad.items())
