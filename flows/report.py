"""Tables people read: the best measured variant per operation and GPU type."""

from __future__ import annotations

import math

import pandas as pd

from kernelcast.kernels.hardware import peak_tflops
from kernelcast.kernels.records import is_lower
from kernelcast.kernels.ops import OPERATIONS


def fraction_of_limit(op_name: str, case_names, runtimes_us, peak_gbps: float, gpu_type: str) -> float | None:
    """Mean over cases of achieved bandwidth (memory-bound) or bf16 throughput (compute-bound) over peak."""
    op = OPERATIONS.get(op_name)
    if op is None or not len(runtimes_us):
        return None
    by_name = {c.name: c for c in op.cases}
    peak_tf = peak_tflops(gpu_type)
    fractions = []
    for name, t in zip(case_names, runtimes_us):
        case = by_name.get(name)
        if case is None:
            continue
        gbps, tflops = op.achieved(case, t)
        if op.bound == "memory" and peak_gbps:
            fractions.append(gbps / peak_gbps)
        elif op.bound == "compute" and peak_tf:
            fractions.append(tflops / peak_tf)
    return sum(fractions) / len(fractions) if fractions else None


def _precision_word(precision: str) -> str:
    """A measurement's precision verdict in a word: lower (than the reference's class), same, or not measured (a row
    from before precision was recorded, or a reference that cannot run in float64)."""
    if is_lower(precision):
        return "lower"
    return "not measured" if not precision or precision.startswith("not measured") else "same"


def reference_host_bound(rows: pd.DataFrame) -> str:
    """What the op's latest reference measurement here says of its cases' host time: the cases whose host side came
    near the flush's head start ("host-sensitive: ..." in its checks), "no" where none did, "" where the row predates
    the mark. A speedup over a host-bound reference is the host's as much as the GPU's: the same kernel measured
    1.2x-4.2x over the same reference in runs on one kind of GPU (docs/measured/harness_repeatability/README.md, "Why the small problems' figures
    move"). Where the reference was measured in several processes (its fastest stored), it says how many and how far
    their figures spread (the largest over the fastest, of its widest case)."""
    if "origin" not in rows or "checks" not in rows:
        return ""
    refs = rows[(rows["origin"] == "seed") & (rows["status"] == "ok")]
    if refs.empty:
        return ""
    from kernelcast.kernels.harness.sweep_report import cases_in
    from kernelcast.kernels.harness.worker import reference_process_figures

    checks = str(refs.sort_values("measured_at").iloc[-1]["checks"] or "")
    cases = cases_in(checks, "host-sensitive: ")
    said = "" if cases is None else f"yes: {', '.join(cases)}" if cases else "no"
    figures = [f for f in reference_process_figures(checks).values() if f and min(f) > 0]
    if said and figures:
        said += (f"; fastest of {max(len(f) for f in figures)} processes, "
                 f"which spread {max(max(f) / min(f) for f in figures):.2f}x")
    return said


def timed_how(checks: str) -> str:
    """How a measurement's cases were timed, from its checks: "alone" (in its own windows), "paired: CASES" (beside the
    reference, reported as the reference's stored runtime times their ratio), and for pairs whose reference ran well
    past its stored runtime, by how much ("beside a slowed reference 2.98x: CASE"): the ratio of such a pair carries to
    the stored figure only where both calls follow the host alike (docs/measured/harness_repeatability/README.md, "Fresh problems"). "" where the
    row predates the mark."""
    from kernelcast.kernels.harness.sweep_report import cases_in
    from kernelcast.kernels.harness.worker import anchored_slowed_in

    paired = cases_in(checks, "anchored: ")
    if paired is None:
        return ""
    if not paired:
        return "alone"
    said = f"paired: {', '.join(paired)}"
    slowed = anchored_slowed_in(checks)
    if slowed:
        said += f"; beside a slowed reference {max(slowed.values()):.2f}x: {', '.join(slowed)}"
    return said


def best_table(root, op: str | None = None) -> pd.DataFrame:
    """One row per (op, gpu_type): counts by status, the fastest correct variant and how its cases were timed
    (``timed_how``), and whether the reference its speedups stand on was host-bound there (``reference_host_bound``)."""
    m = root.read_measurements(op=op)
    if m.empty:
        return pd.DataFrame()
    cands = root.read_candidates(op=op)[["candidate_id", "template", "params", "origin"]]
    m = m.merge(cands.drop_duplicates("candidate_id"), on="candidate_id", how="left")
    rows = []
    for (op_name, gpu_type), g in m.groupby(["op", "gpu_type"], sort=True):
        counts = g["status"].value_counts()
        row = {"op": op_name, "gpu_type": gpu_type, "measured": len(g), "ok": int(counts.get("ok", 0)),
               "failed": int(len(g) - counts.get("ok", 0))}
        correct = g[(g["status"] == "ok") & (g["template"].fillna("").str.rsplit("/", n=1).str[-1] != "eager")]
        # correct kernels whose arithmetic is below the reference's class, timed or not (the interpreter times none)
        row["lower_precision"] = int(sum(map(is_lower, correct["precision"].fillna("").astype(str)))
                                     if "precision" in correct else 0)
        row["reference_host_bound"] = reference_host_bound(g)
        timed = correct[correct["speedup"].notna()]
        if len(timed):
            b = timed.loc[timed["speedup"].idxmax()]
            runtimes = list(b["runtime_us_median"])
            frac = fraction_of_limit(op_name, list(b["case_names"]), runtimes,
                                     float(b.get("peak_bandwidth_gbps") or 0.0), gpu_type)
            row.update({
                "best": b["template"], "params": b["params"],
                "runtime_us": round(math.exp(sum(math.log(t) for t in runtimes) / len(runtimes)), 2),
                "speedup": round(float(b["speedup"]), 3),
                "median_speedup": round(float(timed["speedup"].median()), 3),
                "pct_of_limit": None if frac is None else round(100 * frac, 1),
                "best_precision": _precision_word(str(b.get("precision") or "")),
                "best_timed": timed_how(str(b.get("checks") or "")) if "checks" in b else "",
            })
        rows.append(row)
    return pd.DataFrame(rows)
