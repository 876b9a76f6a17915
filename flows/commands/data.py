"""``kernelcast ops | measure | sweep | show | import | compact | dedup | pairs``: the operations and the measured data.

``measure`` times template variants, or the candidates stored for an imported task (or checks them
on Triton's CPU interpreter), into the data root; ``sweep`` imports and measures every public task
under a folder (``kernelcast.kernels.harness.sweep``); ``show`` prints the best measured ones; ``import`` turns
a KernelBench problem or GPU MODE task into an operation; ``compact`` merges Parquet files;
``dedup`` stores every source under a tree of data roots once (``kernelcast.storage.dedup``);
``pairs`` draws surrogate training pairs.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections import Counter

from kernelcast.flows.commands.common import UsageError, add_data_args, check_data_root, data_root, parse_storage_options


def cmd_ops(args) -> int:
    from kernelcast.kernels.ops import OPERATIONS
    from kernelcast.kernels.spaces import get_space

    print(f"{'operation':<14} {'bound':<8} {'variants':>8}  algorithms / cases")
    for name, op in OPERATIONS.items():
        space = get_space(name)
        algos = Counter(c.template.split("/", 1)[1] for c in space.variants())
        print(f"{name:<14} {op.bound:<8} {sum(algos.values()):>8}  "
              + ", ".join(f"{a} ({n})" for a, n in algos.items()))
        print(f"{'':<33}cases: " + ", ".join(c.name for c in op.cases))
        print(f"{'':<33}{op.summary}")
    return 0


def _resolve_ops(spec: str, root) -> list[str]:
    """The operations ``--op`` names: built in, imported on this machine, or imported under the data root
    (installed from there); 'all' is every built-in one."""
    if spec != "all" and not any(s.strip() for s in spec.split(",")):
        raise UsageError("--op names no operation")
    from kernelcast.kernels.formats import install_from_root, is_imported_name
    from kernelcast.kernels.ops import OPERATIONS, get_operation  # torch: checked after everything that needs nothing

    names = list(OPERATIONS) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        try:
            get_operation(name)
        except ValueError as exc:
            if not (is_imported_name(name) and install_from_root(root, name)):
                raise UsageError(str(exc)) from None
    return names


def _to_measure(root, name: str, limit: int | None) -> list:
    """The candidates ``measure`` takes of one operation: its reference, and either ``limit`` template variants
    spread over its space or, for an imported task (no template space), the candidates stored for it under the
    data root (imported with it, written by a search), the first ``limit`` of them."""
    from kernelcast.kernels.formats import is_imported_name
    from kernelcast.kernels.ops import get_operation

    seeds = get_operation(name).seed_candidates()
    if not is_imported_name(name):
        from kernelcast.kernels.spaces import get_space

        return seeds + get_space(name).spread_subset(limit)
    from kernelcast.storage.schema import candidates_from_frame

    stored = {c.candidate_id: c for c in candidates_from_frame(root.read_candidates(name))}
    for seed in seeds:
        stored.pop(seed.candidate_id, None)
    return seeds + list(stored.values())[:limit]


def _resolve_mode(requested: str):
    """The measurement mode and hardware spec; says so when there is no GPU."""
    import torch

    from kernelcast.kernels.hardware import detect

    if requested == "gpu" and not torch.cuda.is_available():
        raise UsageError("--mode gpu, but no CUDA GPU is visible")
    mode = requested if requested != "auto" else ("gpu" if torch.cuda.is_available() else "interpreter")
    if mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
        print("no GPU in use: checking correctness only, with Triton's CPU interpreter on small cases; "
              "no timings are recorded", file=sys.stderr)
        from kernelcast.kernels.hardware import INTERPRETER
        from kernelcast.kernels.records import HardwareSpec
        import triton

        return mode, HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter",
                                  torch_version=torch.__version__, triton_version=triton.__version__)
    return mode, detect()


def _check_one_protocol(root, ops: list[str], gpu_type: str, protocol: str, where: str) -> None:
    """A data root holds one timing protocol's measurements per GPU type (a candidate has one row per GPU type):
    measuring the same operations another way needs a root of its own; say so before anything runs."""
    for name in ops:
        table = root.read_measurements(name, gpu_type)
        if table.empty or "protocol" not in table:
            continue
        others = sorted(set(table["protocol"].fillna("kernelcast")) - {protocol})
        if others:
            raise UsageError(f"{where} already holds {name}'s measurements on {gpu_type} timed by the "
                             f"{', '.join(others)} protocol; measure with --timing {protocol} into another --data "
                             "root (one protocol a root), or keep --timing " + others[0])


def cmd_measure(args) -> int:
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit must be zero or more, got {args.limit}")
    if args.reference_processes < 1:
        raise UsageError(f"--reference-processes must be 1 or more, got {args.reference_processes}")
    root = data_root(args)
    ops = _resolve_ops(args.op, root)
    mode, hw = _resolve_mode(args.mode)
    from tqdm import tqdm

    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig

    config = WorkerConfig(mode=mode, concurrency=args.concurrency or max(1, (os.cpu_count() or 2) - 1),
                          timeout_s=args.timeout, gpu_timeout_s=args.gpu_timeout,
                          seeds=args.seeds if args.seeds else (3 if mode == "gpu" else 1), protocol=args.timing,
                          anchor=args.anchor, precision=args.precision, shared_checks=not args.checks_alone,
                          model_build=args.model_build, reference_processes=args.reference_processes)
    _check_one_protocol(root, ops, hw.gpu_type, args.timing, args.data)
    plan = []
    for name in ops:
        todo = _to_measure(root, name, args.limit)
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
    print(f"correctness checks beside other candidates' checks: {worker.stats.shared_checks} of "
          f"{worker.stats.children} children" + (" (--checks-alone)" if args.checks_alone else ""))
    if mode == "gpu" and elapsed > 0:
        print(f"throughput {n / (elapsed / 60):.1f} candidates per GPU-minute; GPU busy "
              f"{100 * worker.held_gpu_seconds / elapsed:.0f}% of wall time")
        for op_name, s in sorted(best.items()):
            print(f"  best speedup over eager PyTorch, {op_name}: {s:.2f}x")
    else:
        print("correctness only (interpreter): no runtimes recorded")
    if stopped:
        print(stopped, file=sys.stderr)
        return 130
    if n and not statuses["ok"]:  # a run that measured nothing usable says so, to the scheduler too
        print(f"kernelcast measure: no candidate was ok ({n} measured); the rows say why", file=sys.stderr)
        return 1
    return 0


def cmd_show(args) -> int:
    root = data_root(args)
    from kernelcast.flows.report import best_table

    table = best_table(root, op=args.op)
    if table.empty:
        print(f"no measurements under {args.data}")
        return 0
    print(table.to_string(index=False))
    return 0


def cmd_compact(args) -> int:
    root = data_root(args)
    for table in ("candidates", "measurements"):
        root.compact(table)
    print(f"compacted {args.data}")
    return 0


def cmd_dedup(args) -> int:
    check_data_root(args.tree, parse_storage_options(args.storage_option))
    from kernelcast.storage.dedup import store_once

    report = store_once(args.tree, parse_storage_options(args.storage_option), log=print)
    print(f"{args.tree}: {len(report.roots)} data roots share {args.tree}/sources ({report.contents} contents); "
          f"{report.task_folders} task folders and {report.candidate_files} candidates files rewritten")
    return 0


def cmd_import(args) -> int:
    from kernelcast.kernels.formats import TaskFormatError, import_task, save_to_root, task_files

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
    check_data_root(args.data, parse_storage_options(args.storage_option))
    try:
        op, candidates = import_task(args.format, args.reference, args.candidate or [], name=args.name, **options)
    except TaskFormatError as exc:
        raise UsageError(str(exc)) from None
    # Stored under the data root once its files have passed their checks: a task file that cannot be
    # read fails before the table layer (pandas, pyarrow) loads.
    root = data_root(args)
    save_to_root(root, op.name, task_files(op.name))
    if args.null:
        from kernelcast.kernels.null import null_candidate

        candidates = candidates + [null_candidate(op)]
    root.write_candidates(op.seed_candidates() + candidates)
    print(f"imported {op.name}: {op.summary}")
    print(f"  cases: {', '.join(c.name for c in op.cases)}; interpreter cases: "
          f"{', '.join(c.name for c in op.interpret_cases)}")
    if op.manifest.get("interpret_scaling"):
        from kernelcast.kernels.formats.kernelbench import scaling_text

        print(f"  interpreter case scaled down from the problem's sizes: {scaling_text(op.manifest['interpret_scaling'])}"
              "; --interpret-case NAME=INT,... to choose")
    for c in op.seed_candidates() + candidates:
        print(f"  candidate {c.candidate_id} ({c.origin}, {c.backend})")
    print(f"stored under {args.data}/tasks/{op.name}.json; search it with: kernelcast search --op {op.name} "
          f"--generator llm --generator-url URL --generator-model MODEL --data {args.data}")
    return 0


def _also_roots(args) -> list:
    """The data roots ``--also-data`` names, with ``--data``'s storage options."""
    from kernelcast.storage.dataset import DataRoot

    options = parse_storage_options(args.storage_option)
    return [DataRoot(uri, storage_options=options) for uri in args.also_data or []]


def cmd_pairs(args) -> int:
    only = ("max_failure_share",) if not args.corpus else ("per_op", "parent_fraction")
    given = [f"--{n.replace('_', '-')}" for n in only if getattr(args, n) is not None]
    if given:
        raise UsageError(f"{', '.join(given)}: only " + ("with --corpus" if not args.corpus else "without --corpus"))
    import pandas as pd

    from kernelcast.surrogate.pairs import CorpusSettings, PairSettings, build_pairs, corpus_pairs, write_pairs

    eval_ops = tuple(o.strip() for o in args.eval_ops.split(",") if o.strip()) if args.eval_ops else ()
    if args.corpus:
        share = CorpusSettings.max_failure_share if args.max_failure_share is None else args.max_failure_share
        settings = CorpusSettings(gpu_type=args.gpu_type or CorpusSettings.gpu_type, eval_ops=eval_ops,
                                  n_eval_ops=args.n_eval_ops, max_failure_share=share, seed=args.seed)
        pairs = corpus_pairs(data_root(args), settings, also=_also_roots(args))
        by = ["split", "op", "true_bin"]
    else:
        drawn = {k: getattr(args, k) for k in ("per_op", "parent_fraction") if getattr(args, k) is not None}
        settings = PairSettings(eval_ops=eval_ops, n_eval_ops=args.n_eval_ops, gpu_type=args.gpu_type,
                                seed=args.seed, **drawn)
        pairs = build_pairs(data_root(args), settings, also=_also_roots(args))
        by = ["split", "anchor_kind", "true_bin"]
    write_pairs(pairs, args.out)
    with pd.option_context("display.width", 200):
        print(pairs.groupby(by).size().unstack(fill_value=0).to_string())
    held = sorted(pairs.loc[pairs["split"] == "eval", "op"].unique())
    print(f"{len(pairs)} pairs written to {args.out}; held out for evaluation: {', '.join(held)}")
    return 0


def cmd_sweep(args) -> int:
    from kernelcast.kernels.harness.sweep import run

    return run(args.tasks, args)


def register(sub) -> None:
    """Add ``ops``, ``measure``, ``sweep``, ``show``, ``import``, ``compact``, ``dedup`` and ``pairs`` to the CLI's
    subparsers."""
    sp = sub.add_parser("ops", help="list operations and their template spaces")
    sp.set_defaults(func=cmd_ops)

    sp = sub.add_parser("measure", help="measure template variants of operations, or the candidates stored for an "
                                        "imported one")
    sp.add_argument("--op", required=True, help="operation name, comma-separated names, or 'all' (the built-in ones)")
    sp.add_argument("--limit", type=int, default=None, help="measure N variants spread over the space (an imported "
                                                           "operation: its first N stored candidates)")
    sp.add_argument("--mode", choices=["auto", "gpu", "interpreter"], default="auto")
    sp.add_argument("--concurrency", type=int, default=0, help="children compiling at once (default: cores - 1)")
    sp.add_argument("--timeout", type=float, default=300.0, help="seconds a candidate may take in all")
    sp.add_argument("--gpu-timeout", type=float, default=60.0, help="seconds a candidate may hold the GPU")
    sp.add_argument("--seeds", type=int, default=0, help="seeded correctness inputs per case (default 3 GPU, 1 CPU)")
    sp.add_argument("--remeasure", action="store_true", help="measure again what is already measured here")
    sp.add_argument("--max-minutes", type=float, default=0, help="stop (keeping results) after this long")
    sp.add_argument("--timing", choices=["kernelcast", "kernelbench", "gpumode"], default="kernelcast",
                    help="timing protocol: kernelcast's (default), or a format's own harness's, so that a published "
                         "figure compares like for like (docs/harness.md); one protocol a data root")
    sp.add_argument("--precision", choices=["tolerance", "strict"], default="tolerance",
                    help="a correct result whose error belongs to a lower precision class than the reference's "
                         "(fp16, bf16 or TF32 arithmetic for a float32 task) is ok and flagged (tolerance, the "
                         "format's own rule: default) or fails as incorrect (strict); a data root keeps a kernel's "
                         "first verdict, so judge kernels measured already in another --data root")
    sp.add_argument("--anchor", choices=["host-bound", "all", "off"], default="host-bound",
                    help="kernelcast's protocol: which cases are timed again beside the reference, so that drift of "
                         "the clocks and the host cancels: host-bound ones (default), all (about twice the timing), off")
    sp.add_argument("--checks-alone", action="store_true",
                    help="every candidate holds the GPU alone from its first allocation; by default a candidate's "
                         "correctness checks may run beside other candidates' checks (never beside a candidate being "
                         "timed), where its cases are small and its first calls do not autotune (docs/harness.md)")
    sp.add_argument("--reference-processes", type=int, default=3, metavar="N",
                    help="processes an operation's reference is measured in where its first finds a case host-bound "
                         "(a host-bound call's figure moves with the speed its process gets); its stored runtime is "
                         "the fastest process's and its row names every process's (default: %(default)s)")
    sp.add_argument("--model-build", choices=["auto", "host", "device"], default="auto",
                    help="where a KernelBench task's Model and ModelNew are built: auto (on the CPU and then moved, as "
                         "KernelBench's eval does; a model over 2 GiB of parameters on the GPU under kernelcast's "
                         "timing), host, or device (docs/measured/task_sweep/README.md, \"Models built on the host\")")
    add_data_args(sp)
    sp.set_defaults(func=cmd_measure)

    sp = sub.add_parser("sweep", help="import every KernelBench problem and GPU MODE task under a folder and measure "
                                      "each one's reference and null candidate (a GPU machine's health check; "
                                      "resumable)")
    sp.add_argument("tasks", metavar="TASKS_DIR", help="folder swept for KernelBench problems and GPU MODE tasks")
    from kernelcast.kernels.harness.sweep import add_arguments  # standard library only at import

    add_arguments(sp)
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("show", help="best measured variant per operation and GPU type")
    sp.add_argument("--op", default=None)
    add_data_args(sp)
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("pairs", help="draw (anchor, candidate, true bin) pairs from measurements, as Parquet "
                                      "or JSON lines")
    sp.add_argument("--out", required=True, help="file to write (local path or URL): JSON lines if it ends in "
                                                 ".jsonl, else Parquet")
    sp.add_argument("--corpus", action="store_true",
                    help="--data is an LLM corpus: each written child against the parent it was written from, "
                         "true bin 0 where it failed (default: template pairs of measured variants)")
    sp.add_argument("--max-failure-share", type=float, default=None,
                    help="--corpus: most share of failed children among the training pairs (default: 0.5; "
                         "held-out pairs keep the corpus's mix)")
    sp.add_argument("--gpu-type", default=None,
                    help="only this GPU type's measurements (default: all; with --corpus: h100)")
    sp.add_argument("--per-op", type=int, default=None, help="template pairs per operation (default: 256)")
    sp.add_argument("--parent-fraction", type=float, default=None,
                    help="share of template pairs anchored at a measured parent, not the reference (default: 0.5)")
    sp.add_argument("--eval-ops", default=None, help="comma-separated operations held out for evaluation")
    sp.add_argument("--n-eval-ops", type=int, default=2, help="without --eval-ops, hold out this many at random")
    sp.add_argument("--seed", type=int, default=0)
    add_data_args(sp)
    sp.add_argument("--also-data", action="append", metavar="ROOT",
                    help="another data root whose measurements join --data's (repeatable; a kernel in several "
                         "counts once, from the first)")
    sp.set_defaults(func=cmd_pairs)

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
    sp.add_argument("--null", action="store_true", help="also submit the reference's own code as a candidate (the "
                                                         "null candidate: measured, it must come out at 1.00x)")
    sp.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: the format's)")
    sp.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: the format's)")
    add_data_args(sp)
    sp.set_defaults(func=cmd_import)

    sp = sub.add_parser("compact", help="merge each partition's Parquet files into one")
    add_data_args(sp)
    sp.set_defaults(func=cmd_compact)

    sp = sub.add_parser("dedup", help="store the sources of every data root under a folder once, by content, in "
                                      "the folder's sources table (tasks' files, candidates' sources); idempotent, "
                                      "each root checked to load as before")
    sp.add_argument("tree", metavar="TREE", help="the folder (local or s3://) whose data roots share one sources "
                                                 "table, e.g. data")
    sp.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                    help="fsspec storage option, e.g. endpoint_url=http://127.0.0.1:9000")
    sp.set_defaults(func=cmd_dedup)
