"""lmhead forecaster throughput: (anchor, candidate) source pairs in, calibrated Forecasts out.

    python benchmarks/lmhead_throughput.py --folder DIR [--model MODEL] [--batch 8,32] [--repeats 5]
    python benchmarks/lmhead_throughput.py --model Qwen2.5-Coder-0.5B.gguf      # freshly initialised heads

With ``--folder`` it reads a trained folder (``python -m kernelcast.surrogate.lmhead train``); with only
``--model`` it builds the network with a fresh adapter and heads (the same arithmetic, untrained
answers). The requests are the kernels of the LLM corpus (``--data``) against their anchors, as a
search forecasts written children. For each batch size it times ``forecast`` over ``--requests``
requests ``--repeats`` times after one warm-up pass, each time reading every pair (the outputs the
forecaster keeps for pairs it has read are dropped first; CUDA is synchronised before each clock reading)
and prints the median forecasts per second, with the device, the precision and the mean tokens of a
pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default="", help="a trained lmhead folder")
    p.add_argument("--model", default="", help="the base model (a folder or .gguf); with --folder, replaces its path")
    p.add_argument("--data", default="data/pools/llm", help="measured kernels the requests are drawn from")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--batch", default="8,32", help="comma-separated batch sizes")
    p.add_argument("--max-tokens", type=int, default=1024, help="without --folder: tokens of one pair")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not (args.folder or args.model):
        p.error("give --folder (a trained lmhead folder) or --model (fresh heads on that model)")

    import torch

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import source_pairs, source_requests
    from kernelcast.surrogate.lmhead.model import Calibration, HeadConfig, LMHeadForecaster, PairModel

    if args.folder:
        forecaster = LMHeadForecaster.load(args.folder, model=args.model, device=args.device)
    else:
        net = PairModel(HeadConfig(model=args.model, max_tokens=args.max_tokens), args.device)
        forecaster = LMHeadForecaster.of(net, Calibration(), steps=0)
    rows = source_pairs(DataRoot(args.data), gpu_type=args.gpu_type)
    requests = source_requests(rows.head(args.requests))
    net = forecaster.net_
    tokens = statistics.mean(len(net.pair_ids(r.anchor.source, r.candidate.source)) for r in requests)
    cuda = net.device.startswith("cuda")
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "dtype": str(next(net.lm.parameters()).dtype), "model": forecaster.config_.model,
              "max_tokens": forecaster.config_.max_tokens, "mean_tokens_per_pair": round(tokens, 1),
              "requests": len(requests), "trained": bool(args.folder), "batches": {}}
    for batch in (int(b) for b in args.batch.split(",")):
        forecaster.batch_size = batch
        forecaster.forecast(requests[:batch])  # warm-up: kernels chosen, memory allocated
        rates = []
        for _ in range(args.repeats):
            forecaster.forget()  # every pair read by the model, not answered from what it kept
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            n = len(forecaster.forecast(requests))
            if cuda:
                torch.cuda.synchronize()
            rates.append(n / (time.perf_counter() - t0))
        result["batches"][batch] = {"median_forecasts_per_s": round(statistics.median(rates), 2),
                                    "min": round(min(rates), 2), "max": round(max(rates), 2)}
        print(f"batch {batch:>4}: median {statistics.median(rates):.1f} forecasts/s "
              f"(min {min(rates):.1f}, max {max(rates):.1f}, {args.repeats} repeats of {len(requests)})")
    print(f"{result['device']}, {result['dtype']}, {result['mean_tokens_per_pair']} tokens per pair "
          f"(max {result['max_tokens']}), {'trained' if args.folder else 'fresh'} heads on {result['model']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
