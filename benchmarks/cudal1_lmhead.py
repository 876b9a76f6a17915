"""Train the lmhead forecaster with one fold of the CUDA-L1 pool's problems held out, and write its forecasts
of that fold, for ``benchmarks/cudal1_forecast.py --forecasts lmhead=DIR``.

    PYTHONPATH=$PWD python benchmarks/cudal1_lmhead.py --pool POOL --model MODEL.gguf --fold I --out DIR
        [--folds 4] [--problems all|dev] [--spaces FOLDER ...] [--also-data ROOT ...] [--max-seconds 300]
    PYTHONPATH=$PWD python benchmarks/cudal1_lmhead.py --problems sealed --model MODEL.gguf --out DIR ...

The folds are ``kernelcast.surrogate.ranking.problem_folds`` of the pool's problems: the very folds the forecast
benchmark scores every other forecaster on, so a fold's problems are never in its training. One fold a
process (one a GPU, in parallel); ``--problems sealed`` is one more run, fit on the development problems
and forecasting the sealed fifth (files named ``sealed`` in place of I). Writes DIR/fold-I/ (the trained folder: adapter, heads, calibration,
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

from benchmarks.cudal1_forecast import (_also, _measured, add_pool_arguments, development_split,  # noqa: E402
                                        save_forecasts, with_pool_tasks)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pool_arguments(p)  # the benchmark's: --spaces' kernels are scored there, so they need forecasts too
    p.add_argument("--model", required=True, help="a local model folder or .gguf file")
    p.add_argument("--fold", type=int, default=None, help="the fold held out (0-based; not with --problems sealed)")
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
    p.add_argument("--rank-weight", type=float, default=0.0,
                   help="weight of the within-problem ranking term (kernelcast.surrogate.lmhead.train.rank_loss): batches then "
                        "hold whole problems (default 0: the per-pair losses alone)")
    return p.parse_args(argv)


def training_pairs(kernels):
    """The lmhead's pairs from ``source_pairs`` rows: the candidate's source under the name lmhead reads."""
    return kernels.rename(columns={"source": "candidate_source"})[["op", "anchor_source", "candidate_source",
                                                                   "status", "speedup"]]


def held_out(args, kernels):
    """(fold name, held-out problems, the kernels this run may read, the problems no other pool may teach it) as
    ``cudal1_forecast --problems`` deals them: every problem, the development problems only, or the sealed ones
    held out of a fit on the rest."""
    from kernelcast.surrogate import ranking

    development, sealed = development_split(kernels)
    if args.problems == "sealed":
        if args.fold is not None:
            raise ValueError("--problems sealed holds out the sealed problems as one fold: give no --fold")
        return "sealed", sealed, kernels, sealed
    if args.fold is None:
        raise ValueError(f"--problems {args.problems} needs --fold: which of the {args.folds} folds to hold out")
    if args.problems == "dev":
        kernels = development
    folds = ranking.problem_folds(sorted(kernels["op"].unique()), args.folds, args.seed)
    if not 0 <= args.fold < len(folds):
        raise ValueError(f"--fold {args.fold}: there are {len(folds)} folds (0..{len(folds) - 1})")
    name, held = folds[args.fold]
    return name, frozenset(held), kernels, frozenset(held) | (sealed if args.problems == "dev" else frozenset())


def label(args) -> str:
    """The run's name in its files: the fold's index, or sealed."""
    return "sealed" if args.problems == "sealed" else str(args.fold)


def run(args) -> int:
    import pandas as pd

    from kernelcast.surrogate import ranking
    from kernelcast.surrogate.lmhead.model import HeadConfig
    from kernelcast.surrogate.lmhead.train import TrainSettings, train

    kernels, _ = _measured(args)
    also_kernels, _ = _also(args)
    name, held, kernels, kept_out = held_out(args, kernels)
    if also_kernels is not None:  # another pool holding one of the held-out (or sealed) problems must not teach it
        also_kernels = also_kernels[~also_kernels["op"].isin(kept_out)]
    train_rows = pd.concat([kernels, *([also_kernels] if also_kernels is not None else [])], ignore_index=True)
    t0 = time.perf_counter()
    result = train(training_pairs(train_rows), HeadConfig(model=args.model, max_tokens=args.max_tokens),
                   TrainSettings(folds=args.folds, fold=args.fold or 0, held_out=tuple(sorted(held)), epochs=args.epochs,
                                 batch_size=args.batch, max_seconds=args.max_seconds, seed=args.seed,
                                 gradient_checkpointing=args.gradient_checkpointing,
                                 calibrate_on=args.calibrate_on, rank_weight=args.rank_weight),
                   out=str(Path(args.out) / f"fold-{label(args)}"))
    test = kernels[kernels["op"].isin(held)]
    got = ranking.fold_forecasts(result.forecaster, test, float(kernels[~kernels["op"].isin(held)]["failed"].mean()))
    save_forecasts(test, got.assign(fold=name), Path(args.out), args.seed, part=label(args))
    print(json.dumps({"fold": name, "held_out_problems": len(held), "steps": result.steps,
                      "stopped_early": result.stopped_early, "seconds": time.perf_counter() - t0,
                      "metrics": result.metrics}, indent=1, default=float))
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    return with_pool_tasks(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
