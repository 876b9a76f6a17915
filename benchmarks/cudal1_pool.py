"""Measure CUDA-L1's published kernels (and torch.compile of each reference) through the harness, per timing protocol.

    PYTHONPATH=$PWD python benchmarks/cudal1_pool.py --root POOL --out REPORT [--protocols kernelcast,kernelbench]
        [--variants custom,cuda-graph,cudnn,null] [--levels 1,2] [--problems l2-017,...] [--sample N]
        [--shard I/N] [--max-minutes 8] [--model-build auto|host|device] [--report-only]

Resumable: what a protocol's root holds for this GPU is not measured again, and each measurement is written
as it arrives (kernelcast.tasks.cudal1_pool). At the end, and with ``--report-only`` alone, REPORT gets report.md (the
table against CUDA-L1's published H100 speedups, every disagreement beyond 20% classified) and report.json.
Needs torch, triton, pandas and pyarrow only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARED = Path(__file__).resolve().parents[2] / "shared"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(SHARED / "corpora" / "cuda-l1"), help="CUDA-L1's JSON Lines files")
    p.add_argument("--kernelbench", default=str(SHARED / "tasks" / "kernelbench"),
                   help="today's KernelBench folder, each problem compared with (default: %(default)s)")
    p.add_argument("--root", default=None, help="pool root: one data root per protocol under it, cudal1.parquet "
                                                  "(required but with --import-only)")
    p.add_argument("--out", default=None, help="folder for report.md, report.json (required but with --import-only)")
    p.add_argument("--protocols", default="kernelcast,kernelbench")
    p.add_argument("--variants", default="custom,cuda-graph,cudnn,null",
                   help="comma-separated, or all (default: %(default)s); compile-* compile under the GPU lock")
    p.add_argument("--levels", default="")
    p.add_argument("--problems", default="", help="l2-017,3/5,... (default: every problem)")
    p.add_argument("--sample", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action="store_true",
                   help="measure the problems in an order shuffled by --seed, so that a call cut short covers every level")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="measure only every N-th problem from the I-th (0-based), after any shuffle, on the I-th of N "
                        "shares of this machine's cores: one process a GPU, each with its own CUDA_VISIBLE_DEVICES, "
                        "all writing the same pool root")
    p.add_argument("--max-minutes", type=float, default=None, help="start no chunk after this long")
    p.add_argument("--concurrency", type=int, default=15)
    p.add_argument("--anchor", default="host-bound", choices=("host-bound", "all", "off"),
                   help="kernelcast's protocol: the cases timed again beside the reference (default: %(default)s)")
    p.add_argument("--model-build", default="auto", choices=("auto", "host", "device"),
                   help="where each problem's Model and ModelNew are built: auto (on the CPU and then moved, as "
                        "KernelBench's eval does, but a huge model under kernelcast's protocol), host or device "
                        "(default: %(default)s)")
    p.add_argument("--reference-processes", type=int, default=3, metavar="N",
                   help="processes a problem's reference is measured in where its first finds a case host-sensitive; "
                        "its stored runtime is the fastest process's (default: %(default)s)")
    p.add_argument("--memcheck", default="off", choices=("off", "auto", "all"),
                   help="compute-sanitizer per candidate (8-23 s each on an H100; default: %(default)s)")
    p.add_argument("--mode", default="gpu", choices=("gpu", "interpreter"))
    p.add_argument("--import-only", action="store_true",
                   help="measure nothing: import the problems into this machine's tasks folder (KERNELCAST_TASKS) and "
                        "stop; a GPU run given that folder skips their import (each problem's model is built and "
                        "checked on this machine's CPU: 127 problems in about two minutes on two cores, five on an "
                        "H100 host)")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: read the published figures again from --corpus and write the report of what "
                        "is stored")
    p.add_argument("--gpu-type", default=None, help="report on this GPU type (default: this machine's)")
    p.add_argument("--timeline", default=None,
                   help="write the worker's timeline here as it grows (JSON Lines, as task_sweep's: op, role, "
                        "candidate, phase, seconds, detail; one file a protocol, STEM-PROTOCOL.jsonl, for several): "
                        "what every child was doing while another was timed, kept when the run is cut short")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if not args.import_only and (args.root is None or args.out is None):
        print("error: --root and --out are required (but with --import-only)", file=sys.stderr)
        return 2
    from kernelcast.kernels.formats.cudal1 import SOURCE_GPU, read_corpus, variants_named
    from kernelcast.kernels.harness.sweep import _hardware
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks import cudal1_pool as pool
    from kernelcast.tasks import cudal1_report as report

    try:
        protocols = pool.protocols_named(args.protocols)
        variants = variants_named(args.variants)
        problems = pool.select(read_corpus(args.corpus), args.problems, args.levels, args.sample, args.seed)
        if args.shuffle:
            random.Random(args.seed).shuffle(problems)
        problems = pool.shard(problems, args.shard)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.import_only:
        return import_only(problems, variants, args.kernelbench)
    top = DataRoot(args.root)
    roots = {p: pool.protocol_root(args.root, p) for p in protocols}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    gpu_type = args.gpu_type
    if not args.report_only:
        hardware = _hardware(args.mode)
        gpu_type = gpu_type or hardware.gpu_type
        prepared = pool.prepare(problems, variants, args.kernelbench, roots=list(roots.values()))
        pool.write_side_table(top, pool.side_rows(prepared, pool.file_sha256(Path(args.corpus) / f"{SOURCE_GPU}.jsonl")))
        built = sum(len(p.candidates()) for p in prepared)
        print(f"{len(problems)} problems, {built} candidates built, protocols {', '.join(protocols)}; "
              f"{time.monotonic() - started:.0f} s to import", flush=True)
        measure(args, prepared, roots, protocols, hardware, started, pool.chunk_size(args.concurrency, len(variants)))
    gpu_type = gpu_type or _hardware("gpu").gpu_type
    side = pool.refresh_published(top, problems) if args.report_only else pool.read_side_table(top)
    wanted = {(p.level, p.task_id) for p in problems}
    side = side[[(lv, t) in wanted for lv, t in zip(side["level"], side["task_id"])]] if not side.empty else side
    rows = report.classify(side, report.measured(roots, gpu_type), protocols)
    stats = report.summary(rows)
    (out / "report.md").write_text(report.markdown(rows, stats, gpu_type))
    (out / "report.json").write_text(json.dumps({"gpu_type": gpu_type, "problems": len(problems), "summary": stats,
                                                 "headroom": report.headroom(rows).to_dict("records")},
                                                indent=1, default=str))
    if not rows.empty:
        rows.to_csv(out / "rows.csv", index=False)
    for key, s in stats.items():
        share = f"{s['agree_of_both_ok']:.0%}" if s["agree_of_both_ok"] is not None else "-"
        print(f"{key:<36} ok {s['ok']:>4}/{s['rows']:<4} published {s['published']:>4}  within 20%: "
              f"{s['agree']:>4} ({share} of both ok)  {s['classes']}", flush=True)
    return 0


def shard_cpus(spec: str | None) -> tuple[int, ...] | None:
    """The cores of shard I of N (``spec`` "I/N"): one process a GPU on a host, each compiling and timing on
    cores of its own (kernelcast.kernels.harness.cores.share), so that no GPU's lock holder shares a core with another's
    compiling children. None without a shard: every core this process may use."""
    if not spec:
        return None
    from kernelcast.kernels.harness import cores

    index, parts = (int(x) for x in spec.split("/"))
    return cores.share(index, parts)


def import_only(problems, variants, kernelbench_folder) -> int:
    """Import ``problems`` into this machine's tasks folder and say how many came in; nothing is measured."""
    from kernelcast.kernels.formats import tasks_dir
    from kernelcast.tasks import cudal1_pool as pool

    started = time.monotonic()
    prepared = pool.prepare(problems, variants, kernelbench_folder)
    refused = [p for p in prepared if p.op is None]
    print(f"{len(prepared) - len(refused)} of {len(prepared)} problems imported into {tasks_dir()} in "
          f"{time.monotonic() - started:.0f} s; not imported: {', '.join(p.problem.op_name for p in refused) or 'none'}")
    return 0


def measure(args, prepared, roots, protocols, hardware, started: float, chunk: int) -> None:
    """One worker per protocol, sharing one GPU lock so that the two never time at once."""
    from kernelcast.kernels.harness.sweep import Journal
    from kernelcast.kernels.harness.sweep_report import held_seconds
    from kernelcast.kernels.harness.worker import MeasureWorker
    from kernelcast.tasks import cudal1_pool as pool

    deadline = started + args.max_minutes * 60 if args.max_minutes is not None else None
    with tempfile.TemporaryDirectory(prefix="cudal1-lock-") as folder:
        lock = str(Path(folder) / "gpu.lock")
        settings = dict(mode=args.mode, concurrency=args.concurrency, memcheck=args.memcheck, gpu_lock=lock,
                        cpus=shard_cpus(args.shard), anchor=args.anchor, model_build=args.model_build,
                        reference_processes=args.reference_processes)
        with contextlib.ExitStack() as stack:
            workers = {p: stack.enter_context(MeasureWorker(hardware, pool.worker_config(p, **settings)))
                       for p in protocols}
            names = {cid: (op, "/".join(roles)) for cid, (op, roles) in pool.candidate_roles(prepared).items()}
            for protocol, worker in workers.items() if args.timeline else ():
                stack.callback(Journal(worker, timeline_path(args.timeline, protocol, len(workers)), names).close)
            made = pool.measure(prepared, roots, workers, deadline=deadline, chunk=chunk)
    busy = held_seconds([hold for w in workers.values() for hold in w.holds])["held"]  # the workers share one lock
    print(f"{len(made)} measurements in {time.monotonic() - started:.0f} s wall, the device held {busy:.0f} s",
          flush=True)


def timeline_path(path: str, protocol: str, protocols: int) -> Path:
    """The timeline file of one protocol's worker: ``path`` itself, or ``STEM-PROTOCOL.jsonl`` beside it for several."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path if protocols == 1 else path.with_name(f"{path.stem}-{protocol}{path.suffix or '.jsonl'}")


if __name__ == "__main__":
    sys.exit(main())
