"""A code language model's reading of every (reference, implementation) pair of the CUDA-L1 pool, stored for
``benchmarks/cudal1_forecast.py --embeddings``: the gradient-boosted forecasters with those vectors among their
features (``kernelcast.surrogate.embeddings``).

    PYTHONPATH=$PWD python benchmarks/cudal1_embed.py --model qwen2.5-coder-0.5b.gguf --out embeddings.parquet \
        [--pool data/pools/cudal1] [--spaces data/pools/compiled ...] [--max-tokens 2048] [--batch 8]

Reads the pool as ``cudal1_forecast.py`` does (the same ``--pool``, ``--protocol``, ``--gpu-type`` and
``--spaces``), and also ``--also-data`` roots, so that a forecaster trained on them finds their vectors too.
Each distinct pair is read once, by the model with an untrained adapter (its base weights), on a GPU when
there is one. Writes the table (key, op, candidate_id, vector) and, beside it, a JSON of what made it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cudal1_forecast  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a local .gguf file or model folder (nothing is downloaded)")
    p.add_argument("--out", required=True, help="the Parquet table to write")
    p.add_argument("--pool", default="data/pools/cudal1")
    p.add_argument("--protocol", default="kernelcast", choices=cudal1_forecast.PROTOCOLS)
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--spaces", action="append", default=[])
    p.add_argument("--also-data", action="append", default=[])
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens of one pair, both kernels")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="", help="cuda, cpu (default: CUDA when available)")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"), help="the decoder's weights on a GPU")
    return p.parse_args(argv)


def _sha256(path: str) -> str:
    if Path(path).is_dir():
        return ""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def run(args) -> int:
    from kernelcast.surrogate.embeddings import embed_pairs, pair_key, write_table

    kernels, _ = cudal1_forecast._measured(args)
    also, _ = cudal1_forecast._also(args)
    frames = [kernels[["op", "candidate_id", "anchor_source", "source"]]]
    if also is not None:
        frames.append(also[["op", "candidate_id", "anchor_source", "source"]])
    rows = pd.concat(frames, ignore_index=True)
    rows["key"] = [pair_key(a, c) for a, c in zip(rows["anchor_source"], rows["source"])]
    rows = rows.drop_duplicates("key").reset_index(drop=True)
    print(f"{len(rows)} distinct pairs of {rows['op'].nunique()} problems to read with {args.model}", flush=True)
    t0 = time.perf_counter()
    pairs = list(zip(rows["anchor_source"], rows["source"]))
    vectors = embed_pairs(pairs, args.model, args.max_tokens, args.device, args.batch, args.precision)
    seconds = time.perf_counter() - t0
    written = write_table(args.out, rows["op"], rows["candidate_id"], pairs, vectors)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    meta = {"model": args.model, "model_sha256": _sha256(args.model), "pairs": written, "width": int(vectors.shape[1]),
            "max_tokens": args.max_tokens, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "precision": args.precision if device == "cuda" else "fp32", "seconds": round(seconds, 1),
            "pool": args.pool, "spaces": args.spaces, "also_data": args.also_data,
            "made_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    Path(args.out).with_suffix(".json").write_text(json.dumps(meta, indent=1))
    print(f"{written} vectors of width {vectors.shape[1]} in {seconds:.0f} s ({written / max(seconds, 1e-9):.1f} a "
          f"second) -> {args.out}", flush=True)
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    return cudal1_forecast.with_pool_tasks(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
