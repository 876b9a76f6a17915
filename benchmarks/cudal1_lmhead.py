"""Train the lmhead forecaster with one fold of the CUDA-L1 pool's problems held out, and write its forecasts
of that fold, for ``benchmarks/cudal1_forecast.py --forecasts lmhead=DIR``.

    PYTHONPATH=$PWD python benchmarks/cudal1_lmhead.py --pool POOL --model MODEL.gguf --fold I --out DIR
        [--folds 4] [--spaces FOLDER ...] [--also-data ROOT ...] [--max-seconds 300]

The folds are ``surrogate.ranking.problem_folds`` of the pool's problems: the very folds the forecast
benchmark scores every other forecaster on, so a fold's problems are never in its training. One fold a
process (one a GPU, in parallel). Writes DIR/fold-I/ (the trained folder: adapter, heads, calibration,
training.json naming its held-out problems) and DIR/forecasts-I.parquet (per held-out kernel: op,
candidate_id, fold, fold_seed (the seed that dealt the folds, which is also the training seed), p_fail,
expected, probs). Needs torch, transformers, peft and gguf.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cudal1_forecast import SHARED, _also, _measured, with_pool_tasks  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", default="data/pools/cudal1")
    p.add_argument("--protocol", default="kernelcast")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--spaces", action="append", default=[],
                   help="a folder of variant spaces whose kernels join the pool's problems (as cudal1_forecast's "
                        "--spaces: its table scores them, so they need forecasts too)")
    p.add_argument("--model", required=True, help="a local model folder or .gguf file")
    p.add_argument("--fold", type=int, required=True, help="the fold held out (0-based)")
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--also-data", action="append", default=[], help="another pool's root to train on (repeatable)")
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in the backward pass: longer --max-tokens fit in memory")
    p.add_argument("--calibrate-on", default="",
                   help="draw the calibration split from training problems whose name starts with this only "
                        "(kb.cudal1-: the pool the forecaster is judged on; default: any problem)")
    p.add_argument("--corpus", default=str(SHARED / "corpora" / "cuda-l1"))
    return p.parse_args(argv)


def training_pairs(kernels):
    """The lmhead's pairs from ``source_pairs`` rows: the candidate's source under the name lmhead reads."""
    return kernels.rename(columns={"source": "candidate_source"})[["op", "anchor_source", "candidate_source",
                                                                   "status", "speedup"]]


def run(args) -> int:
    import pandas as pd

    from surrogate import ranking
    from surrogate.lmhead.model import HeadConfig
    from surrogate.lmhead.train import TrainSettings, train

    kernels, _ = _measured(args)
    also_kernels, _ = _also(args)
    problems = sorted(kernels["op"].unique())
    folds = ranking.problem_folds(problems, args.folds, args.seed)
    name, held = folds[args.fold]
    if also_kernels is not None:  # another pool holding one of the held-out problems must not teach it
        also_kernels = also_kernels[~also_kernels["op"].isin(held)]
    train_rows = pd.concat([kernels, *([also_kernels] if also_kernels is not None else [])], ignore_index=True)
    t0 = time.perf_counter()
    result = train(training_pairs(train_rows), HeadConfig(model=args.model, max_tokens=args.max_tokens),
                   TrainSettings(folds=args.folds, fold=args.fold, held_out=tuple(sorted(held)), epochs=args.epochs,
                                 batch_size=args.batch, max_seconds=args.max_seconds, seed=args.seed,
                                 gradient_checkpointing=args.gradient_checkpointing,
                                 calibrate_on=args.calibrate_on),
                   out=str(Path(args.out) / f"fold-{args.fold}"))
    test = kernels[kernels["op"].isin(held)]
    got = ranking.fold_forecasts(result.forecaster, test, float(kernels[~kernels["op"].isin(held)]["failed"].mean()))
    table = pd.DataFrame({"op": test["op"], "candidate_id": test["candidate_id"], "fold": name, "fold_seed": args.seed,
                          "p_fail": got["p_fail"].astype(float), "expected": got["expected"].astype(float),
                          "probs": [list(map(float, p)) for p in got["probs"]]})
    table.to_parquet(Path(args.out) / f"forecasts-{args.fold}.parquet", index=False)
    print(json.dumps({"fold": name, "held_out_problems": len(held), "steps": result.steps,
                      "stopped_early": result.stopped_early, "seconds": time.perf_counter() - t0,
                      "metrics": result.metrics}, indent=1, default=float))
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    return with_pool_tasks(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
