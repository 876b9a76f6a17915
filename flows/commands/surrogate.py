"""``kernelcast evaluate | train``: score a surrogate offline, refit the learned priors, train an LLM with GRPO."""

from __future__ import annotations

import os

from flows.commands.common import UsageError, add_data_args, data_root, prefect_defaults


def cmd_evaluate(args) -> int:
    from surrogate.registry import get_forecaster_factory

    factory = get_forecaster_factory(args.surrogate)  # an unknown name fails before any work
    from surrogate.calibration import CALIBRATORS

    if args.calibrator not in CALIBRATORS:
        raise UsageError(f"unknown --calibrator {args.calibrator!r}; known: {', '.join(CALIBRATORS)}")
    root = data_root(args)
    import pandas as pd

    from surrogate.dataset import case_pairs
    from surrogate.evaluate import evaluate

    pairs = case_pairs(root, gpu_type=args.gpu_type)
    if pairs.empty:
        raise UsageError(f"no measured pairs under {args.data}")
    table = evaluate(factory, pairs, how=args.split, out_dir=args.out, name=args.surrogate,
                     tracking_uri=args.tracking_uri, calibrator=args.calibrator, recentre=args.recentre)
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.round(3).to_string(index=False))
    print(f"table and plots written under {args.out}")
    return 0


# ``kernelcast train --surrogate llm-grpo`` flags -> surrogate.grpo.GRPOSettings fields.
_GRPO_FLAGS = {
    "model": (str, "local model folder or .gguf file (llm-grpo; nothing is downloaded)"),
    "reward": (str, "correctness, brier (correctness + 1 - Brier) or crps (correctness + 1 - CRPS)"),
    "steps": (int, "GRPO steps"), "num_generations": (int, "answers per pair (the GRPO group)"),
    "batch_size": (int, "pairs per step per device"), "learning_rate": (float, "LoRA learning rate"),
    "lora_rank": (int, "LoRA rank"), "max_completion_tokens": (int, "tokens an answer may take"),
    "eval_pairs": (int, "held-out pairs scored before and after (0: all)"),
    "sft_steps": (int, "supervised format warm-up steps of the adapter before GRPO (default 0: none)"),
    "sft_learning_rate": (float, "learning rate of the warm-up (default 2e-4)"),
    "answer_prefix": (str, "text each answer starts with, as schema-constrained decoding forces it "
                           "(default '{\"probabilities\": [' ; '' for none)"),
    "out": (str, "folder for the adapter, metrics.jsonl and evaluation.json"),
    "tracking_uri": (str, "MLflow tracking URI for metrics and the adapter"),
}


def _grpo_options(args) -> dict:
    options = {name: getattr(args, name) for name in _GRPO_FLAGS if getattr(args, name) is not None}
    if "out" in options:
        options["out_dir"] = options.pop("out")
    if "model" not in options:
        raise UsageError("--surrogate llm-grpo needs --model: a local model folder or .gguf file")
    return options


def _check_priors(args) -> None:
    """Every setting of ``train`` (learned priors) checked as a search checks it, the operations last."""
    from tasks.config import PACKAGED_POOL, ConfigError, SearchConfig, check_operation, check_settings

    config = SearchConfig(op=args.op, surrogate=args.surrogate, prior_data=args.prior_data or PACKAGED_POOL,
                          data=args.data, gpu_type=args.gpu_type or "auto", prior_scope=args.prior_scope)
    try:
        check_settings(config)
        if args.op != "all":
            for name in (o.strip() for o in args.op.split(",")):
                check_operation(config.replace(op=name))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def cmd_train(args) -> int:
    if args.surrogate == "llm-grpo":
        options = _grpo_options(args)
        from surrogate.grpo import GRPOSettings

        settings = GRPOSettings(**options)  # bad settings fail here, before Prefect starts
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # One process per GPU (accelerate launch, torchrun): the ranks train together, so no rank
            # may run a flow of its own; they call the same core the flow's tasks call.
            import dataclasses

            from surrogate.grpo import train_grpo
            from tasks.setup import grpo_pairs

            run = dataclasses.asdict(train_grpo(grpo_pairs(args.prior_data or "", args.pairs or "", args.gpu_type,
                                                           settings.seed), settings))
            if not run["before"]:  # not the main process: the main one evaluates and prints
                return 0
        else:
            prefect_defaults()
            from flows.search import train_surrogate

            run = train_surrogate(surrogate="llm-grpo", prior_data=args.prior_data or "", data=args.data,
                                  pairs=args.pairs or "", gpu_type=args.gpu_type, grpo=options)
        # Held-out pairs with failures (an LLM corpus) are scored over bins 0..8, with failure AUROC
        # and Spearman over the kernels that ran in place of the rankings of all.
        keys = [k for k in ("bin_accuracy", "failure_auroc", "spearman", "spearman_valid", "kendall", "ece", "brier",
                            "crps", "parse_rate") if k in (run["before"] or run["after"])]
        print(f"{'held-out':<10}" + "".join(f"{k:>13}" for k in keys))
        for label in ("before", "after_sft", "after"):
            if run.get(label):
                print(f"{label:<10}" + "".join(f"{run[label][k]:>13.3f}" for k in keys))
        print(f"trained on {run['train_pairs']} pairs in {run['train_seconds']:.1f} s "
              f"({run['pairs_per_second']:.2f} pairs/s); adapter in {run['adapter_dir']}"
              + (f"; MLflow run {run['mlflow_run_id']}" if run["mlflow_run_id"] else ""))
        return 0
    given = [f"--{n.replace('_', '-')}" for n in ("pairs", *_GRPO_FLAGS) if getattr(args, n) is not None]
    if given:
        raise UsageError(f"{', '.join(given)}: only for --surrogate llm-grpo")
    _check_priors(args)  # before Prefect starts anything
    prefect_defaults()
    from flows.search import train_surrogate
    from tasks.config import ConfigError

    try:
        fitted = train_surrogate(surrogate=args.surrogate, prior_data=args.prior_data or "", data=args.data,
                                 ops=args.op, gpu_type=args.gpu_type, prior_scope=args.prior_scope)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(f"fitted the {args.surrogate} prior ({args.prior_scope}) for each of: {', '.join(fitted)}; "
          f"stored under {args.data}/models")
    return 0


def register(sub) -> None:
    """Add ``evaluate`` and ``train`` to the CLI's subparsers."""
    sp = sub.add_parser("evaluate", help="evaluate a surrogate offline on held-out splits of a measured pool")
    sp.add_argument("--surrogate", required=True, help="learned, roofline or random")
    sp.add_argument("--split", choices=["operation", "gpu", "random"], default="operation")
    sp.add_argument("--gpu-type", default=None, help="only this GPU type's measurements")
    sp.add_argument("--out", default="kernelcast-eval", help="folder for the CSV table and PNG plots")
    sp.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (e.g. sqlite:///mlflow.db); nothing is logged without it")
    sp.add_argument("--calibrator", default="platt",
                    help="how the confidence is recalibrated on the measured candidates: platt, isotonic or temperature")
    sp.add_argument("--no-recentre", dest="recentre", action="store_false",
                    help="do not recentre a Gaussian forecaster per (operation, GPU type) before calibrating")
    add_data_args(sp)
    sp.set_defaults(func=cmd_evaluate)

    sp = sub.add_parser("train", help="refit the learned surrogate's priors and store them under the data root, "
                                      "or train an LLM surrogate with GRPO (--surrogate llm-grpo)")
    sp.add_argument("--surrogate", default="learned", help="learned (default), or llm-grpo: an LLM trained with GRPO")
    sp.add_argument("--prior-data", default=None, help="measurements to fit on (default: the committed pool)")
    sp.add_argument("--op", default="all")
    sp.add_argument("--pairs", default=None, help="llm-grpo: pairs file from `kernelcast pairs` (default: "
                                                  "drawn from --prior-data)")
    sp.add_argument("--gpu-type", default=None, help="the GPU type the priors are for (default: as a search "
                    "chooses); llm-grpo: draw pairs from this GPU type's measurements")
    sp.add_argument("--prior-scope", default="other-ops", help="what each op's prior sees of it: other-ops "
                    "(nothing, default), other-gpus (its measurements on other GPU types), all")
    for name, (kind, text) in _GRPO_FLAGS.items():
        sp.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, help=text)
    add_data_args(sp)
    sp.set_defaults(func=cmd_train)
