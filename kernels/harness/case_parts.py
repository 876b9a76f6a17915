"""A slow task swept in parts: its cases dealt among N parts, each part measured as a task of its own (its reference
and its null over those cases alone), and the task's row made from its parts' rows once all of them are in.

Why: a task's reference and its null are one measurement each, over every case, and a measurement cut short leaves
nothing. A task whose null outlasts the time one call has (GPU MODE's linalg/eigh, calls of 10 s: about 19 minutes
of an H100 for the null alone, measured on 2026-11-27) can only finish in a call that long; keeping its reference (``sweep.kept_reference``)
halves the pair, not the null. In parts, every part that finishes is a row that stays, and the next call, or
another GPU of the host (``--part``), measures the rest.

The null's speedup is the geometric mean over cases of the reference's time over the null's, each case's ratio from
the two timed in one measurement (``kernelcast.kernels.harness.worker``), so the task's figure from its parts is the geometric
mean of the parts' figures weighted by their numbers of cases: the figure one measurement over every case gives.

The partition is made once per task and kept in ``DIR/parts.json``: cases dealt longest first, each to the part
with the least so far, weighed by the kept reference's time on this device where there is one, else by the case's
bytes, else all alike. Later calls read it from there; a folder of another GPU given the same kept reference makes
the same one. A reference kept for the whole task serves each part: its cases' times, sliced out.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

PARTS_FILE = "parts.json"
_KEY = re.compile(r"^(?P<task>.+) \[part (?P<i>\d+)/(?P<n>\d+)\]$")


def part_key(task_key: str, i: int, n: int) -> str:
    """The row key of part ``i`` (1-based) of ``n`` of a task."""
    return f"{task_key} [part {i}/{n}]"


def parse_part_key(key: str) -> tuple[str, int, int] | None:
    """(task key, i, n) of a part's row key; None for a whole task's."""
    m = _KEY.match(key)
    return (m.group("task"), int(m.group("i")), int(m.group("n"))) if m else None


def deal(weights: list[float], n: int) -> list[tuple[int, ...]]:
    """Case indices dealt among ``min(n, len(weights))`` parts: heaviest first, each to the lightest part so far
    (ties to the lower index), each part's indices in the task's order. Deterministic."""
    if n < 1:
        raise ValueError(f"a task splits into at least one part, not {n}")
    n = min(n, len(weights))
    parts: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    for index in sorted(range(len(weights)), key=lambda k: (-weights[k], k)):
        lightest = min(range(n), key=lambda p: (load[p], p))
        parts[lightest].append(index)
        load[lightest] += weights[index]
    return [tuple(sorted(p)) for p in parts]


def mode_cases(op, mode: str):
    """The cases ``mode`` runs: every case on a GPU, the interpreter's small ones elsewhere."""
    return op.cases if mode == "gpu" else op.interpret_cases


def _weights(op, mode: str, kept: dict | None) -> tuple[list[float], str]:
    """Each case's weight for ``deal`` and what it was read from."""
    from kernelcast.kernels.harness.budget import case_bytes

    cases = mode_cases(op, mode)
    if kept is not None and len(kept.get("us") or ()) == len(cases):
        return [float(u) for u in kept["us"]], "the kept reference's time per case"
    sizes = case_bytes(op, cases)
    if sizes and None not in sizes:
        return [float(s) for s in sizes], "each case's bytes"
    return [1.0] * len(cases), "none known: every case alike"


def check_parts(out: Path, task_keys: list[str], n: int) -> None:
    """Refuse, naming the first, a task that ``out/parts.json`` says was split into another number of parts than
    ``n`` (or than its number of cases, where it has fewer): its part rows would not add up to it."""
    path = out / PARTS_FILE
    table = json.loads(path.read_text()) if path.is_file() else {}
    for key in task_keys:
        entry = table.get(key)
        if entry is not None and len(entry["parts"]) != min(n, len(entry["cases"])):
            raise ValueError(f"{key} was split into {len(entry['parts'])} parts by an earlier call ({path}); "
                             f"sweep it with --case-parts {len(entry['parts'])} or into another --out")


def partition(out: Path, task_key: str, op, mode: str, n: int, kept: dict | None = None) -> list[tuple[int, ...]]:
    """The task's parts as case indices, from ``out/parts.json`` when an earlier call made them (``check_parts``
    has refused another number of them), else made now (``deal``) and written there. A task whose cases are no
    longer those it was split by is refused by name."""
    path = out / PARTS_FILE
    table = json.loads(path.read_text()) if path.is_file() else {}
    cases = [c.name for c in mode_cases(op, mode)]
    entry = table.get(task_key)
    if entry is not None:
        if entry["cases"] != cases:
            raise ValueError(f"{task_key}'s cases are not those it was split by in {path}: the task changed since")
        return [tuple(p) for p in entry["parts"]]
    weights, source = _weights(op, mode, kept)
    parts = deal(weights, n)
    table[task_key] = {"cases": cases, "parts": [list(p) for p in parts], "weighed_by": source,
                       "weights": weights}
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(table, indent=1))
    os.replace(staging, path)
    return parts


def part_operation(op, indices: tuple[int, ...], i: int, n: int, mode: str):
    """Part ``i`` of ``n`` of an imported op: the same task with only the cases at ``indices`` (of those ``mode``
    runs), installed beside it under its own name, ``<op>-part<i>of<n>``."""
    from kernelcast.kernels.formats import MANIFEST, install, load_operation, task_files

    files = task_files(op.name)
    manifest = json.loads(files[MANIFEST])
    field = "cases" if mode == "gpu" else "interpret_cases"
    rows = manifest[field]
    manifest[field] = [rows[k] for k in indices]
    manifest["name"] = name = f"{op.name}-part{i}of{n}"
    manifest["part_of"] = {"op": op.name, "part": i, "parts": n, "cases": len(rows)}
    install(name, {**files, MANIFEST: json.dumps(manifest, indent=1).encode()})
    return load_operation(name)


def sliced_reference(kept: dict, indices: tuple[int, ...], case_names: list[str], part_op) -> dict:
    """A reference kept for the whole task as the kept reference of one of its parts: its cases' times alone."""
    names = {case_names[k] for k in indices}
    return {**kept, "op": part_op.name, "candidate_id": part_op.seed_candidates()[0].candidate_id,
            "us": [kept["us"][k] for k in indices],
            "host_sensitive_cases": [c for c in kept.get("host_sensitive_cases", ()) if c in names],
            "windows": None, "sliced_from": kept.get("op", "")}


def _weighted_geomean(pairs) -> float | None:
    """Geometric mean of (value, weight) pairs; None if any value is missing or not positive."""
    pairs = list(pairs)
    if not pairs or any(v is None or not v > 0 or not math.isfinite(v) for v, _ in pairs):
        return None
    return math.exp(sum(w * math.log(v) for v, w in pairs) / sum(w for _, w in pairs))


def _status(rows: list[dict], role: str) -> tuple[str, str]:
    """The task's status for ``role`` from its parts': ok if every part's is, else the first other, named."""
    for r in rows:
        if r.get(f"{role}_status") != "ok":
            i = parse_part_key(r["task"])[1]
            return r.get(f"{role}_status") or "not measured", f"part {i}: {r.get(f'{role}_error', '')}"[:600]
    return "ok", ""


def _sum(rows: list[dict], field: str):
    values = [r.get(field) for r in rows]
    return None if any(v is None for v in values) else round(sum(values), 3)


def combine(task_key: str, rows: list[dict]) -> dict:
    """The task's row from the rows of all its parts (in part order): cases and times in part order, statuses ok
    only where every part's is, the null's speedup the case-weighted geometric mean of the parts'."""
    rows = sorted(rows, key=lambda r: parse_part_key(r["task"])[1])
    first = rows[0]
    row = {"task": task_key, "format": first["format"], "op": re.sub(r"-part\d+of\d+$", "", first["op"]),
           "mode": first.get("mode", ""), "imported": all(r["imported"] for r in rows), "import_error": "",
           "import_s": _sum(rows, "import_s"), "chunk": ",".join(r.get("chunk", "") for r in rows),
           "parts": [r["task"] for r in rows]}
    if not row["imported"]:
        failed = next(r for r in rows if not r["imported"])
        row.update(import_error=failed["import_error"], fits=None, measured=False, wall_s=_sum(rows, "wall_s"))
        return row
    row.update(cases=sum(r["cases"] for r in rows),
               case_bytes_max=max((r["case_bytes_max"] for r in rows if r.get("case_bytes_max")), default=None),
               case_names=[c for r in rows for c in r["case_names"]])
    if any("reference_status" not in r for r in rows):  # a part imported but never measured
        row.update(fits=None, measured=False, wall_s=_sum(rows, "wall_s"))
        return row
    # every part's reference sliced from one measurement of the whole task: its seconds are counted once
    kept = {r.get("reference_measured_in") for r in rows}
    sliced = len(kept) == 1 and None not in kept and "" not in kept
    for role in ("reference", "null"):
        status, error = _status(rows, role)
        spent = rows[:1] if role == "reference" and sliced else rows
        row.update({f"{role}_status": status, f"{role}_error": error,
                    f"{role}_us": [u for r in rows for u in r.get(f"{role}_us") or ()],
                    f"{role}_gpu_s": _sum(spent, f"{role}_gpu_s"), f"{role}_wall_s": _sum(spent, f"{role}_wall_s"),
                    f"{role}_timing_windows": _sum(spent, f"{role}_timing_windows")})
    refused = next((r["refused"] for r in rows if r.get("refused")), None)
    reference_us = row["reference_us"]
    row.update(fits=not refused and all(r["fits"] for r in rows), refused=refused,
               measured=all(r["measured"] for r in rows),
               reference_us_geomean=_weighted_geomean((u, 1) for u in reference_us) if reference_us else None,
               null_speedup=_weighted_geomean((r.get("null_speedup"), r["cases"]) for r in rows)
               if row["reference_status"] == row["null_status"] == "ok" else None,
               wall_s=_sum(rows, "wall_s"))
    earlier = sorted(kept - {None, ""})
    if earlier:
        row["reference_measured_in"] = "; ".join(earlier)
    if sliced and row["wall_s"] is not None and None not in (r.get("reference_wall_s") for r in rows):
        row["wall_s"] = round(row["wall_s"] - sum(r["reference_wall_s"] for r in rows[1:]), 3)
    for field in ("null_anchored", "null_anchored_ratio_of_medians"):
        row[field] = {case: ratio for r in rows for case, ratio in (r.get(field) or {}).items()}
    return row


def adds_up(rows: list[dict]) -> bool:
    """Whether parts' rows hold each of their task's cases exactly once: parts made by different partitions (folders
    of other GPUs without the same kept reference) would count some cases twice and leave others out."""
    names = [c for r in rows for c in r.get("case_names") or ()]
    whole = {(r.get("part_of") or {}).get("cases") for r in rows}
    return len(names) == len(set(names)) and (whole == {None} or whole == {len(names)})


def complete(rows: list[dict]) -> list[dict]:
    """The task rows that ``rows`` hold every part of but not yet the task itself (one a task, in first-seen
    order): what a sweep writes once a task's last part is in. Parts that do not add up (``adds_up``) make no
    row: the parts stay, said so by the sweep's report."""
    have = {r["task"] for r in rows}
    parts: dict[tuple[str, int], dict[int, dict]] = {}
    for r in rows:
        parsed = parse_part_key(r["task"])
        if parsed is not None and parsed[0] not in have:
            task, i, n = parsed
            parts.setdefault((task, n), {})[i] = r
    return [combine(task, list(got.values())) for (task, n), got in parts.items()
            if len(got) == n and adds_up(list(got.values()))]
