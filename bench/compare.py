"""Two runs side by side: rows matched by case, the ratio of medians B/A with a bootstrap interval
from the raw samples, and a verdict that needs both the interval to exclude 1 and the change to
exceed a noise floor. Also the environment differences that make a comparison suspect.

Where both rows were timed interleaved against the same baseline runtime (bench/interleave.py), the
runtime's *ratio to that baseline* is compared instead of its absolute time: B's ratio over A's, its
interval from block-resampling each run's rounds (consecutive rounds are correlated). Absolute times
of two sweeps on a shared machine drift by tens of percent; ratios measured in turns do not. The
baseline's own row is compared by time, for information only: it counts in no regression and in no
geometric mean. Rows with different requests in flight (--concurrency) never pair."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import interleave
from .results import ResultsError
from .stats import ratio_ci, verdict

MATCH = ("model", "runtime", "device", "precision", "batch", "mode")
PARTS = ("forward", "backward")
SLOWER, FASTER, SAME = "slower", "faster", "no significant difference"


@dataclass
class Line:
    """One timed part (forward or backward) of one matched case."""

    case: tuple[Any, ...]  # the MATCH fields
    part: str
    a_ms: float
    b_ms: float
    a_iqr: float
    b_iqr: float
    ratio: float  # median(B) / median(A): above 1 is slower
    lo: float
    hi: float
    floor: float  # the noise floor used (relative)
    verdict: str
    baseline: str = ""  # set when the interleaved ratios to this runtime were compared, not times
    informational: bool = False  # the interleaving baseline's own absolute time: not a verdict that counts

    def side(self, which: str, fmt_time: Callable[[float, float], str]) -> str:
        """A's or B's figure: its time per call (median, IQR), or on a ratio line its ratio to the baseline."""
        x, iqr = (self.a_ms, self.a_iqr) if which == "A" else (self.b_ms, self.b_iqr)
        return f"{x:.3g}× {self.baseline} time" if self.baseline else fmt_time(x, iqr)


@dataclass
class Comparison:
    lines: list[Line] = field(default_factory=list)
    not_timed: list[str] = field(default_factory=list)  # matched, but a side has no timing
    only_a: list[tuple[Any, ...]] = field(default_factory=list)
    only_b: list[tuple[Any, ...]] = field(default_factory=list)

    def geomean(self, part: str | None = None) -> float | None:
        """Geometric mean of the ratios (of one part, or all): the typical change across cases."""
        rs = [ln.ratio for ln in self.lines if part in (None, ln.part) and not ln.informational]
        return math.exp(sum(map(math.log, rs)) / len(rs)) if rs else None

    def regressions(self, threshold_pct: float) -> list[Line]:
        return [ln for ln in self.lines
                if ln.verdict == SLOWER and (ln.ratio - 1) * 100 > threshold_pct and not ln.informational]

    def counts(self) -> dict[str, int]:
        return {v: sum(ln.verdict == v for ln in self.lines) for v in (SLOWER, FASTER, SAME)}


def match(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], any_runtime: bool = False
          ) -> tuple[list[tuple[Any, Any]], list, list]:
    """Pairs of rows with the same case: the MATCH fields, without the runtime when ``any_runtime``
    (a Torch7 run of 2017 against today's PyTorch). Where a run holds several rows of a case (other
    layouts, protocols or runtimes), those that also agree on these pair up; what is left of a case
    pairs when one side has a single row (compared with each of the other side's); the rest is
    unmatched. Returns the pairs and the MATCH tuples of the unmatched rows of A and of B."""
    keys = tuple(k for k in MATCH if not (any_runtime and k == "runtime"))
    full = lambda r: (*(r.get(k) for k in (*keys, "runtime", "layout", "protocol")), r.get("concurrency") or 1)
    short = lambda r: (*(r.get(k) for k in keys), r.get("concurrency") or 1)
    by_full = {full(r): r for r in rows_b}
    pairs, rest_a, used = [], [], set()
    for r in rows_a:
        if full(r) in by_full and full(r) not in used:
            pairs.append((r, by_full[full(r)]))
            used.add(full(r))
        else:
            rest_a.append(r)
    rest_b = [r for r in rows_b if full(r) not in used]
    for k in dict.fromkeys(map(short, rest_a)):
        side_a = [r for r in rest_a if short(r) == k]
        side_b = [r for r in rest_b if short(r) == k]
        if side_b and (len(side_a) == 1 or len(side_b) == 1):
            pairs += [(x, y) for x in side_a for y in side_b]
    paired = {id(r) for pair in pairs for r in pair}
    case = lambda r: tuple(r.get(k) for k in MATCH)
    return pairs, [case(r) for r in rows_a if id(r) not in paired], [case(r) for r in rows_b if id(r) not in paired]


def noise_floor(a: dict[str, Any], b: dict[str, Any], floor: float) -> float:
    """The larger of the fixed floor and the runs' own noise: the root mean square of their
    relative IQRs. A change smaller than the typical spread of single calls is not reported,
    because medians of separate runs drift by about that much (clocks, scheduling, placement)."""
    rel = [s["iqr_ms"] / s["median_ms"] for s in (a, b)]
    return max(floor, math.sqrt((rel[0] ** 2 + rel[1] ** 2) / 2))


def compare(doc_a: dict[str, Any], doc_b: dict[str, Any], floor: float = 0.02, n_boot: int = 2000,
            names: tuple[str, str] = ("A", "B"), any_runtime: bool = False) -> Comparison:
    """Compare every matched case; ResultsError when a run is empty or no case matches."""
    for name, doc in zip(names, (doc_a, doc_b)):
        if not doc["rows"]:
            raise ResultsError(f"{name}: an empty run (no rows), nothing to compare")
    pairs, only_a, only_b = match(doc_a["rows"], doc_b["rows"], any_runtime)
    if not pairs:
        fields = ", ".join(k for k in MATCH if not (any_runtime and k == "runtime"))
        raise ResultsError(f"no matching rows: the runs share no case ({fields}); "
                           f"A has {_cases(doc_a['rows'])}, B has {_cases(doc_b['rows'])}")
    c = Comparison(only_a=only_a, only_b=only_b)
    for ra, rb in pairs:
        # the runtime reads 'torch7-nn→torch' where the two differ
        case = tuple(ra.get(k) if k != "runtime" or ra.get(k) == rb.get(k) else f"{ra.get(k)}→{rb.get(k)}"
                     for k in MATCH)
        if (ln := _ratio_line(case, ra, rb, floor, n_boot)) is not None:
            c.lines.append(ln)
            continue
        for part in PARTS:
            sa, sb = ra.get(part), rb.get(part)
            if part == "backward" and not sa and not sb:
                continue  # inference rows have no backward
            if not (sa and sb and sa.get("samples_ms") and sb.get("samples_ms")):
                c.not_timed.append(f"{label(case)} {part}: A {ra['status']}, B {rb['status']}")
                continue
            ln = _line(case, part, sa, sb, floor, n_boot)
            ln.informational = _own_baseline(ra, rb)
            c.lines.append(ln)
    return c


def _line(case: tuple[Any, ...], part: str, sa: dict[str, Any], sb: dict[str, Any], floor: float,
          n_boot: int) -> Line:
    r, lo, hi = ratio_ci(np.asarray(sa["samples_ms"]), np.asarray(sb["samples_ms"]), n_boot=n_boot)
    f = noise_floor(sa, sb, floor)
    return Line(case, part, sa["median_ms"], sb["median_ms"], sa["iqr_ms"], sb["iqr_ms"], r, lo, hi, f,
                verdict(r, lo, hi, f))


def _own_baseline(ra: dict[str, Any], rb: dict[str, Any]) -> bool:
    """Both rows timed interleaved, and this runtime is the baseline of both: its absolute time
    drifts with the machine; only the others' ratios to it are measured well."""
    ia, ib = ra.get("interleave") or {}, rb.get("interleave") or {}
    return bool(ia and ib and ia.get("label") == ia.get("baseline") and ib.get("label") == ib.get("baseline"))


def _ratio_line(case: tuple[Any, ...], ra: dict[str, Any], rb: dict[str, Any], floor: float,
                n_boot: int) -> Line | None:
    """B's interleaved ratio to the baseline over A's, when both runs have one to the same baseline
    (and this runtime is not that baseline); the step time (all phases) is what was interleaved."""
    ia, ib = ra.get("interleave") or {}, rb.get("interleave") or {}
    base = _baseline(ra)
    if not base or base != _baseline(rb) or ia.get("baseline") in (ia.get("label"), ib.get("label")):
        return None
    if not (ia.get("round_ratios") and ib.get("round_ratios")):
        return None
    r, lo, hi = interleave.ratio_ci(ia["round_ratios"], ib["round_ratios"], n_boot=n_boot,
                                    sessions_a=ia.get("round_session"), sessions_b=ib.get("round_session"))
    part = "step" if ra.get("backward") else "forward"
    return Line(case, f"{part} / {base}", ia["ratio"], ib["ratio"], _iqr(ia["round_ratios"]),
                _iqr(ib["round_ratios"]), r, lo, hi, floor, verdict(r, lo, hi, floor), base)


def _baseline(row: dict[str, Any]) -> str | None:
    """The interleaved baseline with its precision: files written before sessions (no
    round_session) timed each precision apart, their "torch" meaning torch at the row's precision;
    since then a bare name is fp32 ("torch bf16" otherwise)."""
    i = row.get("interleave") or {}
    base = i.get("baseline")
    if base and not i.get("round_session") and row.get("precision", "fp32") != "fp32":
        return f"{base} {row['precision']}"
    return base


def _iqr(v: list[float]) -> float:
    q1, q3 = np.percentile(v, [25, 75])
    return float(q3 - q1)


def summary(c: Comparison) -> str:
    """'geometric mean of B/A: forward 1.031, backward 1.050, all 1.040 (slower: 1, ...)'."""
    counted = [ln for ln in c.lines if not ln.informational]
    parts = list(dict.fromkeys(ln.part for ln in counted))
    means = [f"{p} {c.geomean(p):.3f}" for p in parts] + ([f"all {c.geomean():.3f}"] if len(parts) > 1 else [])
    counts = ", ".join(f"{v}: {n}" for v, n in c.counts().items())
    text = f"geometric mean of B/A over {len(counted)} timing(s): {', '.join(means) or '-'} ({counts})"
    own = sorted({label(ln.case) for ln in c.lines if ln.informational})
    if own:
        text += (f"; the interleaving baseline's own time ({'; '.join(own)}) is informational, left out of the "
                 "means and regressions")
    ratios = [ln for ln in c.lines if ln.baseline]
    if ratios:
        bases = ", ".join(sorted({ln.baseline for ln in ratios}))
        text += (f"; {len(ratios)} of them compare interleaved ratios to the baseline ({bases}), not times: "
                 "A and B columns are each run's ratio")
    return text


def fmt_ratio(ln: Line) -> str:
    """'1.203 [1.187, 1.221]': decimals down to the second significant digit of the interval's
    half-width (2 to 4), so the ratio is not shown more precisely than it is known."""
    half = (ln.hi - ln.lo) / 2
    d = 4 if half <= 0 else max(2, min(4, -int(math.floor(math.log10(half))) + 1))
    return f"{ln.ratio:.{d}f} [{ln.lo:.{d}f}, {ln.hi:.{d}f}]"


def _cases(rows: list[dict[str, Any]]) -> str:
    keys = sorted({label(tuple(r.get(k) for k in MATCH)) for r in rows})
    return "; ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def label(case: tuple[Any, ...]) -> str:
    model, runtime, device, precision, batch, mode = case
    return f"{model} {runtime} {device} {precision} b{batch} {mode}"


def env_facts(env: dict[str, Any]) -> dict[str, str]:
    """The parts of an environment that change timings, flattened for comparison."""
    gpu = env.get("gpu") or {}
    facts = {"GPU": gpu.get("name"), "driver": gpu.get("driver"), "CUDA": gpu.get("cuda"),
             "cuDNN": gpu.get("cudnn"), "CPU": env.get("cpu"), "threads": env.get("threads")}
    facts.update({name: v for name, v in (env.get("libraries") or {}).items() if name != "zoo"})
    return {k: str(v) for k, v in facts.items() if v is not None}


def env_differences(env_a: dict[str, Any], env_b: dict[str, Any]) -> list[str]:
    """'GPU: X vs Y' for each fact that differs (a fact only one run records counts: it may differ)."""
    a, b = env_facts(env_a), env_facts(env_b)
    return [f"{k}: {a.get(k, '?')} vs {b.get(k, '?')}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
