"""The CUDA-L1 pool against CUDA-L1's published speedups: a row per candidate and protocol, each disagreement classified.

A variant's published figure is the speedup over the eager reference that CUDA-L1's scores imply on
the source GPU (kernelcast.kernels.formats.cudal1.Variant.published_speedup); ours is the harness's speedup of
the same code over the same ``ref_code`` (the problem is imported from the very text they measured,
so a difference from today's KernelBench file cannot separate the two figures; it is reported
beside each row all the same). A row agrees when ours is within ``tolerance`` (20%) of theirs.
Each disagreement gets one class, tried in this order:

- ``untimed``: correct but not timed (interpreter mode), so neither agreeing nor not;
- ``verdict``: we measured no speedup (rejected, incorrect, failed, timed out): the harness's reason;
- ``protocol``: the other protocol's speedup of the same candidate agrees with theirs;
- ``genuine``: both protocols agree with each other (within ``tolerance``) and not with theirs: the
  kernel is not that fast here (our software and GPU as measured, whichever way the difference goes);
- ``protocols disagree``: neither agrees with theirs nor with the other.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd

from kernelcast.storage.dataset import DataRoot

TOLERANCE = 0.20


def agrees(ours: float | None, theirs: float | None, tolerance: float = TOLERANCE) -> bool:
    """Whether ``ours`` is within ``tolerance`` of ``theirs`` (a ratio in [1 - t, 1 + t]); False when either is missing."""
    if not ours or not theirs:
        return False
    return 1 - tolerance <= ours / theirs <= 1 + tolerance


def measured(roots: Mapping[str, DataRoot], gpu_type: str) -> pd.DataFrame:
    """Every stored measurement on ``gpu_type`` under each protocol: candidate_id, protocol, status, speedup, error."""
    frames = []
    for protocol, root in roots.items():
        table = root.read_measurements()
        if table.empty:
            continue
        table = table[table["gpu_type"] == gpu_type]
        frames.append(table.assign(protocol=protocol)[["candidate_id", "op", "protocol", "status", "speedup", "error",
                                                        "precision", "checks"]])
    cols = ["candidate_id", "op", "protocol", "status", "speedup", "error", "precision", "checks"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def classify(side: pd.DataFrame, table: pd.DataFrame, protocols: Sequence[str], gpu: str = "h100",
             tolerance: float = TOLERANCE) -> pd.DataFrame:
    """One row per built candidate and protocol measured: ours, theirs, their ratio, agreement and class."""
    built = side[side["candidate_id"].notna()]
    by = {(r.candidate_id, r.protocol): r for r in table.itertuples(index=False)}
    rows = []
    for s in built.itertuples(index=False):
        theirs = getattr(s, f"published_speedup_{gpu}")
        theirs = float(theirs) if theirs is not None and not pd.isna(theirs) else None
        got = {p: by.get((s.candidate_id, p)) for p in protocols}
        for protocol in protocols:
            m = got[protocol]
            if m is None:
                continue
            ours = float(m.speedup) if m.status == "ok" and m.speedup and not pd.isna(m.speedup) else None
            others = [float(o.speedup) for p, o in got.items() if p != protocol and o is not None
                      and o.status == "ok" and o.speedup and not pd.isna(o.speedup)]
            row = {"op": s.op, "level": s.level, "task_id": s.task_id, "variant": s.variant,
                   "candidate_id": s.candidate_id, "protocol": protocol, "status": m.status, "ours": ours,
                   "theirs": theirs, "ratio": ours / theirs if ours and theirs else None,
                   "kernelbench_status": s.kernelbench_status, "error": (m.error or "")[:300],
                   "precision": m.precision}
            if theirs is None:
                row.update(agrees=None, cls="unpublished")
            elif agrees(ours, theirs, tolerance):
                row.update(agrees=True, cls="")
            elif ours is None and m.status == "ok":
                row.update(agrees=None, cls="untimed")  # an interpreter's verdict: correct, no runtime
            elif ours is None:
                row.update(agrees=False, cls="verdict")
            elif any(agrees(o, theirs, tolerance) for o in others):
                row.update(agrees=False, cls="protocol")
            elif others and all(agrees(ours, o, tolerance) for o in others):
                row.update(agrees=False, cls="genuine")
            else:
                row.update(agrees=False, cls="protocols disagree" if others else "genuine")
            rows.append(row)
    return pd.DataFrame(rows)


def _geomean(values) -> float | None:
    logs = [math.log(v) for v in values if v and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def summary(rows: pd.DataFrame) -> dict:
    """Per protocol and variant: built, measured ok, published, agreeing, the classes, geomean of ours/theirs."""
    out = {}
    if rows.empty:
        return out
    for (protocol, variant), g in rows.groupby(["protocol", "variant"], sort=False):
        pub = g[g["theirs"].notna()]
        both = pub[pub["ours"].notna()]
        out[f"{protocol}/{variant}"] = {
            "rows": int(len(g)), "ok": int((g["status"] == "ok").sum()), "published": int(len(pub)),
            "both_ok": int(len(both)), "agree": int(pub["agrees"].fillna(False).astype(bool).sum()),
            "agree_of_both_ok": round(float(both["agrees"].astype(bool).mean()), 3) if len(both) else None,
            "classes": {k: int(v) for k, v in pub["cls"].value_counts().items() if k},
            "statuses": {k: int(v) for k, v in g["status"].value_counts().items()},
            "geomean_ours_over_theirs": _geomean(both["ratio"]),
            "median_ours": float(g["ours"].median()) if g["ours"].notna().any() else None}
    return out


HEADROOM = 1.3  # a search target: a measured kernel at least this much faster than eager


def headroom(rows: pd.DataFrame, protocol: str = "kernelcast", levels: Sequence[int] = (2, 3),
             threshold: float = HEADROOM) -> pd.DataFrame:
    """The problems of ``levels`` where a kernel measured ok under ``protocol`` (not the null) ran at least
    ``threshold`` times faster than eager: where a search has something to find. One row a problem, best
    first: op, level, variant and speedup of its fastest kernel, and CUDA-L1's published figure for it."""
    cols = ["op", "level", "variant", "ours", "theirs"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    ok = rows[(rows["protocol"] == protocol) & (rows["status"] == "ok") & (rows["variant"] != "null")
              & rows["level"].isin(list(levels)) & rows["ours"].notna()]
    best = ok.sort_values("ours", ascending=False).drop_duplicates("op")
    return best[best["ours"] >= threshold][cols].reset_index(drop=True)


def markdown(rows: pd.DataFrame, stats: dict, gpu_type: str) -> str:
    """The summary table and the disagreements, by class, as Markdown."""
    lines = [f"# CUDA-L1's kernels measured on {gpu_type}, against their published H100 speedups", "",
             "| protocol/variant | built | ok | published | both ok | within 20% | of both ok | ours/theirs (geomean) "
             "| classes of the rest |", "|---|---|---|---|---|---|---|---|---|"]
    for key, s in stats.items():
        g = s["geomean_ours_over_theirs"]
        share = f"{s['agree_of_both_ok']:.0%}" if s["agree_of_both_ok"] is not None else "-"
        classes = ", ".join(f"{k} {v}" for k, v in s["classes"].items() if k != "unpublished")
        lines.append(f"| {key} | {s['rows']} | {s['ok']} | {s['published']} | {s['both_ok']} | {s['agree']} | {share} "
                     f"| {f'{g:.3f}' if g else '-'} | {classes or '-'} |")
    room = headroom(rows)
    if not room.empty:
        lines += ["", f"## Headroom: {len(room)} level-2/3 problems with a kernel at {HEADROOM}x eager or more "
                  "(kernelcast's protocol)", "", "| op | level | fastest | ours | published |", "|---|---|---|---|---|"]
        for r in room.itertuples(index=False):
            theirs = f"{r.theirs:.2f}" if r.theirs is not None and not pd.isna(r.theirs) else "-"
            lines.append(f"| {r.op} | {r.level} | {r.variant} | {r.ours:.2f} | {theirs} |")
    bad = rows[rows["agrees"].eq(False)] if not rows.empty else rows
    if not bad.empty:
        lines += ["", "## Disagreements", "", "| op | variant | protocol | class | ours | theirs | status / reason |",
                  "|---|---|---|---|---|---|---|"]
        for r in bad.sort_values(["cls", "op", "variant", "protocol"]).itertuples(index=False):
            ours = f"{r.ours:.3f}" if r.ours and not pd.isna(r.ours) else "-"
            reason = r.status if r.status == "ok" else f"{r.status}: {r.error[:140]}"
            lines.append(f"| {r.op} | {r.variant} | {r.protocol} | {r.cls} | {ours} | {r.theirs:.3f} | "
                         f"{reason.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
