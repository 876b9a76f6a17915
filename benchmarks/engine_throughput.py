"""Generation throughput of an OpenAI-compatible server on kernel-writing requests: kernels per minute.

    python benchmarks/engine_throughput.py --url http://127.0.0.1:8000/v1 --requests 256 \\
        --concurrency 256 --max-tokens 400 [--json out.json]

Each request is what the free-form generator sends: a system prompt, a Triton row-softmax
kernel (the one-tile template of ``kernels/ops/softmax.py``, read as text) and "write a
faster variant", each naming one optimisation to try and carrying its own seed. All go
out ``--concurrency`` at a time; the clock runs from the first request sent to the last
answer received. Prints completed kernels per minute, completion tokens per second,
latency percentiles, the mean reply length and how many replies hold a code block, and
the server's batch sizes where it reports them (``GET /stats`` on ``kernelcast.infra.engine``).

Only the standard library is used, so it runs on a machine that has nothing else
installed (a GPU box serving ``python -m kernelcast.infra.engine``), against any server: the
engine, vLLM, llama.cpp.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "kernels" / "ops" / "softmax.py"
SYSTEM = ("You are an expert GPU kernel engineer. You improve Triton and PyTorch kernels for speed on "
          "NVIDIA GPUs while keeping their results correct.")
IDEAS = ("process several rows per program", "use a persistent grid sized to the SMs",
         "tune num_warps to the row length", "keep the row in registers and read it once",
         "use an online max-and-sum in one pass", "vectorise the loads and stores",
         "cut the masking work for full tiles", "store the result in the input dtype directly")


def kernel_source(path: Path = SOURCE) -> str:
    """The one-tile softmax kernel as a user would see it: the module's prelude plus its first template.

    Read with ``ast`` from the module's text (never imported: this script needs no torch or triton);
    a file of another shape is taken whole.
    """
    text = path.read_text()
    strings = [node.value for stmt in ast.parse(text).body if isinstance(stmt, ast.Assign)
               for node in ast.walk(stmt.value) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    prelude = next((s for s in strings if "import triton" in s), "")
    kernel = next((s for s in strings if "@triton.jit" in s), None)
    return text if kernel is None else (prelude + kernel).strip() + "\n"


def messages(source: str, i: int) -> list[dict[str, str]]:
    """The i-th request's chat: the kernel, its measured speed, and one idea to try."""
    user = ("## Task\n`softmax`: row softmax over the last dimension of an (M, N) matrix. "
            "Cases: float32 8192x4096, bfloat16 32768x1000, bfloat16 4096x8192.\n\n"
            f"## Current kernel: measured speedup 1.00x over torch.softmax\n```python\n{source}```\n\n"
            f"## Answer\nWrite a faster kernel that computes the same result; try this: {IDEAS[i % len(IDEAS)]}. "
            "Keep `launch(x, out, ...)` with the same signature. Reply with the complete file in one "
            "```python code block.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _get(url: str, timeout_s: float):
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def one_request(url: str, body: dict, timeout_s: float) -> dict:
    """Send one chat completion; its latency, token counts and finish reason, or the error."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as e:
        return {"ok": False, "error": f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}",
                "latency_s": time.perf_counter() - start}
    except (urllib.error.URLError, OSError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "latency_s": time.perf_counter() - start}
    choice = answer["choices"][0]
    text = choice["message"]["content"] or ""
    return {"ok": True, "latency_s": time.perf_counter() - start,
            "prompt_tokens": answer["usage"]["prompt_tokens"],
            "completion_tokens": answer["usage"]["completion_tokens"],
            "finish_reason": choice["finish_reason"], "code_block": "```" in text,
            "batch_size": answer.get("engine", {}).get("batch_size")}


def run(url: str, model: str, *, requests: int, concurrency: int, max_tokens: int, temperature: float,
        seed: int, timeout_s: float, source: str) -> dict:
    """Send ``requests`` kernel-writing requests ``concurrency`` at a time; the figures of the run."""
    bodies = [{"model": model, "messages": messages(source, i), "max_tokens": max_tokens,
               "temperature": temperature, "seed": seed + i} for i in range(requests)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda body: one_request(url, body, timeout_s), bodies))
    wall_s = time.perf_counter() - start
    done = [r for r in results if r["ok"]]
    latencies = sorted(r["latency_s"] for r in done)
    completion_tokens = sum(r["completion_tokens"] for r in done)
    return {
        "requests": requests, "concurrency": concurrency, "max_tokens": max_tokens, "temperature": temperature,
        "completed": len(done), "failed": len(results) - len(done),
        "errors": sorted({r["error"] for r in results if not r["ok"]})[:5],
        "wall_s": round(wall_s, 3),
        "kernels_per_minute": round(60 * len(done) / wall_s, 2),
        "completion_tokens_per_s": round(completion_tokens / wall_s, 1),
        "completion_tokens_mean": round(completion_tokens / len(done), 1) if done else 0.0,
        "prompt_tokens_mean": round(statistics.fmean(r["prompt_tokens"] for r in done), 1) if done else 0.0,
        "latency_s_median": round(statistics.median(latencies), 3) if done else None,
        "latency_s_p90": round(latencies[int(0.9 * (len(latencies) - 1))], 3) if done else None,
        "finished_by_length": sum(r["finish_reason"] == "length" for r in done),
        "with_code_block": sum(r["code_block"] for r in done),
        "batch_sizes_seen": sorted({r["batch_size"] for r in done if r.get("batch_size")}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's base URL, ending in /v1")
    p.add_argument("--model", default=None, help="model id to ask for (default: the first that /models lists)")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="requests sent (and not counted) before the run")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one request may take")
    p.add_argument("--source", type=Path, default=SOURCE, help="the kernel file to put in the prompt")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    url = args.url.rstrip("/")
    try:
        listed = _get(f"{url}/models", 30.0)
    except (urllib.error.URLError, OSError) as e:
        raise SystemExit(f"the server at {url} does not answer GET /models: {e}") from None
    model = args.model or listed["data"][0]["id"]
    source = kernel_source(args.source)
    for i in range(args.warmup):
        warm = one_request(url, {"model": model, "messages": messages(source, i), "max_tokens": 16,
                                 "temperature": 0.0}, args.timeout)
        if not warm["ok"]:
            raise SystemExit(f"the warm-up request failed: {warm['error']}")
    figures = run(url, model, requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens,
                  temperature=args.temperature, seed=args.seed, timeout_s=args.timeout, source=source)
    try:
        figures["server_stats"] = _get(f"{url.removesuffix('/v1')}/stats", 10.0)
    except (urllib.error.URLError, OSError, ValueError):
        figures["server_stats"] = None  # vLLM and llama.cpp have no /stats
    figures.update(url=url, model=model)
    print(f"{figures['completed']}/{args.requests} kernels in {figures['wall_s']:.1f} s: "
          f"{figures['kernels_per_minute']:.1f} kernels/min, {figures['completion_tokens_per_s']:.1f} "
          f"completion tokens/s; {figures['completion_tokens_mean']:.0f} tokens a kernel on average "
          f"({figures['finished_by_length']} cut at max_tokens, {figures['with_code_block']} with a code block); "
          f"latency median {figures['latency_s_median']} s, p90 {figures['latency_s_p90']} s; "
          f"prompt {figures['prompt_tokens_mean']:.0f} tokens")
    if figures["failed"]:
        print(f"{figures['failed']} failed: {figures['errors']}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if figures["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
