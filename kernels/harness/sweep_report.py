"""The task sweep's report: a line per task, the summary against the goals, the Markdown table, and where the
measuring children's time went (``lock_breakdown``, from the worker's timeline).

Standard library only: it runs where the sweep runs, on a machine with torch and triton alone.
"""

from __future__ import annotations

import math
import re
import statistics

GOALS = {"measured_share": 0.97, "null_within_2pct_share": 0.95, "null_median_abs_dev": 0.005}
NULL_BAND = 0.02


# (segment, its first mark, its last mark or the marks that may end it, the first found): with shared checks
# (under_lock.DeviceLock) a child's checks end at "checked" and it waits for the lock alone until "exclusive"; after its
# timing it holds the lock shared again ("shared_again"), unless another child got it alone first ("share_wait").
SEGMENTS = (("compile ahead", "started", "ahead_done"), ("first calls", "locked", "checks"),
            ("checks", "checks", ("checked", "timing")), ("waiting, alone", "exclusive_wait", "exclusive"),
            ("recheck", "last_timed", "releasing"), ("waiting, shared again", "share_wait", "shared_again"),
            ("free", "releasing", "released"))
# Parts of the segments above, summed per child: a check of the first seed (it also measures precision against a
# float64 reference) and of the others, within "checks"; the verification of each timed window, within "between
# windows": its traced call (the profiler's session), then its calls on unseen inputs with their synced windows.
# Within the first seed's checks, the comparison after a case's first call (its correctness check and its precision
# against float64) on the child's first case and on the others: in a fresh process the first launches of the
# comparison's kernels cost about 200 ms on an H100, every later case's 3-16 ms.
PARTS = ("check, first seed", "check, other seeds", "comparison, first case", "comparison, later cases",
         "verification: trace", "verification: unseen inputs", "timing: inputs", "timing: freeing before inputs")
# Marks a check makes on its way (its inputs, its call, the limits its call's time sets): the check goes on past them.
_WITHIN_CHECK = ("first_inputs", "calling", "call", "limits")
# (mark, the child's mark before it) -> the part the time between them is: "verified" right after "timed" is a case
# verified without a trace (tracing unavailable)
_VERIFICATION = {("traced", "timed"): "verification: trace", ("verified", "traced"): "verification: unseen inputs",
                 ("verified", "timed"): "verification: unseen inputs",
                 # a window's rotation sets made (from "case_inputs" to "timing"); the previous window's freed before
                 ("timing", "case_inputs"): "timing: inputs", ("case_inputs", "verified"): "timing: freeing before inputs",
                 ("case_inputs", "timed"): "timing: freeing before inputs",
                 ("case_inputs", "anchored"): "timing: freeing before inputs"}


def lock_breakdown(timeline) -> dict[str, dict[str, float]]:
    """Where each child's time went, from the worker's timeline: median and total seconds per segment.

    Under the lock: first calls (of cases not compiled ahead), the correctness checks (with the first
    case's timing inputs), the timed calls of every window, what lies between windows (the next case's
    inputs, the verification of each window, freeing), the recheck after timing, and freeing the device;
    before it, compiling ahead. ``PARTS`` split the checks by seed and give the verification's share."""
    children: dict[tuple[str, int], dict[str, float]] = {}
    timing: dict[tuple[str, int], float] = {}
    parts: dict[str, dict[tuple[str, int], float]] = {name: {} for name in PARTS}
    last: dict[tuple[str, int], tuple[str, float, object]] = {}
    checking: dict[tuple[str, int], tuple[str, float]] = {}  # a child's check under way: (its part, its start)
    compared: set[tuple[str, int]] = set()  # children past their first case's comparison
    for cid, attempt, phase, t, detail in timeline:
        key = (cid, attempt)
        before = last.get(key)
        if key in checking and phase not in _WITHIN_CHECK:  # one seed's check: its inputs, call and comparison
            part, started = checking.pop(key)
            parts[part][key] = parts[part].get(key, 0.0) + t - started
        if phase == "check":
            seed = detail.get("seed") if isinstance(detail, dict) else None
            checking[key] = ("check, first seed" if seed == 1 else "check, other seeds", t)
        if before is not None and before[0] == "call":  # a case's first call returned: its comparison until now
            part = "comparison, first case" if key not in compared else "comparison, later cases"
            compared.add(key)
            parts[part][key] = parts[part].get(key, 0.0) + t - before[1]
        if before is not None and (phase, before[0]) in _VERIFICATION:  # a timed window's trace, or its unseen inputs
            part = _VERIFICATION[phase, before[0]]
            parts[part][key] = parts[part].get(key, 0.0) + t - before[1]
        last[key] = (phase, t, detail)
        marks = children.setdefault((cid, attempt), {})
        if phase == "timing":
            marks["_timing_started"] = t
            marks.setdefault("timing", t)
        elif phase == "timed" and "_timing_started" in marks:
            timing[(cid, attempt)] = timing.get((cid, attempt), 0.0) + t - marks.pop("_timing_started")
            marks["last_timed"] = t
        else:
            marks.setdefault(phase, t)
    spans: dict[str, list[float]] = {name: [] for name, _, _ in SEGMENTS}
    spans["timed calls"] = list(timing.values())
    spans["between windows"] = [marks["last_timed"] - marks["timing"] - timing[key]
                                for key, marks in children.items() if key in timing]  # inputs, freeing
    for name, per_child in parts.items():
        spans[name] = list(per_child.values())
    for marks in children.values():
        for name, a, ends in SEGMENTS:
            b = next((e for e in ((ends,) if isinstance(ends, str) else ends) if e in marks), None)
            if a in marks and b is not None:
                spans[name].append(marks[b] - marks[a])
    return {name: {"median_s": round(statistics.median(v), 4), "total_s": round(sum(v), 2), "children": len(v)}
            for name, v in spans.items() if v}


def held_seconds(holds) -> dict[str, float]:
    """How long the GPU lock was held, from its holds (``MeasureWorker.holds``: start, end, shared): "held" (by any
    child, overlaps counted once), "alone" (held exclusive: a child that did not share, and every child's timing) and
    "shared" (held by children's shared checks only, one child or several at once)."""
    held = union_seconds([(a, b) for a, b, _ in holds])
    alone = union_seconds([(a, b) for a, b, shared in holds if not shared])
    return {"held": held, "alone": alone, "shared": held - alone}


def union_seconds(intervals) -> float:
    """The length of the union of (start, end) intervals."""
    total, reach = 0.0, None
    for a, b in sorted(intervals):
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def cases_in(checks: str, clause: str) -> tuple[str, ...] | None:
    """The cases a row's checks list after ``clause`` ("anchored: a, b"; "none": no case); None where the row has no
    such clause."""
    for part in (checks or "").split("; "):
        if part.startswith(clause):
            return tuple(name for name in part[len(clause):].split(", ") if name and name != "none")
    return None


def anchored_in(checks: str) -> set[str]:
    """The cases a row's checks say were timed beside the reference ("anchored: a, b"; "none": no case)."""
    return set(cases_in(checks, "anchored: ") or ())


def repeat_spread(series: dict[str, dict], case_names: dict[str, list[str]]) -> dict[str, list[float]]:
    """The coefficient of variation of each (candidate, case) over its separate runs, split by how the case was timed:
    "own" (its fastest window in every run) and "anchored" (beside the reference in at least one run, reported as the
    reference's runtime in that run times their ratio, so it moves with the reference's own measurement a run).

    ``series``: candidate -> {"op", "runtime_us": [per run, per case], "checks": [per run]}; ``case_names``: op -> its
    cases' names in order."""
    found: dict[str, list[float]] = {"own": [], "anchored": []}
    for s in series.values():
        names = case_names[s["op"]]
        anchored = set().union(*(anchored_in(c) for c in s["checks"])) if s["checks"] else set()
        for i, per_case in enumerate(zip(*s["runtime_us"])):
            if len(per_case) >= 2 and statistics.mean(per_case) > 0:
                kind = "anchored" if i < len(names) and names[i] in anchored else "own"
                found[kind].append(statistics.stdev(per_case) / statistics.mean(per_case))
    return found


def task_line(row: dict) -> str:
    """One task's row as the sweep prints it when it is done."""
    if not row["imported"]:
        return f"{row['task']}: not imported ({reason(row['import_error'])[:160]})"
    ref, null = row.get("reference_status", "?"), row.get("null_status", "?")
    us = row.get("reference_us_geomean")
    s = row.get("null_speedup")
    text = (f"{row['task']}: reference {ref}" + (f" {us:.1f} us" if us else "") + f", null {null}"
            + (f" {s:.4f}x" if s else "") + f", {row['wall_s']:.1f} s")
    if ref != "ok":
        text += f" [{row.get('reference_error', '')[:160]}]"
    elif null != "ok":
        text += f" [{row.get('null_error', '')[:160]}]"
    return text


_STAGED_PATH = re.compile(r"(?:\w+Error: )?(?:/[^\s:]+/)+(?P<file>[^/\s:]+\.py)")


def reason(error: str) -> str:
    """An error as a table shows it: the exception's class and the import's staging folder dropped, the file
    named alone (the reason is the part worth the width)."""
    return _STAGED_PATH.sub(lambda m: m.group("file"), error, count=1)


def null_speedup_by_ratio_of_medians(row: dict) -> float | None:
    """The row's null speedup had each case timed beside the reference taken the ratio of the pair's medians rather
    than the median of its per-round ratios (``null_anchored_ratio_of_medians`` against ``null_anchored``): the
    other estimator on the same pairs. None where the row lacks what it needs (a row of an earlier sweep)."""
    names, ref, null = row.get("case_names"), row.get("reference_us"), row.get("null_us")
    used, other = row.get("null_anchored") or {}, row.get("null_anchored_ratio_of_medians") or {}
    if not names or not ref or not null or len(names) != len(ref) or len(ref) != len(null) or set(used) != set(other):
        return None
    logs = []
    for name, r, t in zip(names, ref, null):
        if name in used:
            t = t / used[name] * other[name]
        if not (r > 0 and t > 0):
            return None
        logs.append(math.log(r / t))
    return math.exp(sum(logs) / len(logs))


def summarize(rows: list[dict]) -> dict:
    """The sweep against its goals."""
    imported = [r for r in rows if r["imported"]]
    judged = [r for r in imported if "reference_status" in r]
    fits = [r for r in judged if r["fits"]]
    measured = [r for r in fits if r["measured"]]
    speedups = [r["null_speedup"] for r in measured if r.get("null_speedup")]
    devs = [abs(1 - s) for s in speedups]
    oom = [r for r in judged for role in ("reference", "null")
           if "out of memory" in r.get(f"{role}_error", "").lower()]
    timeouts = [r for r in judged for role in ("reference", "null") if r.get(f"{role}_status") == "timeout"]
    twin_disagrees = [r for r in fits if r["reference_status"] != r["null_status"]]
    chunks = {}
    for r in judged:
        chunks.setdefault(r["chunk"], []).append(r)
    summary = {
        "tasks": len(rows), "imported": len(imported), "not_imported": len(rows) - len(imported),
        "refused_too_big": sum(1 for r in judged if not r["fits"] and r.get("refused", "size") == "size"),
        "refused_requirement": sum(1 for r in judged if r.get("refused") == "requirement"),
        "fit": len(fits), "measured": len(measured),
        "measured_share": len(measured) / len(fits) if fits else None,
        "null_speedups": len(speedups),
        "null_within_2pct_share": sum(d <= NULL_BAND for d in devs) / len(devs) if devs else None,
        "null_median_abs_dev": statistics.median(devs) if devs else None,
        "null_speedup_median": statistics.median(speedups) if speedups else None,
        "out_of_memory_verdicts": len(oom), "timeouts": len(timeouts),
        "reference_timeout_with_twin_ok": sum(1 for r in fits if r["reference_status"] == "timeout"
                                              and r["null_status"] == "ok"),
        "twin_status_disagreements": len(twin_disagrees),
        # children whose checks ran beside other children's (a sweep since WorkerConfig.shared_checks)
        "checks_shared": sum(1 for r in judged for role in ("reference", "null") if r.get(f"{role}_checks_shared")),
        "checks_alone": sum(1 for r in judged for role in ("reference", "null")
                            if r.get(f"{role}_checks_shared") is False),
        "import_seconds": round(sum(r["import_s"] for r in rows), 1),
        "task_wall_seconds": round(sum(r["wall_s"] for r in rows), 1),
        "device_seconds": round(sum(r.get("reference_gpu_s", 0) + r.get("null_gpu_s", 0) for r in judged), 1),
        "failures": {r["task"]: (r.get("reference_error") or r.get("null_error") or "")[:200]
                     for r in fits if not r["measured"]},
    }
    # the same nulls with their paired cases taken by the other estimator, where every row can say (a sweep since
    # the per-round ratio): which of the two brings identical code nearer 1.00 on the same pairs
    other = [null_speedup_by_ratio_of_medians(r) for r in measured if r.get("null_speedup")]
    if speedups and None not in other:
        summary["null_within_2pct_share_by_ratio_of_medians"] = sum(abs(1 - s) <= NULL_BAND for s in other) / len(other)
    summary["goals"] = {
        "measured_share >= 0.97": _meets(summary["measured_share"], GOALS["measured_share"], True),
        "null within 1.00 +- 0.02 on >= 95%": _meets(summary["null_within_2pct_share"],
                                                     GOALS["null_within_2pct_share"], True),
        "median abs(1 - s) <= 0.5%": _meets(summary["null_median_abs_dev"], GOALS["null_median_abs_dev"], False),
        "no out-of-memory verdict": summary["out_of_memory_verdicts"] == 0,
        "no reference timeout whose twin passed": summary["reference_timeout_with_twin_ok"] == 0,
    }
    return summary


def _meets(value, goal, at_least: bool):
    if value is None:
        return None
    return value >= goal if at_least else value <= goal


def markdown(rows: list[dict], summary: dict) -> str:
    lines = ["| task | imported | reference | reference runtime (us, geomean) | null | null speedup | wall (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["task"]):
        if not r["imported"]:
            lines.append(f"| {r['task']} | no: {reason(r['import_error'])[:160].replace('|', '/')} | | | | | {r['wall_s']:.1f} |")
            continue
        us = r.get("reference_us_geomean")
        s = r.get("null_speedup")
        ref = r.get("reference_status", "")
        if ref and ref != "ok":
            ref += ": " + reason(r.get("reference_error", ""))[:160].replace("|", "/")
        lines.append(f"| {r['task']} | yes | {ref} | {f'{us:.1f}' if us else ''} | {r.get('null_status', '')} | "
                     f"{f'{s:.4f}' if s else ''} | {r['wall_s']:.1f} |")
    lines += ["", "| summary | value |", "|---|---|"]
    for k, v in summary.items():
        if k not in ("failures", "goals"):
            lines.append(f"| {k} | {round(v, 4) if isinstance(v, float) else v} |")
    for k, v in summary["goals"].items():
        lines.append(f"| goal: {k} | {'met' if v else 'not met' if v is not None else 'n/a'} |")
    return "\n".join(lines) + "\n"
