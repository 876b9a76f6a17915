"""Random, roofline and learned surrogates side by side on held-out splits, against the issue's goals.

    python benchmarks/surrogate_eval.py --data data/pools --split operation [--gpu-type h100]
        [--seeds 0] [--calibrate-on measured] [--out eval] [--json out.json]

Runs ``kernelcast.surrogate.evaluate.evaluate`` (what ``kernelcast evaluate`` runs) for each surrogate
and seed, with one OpenMP thread (a shared machine's spinning thread teams crawl), and prints:

1. every pooled metric, raw and recalibrated, per surrogate (mean over seeds);
2. the conformal policy at target risks 5% and 10%: coverage and realised risk per held-out
   fold and pooled, for the learned surrogate;
3. the goals: learned top-10% recovery within 5% on >= 80% of pools, ECE <= 0.05 after
   recalibration, AURC at most half of random's, conformal risk <= target + 1%.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from kernelcast.storage.dataset import DataRoot
from kernelcast.surrogate.dataset import case_pairs
from kernelcast.surrogate.evaluate import evaluate
from kernelcast.surrogate.registry import get_forecaster_factory

METRICS = ("n", "bin_accuracy", "pairwise_accuracy", "spearman", "kendall", "ece", "brier", "crps", "nll",
           "sharpness", "aurc", "risk_at_coverage_50", "top10_within_5pct", "top10_within_20pct")
TARGETS = (5, 10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/pools")
    p.add_argument("--gpu-type", default=None)
    p.add_argument("--split", default="operation", choices=["operation", "gpu", "random"])
    p.add_argument("--surrogates", default="random,roofline,learned")
    p.add_argument("--seeds", default="0", help="comma-separated: which candidates count as measured "
                                                "(and, for --split random, which are held out)")
    p.add_argument("--calibrate-on", default="measured", choices=["measured", "training"])
    p.add_argument("--calibrator", default="platt")
    p.add_argument("--no-recentre", dest="recentre", action="store_false",
                   help="calibrate the confidence only, without recentring Gaussian forecasters")
    p.add_argument("--out", default=None, help="folder for each evaluation's CSV and PNG")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    pairs = case_pairs(DataRoot(args.data), gpu_type=args.gpu_type)
    seeds = [int(s) for s in args.seeds.split(",")]
    tables = []
    for name in args.surrogates.split(","):
        for seed in seeds:
            t0 = time.perf_counter()
            with threadpool_limits(1):
                table = evaluate(get_forecaster_factory(name), pairs, how=args.split, name=name, seed=seed,
                                 calibrate_on=args.calibrate_on, calibrator=args.calibrator, recentre=args.recentre,
                                 out_dir=f"{args.out}/seed{seed}" if args.out else None)
            tables.append(table.assign(seed=seed))
            print(f"{name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    table = pd.concat(tables, ignore_index=True)
    pools = table[table["fold"] == "all"]
    gpus = ", ".join(sorted(pairs["gpu_type"].unique()))
    how = ("per-(op, GPU) level and spread, then " if args.recentre and args.calibrate_on == "measured" else "") + \
        args.calibrator
    print(f"\n{len(pairs)} pairs ({gpus}), split {args.split}, recalibration {how} on "
          f"{args.calibrate_on} candidates, seeds {args.seeds}; pooled over held-out folds, mean over seeds:")
    overall = pools.groupby(["surrogate", "forecasts"], sort=False)[list(METRICS)].mean()
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(overall.round(3).to_string())

    cal = table[(table["forecasts"] == "calibrated")]
    cols = [f"conformal{t}_{k}" for t in TARGETS for k in ("coverage", "risk")]
    print("\nconformal policy (threshold from the measured candidates, scored on the rest), per fold:")
    for name, frame in cal.groupby("surrogate", sort=False):
        per_fold = frame.pivot_table(index="fold", columns="seed", values=cols, sort=False)
        print(f"-- {name}")
        with pd.option_context("display.width", 250, "display.max_columns", 40):
            print(per_fold.round(3).to_string())

    goals = {}
    if {"learned", "random"} <= set(pools["surrogate"]):
        learned, random = overall.loc["learned"], overall.loc["random"]
        learned_cal = cal[cal["surrogate"] == "learned"]
        worst = {t: float(learned_cal[f"conformal{t}_risk"].max()) for t in TARGETS}
        pooled_risk = {t: float(learned_cal[learned_cal["fold"] == "all"][f"conformal{t}_risk"].mean())
                       for t in TARGETS}
        goals = {
            "learned top-10% within 5% of pool best, share of pools (>= 0.80)":
                (learned.loc["raw", "top10_within_5pct"], learned.loc["raw", "top10_within_5pct"] >= 0.80),
            "learned ECE after recalibration (<= 0.05)":
                (learned.loc["calibrated", "ece"], learned.loc["calibrated", "ece"] <= 0.05),
            "learned AURC / random AURC, calibrated (<= 0.5)":
                (learned.loc["calibrated", "aurc"] / random.loc["calibrated", "aurc"],
                 learned.loc["calibrated", "aurc"] <= 0.5 * random.loc["calibrated", "aurc"]),
            **{f"learned conformal realised risk at {t}%, pooled (<= {t + 1}%)":
               (pooled_risk[t], pooled_risk[t] <= (t + 1) / 100) for t in TARGETS},
            **{f"learned conformal realised risk at {t}%, worst single (fold, seed) draw (<= {t + 1}%; "
               f"the guarantee is over draws: benchmarks/conformal_draws.py)":
               (worst[t], worst[t] <= (t + 1) / 100) for t in TARGETS},
        }
        print("\ngoals:")
        for goal, (value, met) in goals.items():
            print(f"  {goal}: {value:.3f} -> {'met' if met else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "pairs": len(pairs), "gpu_types": gpus,
                       "rows": json.loads(table.to_json(orient="records")),
                       "goals": {k: {"value": float(v), "met": bool(m)} for k, (v, m) in goals.items()}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
