"""Each operation's best measured variant against the GPU's limits, torch eager and torch.compile.

    python benchmarks/best_vs_torch.py --data data/pools [--json out.json]

Needs a CUDA GPU and a data root holding measurements for this GPU type. Measures,
in one run: the copy bandwidth and bf16 matmul ceilings; then per operation and case
the best variant (highest pooled speedup), eager PyTorch and torch.compile(eager),
timed the harness's way (CUDA events, L2 flushed, inputs rotated, median).
Memory-bound operations are judged by bandwidth against the measured copy rate,
compute-bound ones by TFLOP/s against the measured matmul rate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from benchmarks.harness_bench import ceilings
from kernelcast.kernels.harness.correctness import load_launch, poisoned_outputs, call_candidate
from kernelcast.kernels.harness.timing import l2_flush_buffer, time_call
from kernelcast.kernels.hardware import detect
from kernelcast.kernels.ops import OPERATIONS, mismatch
from kernelcast.kernels.records import Candidate
from kernelcast.storage.dataset import DataRoot


def _time(fn, op, case, flush) -> float:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1000)
    sets = [op.make_inputs(case, gen, "cuda") for _ in range(3)]
    outs = [poisoned_outputs(op, case, "cuda") for _ in range(3)]
    return time_call(lambda i: fn(*sets[i % 3], *outs[i % 3]), flush, max_seconds=2.0).runtime_us_median


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data/pools")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    hw = detect()
    ceil = ceilings()
    print(f"{hw.device_name}: copy {ceil['copy_gbps']:.0f} GB/s, bf16 matmul {ceil['matmul_bf16_tflops']:.0f} TFLOP/s")
    root = DataRoot(args.data)
    m = root.read_measurements(gpu_type=hw.gpu_type)
    cands = root.read_candidates().set_index("candidate_id")
    flush = l2_flush_buffer()
    rows = []
    for name, op in OPERATIONS.items():
        ok = m[(m["op"] == name) & (m["status"] == "ok") & m["speedup"].notna()]
        ok = ok[ok["candidate_id"].map(lambda i: cands.loc[i, "origin"] == "template")]
        if ok.empty:
            print(f"{name}: no measured template variant on {hw.gpu_type}")
            continue
        best_id = ok.loc[ok["speedup"].idxmax(), "candidate_id"]
        row = cands.loc[best_id]
        best = Candidate(op=name, backend=row["backend"], source=row["source"], params=json.loads(row["params"]),
                         template=row["template"], origin="template")
        launch = load_launch(best.source)
        eager = load_launch(op.eager_source)
        compiled = torch.compile(eager)
        per_case = []
        for case in op.cases:
            gen = torch.Generator(device="cuda")
            gen.manual_seed(5)
            inputs = op.make_inputs(case, gen, "cuda")
            got = call_candidate(launch, inputs, poisoned_outputs(op, case, "cuda"), best.params)
            torch.cuda.synchronize()
            problem = mismatch(op, case, got, op.reference(*inputs))
            if problem:
                raise SystemExit(f"{name}: best variant fails its check here: {problem}")
            t_best = _time(lambda *a: launch(*a, **best.params), op, case, flush)
            t_eager = _time(eager, op, case, flush)
            t_comp = _time(compiled, op, case, flush)
            gbps, tflops = op.achieved(case, t_best)
            frac = gbps / ceil["copy_gbps"] if op.bound == "memory" else tflops / ceil["matmul_bf16_tflops"]
            per_case.append((t_best, t_eager, t_comp, gbps, tflops, frac))
        r = {"op": name, "best": best.template, "params": best.params,
             "runtime_us": geomean([c[0] for c in per_case]),
             "achieved": (f"{geomean([c[3] for c in per_case]):.0f} GB/s" if op.bound == "memory"
                          else f"{geomean([c[4] for c in per_case]):.0f} TFLOP/s"),
             "fraction_of_limit": sum(c[5] for c in per_case) / len(per_case),
             "speedup_vs_eager": geomean([c[1] / c[0] for c in per_case]),
             "speedup_vs_compile": geomean([c[2] / c[0] for c in per_case])}
        rows.append(r)
        print(f"{name:<14} {r['best']:<28} {r['achieved']:>12} {100 * r['fraction_of_limit']:5.1f}% of limit  "
              f"x{r['speedup_vs_eager']:.2f} vs eager  x{r['speedup_vs_compile']:.2f} vs torch.compile", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": hw.device_name, **ceil, "ops": rows}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
