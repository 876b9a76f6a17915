"""Score forecasters on the zero-shot set (benchmarks/zeroshot): operations no training pool holds.

    PYTHONPATH=$PWD python benchmarks/zeroshot_score.py [--measurements DIR/measurements.parquet]
        [--problems dev|sealed|all] [--forecasters physics,labels,learned] [--gpu-type h100] [--out STEM]

Every kernel of every problem is forecast against the problem's reference, on the CPU, by each forecaster:
``physics`` as it is (no training data at all), ``labels`` (the label baseline) and ``learned`` fit on the
packaged pools (template variants, and CUDA-L1's kernels as the written ones). Without measurements, the
properties a forecast has on its own are scored: whether kernels that differ in launch parameters or algorithm
get distinct forecasts, whether every kernel that does not compile for the target is forecast to fail at
0.95 or more, and the seconds a cold forecast costs. With the GPU's measurements
(benchmarks/zeroshot_measure.py), the ranking figures too (``kernelcast.surrogate.ranking``): within-problem
Spearman, top-1 within 10% of the best, the 10/20/30% selections, failure AUROC, each with a 95% bootstrap
interval over problems. The sealed third (benchmarks/zeroshot_tasks.py states the rule) is scored only with
``--problems sealed``: once, last. CUDA-L1 publishes no figure for these problems, so that column is absent here.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SET = REPO / "benchmarks" / "zeroshot"
# kernels that differ from each other in launch parameters or algorithm: each pair must get distinct forecasts
DIFFERING = (("triton_b1024", "triton_b32"), ("triton_b1024", "triton_rowloop"), ("triton_b32", "triton_rowloop"),
             ("triton_b1024", "triton_w2"), ("triton_b32", "triton_w2"), ("eager", "triton_b1024"),
             ("eager", "compile"), ("eager", "graph"), ("compile", "graph"))
# H100 SXM as its datasheet gives it: the hardware record a forecast is asked for where no measurement says
H100 = dict(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
            mem_clock_mhz=2619, bus_width_bits=5120, l2_mib=50.0, memory_gib=79.1)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default=str(SET))
    p.add_argument("--measurements", default=None, help="zeroshot_measure.py's measurements.parquet")
    p.add_argument("--problems", default="dev", choices=("dev", "sealed", "all"))
    p.add_argument("--forecasters", default="physics,labels,learned")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--cudal1-pool", default=str(REPO / "data" / "pools" / "cudal1"),
                   help="CUDA-L1's pool, whose kernels the label baseline and learned are fit on")
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--out", default=None, help="path stem of the .txt and .json results")
    return p.parse_args(argv)


def problems_of(folder: Path, which: str) -> list[dict]:
    manifest = json.loads((folder / "manifest.json").read_text())
    keep = {"dev": lambda p: not p["sealed"], "sealed": lambda p: p["sealed"], "all": lambda p: True}[which]
    return [p for p in manifest["problems"] if keep(p)]


def imported(folder: Path, problem: dict):
    """(operation, {kernel name: candidate}) of one problem, imported as a KernelBench task."""
    from kernelcast.kernels.formats import import_task

    names = list(problem["kernels"])
    where = folder / problem["name"]
    op, kernels = import_task("kernelbench", str(where / "reference.py"), [str(where / f"{k}.py") for k in names],
                              name=problem["name"])
    return op, dict(zip(names, kernels))


def fitted(name: str, gpu_type: str, cudal1_pool: str):
    """Forecaster ``name`` as it would forecast an operation it has never seen: physics as it is, the others fit on
    the packaged pools (template pairs; CUDA-L1's kernels, its written ones)."""
    from kernelcast.surrogate import registry

    forecaster = registry.get_forecaster_factory(name)()
    if not registry.fits_on_prior(name):
        return forecaster.fit(None)
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs

    pairs = case_pairs(DataRoot(str(REPO / "data" / "pools")), gpu_type=gpu_type)
    sources = cudal1_kernels(gpu_type, cudal1_pool)
    return registry.fit_prior(name, forecaster, pairs, sources)


def cudal1_kernels(gpu_type: str, pool: str) -> pd.DataFrame:
    """CUDA-L1's measured kernels (kernelcast protocol) with their references, their tasks installed here."""
    from benchmarks.cudal1_forecast import _measured

    args = argparse.Namespace(pool=pool, protocol="kernelcast", gpu_type=gpu_type,
                              spaces=[], drop_verdicts=None)
    kernels, _ = _measured(args)
    return kernels


def main(argv=None) -> int:
    args = parse(argv)
    from kernelcast.kernels.formats import TASKS_ENV

    with tempfile.TemporaryDirectory(prefix="zeroshot-tasks-") as tasks:
        os.environ[TASKS_ENV] = tasks
        return run(args)


def run(args) -> int:
    from kernelcast.kernels.records import HardwareSpec
    from kernelcast.surrogate import metrics, ranking
    from kernelcast.surrogate.forecast import ForecastRequest

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    folder = Path(args.set)
    problems = problems_of(folder, args.problems)
    measured = pd.read_parquet(args.measurements) if args.measurements else None
    hardware = HardwareSpec(**{**H100, "gpu_type": args.gpu_type})
    rows = []
    for problem in problems:
        op, kernels = imported(folder, problem)
        reference = op.seed_candidates()[0]
        ref_us = ()
        if measured is not None:
            mine = measured[(measured["problem"] == problem["name"]) & (measured["kernel"] == "reference")]
            if len(mine) and len(mine.iloc[0]["runtime_us_median"]):
                ref_us = tuple(float(u) for u in mine.iloc[0]["runtime_us_median"])
        for kernel, candidate in kernels.items():
            rows.append({"problem": problem["name"], "op": op.name, "kernel": kernel, "sealed": problem["sealed"],
                         "character": problem["kernels"][kernel], "candidate_id": candidate.candidate_id,
                         "request": ForecastRequest(reference, candidate, op.name, hardware,
                                                    case_names=tuple(c.name for c in op.cases),
                                                    anchor_runtime_us=ref_us)})
    table = pd.DataFrame(rows)
    say(f"zero-shot set {folder}: {len(problems)} {args.problems} problems, {len(table)} kernels, forecast for "
        f"{args.gpu_type}")
    results = {"problems": args.problems, "n_problems": len(problems), "n_kernels": len(table), "forecasters": {}}
    for name in [n for n in args.forecasters.split(",") if n]:
        t = time.perf_counter()
        forecaster = fitted(name, args.gpu_type, args.cudal1_pool)
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        forecasts = forecaster.forecast(list(table["request"]))
        per_kernel_s = (time.perf_counter() - t) / len(table)
        expected = np.array([f.expected_speedup for f in forecasts])
        p_fail = np.array([f.failure_probability for f in forecasts], dtype=float)
        p_fail = np.where(np.isfinite(p_fail), p_fail, 0.0)
        table[f"{name}_expected"], table[f"{name}_p_fail"] = expected, p_fail
        out = {"fit_seconds": round(fit_s, 1), "forecast_seconds_per_kernel": round(per_kernel_s, 3),
               **own_properties(table, name)}
        if measured is not None:
            out.update(measured_figures(table, measured, name, args.draws, ranking, metrics))
            spent = measured[measured["kernel"] != "reference"]
            spent = (spent["compile_seconds"] + spent["gpu_seconds"])[spent["status"] != "not_measured"]
            if len(spent):  # what a forecast costs beside what a measurement charges (its compile and GPU seconds)
                out["measurement_seconds_median"] = float(spent.median())
                out["forecast_to_measurement_cost"] = per_kernel_s / float(spent.median())
        results["forecasters"][name] = out
        say(f"{name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in out.items()))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps(results, indent=1, default=float))
        table.drop(columns=["request"]).to_parquet(args.out + "-forecasts.parquet")
    return 0


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def own_properties(table: pd.DataFrame, name: str) -> dict:
    """What a forecast can be judged on without a measurement: distinct forecasts for kernels that differ in launch
    parameters or algorithm, compile failures forecast, and whether every problem gets a non-constant forecast."""
    pairs = distinct = 0
    for _, g in table.groupby("problem"):
        by_kernel = dict(zip(g["kernel"], g[f"{name}_expected"]))
        for a, b in DIFFERING:
            if a in by_kernel and b in by_kernel:
                pairs += 1
                distinct += abs(math.log(by_kernel[a] / by_kernel[b])) > 1e-3
    missing = table[table["kernel"] == "missing"]
    constant = sum(g[f"{name}_expected"].nunique() < 2 for _, g in table.groupby("problem"))
    return {"distinct_pairs": f"{distinct}/{pairs}",
            "compile_errors_at_095": f"{int((missing[f'{name}_p_fail'] >= 0.95).sum())}/{len(missing)}",
            "compile_error_p_fail_min": float(missing[f"{name}_p_fail"].min()) if len(missing) else float("nan"),
            "problems_with_constant_forecast": int(constant)}


def measured_figures(table, measured, name, draws, ranking, metrics) -> dict:
    """The ranking figures of ``name``'s forecasts against the GPU's measurements (kernels measured only)."""
    m = measured[measured["kernel"] != "reference"][["problem", "kernel", "status", "speedup"]]
    joined = table.merge(m, on=["problem", "kernel"], how="inner")
    joined = joined[joined["status"] != "not_measured"]
    if joined.empty:
        return {"measured_kernels": 0}
    kernels = pd.DataFrame({"op": joined["problem"].to_numpy(), "speedup": joined["speedup"].to_numpy(float),
                            "failed": (joined["status"] != "ok").to_numpy()})
    score = ranking.ranking_score(joined[f"{name}_expected"], joined[f"{name}_p_fail"])
    figures = ranking.ranking_figures(kernels, score, joined[f"{name}_expected"].to_numpy(float), draws=draws)
    failed = kernels["failed"].to_numpy()
    auroc = metrics.auroc(joined[f"{name}_p_fail"].to_numpy(float), failed) if 0 < failed.sum() < len(failed) \
        else float("nan")
    keep = ("problems", "kernels", "failed", "spearman", "spearman_lo", "spearman_hi", "top1_within_10pct",
            "top1_within_10pct_lo", "top1_within_10pct_hi", "select_top10_within_20pct")
    return {**{k: figures[k] for k in keep}, "failure_auroc": float(auroc)}


if __name__ == "__main__":
    raise SystemExit(main())
