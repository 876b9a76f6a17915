"""How the pairs of pool runs met their reference: from each run's timeline, every anchored figure (a candidate's case
timed beside its op's reference and reported as the reference's stored runtime times their ratio), how far the
reference beside it ran from its stored runtime, and what that did to the figures' repeatability across runs.

    PYTHONPATH=$PWD python benchmarks/anchored_pairs.py TIMELINE [TIMELINE ...] [--slowed 1.25]

Each TIMELINE is a run's ``--timeline`` file (``cudal1_pool.py``, ``kernelcast measure``; ``.jsonl`` or ``.jsonl.gz``),
one run a file. Prints: how many anchored figures met a reference slowed past ``--slowed`` times its stored runtime
(``runner.ANCHOR_SLOWED``), the quantiles of that ratio, each candidate's own host time in its pairs (beside a
reference within 1.5x of its stored runtime, and past it), and, for the cases anchored in two or more runs, the range
of their speedups (largest over smallest) over all their figures and over those made beside an unslowed reference.
Reads the timelines only: no GPU. (docs/measured/harness_repeatability/README.md, "Fresh problems".)
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcast.kernels.harness.runner import ANCHOR_SLOWED  # noqa: E402 - after the path is set


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timelines", nargs="+", metavar="TIMELINE", help="one run's timeline each (.jsonl or .jsonl.gz)")
    p.add_argument("--slowed", type=float, default=ANCHOR_SLOWED,
                   help="a pair's reference past this many times its stored runtime counts as slowed "
                        "(default: %(default)s)")
    return p.parse_args(argv)


def events(path: str):
    """A timeline's events, in order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def anchored_figures(path: str) -> list[dict]:
    """Each anchored figure of a run: (task, candidate, case), the speedup it gave, how many times its stored runtime
    the reference ran beside it, and the candidate's host time in that pair (None where the timeline has no pair's
    window for it)."""
    timed, out = {}, []
    for e in events(path):
        if e.get("role") == "reference" or not isinstance(e.get("detail"), dict):
            continue
        d, key = e["detail"], (e["task"], e["candidate"], e["detail"].get("case"))
        if e["phase"] == "timed" and "reference_us" in d:
            timed[key] = d
        elif e["phase"] == "anchored" and d.get("reference_us") and d.get("ratio"):
            out.append({"key": key, "speedup": 1.0 / d["ratio"], "slowed": d["reference_us_here"] / d["reference_us"],
                        "host_us": timed.get(key, {}).get("host_us")})
    return out


def summary(runs: list[list[dict]], slowed: float) -> dict:
    """The figures' counts, quantiles and ranges over ``runs`` (each run's ``anchored_figures``)."""
    figures = [f for run in runs for f in run]
    if not figures:
        return {"figures": 0}
    ratios = sorted(f["slowed"] for f in figures)
    per_case: dict = {}
    for f in figures:
        per_case.setdefault(f["key"], []).append(f)
    ranges_all, ranges_unslowed, host = [], [], {}
    for key, fs in per_case.items():
        if len(fs) >= 2:
            ranges_all.append(max(f["speedup"] for f in fs) / min(f["speedup"] for f in fs))
            calm = [f["speedup"] for f in fs if f["slowed"] <= slowed]
            if len(calm) >= 2:
                ranges_unslowed.append(max(calm) / min(calm))
        split = host.setdefault(key[0], ([], []))
        for f in fs:
            if f["host_us"] is not None:
                split[f["slowed"] > 1.5].append(round(f["host_us"]))
    median = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {"figures": len(figures), "slowed": sum(r > slowed for r in ratios),
            "ratio_quantiles": [round(q, 2) for q in statistics.quantiles(ratios, n=10)] if len(ratios) > 1 else ratios,
            "cases_in_two_runs": len(ranges_all), "median_range_all": median(ranges_all),
            "cases_with_two_unslowed": len(ranges_unslowed), "median_range_unslowed": median(ranges_unslowed),
            "host_us": {task: {"within_1.5x": a, "past_1.5x": b} for task, (a, b) in sorted(host.items())}}


def main(argv=None) -> int:
    args = parse(argv)
    if not args.slowed > 1.0:
        print(f"error: --slowed must be above 1, got {args.slowed}", file=sys.stderr)
        return 2
    missing = [t for t in args.timelines if not Path(t).is_file()]
    if missing:
        print(f"error: no timeline at {', '.join(missing)}", file=sys.stderr)
        return 2
    s = summary([anchored_figures(t) for t in args.timelines], args.slowed)
    if not s["figures"]:
        print(f"no anchored figures in {len(args.timelines)} timelines")
        return 0
    print(f"{s['figures']} anchored figures in {len(args.timelines)} runs; beside a reference past {args.slowed}x "
          f"its stored runtime: {s['slowed']}; that ratio's deciles {s['ratio_quantiles']}")
    fmt = lambda x: "-" if x is None else f"{x:.3f}x"  # noqa: E731
    print(f"cases anchored in two or more runs: {s['cases_in_two_runs']}, median range of their speedups "
          f"{fmt(s['median_range_all'])}; over figures beside an unslowed reference only "
          f"({s['cases_with_two_unslowed']} cases): {fmt(s['median_range_unslowed'])}")
    print("the candidate's own host time in its pairs (us), where the reference ran within 1.5x of its stored "
          "runtime | past it:")
    for task, h in s["host_us"].items():
        print(f"  {task}: {h['within_1.5x']} | {h['past_1.5x']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
