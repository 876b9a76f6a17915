"""``python -m kernelcast.surrogate.lmhead train --pairs PAIRS.parquet --model MODEL --out DIR``: train, calibrate, score."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelcast.surrogate.lmhead",
                                     description="the language-model forecaster with heads (kernelcast.surrogate.lmhead)")
    sub = parser.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("train", help="train on measured pairs with one fold of problems held out; writes DIR")
    sp.add_argument("--pairs", required=True, help="pairs file from `kernelcast pairs` (Parquet, or .jsonl)")
    sp.add_argument("--model", required=True, help="a local model folder or .gguf file (nothing is downloaded)")
    sp.add_argument("--out", required=True, help="folder for the adapter, heads, calibration, config and metrics")
    sp.add_argument("--folds", type=int, default=5, help="folds over problems (default 5)")
    sp.add_argument("--fold", type=int, default=0, help="the fold held out for testing (default 0)")
    sp.add_argument("--calibration-fraction", type=float, default=0.2,
                    help="share of the training problems kept out of training for calibration (default 0.2)")
    sp.add_argument("--epochs", type=int, default=1)
    sp.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (default 0: the epochs)")
    sp.add_argument("--max-seconds", type=float, default=0.0,
                    help="stop training in time to calibrate, score and save within this many seconds (0: no limit)")
    sp.add_argument("--max-tokens", type=int, default=1024, help="tokens of one pair, both kernels (default 1024)")
    sp.add_argument("--batch", type=int, default=8, help="pairs per step (default 8)")
    sp.add_argument("--lr", type=float, default=2e-4, help="LoRA learning rate (default 2e-4)")
    sp.add_argument("--head-lr", type=float, default=1e-3, help="heads' learning rate (default 1e-3)")
    sp.add_argument("--lora-rank", type=int, default=8)
    sp.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="decoder weights on a GPU")
    sp.add_argument("--gradient-checkpointing", action="store_true",
                    help="recompute activations in the backward pass (less memory, about a third slower)")
    sp.add_argument("--device", default="", help="cuda, cpu, ... (default: CUDA when available)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--rank-weight", type=float, default=0.0,
                    help="weight of the within-problem ranking term; batches then hold whole problems (default 0)")
    args = parser.parse_args(argv)

    from kernelcast.surrogate.lmhead.model import HeadConfig
    from kernelcast.surrogate.lmhead.train import REQUIRED, TrainSettings, train
    from kernelcast.surrogate.pairs import read_pairs

    try:
        head = HeadConfig(model=args.model, max_tokens=args.max_tokens, lora_rank=args.lora_rank,
                          lora_alpha=2 * args.lora_rank, precision=args.precision)
        settings = TrainSettings(folds=args.folds, fold=args.fold, calibration_fraction=args.calibration_fraction,
                                 epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch,
                                 learning_rate=args.lr, head_learning_rate=args.head_lr,
                                 max_seconds=args.max_seconds, gradient_checkpointing=args.gradient_checkpointing,
                                 seed=args.seed, rank_weight=args.rank_weight)
        pairs = read_pairs(args.pairs, columns=REQUIRED)
        result = train(pairs, head, settings, out=args.out, device=args.device)
    except (ValueError, OSError) as exc:  # bad settings or pairs, a file that is not there
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{result.steps} steps in {result.seconds:.1f} s" + (" (stopped by --max-seconds)" if result.stopped_early
                                                                 else "")
          + (f"; loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}" if result.losses else ""))
    print(json.dumps(result.metrics, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
