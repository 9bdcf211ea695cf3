"""The .t7 reading check: a VGG-16-sized Torch7 file read by zoo's reader vs numpy.fromfile."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .checks_common import save as _save

VGG16_LUA = """
require 'nn'
local m, planes = nn.Sequential(), 3
for _, v in ipairs({64, 64, 'M', 128, 128, 'M', 256, 256, 256, 'M', 512, 512, 512, 'M', 512, 512, 512, 'M'}) do
   if v == 'M' then m:add(nn.SpatialMaxPooling(2, 2, 2, 2))
   else m:add(nn.SpatialConvolution(planes, v, 3, 3, 1, 1, 1, 1)):add(nn.ReLU(true)); planes = v end
end
m:add(nn.View(512 * 7 * 7)):add(nn.Linear(25088, 4096)):add(nn.ReLU(true)):add(nn.Dropout(0.5))
m:add(nn.Linear(4096, 4096)):add(nn.ReLU(true)):add(nn.Dropout(0.5)):add(nn.Linear(4096, 1000))
return m
"""

HWM = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"
TIMED = r"""
import sys, time
import numpy as np
t0 = time.perf_counter()
if sys.argv[1] == "zoo":
    from convert.torch7 import t7file
    t7file.load(sys.argv[2])
else:
    np.fromfile(sys.argv[2], dtype=np.uint8)
print(time.perf_counter() - t0, """ + HWM + r""")
"""

BASELINE = r"""
import sys
import numpy as np
if sys.argv[1] == "zoo":
    from convert.torch7 import t7file
print(""" + HWM + r""")
"""


def _run(kind: str, path: Path) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", TIMED, kind, str(path)], check=True, capture_output=True,
                         text=True).stdout.split()
    base = float(subprocess.run([sys.executable, "-c", BASELINE, kind], check=True, capture_output=True,
                                text=True).stdout)
    return float(out[0]), float(out[1]) - base


def t7_speed(repeats: int = 5) -> dict[str, Any]:
    from convert.torch7 import lua, t7write


    work = Path(tempfile.mkdtemp(prefix="zoo-t7speed-"))
    try:
        src = work / "vgg16.lua"
        src.write_text(VGG16_LUA)
        path = work / "vgg16.t7"
        t7write.dump(lua.run_definition(src, seed=0), path)
        size = path.stat().st_size
        ours, theirs = [], []
        for _ in range(repeats):  # alternating, each in a fresh process (same page-cache state)
            ours.append(_run("zoo", path))
            theirs.append(_run("numpy", path))
        med = statistics.median
        result = {"t7_bytes": size, "repeats": repeats,
                  "zoo_read_median_s": med(t for t, _ in ours), "fromfile_median_s": med(t for t, _ in theirs),
                  "zoo_peak_rss_growth_bytes": med(m for _, m in ours),
                  "fromfile_peak_rss_growth_bytes": med(m for _, m in theirs)}
        result["time_ratio"] = result["zoo_read_median_s"] / result["fromfile_median_s"]
        result["zoo_peak_over_file_size"] = result["zoo_peak_rss_growth_bytes"] / size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    _save("t7-speed", result)
    return result
