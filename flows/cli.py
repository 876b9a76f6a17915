"""The ``kernelcast`` command line: list operations, measure template spaces, show the best kernels.

Configuration is read here, at the edge, validated once, and passed down as values.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from collections import Counter

DEFAULT_DATA = "kernelcast-data"


class UsageError(Exception):
    """Bad input from the command line; printed as one clear line, exit status 2."""


def _parse_storage_options(pairs: list[str]) -> dict:
    options: dict = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"--storage-option takes KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        if key == "endpoint_url":
            options.setdefault("client_kwargs", {})["endpoint_url"] = value
        else:
            options[key] = value
    return options


def _data_root(args):
    from storage.dataset import DataRoot

    return DataRoot(args.data, storage_options=_parse_storage_options(args.storage_option))


def cmd_ops(args) -> int:
    from kernels.ops import OPERATIONS
    from kernels.spaces import get_space

    print(f"{'operation':<14} {'bound':<8} {'variants':>8}  algorithms / cases")
    for name, op in OPERATIONS.items():
        space = get_space(name)
        algos = Counter(c.template.split("/", 1)[1] for c in space.variants())
        print(f"{name:<14} {op.bound:<8} {sum(algos.values()):>8}  "
              + ", ".join(f"{a} ({n})" for a, n in algos.items()))
        print(f"{'':<33}cases: " + ", ".join(c.name for c in op.cases))
        print(f"{'':<33}{op.summary}")
    return 0


def _resolve_ops(spec: str) -> list[str]:
    from kernels.ops import OPERATIONS, get_operation

    names = list(OPERATIONS) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise UsageError("--op names no operation")
    for name in names:
        try:
            get_operation(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return names


def _resolve_mode(requested: str):
    """The measurement mode and hardware spec; says so when there is no GPU."""
    import torch

    from kernels.hardware import detect

    if requested == "gpu" and not torch.cuda.is_available():
        raise UsageError("--mode gpu, but no CUDA GPU is visible")
    mode = requested if requested != "auto" else ("gpu" if torch.cuda.is_available() else "interpreter")
    if mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
        print("no GPU in use: checking correctness only, with Triton's CPU interpreter on small cases; "
              "no timings are recorded", file=sys.stderr)
        from kernels.hardware import INTERPRETER
        from kernels.records import HardwareSpec
        import triton

        return mode, HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter",
                                  torch_version=torch.__version__, triton_version=triton.__version__)
    return mode, detect()


def cmd_measure(args) -> int:
    from tqdm import tqdm

    from kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernels.ops import get_operation
    from kernels.spaces import get_space

    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit must be zero or more, got {args.limit}")
    ops = _resolve_ops(args.op)
    root = _data_root(args)
    mode, hw = _resolve_mode(args.mode)
    config = WorkerConfig(mode=mode, concurrency=args.concurrency or max(1, (os.cpu_count() or 2) - 1),
                          timeout_s=args.timeout, gpu_timeout_s=args.gpu_timeout,
                          seeds=args.seeds if args.seeds else (3 if mode == "gpu" else 1))
    plan = []
    for name in ops:
        todo = get_operation(name).seed_candidates() + get_space(name).spread_subset(args.limit)
        done = set() if args.remeasure else root.measured_ids(name, hw.gpu_type)
        plan += [c for c in todo if c.candidate_id not in done]
    print(f"measuring {len(plan)} candidates of {', '.join(ops)} on {hw.device_name} ({hw.gpu_type}), "
          f"mode {mode}, data root {args.data}", file=sys.stderr)
    if not plan:
        print("nothing to measure: every candidate is already measured here (use --remeasure)", file=sys.stderr)
        return 0
    root.write_candidates(plan)

    deadline = time.monotonic() + args.max_minutes * 60 if args.max_minutes else math.inf
    statuses: Counter = Counter()
    buffer, written, t0, last_flush = [], 0, time.monotonic(), time.monotonic()
    best: dict[str, float] = {}

    def flush():
        nonlocal buffer, written, last_flush
        if buffer:
            written += root.write_measurements(buffer)
            buffer, last_flush = [], time.monotonic()

    def on_term(signum, frame):  # `timeout` and schedulers send SIGTERM: keep what is measured
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    worker = MeasureWorker(hw, config)
    bar = tqdm(total=len(plan), unit="cand", file=sys.stderr, dynamic_ncols=True)
    stopped = ""
    try:
        for m in worker.measure(plan):
            buffer.append(m)
            statuses[m.status] += 1
            if m.speedup:
                best[m.op] = max(best.get(m.op, 0.0), m.speedup)
            bar.update(1)
            bar.set_postfix({k: v for k, v in statuses.most_common()}, refresh=False)
            if len(buffer) >= 25 or time.monotonic() - last_flush > 30:
                flush()
            if time.monotonic() > deadline:
                stopped = f"stopped after --max-minutes {args.max_minutes}; rerun to continue"
                break
    except KeyboardInterrupt:
        stopped = "interrupted; rerun to continue where it stopped"
    finally:
        bar.close()
        flush()
        worker.close()
        signal.signal(signal.SIGTERM, previous)
    elapsed = time.monotonic() - t0
    n = sum(statuses.values())
    print(f"measured {n} candidates in {elapsed:.1f} s ({written} new rows written): "
          + ", ".join(f"{k} {v}" for k, v in statuses.most_common()))
    if mode == "gpu" and elapsed > 0:
        print(f"throughput {n / (elapsed / 60):.1f} candidates per GPU-minute; GPU busy "
              f"{100 * worker.busy_gpu_seconds / elapsed:.0f}% of wall time")
        for op_name, s in sorted(best.items()):
            print(f"  best speedup over eager PyTorch, {op_name}: {s:.2f}x")
    else:
        print("correctness only (interpreter): no runtimes recorded")
    if stopped:
        print(stopped, file=sys.stderr)
        return 130
    return 0


def cmd_show(args) -> int:
    from flows.report import best_table

    root = _data_root(args)
    table = best_table(root, op=args.op)
    if table.empty:
        print(f"no measurements under {args.data}")
        return 0
    print(table.to_string(index=False))
    return 0


def cmd_evaluate(args) -> int:
    import pandas as pd

    from surrogate.dataset import case_pairs
    from surrogate.evaluate import evaluate
    from surrogate.registry import get_forecaster_factory

    from surrogate.calibration import CALIBRATORS

    factory = get_forecaster_factory(args.surrogate)  # an unknown name fails before any work
    if args.calibrator not in CALIBRATORS:
        raise UsageError(f"unknown --calibrator {args.calibrator!r}; known: {', '.join(CALIBRATORS)}")
    pairs = case_pairs(_data_root(args), gpu_type=args.gpu_type)
    if pairs.empty:
        raise UsageError(f"no measured pairs under {args.data}")
    table = evaluate(factory, pairs, how=args.split, out_dir=args.out, name=args.surrogate,
                     tracking_uri=args.tracking_uri, calibrator=args.calibrator, recentre=args.recentre)
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(table.round(3).to_string(index=False))
    print(f"table and plots written under {args.out}")
    return 0


def cmd_compact(args) -> int:
    root = _data_root(args)
    for table in ("candidates", "measurements"):
        root.compact(table)
    print(f"compacted {args.data}")
    return 0


def cmd_import(args) -> int:
    from kernels.formats import TaskFormatError, import_task

    options: dict = {}
    if args.rtol is not None or args.atol is not None:
        if args.rtol is None or args.atol is None:
            raise UsageError("give both --rtol and --atol, or neither")
        options["tolerance"] = {"rtol": args.rtol, "atol": args.atol}
    if args.format == "kernelbench":
        if args.specs:
            raise UsageError("--specs is for GPU MODE tasks; a KernelBench problem's sizes are in its file")
        options["interpret_sizes"] = args.interpret_case or []
    else:
        if args.interpret_case:
            raise UsageError("--interpret-case is for KernelBench problems; a GPU MODE task's tests are its "
                             "interpreter cases")
        options["specs"] = args.specs
    root = _data_root(args)
    try:
        op, candidates = import_task(args.format, args.reference, args.candidate or [], name=args.name,
                                     root=root, **options)
    except TaskFormatError as exc:
        raise UsageError(str(exc)) from None
    root.write_candidates(op.seed_candidates() + candidates)
    print(f"imported {op.name}: {op.summary}")
    print(f"  cases: {', '.join(c.name for c in op.cases)}; interpreter cases: "
          f"{', '.join(c.name for c in op.interpret_cases)}")
    for c in op.seed_candidates() + candidates:
        print(f"  candidate {c.candidate_id} ({c.origin}, {c.backend})")
    print(f"stored under {args.data}/tasks/{op.name}; search it with: kernelcast search --op {op.name} "
          f"--generator llm --generator-url URL --generator-model MODEL --data {args.data}")
    return 0


# Search flags -> SearchConfig fields; a flag left out keeps the YAML file's value or the default.
_SEARCH_FLAGS = {
    "op": (str, "operation to search"), "gpu_type": (str, "GPU type to measure on (default: this GPU, or h100 "
                                                          "when replaying without one)"),
    "budget": (int, "measurements charged over the whole search (default 32)"),
    "generations": (int, "generations (default 4)"), "children": (int, "children per generation (default 256)"),
    "generator": (str, "template, or llm (a model proposes children; template ones fill up)"),
    "generator_url": (str, "OpenAI-compatible endpoint (generator llm)"),
    "generator_model": (str, "model name at that endpoint (generator llm)"),
    "generator_children": (int, "children asked of the model per generation (generator llm, default 16)"), "surrogate": (str, "learned, roofline, random, llm, or none (the "
                                                             "equal-budget baseline: every child measured)"),
    "policy": (str, "budget (confidence threshold) or conformal (certified risk)"),
    "trust_threshold": (float, "max-probability at which a forecast is trusted (policy budget)"),
    "target_risk": (float, "risk of trusting a forecast off by more than one bin (policy conformal)"),
    "acquisition": (str, "how unsure children are chosen: thompson (a draw from each forecast, default) or ei "
                         "(expected improvement)"),
    "gpu_seconds_budget": (float, "also stop once this many GPU-seconds are charged"),
    "seed": (int, "random seed"), "run_id": (str, "run id; rerun the same id to resume"),
    "backend": (str, "auto, local, replay or ray"), "replay_pool": (str, "measured pool the replay backend answers from"),
    "prior_data": (str, "measurements the learned surrogate's prior is fit on"),
    "prior_scope": (str, "what the prior saw of the searched op: other-ops (nothing, default), other-gpus (its "
                         "measurements on other GPU types), all"),
    "storage_retry_s": (float, "seconds a storage outage is retried before the search fails (default 120)"),
    "tracking_uri": (str, "MLflow tracking URI (default: sqlite under a local data root)"),
    "experiment": (str, "MLflow experiment"), "llm_url": (str, "OpenAI-compatible endpoint (surrogate llm)"),
    "llm_model": (str, "model name at that endpoint"), "ray_address": (str, "Ray cluster address (backend ray)"),
}


def search_config(args):
    """The SearchConfig of ``kernelcast search``: YAML file first, then flags that were given."""
    from tasks.config import SearchConfig

    values: dict = {}
    if args.config:
        import yaml

        try:
            with open(args.config) as f:
                values = yaml.safe_load(f) or {}
        except OSError as exc:
            raise UsageError(f"cannot read --config {args.config}: {exc.strerror}") from None
        if not isinstance(values, dict):
            raise UsageError(f"--config {args.config} must hold a mapping of search settings")
    for name in _SEARCH_FLAGS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    values["data"] = args.data
    options = _parse_storage_options(args.storage_option)
    if options:
        values["storage_options"] = options
    return SearchConfig.from_mapping(values)


def _prefect_where() -> str:
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if api:
        return f"UI at {api.removesuffix('/api')} (flow 'kernel-search')"
    return ("runs are in Prefect's local database; `prefect server start`, then open "
            "http://127.0.0.1:4200 to browse them")


def _prefect_defaults() -> None:
    """Without a Prefect server configured, flows run against a temporary local one; on a busy
    two-core machine it can take longer to start than Prefect's default 20 s."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def cmd_search(args) -> int:
    _prefect_defaults()
    from flows.search import kernel_search
    from tasks.report import summary_lines
    from tasks.search import SearchResult
    from tasks.setup import resolve

    config = resolve(search_config(args))  # bad input fails here, before Prefect or any GPU
    fields = {f: getattr(config, f) for f in ("op", "gpu_type", "budget", "generations", "children", "generator",
                                              "surrogate", "policy", "seed", "run_id", "data", "backend",
                                              "tracking_uri")}
    options = {k: v for k, v in config.__dict__.items() if k not in fields}
    out = kernel_search(**fields, options=options)
    gens = out.pop("generations")
    from kernels.records import GenerationSummary

    result = SearchResult(**{**{k: out[k] for k in SearchResult.__dataclass_fields__ if k != "generations"},
                             "generations": tuple(GenerationSummary(**g) for g in gens)})
    print("\n".join(summary_lines(result, out["data"], out["tracking_uri"], _prefect_where())))
    return 0


def cmd_backfill(args) -> int:
    _prefect_defaults()
    from flows.search import backfill

    options = {"storage_options": _parse_storage_options(args.storage_option)}
    if args.replay_pool:
        options["replay_pool"] = args.replay_pool
    if args.ray_address:
        options["ray_address"] = args.ray_address
    out = backfill(args.source, args.target, op=args.op, data=args.data, backend=args.backend,
                   limit=args.limit, only_ok=not args.all_statuses, options=options)
    print(", ".join(f"{k} {v}" for k, v in out.items()))
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


def cmd_train(args) -> int:
    _prefect_defaults()
    from flows.search import train_surrogate

    if args.surrogate == "llm-grpo":
        options = _grpo_options(args)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # One process per GPU (accelerate launch, torchrun): the ranks train together, so no rank
            # may run a flow of its own; they call the same core the flow's tasks call.
            import dataclasses

            from surrogate.grpo import GRPOSettings, train_grpo
            from tasks.setup import grpo_pairs

            settings = GRPOSettings(**options)
            run = dataclasses.asdict(train_grpo(grpo_pairs(args.prior_data or "", args.pairs or "", args.gpu_type,
                                                           settings.seed), settings))
            if not run["before"]:  # not the main process: the main one evaluates and prints
                return 0
        else:
            run = train_surrogate(surrogate="llm-grpo", prior_data=args.prior_data or "", data=args.data,
                                  pairs=args.pairs or "", gpu_type=args.gpu_type, grpo=options)
        keys = ("bin_accuracy", "spearman", "kendall", "ece", "brier", "crps", "parse_rate")
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
    from tasks.config import PRIOR_SCOPES, ConfigError

    if args.prior_scope not in PRIOR_SCOPES:  # before Prefect starts anything
        raise UsageError(f"unknown prior_scope {args.prior_scope!r}; known: {', '.join(PRIOR_SCOPES)}")
    try:
        fitted = train_surrogate(surrogate=args.surrogate, prior_data=args.prior_data or "", data=args.data,
                                 ops=args.op, gpu_type=args.gpu_type, prior_scope=args.prior_scope)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(f"fitted the {args.surrogate} prior ({args.prior_scope}) for each of: {', '.join(fitted)}; "
          f"stored under {args.data}/models")
    return 0


def cmd_pairs(args) -> int:
    import pandas as pd

    from surrogate.pairs import PairSettings, build_pairs, write_pairs

    eval_ops = tuple(o.strip() for o in args.eval_ops.split(",") if o.strip()) if args.eval_ops else ()
    settings = PairSettings(per_op=args.per_op, parent_fraction=args.parent_fraction, eval_ops=eval_ops,
                            n_eval_ops=args.n_eval_ops, gpu_type=args.gpu_type, seed=args.seed)
    pairs = build_pairs(_data_root(args), settings)
    write_pairs(pairs, args.out)
    with pd.option_context("display.width", 200):
        print(pairs.groupby(["split", "anchor_kind", "true_bin"]).size().unstack(fill_value=0).to_string())
    held = sorted(pairs.loc[pairs["split"] == "eval", "op"].unique())
    print(f"{len(pairs)} pairs written to {args.out}; held out for evaluation: {', '.join(held)}")
    return 0


def cmd_serve(args) -> int:
    _prefect_defaults()
    from flows.deployments import serve

    serve(data=args.data, cron=args.cron)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelcast", description="Find fast GPU kernels with few GPU measurements.")
    sub = p.add_subparsers(dest="command", required=True)

    def data_args(sp):
        sp.add_argument("--data", default=os.environ.get("KERNELCAST_DATA", DEFAULT_DATA),
                        help="data root: a local folder or s3://bucket/prefix (default: %(default)s)")
        sp.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                        help="fsspec storage option, e.g. endpoint_url=http://127.0.0.1:9000")

    sp = sub.add_parser("ops", help="list operations and their template spaces")
    sp.set_defaults(func=cmd_ops)

    sp = sub.add_parser("measure", help="measure template variants of operations")
    sp.add_argument("--op", required=True, help="operation name, comma-separated names, or 'all'")
    sp.add_argument("--limit", type=int, default=None, help="measure N variants spread over the space")
    sp.add_argument("--mode", choices=["auto", "gpu", "interpreter"], default="auto")
    sp.add_argument("--concurrency", type=int, default=0, help="children compiling at once (default: cores - 1)")
    sp.add_argument("--timeout", type=float, default=300.0, help="seconds a candidate may take in all")
    sp.add_argument("--gpu-timeout", type=float, default=60.0, help="seconds a candidate may hold the GPU")
    sp.add_argument("--seeds", type=int, default=0, help="seeded correctness inputs per case (default 3 GPU, 1 CPU)")
    sp.add_argument("--remeasure", action="store_true", help="measure again what is already measured here")
    sp.add_argument("--max-minutes", type=float, default=0, help="stop (keeping results) after this long")
    data_args(sp)
    sp.set_defaults(func=cmd_measure)

    sp = sub.add_parser("show", help="best measured variant per operation and GPU type")
    sp.add_argument("--op", default=None)
    data_args(sp)
    sp.set_defaults(func=cmd_show)

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
    data_args(sp)
    sp.set_defaults(func=cmd_evaluate)

    sp = sub.add_parser("search", help="run a surrogate-filtered kernel search (a Prefect flow)")
    sp.add_argument("--config", default=None, help="YAML file of search settings; flags override it")
    for name, (kind, text) in _SEARCH_FLAGS.items():
        sp.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, help=text)
    data_args(sp)
    sp.set_defaults(func=cmd_search)

    sp = sub.add_parser("backfill", help="measure on one GPU type what was measured on another")
    sp.add_argument("--from", dest="source", required=True, help="GPU type the candidates were measured on")
    sp.add_argument("--to", dest="target", required=True, help="GPU type to measure them on")
    sp.add_argument("--op", default="all")
    sp.add_argument("--backend", choices=["local", "replay", "ray"], default="local")
    sp.add_argument("--replay-pool", default=None)
    sp.add_argument("--ray-address", default=None)
    sp.add_argument("--limit", type=int, default=0)
    sp.add_argument("--all-statuses", action="store_true", help="also candidates that failed on the source type")
    data_args(sp)
    sp.set_defaults(func=cmd_backfill)

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
    data_args(sp)
    sp.set_defaults(func=cmd_train)

    sp = sub.add_parser("pairs", help="draw (anchor, candidate, true bin) pairs from measurements, as Parquet")
    sp.add_argument("--out", required=True, help="Parquet file to write (local path or URL)")
    sp.add_argument("--gpu-type", default=None, help="only this GPU type's measurements (default: all)")
    sp.add_argument("--per-op", type=int, default=256, help="pairs per operation (default: %(default)s)")
    sp.add_argument("--parent-fraction", type=float, default=0.5,
                    help="share of pairs anchored at a measured parent, not the reference (default: %(default)s)")
    sp.add_argument("--eval-ops", default=None, help="comma-separated operations held out for evaluation")
    sp.add_argument("--n-eval-ops", type=int, default=2, help="without --eval-ops, hold out this many at random")
    sp.add_argument("--seed", type=int, default=0)
    data_args(sp)
    sp.set_defaults(func=cmd_pairs)

    sp = sub.add_parser("serve", help="serve the deployments (nightly search, backfill, evaluate, train)")
    sp.add_argument("--cron", default="0 2 * * *", help="nightly search schedule (default: %(default)s)")
    data_args(sp)
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("import", help="import a KernelBench problem or GPU MODE task as an operation")
    sp.add_argument("--format", required=True, choices=["kernelbench", "gpumode"])
    sp.add_argument("--reference", required=True, help="the problem file (Model, get_inputs, get_init_inputs) "
                                                      "or GPU MODE reference (ref_kernel, generate_input, "
                                                      "check_implementation)")
    sp.add_argument("--candidate", action="append", help="a candidate file (ModelNew or custom_kernel); repeatable")
    sp.add_argument("--name", default=None, help="task name (default: from the file name); the op is "
                                                 "kb.NAME or gpumode.NAME")
    sp.add_argument("--specs", default=None, help="GPU MODE test specs (task.yml; default: beside the reference)")
    sp.add_argument("--interpret-case", action="append", metavar="NAME=INT,...",
                    help="KernelBench sizes for Triton's CPU interpreter, e.g. batch_size=2,dim=64; repeatable")
    sp.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: the format's)")
    sp.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: the format's)")
    data_args(sp)
    sp.set_defaults(func=cmd_import)

    sp = sub.add_parser("compact", help="merge each partition's Parquet files into one")
    data_args(sp)
    sp.set_defaults(func=cmd_compact)

    from flows.commands import model as model_cmd
    model_cmd.register(sub)
    from flows.commands import report as report_cmd
    report_cmd.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ValueError, OSError, RuntimeError) as exc:  # storage and tracking errors are OSErrors naming the URI
        print(f"kernelcast {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
