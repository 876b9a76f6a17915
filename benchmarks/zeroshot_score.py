"""Score forecasters on the zero-shot set (benchmarks/zeroshot): operations no training pool holds.

    PYTHONPATH=$PWD python benchmarks/zeroshot_score.py [--measurements OUT/measurements.parquet] [--sealed]
        [--forecasters physics,labels,...] [--gpu-type h100] [--out STEM]

Every kernel of every problem is forecast against the problem's reference, on the CPU, by each forecaster (by
default every registered one that needs no trained folder: ``physics`` as it is, no training data at all; the
others, ``labels`` the label baseline among them, fit on the packaged pools: template variants, and CUDA-L1's
kernels as the written ones). Without measurements, the properties a forecast has on its own are scored: whether
kernels that differ in launch parameters or algorithm get distinct forecasts, whether every kernel that does not
compile for the target is forecast to fail at 0.95 or more, and the seconds a cold forecast costs. With the GPU's
measurements (benchmarks/zeroshot_measure.py's OUT/measurements.parquet; OUT/summary.json beside it is read for
the device), the ranking figures too (``kernelcast.surrogate.ranking``): within-problem Spearman (mean, with a 95%
bootstrap interval over problems, and median over problems), top-1 within 10% of the best (the fraction of
problems), the 10% selection, failure AUROC, ECE, each forecaster paired against the label baseline on the same
problems; and the compile failures the GPU found, each forecast to fail at 0.95 or more or not.

The development two thirds are scored by default. The sealed third (benchmarks/zeroshot_tasks.py states the rule)
is scored only with ``--sealed``: once, last; its measurements are never read otherwise. CUDA-L1 publishes no
figure for these problems, so that column is absent here.
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
DESIGNED_COMPILE_ERROR = "missing"  # the kernel of each problem that calls a Triton function that does not exist
BASELINE = "labels"  # every table carries the label baseline, and every forecaster is paired against it
# H100 SXM as its datasheet gives it: the hardware record a forecast is asked for where no measurement says
H100 = dict(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", sm_count=132,
            mem_clock_mhz=2619, bus_width_bits=5120, l2_mib=50.0, memory_gib=79.1)


def registered() -> list[str]:
    """Every registered forecaster that can be readied here: fit on the packaged pools or used as it is (not one
    read from a trained folder, nor the oracle, which reads a data root's measurements)."""
    from kernelcast.surrogate import registry

    return [name for name in registry.SURROGATES if not registry.reads_folder(name)]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default=str(SET))
    p.add_argument("--measurements", default=None, help="zeroshot_measure.py's OUT/measurements.parquet")
    p.add_argument("--sealed", action="store_true",
                   help="score the sealed third (once, last) in place of the development two thirds")
    p.add_argument("--problems", default="dev", choices=("dev", "sealed"),
                   help="dev (the default); sealed needs --sealed as well, so that it is never scored by accident")
    p.add_argument("--forecasters", default=None,
                   help="comma-separated (default: every registered one that needs no trained folder)")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--cudal1-pool", default=str(REPO / "data" / "pools" / "cudal1"),
                   help="CUDA-L1's pool, whose kernels the label baseline and learned are fit on")
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--out", default=None, help="path stem of the .txt and .json results")
    args = p.parse_args(argv)
    if args.problems == "sealed" and not args.sealed:
        p.error("the sealed third is scored only with --sealed (once, last)")
    args.which = "sealed" if args.sealed else "dev"
    args.forecasters = args.forecasters or ",".join(registered())
    return args


def problems_of(folder: Path, which: str) -> list[dict]:
    """The manifest's ``which`` problems: "dev" (not sealed) or "sealed"."""
    if which not in ("dev", "sealed"):
        raise ValueError(f"unknown problem set {which!r}; known: dev, sealed")
    manifest = json.loads((folder / "manifest.json").read_text())
    return [p for p in manifest["problems"] if bool(p["sealed"]) == (which == "sealed")]


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

    before = os.environ.get(TASKS_ENV)
    with tempfile.TemporaryDirectory(prefix="zeroshot-tasks-") as tasks:
        os.environ[TASKS_ENV] = tasks
        try:
            return run(args)
        finally:
            if before is None:
                os.environ.pop(TASKS_ENV, None)
            else:
                os.environ[TASKS_ENV] = before


def read_measurements(path: str, problems: list[dict]) -> tuple[pd.DataFrame, dict]:
    """The rows of zeroshot_measure.py's parquet for ``problems`` only (another set's rows are never read on), and
    its summary.json beside it (empty where there is none)."""
    measured = pd.read_parquet(path)
    missing = {"problem", "kernel", "status", "speedup", "runtime_us_median"} - set(measured.columns)
    if missing:
        raise ValueError(f"{path}: not zeroshot_measure.py's measurements (no column {', '.join(sorted(missing))})")
    measured = measured[measured["problem"].isin({p["name"] for p in problems})].reset_index(drop=True)
    summary = Path(path).with_name("summary.json")
    return measured, (json.loads(summary.read_text()) if summary.exists() else {})


def run(args) -> int:
    from kernelcast.kernels.records import HardwareSpec
    from kernelcast.surrogate.forecast import ForecastRequest

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    folder = Path(args.set)
    problems = problems_of(folder, args.which)
    measured, summary = read_measurements(args.measurements, problems) if args.measurements else (None, {})
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
    names = [n for n in args.forecasters.split(",") if n]
    say(f"zero-shot set {folder}: {len(problems)} {'sealed' if args.sealed else 'development'} problems, "
        f"{len(table)} kernels, forecast for {args.gpu_type}"
        + (f"; measured on {summary.get('device', 'a GPU')}: {measured['problem'].nunique()} problems, "
           f"{int((measured['status'] != 'not_measured').sum())} rows" if measured is not None else ""))
    results = {"problems": "sealed" if args.sealed else "dev", "n_problems": len(problems), "n_kernels": len(table),
               "device": summary.get("device"), "forecasters": {}, "versus": {}}
    held = {}  # name -> its forecasts of the measured kernels, as ranking scores held-out forecasts
    kernels = truth(table, measured) if measured is not None else None
    for name in names:
        t = time.perf_counter()
        forecaster = fitted(name, args.gpu_type, args.cudal1_pool)
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        forecasts = forecaster.forecast(list(table["request"]))
        per_kernel_s = (time.perf_counter() - t) / len(table)
        record(table, name, forecasts)
        out = {"fit_seconds": round(fit_s, 1), "forecast_seconds_per_kernel": round(per_kernel_s, 3),
               **own_properties(table, name)}
        if kernels is not None:
            held[name] = as_held_out(table, kernels, name)
            out.update(measured_figures(kernels, held[name], args.draws))
            spent = measured[(measured["kernel"] != "reference") & (measured["status"] != "not_measured")]
            spent = spent["compile_seconds"] + spent["gpu_seconds"]
            if len(spent):  # what a forecast costs beside what a measurement charges (its compile and GPU seconds)
                out["measurement_seconds_median"] = float(spent.median())
                out["forecast_to_measurement_cost"] = per_kernel_s / float(spent.median())
        results["forecasters"][name] = out
        print(f"{name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in out.items()), flush=True)
    say()
    say(figures_table(results["forecasters"], measured is not None))
    if kernels is not None and BASELINE in held:
        from kernelcast.surrogate import ranking

        say()
        say(f"Paired against {BASELINE} (each forecaster's figure less {BASELINE}'s on the same problems; 95% bootstrap "
            "over problems; * where the interval excludes a tie):")
        for name in (n for n in names if n != BASELINE):
            diff = ranking.paired_difference(kernels, held[name], held[BASELINE], args.draws)
            results["versus"][name] = diff
            say(f"  {name}: " + ", ".join(f"{label} {_signed(diff, key)}" for key, label in (
                ("spearman", "Spearman"), ("top1_within_10pct", "top-1 within 10%"),
                ("select_top10_within_20pct", "top 10% within 20%"), ("failure_auroc", "failure AUROC"))))
    say("CUDA-L1 publishes no figure for these problems (operations of our own), so its column is absent.")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps(results, indent=1, default=float))
        table.drop(columns=["request"]).to_parquet(args.out + "-forecasts.parquet")
    return 0


def record(table: pd.DataFrame, name: str, forecasts) -> None:
    """``name``'s forecasts into ``table``'s columns NAME_expected, NAME_p_fail (0 where it says nothing of failure)
    and NAME_probs (its 8 bins)."""
    p_fail = np.array([f.failure_probability for f in forecasts], dtype=float)
    table[f"{name}_expected"] = np.array([f.expected_speedup for f in forecasts], dtype=float)
    table[f"{name}_p_fail"] = np.where(np.isfinite(p_fail), p_fail, 0.0)
    table[f"{name}_probs"] = [list(map(float, f.probabilities)) for f in forecasts]


def truth(table: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """The measured kernels of ``table``, as ``kernelcast.surrogate.ranking`` scores them: op (the problem), speedup,
    failed, true_bin, status, and the row of ``table`` each came from (``row``). A kernel not measured is left out.

    Within a problem the kernels are in the order of their candidate ids (content hashes), not the manifest's: a
    ranking breaks ties by order, and the manifest lists the BLOCK 1024 kernel, often the best, first, which would
    hand a forecaster that gives a problem's Triton kernels one forecast (labels, roofline) its top-1."""
    from kernelcast.surrogate.bins import speedup_bin

    m = measured[(measured["kernel"] != "reference") & (measured["status"] != "not_measured")]
    joined = table.reset_index().rename(columns={"index": "row"})[["row", "problem", "kernel", "candidate_id"]].merge(
        m[["problem", "kernel", "status", "speedup"]], on=["problem", "kernel"], how="inner")
    joined = joined.sort_values(["problem", "candidate_id"], kind="stable").reset_index(drop=True)
    ran = (joined["status"] == "ok").to_numpy() & (joined["speedup"].to_numpy(float) > 0)
    speedup = np.where(ran, joined["speedup"].to_numpy(float), np.nan)
    return pd.DataFrame({"op": joined["problem"].to_numpy(), "kernel": joined["kernel"].to_numpy(),
                         "row": joined["row"].to_numpy(), "speedup": speedup, "failed": ~ran,
                         "status": joined["status"].to_numpy(),
                         "true_bin": [speedup_bin(s if r else None) for s, r in zip(speedup, ran)]})


def as_held_out(table: pd.DataFrame, kernels: pd.DataFrame, name: str) -> pd.DataFrame:
    """``name``'s forecasts of ``kernels`` in the columns ``kernelcast.surrogate.ranking`` reads of held-out ones (fold,
    p_fail, expected, probs over the 9 bins, 0 failure): no forecaster saw these operations."""
    from kernelcast.surrogate import metrics

    rows = table.loc[kernels["row"]]
    p_fail = rows[f"{name}_p_fail"].to_numpy(float)
    probs = metrics.with_failure(np.array(rows[f"{name}_probs"].to_list(), dtype=float), p_fail)
    return pd.DataFrame({"fold": "zero-shot", "p_fail": p_fail, "expected": rows[f"{name}_expected"].to_numpy(float),
                         "probs": list(probs)}, index=kernels.index)


def measured_figures(kernels: pd.DataFrame, forecasts: pd.DataFrame, draws: int) -> dict:
    """The ranking figures of ``forecasts`` of the measured ``kernels`` (``kernelcast.surrogate.ranking.score``), the
    median of the within-problem Spearman beside its mean, and the compile failures the GPU found that the
    forecast gives 0.95 or more to fail."""
    from kernelcast.surrogate import ranking

    out = ranking.score(kernels, forecasts, draws)
    spearman = ranking.per_problem_figures(kernels, *ranking.rank_of(forecasts))["spearman"].dropna()
    out["spearman_median"] = float(spearman.median()) if len(spearman) else float("nan")
    compile_errors = (kernels["status"] == "compile_error").to_numpy()
    caught = int((forecasts["p_fail"].to_numpy(float)[compile_errors] >= 0.95).sum())
    out["measured_compile_errors_at_095"] = f"{caught}/{int(compile_errors.sum())}"
    return out


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _signed(d: dict, key: str) -> str:
    value, lo, hi = d[key], d[f"{key}_lo"], d[f"{key}_hi"]
    if not np.isfinite(value):
        return "-"
    return f"{value:+.2f} [{lo:+.2f},{hi:+.2f}]" + ("*" if lo > 0 or hi < 0 else "")


def _with_interval(r: dict, key: str) -> str:
    value = r.get(key, float("nan"))
    if not isinstance(value, float) or not np.isfinite(value):
        return "-"
    lo, hi = r.get(f"{key}_lo", float("nan")), r.get(f"{key}_hi", float("nan"))
    return f"{value:.2f} [{lo:.2f},{hi:.2f}]" if np.isfinite(lo) else f"{value:.2f}"


def figures_table(results: dict, with_measurements: bool) -> str:
    """One row a forecaster, the label baseline among them: what the issue asks of a zero-shot forecast."""
    heads = ["forecaster", "distinct forecasts (differing kernels)", "compile errors forecast >= 0.95"]
    if with_measurements:
        heads += ["problems", "Spearman median", "Spearman mean (problems)", "top-1 within 10%", "top 10% within 20%",
                  "failure AUROC", "ECE", "GPU's compile errors >= 0.95"]
    heads += ["s a forecast"]
    body = []
    for name, r in results.items():
        row = [name + (" (the baseline)" if name == BASELINE else ""), r["distinct_pairs"], r["compile_errors_at_095"]]
        if with_measurements:
            row += [str(r.get("problems", 0)), _fmt(r.get("spearman_median", float("nan"))),
                    f"{_with_interval(r, 'spearman')} ({r.get('spearman_problems', 0)})",
                    _with_interval(r, "top1_within_10pct"), _with_interval(r, "select_top10_within_20pct"),
                    _with_interval(r, "failure_auroc"), _with_interval(r, "ece"),
                    r.get("measured_compile_errors_at_095", "-")]
        row += [f"{r['forecast_seconds_per_kernel']:.3f}"]
        body.append(row)
    width = [max(len(str(x)) for x in col) for col in zip(heads, *body)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(row, width)) for row in [heads, *body])


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
    missing = table[table["kernel"] == DESIGNED_COMPILE_ERROR]
    constant = sum(g[f"{name}_expected"].nunique() < 2 for _, g in table.groupby("problem"))
    return {"distinct_pairs": f"{distinct}/{pairs}",
            "compile_errors_at_095": f"{int((missing[f'{name}_p_fail'] >= 0.95).sum())}/{len(missing)}",
            "compile_error_p_fail_min": float(missing[f"{name}_p_fail"].min()) if len(missing) else float("nan"),
            "problems_with_constant_forecast": int(constant)}


if __name__ == "__main__":
    raise SystemExit(main())
