"""``kernelcast evaluate | train | forecast``: score a surrogate offline, refit the learned priors, train an LLM with
GRPO, forecast a user's kernel files as a search would."""

from __future__ import annotations

import os

from kernelcast.flows.commands.common import UsageError, add_data_args, data_root, parse_storage_options, prefect_defaults


def cmd_evaluate(args) -> int:
    from kernelcast.surrogate.registry import get_forecaster_factory

    factory = get_forecaster_factory(args.surrogate)  # an unknown name fails before any work
    from kernelcast.surrogate.calibration import CALIBRATORS

    if args.calibrator not in CALIBRATORS:
        raise UsageError(f"unknown --calibrator {args.calibrator!r}; known: {', '.join(CALIBRATORS)}")
    root = data_root(args)
    import pandas as pd

    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.surrogate.evaluate import evaluate

    pairs = case_pairs(root, gpu_type=args.gpu_type)
    if pairs.empty:
        raise UsageError(f"no measured pairs under {args.data}")
    table = evaluate(factory, pairs, how=args.split, out_dir=args.out, name=args.surrogate,
                     tracking_uri=args.tracking_uri, calibrator=args.calibrator, recentre=args.recentre)
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.round(3).to_string(index=False))
    print(f"table and plots written under {args.out}")
    return 0


# ``kernelcast train --surrogate llm-grpo`` flags -> kernelcast.surrogate.grpo.GRPOSettings fields.
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
    from kernelcast.tasks.config import PACKAGED_POOL, ConfigError, SearchConfig, check_operation, check_settings

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
        from kernelcast.surrogate.grpo import GRPOSettings

        settings = GRPOSettings(**options)  # bad settings fail here, before Prefect starts
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # One process per GPU (accelerate launch, torchrun): the ranks train together, so no rank
            # may run a flow of its own; they call the same core the flow's tasks call.
            import dataclasses

            from kernelcast.surrogate.grpo import train_grpo
            from kernelcast.tasks.setup import grpo_pairs, grpo_tracker

            run = dataclasses.asdict(train_grpo(grpo_pairs(args.prior_data or "", args.pairs or "", args.gpu_type,
                                                           settings.seed), settings, grpo_tracker(settings)))
            if not run["before"]:  # not the main process: the main one evaluates and prints
                return 0
        else:
            prefect_defaults()
            from kernelcast.flows.search import train_surrogate

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
    from kernelcast.flows.search import train_surrogate
    from kernelcast.tasks.config import ConfigError

    try:
        fitted = train_surrogate(surrogate=args.surrogate, prior_data=args.prior_data or "", data=args.data,
                                 ops=args.op, gpu_type=args.gpu_type, prior_scope=args.prior_scope)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(f"fitted the {args.surrogate} prior ({args.prior_scope}) for each of: {', '.join(fitted)}; "
          f"stored under {args.data}/models")
    return 0


def _forecast_config(args):
    """The search settings a forecast is made under, checked as a search checks them."""
    from kernelcast.tasks.config import PACKAGED_POOL, ConfigError, SearchConfig, check_operation, check_settings

    config = SearchConfig(op=args.op, gpu_type=args.gpu_type, surrogate=args.surrogate, data=args.data,
                          surrogate_folder=args.surrogate_folder or "",
                          prior_data=args.prior_data or PACKAGED_POOL, prior_scope=args.prior_scope,
                          storage_options=parse_storage_options(args.storage_option))
    try:
        check_settings(config)
        if config.surrogate in ("llm", "none"):
            raise ConfigError(f"--surrogate {config.surrogate}: forecast with learned, source, lmhead, physics, labels, "
                              "roofline or random")
        check_operation(config.replace(generator="freeform"))  # an imported task too: no template space is needed
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return config


def _percent(p: float) -> str:
    return "n/a" if p != p else f"{100 * p:.0f}%"


def cmd_forecast(args) -> int:
    config = _forecast_config(args)
    import dataclasses
    import json

    from kernelcast.surrogate.bins import UPPER_EDGES
    from kernelcast.tasks.config import ConfigError
    from kernelcast.tasks.forecast import forecast_files
    from kernelcast.tasks.setup import data_root as open_root, forecaster

    try:
        root = open_root(config)
        report = forecast_files(config, root, forecaster(config, root), args.files, anchor=args.anchor)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=1, default=str))
        return 0
    lows = (0.0,) + UPPER_EDGES[:-1]
    labels = [f"<{UPPER_EDGES[0]}x"] + [f"{lo}-{hi}x" for lo, hi in zip(lows[1:-1], UPPER_EDGES[1:-1])] \
        + [f">{lows[-1]}x"]
    if report.anchor == "reference":
        anchor = "the eager reference"
    else:
        how = "measured" if report.anchor_measured else "forecast"
        anchor = f"{report.anchor} ({how} {report.anchor_speedup:.2f}x the reference)"
    print(f"{report.op} on {report.gpu_type}, surrogate {report.surrogate}; speedups against {anchor}; "
          f"best measured so far: "
          + (f"{report.best_measured:.2f}x" if report.best_measured else "none")
          + f"; a search's first generation measures up to {report.budget}")
    ops = ", ".join(report.fit_operations[:6]) + (f" and {len(report.fit_operations) - 6} more"
                                                  if len(report.fit_operations) > 6 else "")
    print(f"fit on: {report.fit_on} ({len(report.fit_operations)} operations on {report.gpu_type}: {ops or 'none'}; "
          f"prior scope {report.prior_scope}); corrected by "
          + (f"{report.corrected_by} measurements of {report.op} on {report.gpu_type} under {report.data_root}"
             if report.corrected_by else f"no measurement of {report.op} on {report.gpu_type} under "
                                         f"{report.data_root}")
          + " (another data root's measurements correct the forecasts differently)")
    for k in report.kernels:
        print(f"{k.file}  [{k.candidate_id}]  -> {k.decision}")
        if k.reason:
            print(f"  cannot run: {k.reason}: {k.detail}")
            continue
        spread = "" if k.log_speedup_sigma != k.log_speedup_sigma else f", log-spread {k.log_speedup_sigma:.2f}"
        print(f"  fails: {_percent(k.failure_probability)}; expected speedup {k.expected_speedup:.2f}x "
              f"({k.expected_speedup_vs_reference:.2f}x the reference); how sure: {_percent(k.confidence)} in "
              f"its likeliest bin{spread}")
        print(f"  bins against the {k.bins_against}: "
              + ", ".join(f"{label} {100 * p:.0f}%" for label, p in zip(labels, k.probabilities) if p >= 0.005))
        if k.why:
            print(f"  why: {k.why}")
    return 0


def register(sub) -> None:
    """Add ``evaluate``, ``train`` and ``forecast`` to the CLI's subparsers."""
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

    sp = sub.add_parser("forecast", help="forecast kernel files as a search would: how likely each fails, how fast "
                                         "against an anchor, how sure, and whether a search would measure, trust "
                                         "or drop it")
    sp.add_argument("--op", required=True, help="the operation the kernels implement (built in, or imported)")
    sp.add_argument("files", nargs="+", metavar="FILE", help="kernel files (launch(...) or, for an imported "
                                                           "task, its submission)")
    sp.add_argument("--anchor", default=None, help="what speedups are against: a candidate id measured under "
                                                   "--data, or a kernel file (default: the eager reference)")
    sp.add_argument("--gpu-type", default="h100", help="GPU type to forecast for (default: %(default)s)")
    sp.add_argument("--surrogate", default="learned", help="learned (default), source, lmhead, physics, labels, roofline "
                                                            "or random")
    sp.add_argument("--surrogate-folder", default=None, help="--surrogate lmhead: the folder its training wrote "
                                                            "(python -m kernelcast.surrogate.lmhead train --out DIR)")
    sp.add_argument("--prior-data", default=None, help="measurements the surrogate is fit on (default: the "
                                                       "committed pool)")
    sp.add_argument("--prior-scope", default="other-ops", help="what the prior sees of the op: other-ops (nothing, "
                    "default), other-gpus, all")
    sp.add_argument("--json", action="store_true", help="print the report as JSON")
    add_data_args(sp)
    sp.set_defaults(func=cmd_forecast)
