"""What the lmhead forecaster reads of the CUDA-L1 pool's pairs, and how far its forecasts spread within a problem.

    PYTHONPATH=$PWD python benchmarks/lmhead_reading.py --model MODEL.gguf [--problems dev] [--spaces FOLDER ...] \\
        [--max-tokens 1024,2048,4096] [--forecasts DIR ...]

Per ``--max-tokens``, with the model's own tokenizer and the pair's cut (``kernelcast.surrogate.lmhead.model.kept_tokens``):
the share of (anchor, candidate) pairs read whole, the share of the candidate read (median, 10th percentile),
and the problems where two kernels read alike (the kept tokens the same). Per stored forecasts folder
(``cudal1_lmhead.py``'s): the within-problem spread of the forecast log speedup against the measured one
(standard deviation over a problem's kernels that ran, median over problems). Needs transformers and gguf for
the tokenizer only (no weights are loaded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cudal1_forecast import (_measured, add_pool_arguments, development_split,  # noqa: E402
                                        with_pool_tasks)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pool_arguments(p)
    p.add_argument("--model", required=True, help="a local model folder or .gguf file (its tokenizer is read)")
    p.add_argument("--max-tokens", default="1024,2048,4096")
    p.add_argument("--forecasts", action="append", default=[], metavar="DIR",
                   help="a folder of forecasts-*.parquet (cudal1_lmhead.py --out): their within-problem spread")
    p.add_argument("--json", default="")
    return p.parse_args(argv)


def reading(kernels: pd.DataFrame, lengths: dict, headers: int, max_tokens: int) -> dict:
    """What a pair cut to ``max_tokens`` keeps, over ``kernels`` (op, anchor_source, source)."""
    from kernelcast.surrogate.lmhead.model import kept_tokens

    a = kernels["anchor_source"].map(lengths).to_numpy()
    c = kernels["source"].map(lengths).to_numpy()
    kept = np.array([kept_tokens(x, y, max_tokens - headers) for x, y in zip(a, c)])
    whole = (kept[:, 0] == a) & (kept[:, 1] == c)
    share = kept[:, 1] / np.maximum(c, 1)
    return {"max_tokens": max_tokens, "pairs": len(kernels), "read_whole": float(whole.mean()),
            "candidate_read_median": float(np.median(share)), "candidate_read_p10": float(np.percentile(share, 10)),
            "kept_candidate_tokens": kept[:, 1]}


def alike(kernels: pd.DataFrame, ids: dict, kept: np.ndarray) -> int:
    """Problems where two kernels keep the same candidate tokens (the anchor is the problem's own)."""
    seen = kernels.assign(key=[tuple(ids[s][:k]) for s, k in zip(kernels["source"], kept)])
    return int(seen.groupby("op")["key"].agg(lambda k: k.duplicated().any()).sum())


def spread(kernels: pd.DataFrame, folder: str) -> dict:
    """Median over problems of the standard deviation of forecast and measured log speedup (kernels that ran)."""
    table = pd.concat([pd.read_parquet(f) for f in sorted(Path(folder).glob("forecasts-*.parquet"))])
    if table.empty:
        raise ValueError(f"--forecasts {folder}: no forecasts-*.parquet there")
    both = kernels.merge(table[["op", "candidate_id", "expected"]], on=["op", "candidate_id"])
    ran = both[~both["failed"] & (both["speedup"] > 0)]
    by = ran.assign(f=np.log(ran["expected"]), t=np.log(ran["speedup"])).groupby("op")
    sd = by.agg(f=("f", "std"), t=("t", "std"), n=("f", "size"))
    sd = sd[sd["n"] >= 2]
    return {"forecasts": folder, "problems": int(len(sd)), "forecast_sd_median": float(sd["f"].median()),
            "measured_sd_median": float(sd["t"].median()), "ratio_median": float((sd["f"] / sd["t"]).median())}


def run(args) -> int:
    from kernelcast.surrogate.grpo.model import load_tokenizer
    from kernelcast.surrogate.lmhead.model import header_tokens

    kernels, _ = _measured(args)
    development, sealed = development_split(kernels)
    if args.problems == "dev":
        kernels = development
    elif args.problems == "sealed":
        kernels = kernels[kernels["op"].isin(sealed)].reset_index(drop=True)
    tokenizer = load_tokenizer(args.model)
    texts = set(kernels["anchor_source"]) | set(kernels["source"])
    ids = {t: tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts}
    lengths = {t: len(i) for t, i in ids.items()}
    headers = header_tokens(tokenizer)
    a, c = kernels["anchor_source"].map(lengths), kernels["source"].map(lengths)
    out = {"pool": args.pool, "problems": args.problems, "n_problems": int(kernels["op"].nunique()),
           "pairs": len(kernels), "anchor_tokens_median": float(a.median()), "candidate_tokens_median": float(c.median()),
           "pair_tokens_median": float((a + c).median()), "pair_tokens_p90": float((a + c).quantile(0.9)),
           "cuts": [], "spread": [spread(kernels, f) for f in args.forecasts]}
    print(f"{out['n_problems']} problems, {len(kernels)} pairs: tokens a pair median {out['pair_tokens_median']:.0f} "
          f"(anchor {out['anchor_tokens_median']:.0f}, candidate {out['candidate_tokens_median']:.0f}), 90th "
          f"percentile {out['pair_tokens_p90']:.0f}")
    for m in (int(x) for x in args.max_tokens.split(",")):
        cut = reading(kernels, lengths, headers, m)
        cut["problems_reading_two_alike"] = alike(kernels, ids, cut.pop("kept_candidate_tokens"))
        out["cuts"].append(cut)
        print(f"  {m:>5} tokens: pairs read whole {cut['read_whole']:.2f}; candidate read median "
              f"{cut['candidate_read_median']:.2f}, 10th percentile {cut['candidate_read_p10']:.2f}; problems "
              f"with two kernels read alike {cut['problems_reading_two_alike']}")
    for s in out["spread"]:
        print(f"  {s['forecasts']}: within-problem sd of log speedup, forecast {s['forecast_sd_median']:.3f} against "
              f"measured {s['measured_sd_median']:.3f} (median ratio {s['ratio_median']:.2f}, {s['problems']} problems)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    return with_pool_tasks(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
