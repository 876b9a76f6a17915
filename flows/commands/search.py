"""``kernelcast search | backfill | serve``: the Prefect flows that spend GPU time, and their deployments.

A search's settings are the fields of ``kernelcast.tasks.config.SearchConfig``: a YAML file first, then
the flags that were given; checked once, before Prefect or any GPU starts.
"""

from __future__ import annotations

import os

from kernelcast.flows.commands.common import (UsageError, add_data_args, check_data_root, parse_storage_options,
                                    prefect_defaults)

# Search flags -> SearchConfig fields; a flag left out keeps the YAML file's value or the default.
_SEARCH_FLAGS = {
    "op": (str, "operation to search"), "gpu_type": (str, "GPU type to measure on (default: this GPU, or h100 "
                                                          "when replaying without one)"),
    "budget": (float, "the whole search's budget in --budget-kind's units (default 32 measurements)"),
    "budget_kind": (str, "what --budget counts: measurements (default), gpu_seconds, or gpu_compile_seconds (GPU "
                         "plus compile seconds charged)"),
    "generations": (int, "generations (default 4)"), "children": (int, "children per generation (default 256)"),
    "generator": (str, "template; llm (a model picks template variants; template ones fill up); freeform (a "
                       "model rewrites the parent's whole source); replay (a measured corpus's recorded "
                       "children answer for the model); variants (KernelBench tasks: torch.compile, CUDA graph, "
                       "channels_last, cuDNN-autotuned runs of the reference and measured parents); or "
                       "llm+variants, freeform+variants, replay+variants"),
    "replay_corpus": (str, "generator replay: the corpus whose recorded children answer (default: the packaged "
                           "data/pools/llm); the replay backend then answers from its measurements"),
    "generator_url": (str, "OpenAI-compatible endpoint (generator llm)"),
    "generator_model": (str, "model name at that endpoint (generator llm)"),
    "generator_temperature": (float, "sampling temperature of the generator's model (default 0.8)"),
    "generator_model_sha256": (str, "SHA-256 of the generator model's weights, recorded with each child"),
    "generator_concurrency": (int, "requests to the generator's model in flight at once (default 4; a batching "
                                   "server such as vLLM or the GPU engine answers many together)"),
    "generator_max_tokens": (int, "most tokens of one rewritten source (generator freeform; default 2048)"),
    "generator_roots": (str, "generators freeform and variants: a measured pool whose best, median and poor "
                             "kernels of the op (template variants, or those imported with the task, as CUDA-L1's "
                             "in data/pools/cudal1/kernelcast) every search measures first, then rewrites or runs "
                             "another way (default: it starts from the eager reference)"),
    "variants_recorded": (str, "generator variants: a data root whose recorded variant children (a live variants "
                               "search's) are offered rather than made anew, so a replay of it on that pool meets "
                               "the children, and ids, it measured"),
    "generator_children": (int, "children asked of the model per generation (generators llm, freeform, replay; "
                                "default 16)"), "surrogate": (str, "learned, source, lmhead, roofline, random, llm, or "
                                                             "none (the equal-budget baseline: every child measured)"),
    "surrogate_folder": (str, "surrogate lmhead: the folder `python -m kernelcast.surrogate.lmhead train --out DIR` wrote"),
    "policy": (str, "budget (confidence threshold) or conformal (certified risk)"),
    "trust_threshold": (float, "max-probability at which a forecast is trusted (policy budget)"),
    "target_risk": (float, "risk of trusting a forecast off by more than one bin (policy conformal)"),
    "acquisition": (str, "how unsure children are chosen: thompson (a draw from each forecast, default), ei "
                         "(expected improvement) or ei-per-second (expected improvement over the GPU plus compile "
                         "seconds the run's children of the same origin have cost)"),
    "precision": (str, "tolerance (default: a correct kernel computed in a lower precision class than the "
                       "reference's counts, flagged) or strict (it counts as incorrect, measured now or reused)"),
    "gpu_seconds_budget": (float, "also stop once this many GPU-seconds are charged (checked after each wave "
                                  "of measurements)"),
    "measure_wave": (int, "with a budget in seconds: measurements between two checks of it (default 8)"),
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


def read_config(path: str | None) -> dict:
    """The search settings of a ``--config`` YAML file ({} without one); a bad file is one line."""
    if not path:
        return {}
    import yaml

    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except OSError as exc:
        raise UsageError(f"cannot read --config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:  # one line: where the file stops being YAML, and why
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"--config {path} is not valid YAML{where}: {problem}") from None
    if not isinstance(values, dict):
        raise UsageError(f"--config {path} must hold a mapping of search settings")
    return values


def search_config(args):
    """The SearchConfig of ``kernelcast search``: YAML file first, then flags that were given."""
    from kernelcast.tasks.config import SearchConfig

    values = read_config(args.config)
    for name in _SEARCH_FLAGS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    values["data"] = args.data
    if isinstance(values.get("budget"), float) and values["budget"].is_integer() \
            and values.get("budget_kind", "measurements") == "measurements":
        values["budget"] = int(values["budget"])  # a count of measurements, given as --budget 32
    options = parse_storage_options(args.storage_option)
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


def cmd_search(args) -> int:
    from kernelcast.tasks.config import validate

    # Bad input fails here, before Prefect, MLflow or a GPU starts: every setting, then the operation
    # (its registry, which loads torch, is the one heavy thing loaded), then the data root's protocol.
    given = search_config(args)
    resumed = bool(given.run_id)  # a run id of the user's: resumed only with its own settings
    config = validate(given)  # the command's one validation
    check_data_root(config.data, dict(config.storage_options))
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.search import check_resume
    from kernelcast.tasks.setup import settle

    config = settle(config)  # backend and GPU type 'auto' settled against this machine, not validated again
    if resumed:  # a new run id has no run to resume: the data root is left for the flow to open
        check_resume(DataRoot(config.data, storage_options=dict(config.storage_options)), config)
    prefect_defaults()
    from kernelcast.flows.search import kernel_search
    from kernelcast.tasks.report import summary_lines
    from kernelcast.tasks.search import SearchResult
    fields = {f: getattr(config, f) for f in ("op", "gpu_type", "budget", "budget_kind", "generations", "children",
                                              "generator",
                                              "surrogate", "policy", "seed", "run_id", "data", "backend",
                                              "tracking_uri")}
    options = {k: v for k, v in config.__dict__.items() if k not in fields}
    out = kernel_search(**fields, options=options)
    gens = out.pop("generations")
    from kernelcast.kernels.records import GenerationSummary

    result = SearchResult(**{**{k: out[k] for k in SearchResult.__dataclass_fields__ if k != "generations"},
                             "generations": tuple(GenerationSummary(**g) for g in gens)})
    print("\n".join(summary_lines(result, out["data"], out["tracking_uri"], _prefect_where())))
    return 0


def cmd_backfill(args) -> int:
    from kernelcast.tasks.backfill import backfill_ops

    options = {"storage_options": parse_storage_options(args.storage_option)}
    backfill_ops(args.source, args.target, args.op, args.limit)  # bad input fails here, before Prefect starts
    check_data_root(args.data, options["storage_options"])
    prefect_defaults()
    from kernelcast.flows.search import backfill

    if args.replay_pool:
        options["replay_pool"] = args.replay_pool
    if args.ray_address:
        options["ray_address"] = args.ray_address
    out = backfill(args.source, args.target, op=args.op, data=args.data, backend=args.backend,
                   limit=args.limit, only_ok=not args.all_statuses, options=options)
    print(", ".join(f"{k} {v}" for k, v in out.items()))
    return 0


def cmd_serve(args) -> int:
    check_data_root(args.data, parse_storage_options(args.storage_option))  # now, not in the first scheduled run
    from prefect.client.schemas.schedules import CronSchedule

    for flag, cron in (("--cron", args.cron), ("--backfill-cron", args.backfill_cron)):
        if cron:
            try:
                CronSchedule(cron=cron)  # a malformed schedule fails here, before the deployments are built
            except ValueError as exc:  # pydantic's ValidationError: its first error's message, without its prefix
                errors = exc.errors() if hasattr(exc, "errors") else [{"msg": str(exc)}]
                why = errors[0]["msg"].removeprefix("Value error, ") if errors else str(exc)
                raise UsageError(f"{flag} {cron!r} is not a cron schedule: {why}") from None
    from kernelcast.flows.deployments import NIGHTLY_OPS, nightly_parameters, serve
    from kernelcast.tasks.config import SearchConfig, validate

    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip()) if args.ops else NIGHTLY_OPS
    settings = read_config(args.config)
    for op in ops:  # every nightly search's settings checked once, now, rather than at 02:00
        params = nightly_parameters(op, args.data, settings)
        validate(SearchConfig.from_mapping({**{k: v for k, v in params.items() if k != "options"},
                                            **params.get("options", {})}))
    prefect_defaults()
    from kernelcast.flows.server import ServerError, scheduling_server

    try:
        server = scheduling_server(port=args.port)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    os.environ["PREFECT_API_URL"] = server.api_url  # for the runs, each a subprocess of the runner
    started = f"a local server started here (log: {server.log_path})" if server.process else "the configured server"
    print(f"Prefect UI: {server.ui_url} ({started}; its scheduler turns the schedules into runs)", flush=True)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            serve(data=args.data, cron=args.cron, ops=ops, settings=settings, backfill_cron=args.backfill_cron,
                  backfill_backend=args.backfill_backend)
    finally:
        server.stop()
    return 0


def register(sub) -> None:
    """Add ``search``, ``backfill`` and ``serve`` to the CLI's subparsers."""
    sp = sub.add_parser("search", help="run a surrogate-filtered kernel search (a Prefect flow)")
    sp.add_argument("--config", default=None, help="YAML file of search settings; flags override it")
    for name, (kind, text) in _SEARCH_FLAGS.items():
        sp.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, help=text)
    add_data_args(sp)
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
    add_data_args(sp)
    sp.set_defaults(func=cmd_backfill)

    sp = sub.add_parser("serve", help="serve the deployments (nightly search, backfill, evaluate, train) against "
                                      "PREFECT_API_URL's server, or a local one with its scheduler and UI")
    sp.add_argument("--cron", default="0 2 * * *", help="nightly search schedule, UTC (default: %(default)s)")
    sp.add_argument("--ops", default=None, help="operations searched nightly, comma-separated (default: "
                                                "softmax,layernorm,rmsnorm,cross_entropy,fp8_quant,bias_gelu,"
                                                "matmul,attention)")
    sp.add_argument("--config", default=None, help="YAML file of the nightly searches' settings (SearchConfig "
                                                   "fields: budget, surrogate, backend, ...)")
    sp.add_argument("--backfill-cron", default=None, help="schedule of the backfill deployment (default: on demand)")
    sp.add_argument("--backfill-backend", choices=["local", "replay", "ray"], default="ray",
                    help="how the backfill deployment measures (default: %(default)s)")
    sp.add_argument("--port", type=int, default=4200, help="port of the local Prefect server started when "
                                                           "PREFECT_API_URL is unset (default: %(default)s)")
    add_data_args(sp)
    sp.set_defaults(func=cmd_serve)
