"""How much of an autotune sweep ``kernelcast.autotune.forecast_pruner`` saves, and what it costs.

    python benchmarks/autotune_pruning.py [--data data/pools] [--ops softmax,matmul] [--top-k 0.33]
                                          [--gpu-type h100] [--json out.json]

Each template algorithm of each operation (``kernels/ops/``) is written as the config list a
user would hand ``@triton.autotune``: one ``triton.Config`` per variant of the algorithm. The
configs Triton would time are chosen by Triton's own ``Autotuner.prune_configs`` with the
pruner's ``prune_configs_by``. Reported per (op, algorithm): configs timed out of all, and the
chosen config's runtime over the full sweep's best (1.0: the pruned autotune finds the best).

On a GPU, per case of the op, every variant is compiled and timed (``triton.testing.do_bench``,
median of its repetitions, the template's own ``launch``); the chosen config is the fastest of the
timed subset by those same timings, as the autotuner would pick it. Without a GPU that part is
skipped (and says so), and the same figures are read from the pool's measurements of the GPU type
instead: the speedup of the pool's best kept config over its best overall, geometric means over
the op's cases. Those come from the very pool the forecaster is corrected with, so they show how
well the pruner keeps what the pool knows, not how it does on a kernel it has never seen.

Goal: at most 1/3 of the configs timed, the chosen config within 3% of the sweep's best.
Medians over (op, algorithm[, case]) are printed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_FRACTION_TIMED = 1 / 3
GOAL_SLOWDOWN = 1.03


def config_list(op: str, algorithm: str):
    """(variant, ``triton.Config``) for every variant of one template algorithm."""
    import triton

    from kernelcast.kernels.spaces import get_space

    out = []
    for v in get_space(op).variants():
        if v.template == f"{op}/{algorithm}":
            meta = {k: x for k, x in v.params.items() if k not in ("num_warps", "num_stages")}
            out.append((v, triton.Config(meta, num_warps=v.params.get("num_warps", 4),
                                         num_stages=v.params.get("num_stages", 3))))
    return out


def triton_keeps(prune: dict, launch, arg_names, nargs: dict, configs) -> list:
    """The configs Triton 3.x's autotuner would time: its own ``prune_configs``, with our ``prune_configs_by``."""
    from triton.runtime.autotuner import Autotuner

    tuner = Autotuner(launch, list(arg_names), configs, key=[], reset_to_zero=None, restore_value=None,
                      prune_configs_by=prune)
    tuner.nargs = nargs
    return tuner.prune_configs({})


def replay(args, ops) -> list[dict]:
    """Per (op, algorithm): configs kept, and the pool's best kept over its best (GPU-free)."""
    from kernelcast.autotune import ForecastPruner
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import measurements_from_frame

    rows = []
    for op in ops:
        pruner_for = {}
        measured = {m.candidate_id: m.speedup for m in measurements_from_frame(
            DataRoot(args.data).read_measurements(op=op, gpu_type=args.gpu_type)) if m.status == "ok" and m.speedup}
        from kernelcast.kernels.spaces import get_space

        for algo in get_space(op).algorithms:
            pairs = config_list(op, algo.name)
            pruner = pruner_for.setdefault(algo.name, ForecastPruner(op, args.data, args.top_k, args.gpu_type,
                                                                     algorithm=algo.name))
            configs = [c for _, c in pairs]
            t0 = time.perf_counter()
            kept = triton_keeps(pruner.prune_configs_by(), lambda *a, **k: None, [], {}, configs)
            rank_s = time.perf_counter() - t0
            by_config = {id(c): v.candidate_id for v, c in pairs}
            every = [measured[v.candidate_id] for v, _ in pairs if v.candidate_id in measured]
            chosen = [measured[by_config[id(c)]] for c in kept if by_config[id(c)] in measured]
            if not every or not chosen:
                continue
            rows.append({"op": op, "algorithm": algo.name, "configs": len(configs), "timed": len(kept),
                         "fraction_timed": len(kept) / len(configs),
                         "slowdown_vs_best": max(every) / max(chosen), "rank_seconds": rank_s})
    return rows


def sweep(args, ops, save=lambda rows: None) -> list[dict]:
    """Per (op, algorithm, case) on this GPU: every variant timed, and the pruned autotune's choice; ``save``
    gets the rows so far after each one (the sweep compiles every config, and a run cut short keeps its rows)."""
    import torch
    import triton.testing

    from kernelcast.autotune import ForecastPruner
    from kernelcast.kernels.harness.correctness import load_launch
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.spaces import get_space

    rows = []
    for op_name in ops:
        op = get_operation(op_name)
        for algo in get_space(op_name).algorithms:
            launch = load_launch(algo.source, module_name=f"{op_name}_{algo.name}")
            pairs = config_list(op_name, algo.name)
            configs = [c for _, c in pairs]
            pruner = ForecastPruner(op_name, args.data, args.top_k, args.gpu_type, algorithm=algo.name)
            for case in op.cases:
                gen = torch.Generator(device="cuda").manual_seed(0)
                inputs = op.make_inputs(case, gen, "cuda")
                outputs = tuple(torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in op.output_specs(case))
                names = [*op.input_names(), *(f"out{i}" for i in range(len(outputs)))]
                kept = triton_keeps(pruner.prune_configs_by(), launch, names,
                                    dict(zip(names, (*inputs, *outputs))), configs)
                times = {}
                for variant, config in pairs:
                    try:
                        times[id(config)] = triton.testing.do_bench(
                            lambda: launch(*inputs, *outputs, **variant.params), return_mode="median")
                    except Exception:  # does not compile or launch on this GPU: the autotuner skips it too
                        times[id(config)] = math.inf
                best = min(times.values())
                chosen = min(times[id(c)] for c in kept)
                if not math.isfinite(best):
                    continue
                rows.append({"op": op_name, "algorithm": algo.name, "case": case.name, "configs": len(configs),
                             "timed": len(kept), "fraction_timed": len(kept) / len(configs),
                             "best_us": best * 1e3, "chosen_us": chosen * 1e3, "slowdown_vs_best": chosen / best})
                save(rows)
                print(f"  {op_name}/{algo.name} {case.name}: timed {len(kept)}/{len(configs)}, "
                      f"chosen {chosen * 1e3:.1f} us vs best {best * 1e3:.1f} us", flush=True)
    return rows


def summary(rows: list[dict], what: str) -> dict:
    if not rows:
        return {}
    fraction = statistics.median(r["fraction_timed"] for r in rows)
    slowdown = statistics.median(r["slowdown_vs_best"] for r in rows)
    worst = max(r["slowdown_vs_best"] for r in rows)
    within = sum(r["slowdown_vs_best"] <= GOAL_SLOWDOWN for r in rows)
    print(f"{what}: {len(rows)} rows; median fraction of configs timed {fraction:.3f} "
          f"(goal <= {GOAL_FRACTION_TIMED:.3f}); median chosen/best {slowdown:.4f}, worst {worst:.4f} "
          f"(goal <= {GOAL_SLOWDOWN}); within 3% in {within} of {len(rows)}")
    return {"rows": len(rows), "median_fraction_timed": fraction, "median_slowdown_vs_best": slowdown,
            "worst_slowdown_vs_best": worst, "within_goal": within}


def main(argv=None) -> int:
    from kernelcast.autotune import PACKAGED_POOL
    from kernelcast.kernels.ops import OPERATIONS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=PACKAGED_POOL)
    parser.add_argument("--ops", default=",".join(n for n, o in OPERATIONS.items() if o.algorithms))
    parser.add_argument("--top-k", type=float, default=0.33)
    parser.add_argument("--gpu-type", default=None, help="the pool's GPU type to forecast (default: this GPU's, else h100)")
    parser.add_argument("--json", default="")
    parser.add_argument("--parts", default="sweep,replay",
                        help="sweep (the GPU's, where there is one), replay (the pool's, on the CPU), or both")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(args.parts) - {"sweep", "replay"})
    if unknown or not args.parts:
        parser.error(f"--parts takes sweep and/or replay, got {', '.join(unknown) or 'nothing'}")
    ops = [o for o in args.ops.split(",") if o]
    import torch

    gpu = torch.cuda.is_available()
    if args.gpu_type is None:
        from kernelcast.kernels.hardware import gpu_type_of

        args.gpu_type = gpu_type_of(torch.cuda.get_device_name(0)) if gpu else "h100"
    result = {"top_k": args.top_k, "gpu_type": args.gpu_type, "ops": ops}
    # The GPU sweep first: the replay fits a forecaster per algorithm on the CPU, which on a big host took
    # longer than a sweep's whole budget; the sweep's table is the figure that counts.
    if gpu and "sweep" in args.parts:
        print(f"GPU sweep on {torch.cuda.get_device_name(0)}:")
        def save(rows: list[dict]) -> None:
            if args.json:
                Path(args.json).write_text(json.dumps(result | {"sweep": rows, "partial": True}, indent=2))

        result["sweep"] = sweep(args, ops, save)
        result["sweep_summary"] = summary(result["sweep"], "GPU sweep")
    elif "sweep" in args.parts:
        print("no CUDA GPU: skipping the GPU part (compiling and timing every config)")
    if "replay" in args.parts:
        print(f"pool replay on {args.gpu_type} (the pool that also corrects the forecaster):")
        result["replay"] = replay(args, ops)
        result["replay_summary"] = summary(result["replay"], "pool replay")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
