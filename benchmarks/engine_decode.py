"""Time one decode step of a 1.5B-sized model two ways: transformers' own cache and attention, and the slots.

The engine's throughput is set by its decode step: every busy row gets one token per
forward. This builds a random-weight model with Qwen2.5-Coder-1.5B's shape (no weights need
to travel), fills a cache of ``--rows`` prompts of ``--prompt`` tokens, and times ``--steps``
decode steps:

* ``dynamic``: transformers' ``DynamicCache`` (grows by concatenation) with its SDPA
  attention and a padding mask, as the engine decoded before the slots;
* ``slots``: ``kernelcast.infra.slots.SlotCache`` and ``slot_attention``, as the engine decodes now;

and the engine's ``sample`` on the step's logits. A ``torch.profiler`` table of one slot
step names where its time goes.

    python benchmarks/engine_decode.py --rows 256 --prompt 1500 --steps 20 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernelcast.infra import slots  # noqa: E402
from kernelcast.infra.engine import sample  # noqa: E402

QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                 tie_word_embeddings=True)


def random_model(device: str, attention: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**QWEN_1_5B, attn_implementation=attention)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    return model


def timed(fn, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


@torch.inference_mode()
def dynamic_steps(model, rows: int, prompt: int, steps: int) -> list[float]:
    from transformers import DynamicCache

    ids = torch.randint(0, 150000, (rows, prompt), device="cuda")
    mask = torch.ones_like(ids)
    mask[:, : prompt // 4] = torch.rand(rows, 1, device="cuda") > 0.5  # some rows left-padded
    cache = DynamicCache(config=model.config)
    for lo in range(0, rows, 8):
        part = DynamicCache(config=model.config)
        model(input_ids=ids[lo:lo + 8], attention_mask=mask[lo:lo + 8], past_key_values=part, use_cache=True,
              logits_to_keep=1)
        for i, layer in enumerate(part.layers):
            if lo == 0:
                cache.update(layer.keys, layer.values, i)
            else:
                cache.layers[i].keys = torch.cat([cache.layers[i].keys, layer.keys])
                cache.layers[i].values = torch.cat([cache.layers[i].values, layer.values])
    state = {"mask": mask, "position": mask.sum(-1, keepdim=True)}
    tokens = torch.randint(0, 150000, (rows, 1), device="cuda")

    def step():
        state["mask"] = torch.cat([state["mask"], state["mask"].new_ones((rows, 1))], dim=1)
        model(input_ids=tokens, attention_mask=state["mask"], position_ids=state["position"], past_key_values=cache,
              use_cache=True)
        state["position"] = state["position"] + 1

    return timed(step, steps)


@torch.inference_mode()
def slot_steps(model, rows: int, prompt: int, steps: int, profile: bool) -> tuple[list[float], str]:
    slots.register(model)
    cache = slots.SlotCache(model.config, rows, prompt + steps + 8, device="cuda", dtype=torch.bfloat16)
    lengths = torch.randint(prompt // 2, prompt, (rows,), device="cuda")  # rows of different lengths
    tokens = torch.randint(0, 150000, (rows, 1), device="cuda")

    def step():
        mask = cache.decoding(lengths, rows)
        model(input_ids=tokens, attention_mask=slots.masks(model, mask), position_ids=lengths[:, None],
              past_key_values=cache, use_cache=True, logits_to_keep=1)
        lengths.add_(1)

    times = timed(step, steps)
    table = ""
    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    return times, table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--prompt", type=int, default=1500, help="tokens already in each row's cache")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no GPU: this benchmark times GPU decode steps", file=sys.stderr)
        return 2
    figures = {"rows": args.rows, "prompt": args.prompt, "steps": args.steps, "device": torch.cuda.get_device_name(),
               "torch": torch.__version__}
    import transformers

    figures["transformers"] = transformers.__version__
    model = random_model("cuda", "sdpa")
    figures["dynamic_step_s"] = statistics.median(dynamic_steps(model, args.rows, args.prompt, args.steps))
    torch.cuda.empty_cache()
    times, table = slot_steps(model, args.rows, args.prompt, args.steps, profile=True)
    figures["slots_step_s"] = statistics.median(times)
    logits = torch.randn(args.rows, QWEN_1_5B["vocab_size"], device="cuda", dtype=torch.bfloat16)
    temperature = torch.full((args.rows,), 0.8, device="cuda")
    top_p = torch.full((args.rows,), 0.95, device="cuda")
    figures["sample_s"] = statistics.median(timed(
        lambda: sample(logits, temperature, top_p, torch.rand(args.rows, device="cuda")).tolist(), args.steps))
    figures["speedup"] = figures["dynamic_step_s"] / figures["slots_step_s"]
    print(table)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**figures, "profile": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
