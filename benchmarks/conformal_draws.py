"""The conformal trust policy over many calibration draws, per held-out fold.

    python benchmarks/conformal_draws.py --data data/pools --split operation --draws 20

Conformal risk control promises that the realised risk (trusting a forecast whose bin is
off by more than one, as a share of new candidates) is at most the target *in expectation
over which candidates were measured*. ``surrogate_eval.py`` draws the measured 20% three
times; here each held-out fold is forecast once and drawn ``--draws`` times, so the mean
over draws per fold can be set against the target (goal: <= target + 1%).
"""

from __future__ import annotations

import argparse
import json

import pandas as pd
from threadpoolctl import threadpool_limits

from kernelcast.storage.dataset import DataRoot
from kernelcast.surrogate.dataset import case_pairs
from kernelcast.surrogate.evaluate import conformal_draws
from kernelcast.surrogate.registry import get_forecaster_factory


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/pools")
    p.add_argument("--gpu-type", default=None)
    p.add_argument("--split", default="operation", choices=["operation", "gpu", "random"])
    p.add_argument("--surrogate", default="learned")
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--calibrator", default="platt")
    p.add_argument("--no-recentre", dest="recentre", action="store_false")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    pairs = case_pairs(DataRoot(args.data), gpu_type=args.gpu_type)
    with threadpool_limits(1):
        rows = conformal_draws(get_forecaster_factory(args.surrogate), pairs, how=args.split, draws=args.draws,
                               calibrator=args.calibrator, recentre=args.recentre)
    per_fold = rows.groupby(["target_risk", "fold"], sort=False).agg(
        coverage=("coverage", "mean"), risk=("risk", "mean"), risk_max=("risk", "max"))
    per_fold["draws_over_target+1%"] = [int((g["risk"] > t + 0.01).sum()) for (t, _), g in
                                        rows.groupby(["target_risk", "fold"], sort=False)]
    print(f"{args.surrogate}, split {args.split}, {args.draws} draws of the measured 20% per fold, "
          f"recalibration {'level and spread, then ' if args.recentre else ''}{args.calibrator}:")
    with pd.option_context("display.width", 200):
        print(per_fold.round(3).to_string())
    goals = {}
    for target, frame in per_fold.groupby(level="target_risk"):
        pooled = rows[rows["target_risk"] == target]
        goals[f"mean risk at {target:.0%}, worst fold (<= {target + 0.01:.0%})"] = \
            (float(frame["risk"].max()), bool(frame["risk"].max() <= target + 0.01))
        goals[f"mean risk at {target:.0%}, pooled over folds (<= {target + 0.01:.0%})"] = \
            (float(pooled["risk"].mean()), bool(pooled["risk"].mean() <= target + 0.01))
        goals[f"coverage at {target:.0%}, pooled over folds"] = (float(pooled["coverage"].mean()), True)
    print("\ngoals:")
    for goal, (value, met) in goals.items():
        print(f"  {goal}: {value:.3f}" + ("" if goal.startswith("coverage") else f" -> {'met' if met else 'NOT met'}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": json.loads(rows.to_json(orient="records")),
                       "goals": {k: {"value": v, "met": m} for k, (v, m) in goals.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
