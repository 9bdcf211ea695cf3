"""Check commands (minutes, not part of the test suite): numbers for the notes and the README.

    python -m zoo.checks corpus            # convert + verify every corpus prototxt (batch 1)
    python -m zoo.checks caffemodel-speed  # VGG-16 caffemodel: zoo's loader vs OpenCV, peak RSS
    python -m zoo.checks t7-speed          # VGG-16-sized .t7: zoo's reader vs numpy.fromfile
    python -m zoo.checks harness           # interleaved ratios: A/A and repeated sweeps within 5%
    python -m zoo.checks fuzz --minutes N [--seed S]  # hostile/broken inputs to the CLI (zoo/fuzz.py)
    python -m zoo.checks disk [--quick]    # README command 1 (zoo bench --all): peak disk, time, RSS
    python -m zoo.checks mtcnn             # real trained MTCNN nets: model.py vs OpenCV on an image pyramid
    python -m zoo.checks list [--regenerate]  # zoo list: time and peak RSS cold/warm; or rewrite zoo/zoo-list.json
    python -m zoo.checks artifacts         # ONNX node counts, eager model.py vs fx-folded (zoo/checks_artifacts.py)
    python -m zoo.checks threads           # each runtime's thread settings, machine as is and one core busy
    python -m zoo.checks roofline          # fp32 floor of AlexNet/VGG-16 at batch 1 vs OpenCV (zoo/checks_roofline.py)
    python -m zoo.checks gpu [--minutes 8] [--dry-run]  # the zoo on one CUDA device (zoo/checks_gpu.py)

Results are printed and written as JSON under outputs/checks/.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from convert.api import convert, load
from convert.errors import ConvertError, Unsupported

from .catalogue import CATALOGUE
from .checks_common import CORPUS, OUT
from .checks_common import save as _save


def corpus(root: Path = CORPUS, jobs: int | None = None) -> dict[str, Any]:
    """Every prototxt of realworld/ and seeds/: converted and verified at batch 1, or refused; ``jobs``
    files at once (default: the physical cores), each in its own process (zoo/parallel.py)."""
    import functools

    import psutil

    from .parallel import map_jobs

    files = sorted(list((root / "realworld").rglob("*.prototxt")) + list((root / "seeds").rglob("*.prototxt")))
    rows, unsupported = [], {}
    for row in map_jobs(functools.partial(_corpus_file, root=root), files,
                        jobs=jobs or psutil.cpu_count(logical=False) or 1):
        for kind in row.pop("unsupported_types", []):
            unsupported[kind] = unsupported.get(kind, 0) + 1
        rows.append(row)
        print(f"{row['status']:12s} {row['seconds']:6.1f}s {row['file']}", flush=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    result = {"files": len(rows), "counts": counts, "unsupported_layer_types": unsupported, "rows": rows}
    print(json.dumps({k: result[k] for k in ("files", "counts", "unsupported_layer_types")}, indent=2))
    _save("corpus", result)
    return result


def _corpus_file(f: Path, root: Path) -> dict[str, Any]:
    """One corpus file converted and verified at batch 1 in a temporary folder (removed after)."""
    rel = str(f.relative_to(root))
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="zoo-corpus-"))
    try:
        g = load(f, seed=None).graph
        shapes = {k: (1, *v[1:]) for k, v in g.inputs.items()}
        res = convert(f, out=tmp, shapes=shapes, name="m")
        b = res.report["verification"]["backends"]
        row = {"file": rel, "status": res.report["status"],
               **{k: v.get("max_rel", v.get("status")) for k, v in b.items()}}
    except Unsupported as e:
        row = {"file": rel, "status": "unsupported", "message": str(e), "unsupported_types": [k for k, _ in e.items]}
    except ConvertError as e:
        row = {"file": rel, "status": "error", "message": str(e)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def caffemodel_speed(repeats: int = 5) -> dict[str, Any]:
    """VGG-16 with random weights as a real caffemodel: load time vs OpenCV, and peak RSS of convert."""
    import cv2

    from convert.caffe import binary, frontend

    work = Path(tempfile.mkdtemp(prefix="zoo-speed-"))
    try:
        proto = CATALOGUE["vgg16"].source
        model = frontend.read(proto, seed=0)
        weights = work / "vgg16.caffemodel"
        binary.write(weights, model.layers, "VGG16")
        del model
        size = weights.stat().st_size
        ours, touched, theirs = [], [], []
        for _ in range(repeats):  # alternate, so that both see the same page-cache state
            t0 = time.perf_counter()
            g = frontend.read(proto, weights).graph
            ours.append(time.perf_counter() - t0)
            sum(float(w.sum(dtype=np.float64)) for w in g.weights.values())  # every value read once
            touched.append(time.perf_counter() - t0)
            del g
            t0 = time.perf_counter()
            cv2.dnn.readNetFromCaffe(str(proto), str(weights))
            theirs.append(time.perf_counter() - t0)
        secs = _timed([sys.executable, "-m", "zoo.cli", "convert", str(proto), "--weights", str(weights),
                       "--out", str(work / "out")])
        info = json.loads((work / "out" / "vgg16" / "convert.json").read_text())
        zoo_peak = info["peak_rss_bytes"]
        cv_peak = info["verification"]["backends"].get("opencv", {}).get("peak_rss_bytes")
        med = statistics.median
        result = {"caffemodel_bytes": size, "repeats": repeats,
                  "zoo_load_median_s": med(ours), "zoo_load_and_read_all_median_s": med(touched),
                  "opencv_load_median_s": med(theirs),
                  "ratio_zoo_over_opencv": med(ours) / med(theirs),
                  "ratio_zoo_read_all_over_opencv": med(touched) / med(theirs),
                  "convert_seconds": secs, "convert_status": info["status"],
                  "zoo_process_peak_rss_bytes": zoo_peak, "zoo_peak_over_file_size": zoo_peak / size,
                  "opencv_child_peak_rss_bytes": cv_peak,
                  "opencv_peak_over_file_size": cv_peak / size if cv_peak else None}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    _save("caffemodel-speed", result)
    return result


def fuzz(argv: list[str]) -> None:
    """Fuzz the CLI for N minutes; findings (reproducers) under outputs/checks/fuzz-findings/; exit 1 on any."""
    import argparse

    from . import fuzz as fz

    p = argparse.ArgumentParser(prog="python -m zoo.checks fuzz")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    dest = OUT / "fuzz-findings"
    shutil.rmtree(dest, ignore_errors=True)
    result = fz.run(a.minutes * 60, a.seed, dest=dest)
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}, indent=2))
    for key, f in sorted(result["findings"].items()):
        print(f"{f['count']:5d}  {key}  {f.get('reproducer', '')}")
    _save("fuzz", result)
    sys.exit(1 if result["fatal"] else 0)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.ERROR)
    if argv[:1] == ["fuzz"]:
        return fuzz(argv[1:])
    if argv[:1] == ["gpu"]:  # the zoo on one CUDA device in under 8 minutes (zoo/checks_gpu.py)
        from .checks_gpu import main as gpu

        return gpu(argv[1:])
    if argv[:1] == ["corpus"] and argv[1:2] == ["--jobs"] and argv[2:3] and argv[2].isdigit():
        return corpus(jobs=int(argv[2]))  # python -m zoo.checks corpus --jobs N
    if argv[:1] == ["disk"]:  # README command 1's peak disk, time and memory (zoo/checks_disk.py)
        from .checks_disk import disk

        return disk(argv[1:])
    if argv[:1] == ["list"]:  # zoo list cold/warm, or --regenerate zoo/zoo-list.json (zoo/checks_list.py)
        from .checks_list import main as list_main

        return list_main(argv[1:])
    from .checks_harness import harness
    from .checks_list import list_speed
    from .checks_mtcnn import mtcnn

    checks = {"corpus": corpus, "caffemodel-speed": caffemodel_speed, "harness": harness, "mtcnn": mtcnn,
              "list": list_speed}
    from .checks_artifacts import artifacts

    checks["artifacts"] = artifacts
    from .checks_roofline import roofline  # the fp32 floor of AlexNet and VGG-16 at batch 1

    checks["roofline"] = roofline
    from .checks_threads import threads  # how each runtime's threads must be set on a busy machine

    checks["threads"] = threads
    try:
        from .checks_t7 import t7_speed  # noqa: PLC0415 (optional: present with the Torch7 frontend)

        checks["t7-speed"] = t7_speed
    except ImportError:
        pass
    if len(argv) != 1 or argv[0] not in checks:
        print(f"usage: python -m zoo.checks {{{'|'.join(checks)}}}")
        sys.exit(2)
    checks[argv[0]]()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main(sys.argv[1:])
