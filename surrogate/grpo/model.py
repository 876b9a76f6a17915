"""A causal language model in this process: loaded from a local folder or a .gguf file (never from
the hub), with a trained LoRA adapter (``load_adapter``), forecasting greedily with the forecaster's
prompt and parser (``TransformersForecaster``), and scored on pairs as ``kernelcast evaluate``
scores a forecaster (``evaluate_pairs``). transformers and peft are imported inside the functions."""

from __future__ import annotations

import math
import os
import time
from typing import Sequence

import numpy as np
import pandas as pd

from kernelcast.surrogate import metrics
from kernelcast.surrogate.forecast import Forecast, ForecastRequest
from kernelcast.surrogate.grpo.answers import render_prompt
from kernelcast.surrogate.llm import build_messages, forecast_from_answer, prompt_version
from kernelcast.surrogate.pairs import requests_of


PRECISIONS = ("bf16", "fp32")


def _local_model(path: str) -> tuple[str, str | None]:
    """(folder, .gguf file name or None) of a local model folder or .gguf file; a path that does not exist is
    refused by name, and the hub is never asked."""
    if not os.path.exists(path):
        raise ValueError(f"model {path!r} does not exist; give a local model folder or .gguf file")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return (os.path.dirname(path) or ".", os.path.basename(path)) if path.endswith(".gguf") else (path, None)


def load_tokenizer(path: str):
    """The tokenizer of a local model folder or .gguf file (no weights are loaded), never from the hub."""
    from transformers import AutoTokenizer

    folder, gguf = _local_model(path)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True, **({"gguf_file": gguf} if gguf else {}))


def load_causal_lm(path: str, precision: str = "bf16"):
    """(model, tokenizer) from a local folder or a .gguf file, never from the hub; bfloat16 weights on a
    GPU unless ``precision`` is fp32. A path that does not exist is refused by name."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    folder, gguf = _local_model(path)
    import torch
    from transformers import AutoModelForCausalLM

    extra: dict = {"gguf_file": gguf} if gguf else {}
    tokenizer = load_tokenizer(path)
    dtype = torch.bfloat16 if torch.cuda.is_available() and precision == "bf16" else torch.float32
    if gguf:
        from transformers import GgufConfig

        # Dense weights, unpacked at load: LoRA trains on top of them like on any checkpoint.
        extra["quantization_config"] = GgufConfig(gguf_file=gguf, dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype, **extra)
    if gguf:
        # Nothing is left packed, so the model is an ordinary dense one; without this the trainer
        # refuses it as a GGUF-quantized model it cannot train.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_model(path: str, precision: str = "bf16"):
    """``load_causal_lm``, for a model that is prompted: its tokenizer must have a chat template."""
    model, tokenizer = load_causal_lm(path, precision)
    if not tokenizer.chat_template:
        raise ValueError(f"the tokenizer of {path} has no chat template; the forecaster's prompt is a chat")
    return model, tokenizer


def load_adapter(base: str, adapter_dir: str):
    """(model with the trained LoRA adapter, tokenizer): a checkpoint written by ``train_grpo``."""
    from peft import PeftModel

    model, tokenizer = load_model(base)
    return PeftModel.from_pretrained(model, adapter_dir), tokenizer


class TransformersForecaster:
    """Forecasts from a transformers model in this process: greedy, batched, the forecaster's prompt and parser."""

    name = "llm-transformers"

    def __init__(self, model, tokenizer, *, version: str = "", max_new_tokens: int = 96, batch_size: int = 16,
                 answer_prefix: str = ""):
        self.model = model
        self.tokenizer = tokenizer
        self.version = version or prompt_version()
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.answer_prefix = answer_prefix

    def answers(self, messages: Sequence[list[dict]]) -> list[str]:
        """The greedy answer to each chat (``answer_prefix`` included), left-padded in batches so every
        answer starts at one column."""
        import torch

        side, self.tokenizer.padding_side = self.tokenizer.padding_side, "left"
        training = self.model.training
        self.model.eval()  # a model straight out of the trainer is in training mode
        device = next(self.model.parameters()).device
        out: list[str] = []
        try:
            for i in range(0, len(messages), self.batch_size):
                texts = [render_prompt(self.tokenizer, m, self.answer_prefix) for m in messages[i:i + self.batch_size]]
                batch = self.tokenizer(texts, padding=True, return_tensors="pt").to(device)
                with torch.inference_mode():
                    ids = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, do_sample=False,
                                              temperature=None, top_p=None, top_k=None,
                                              pad_token_id=self.tokenizer.pad_token_id)
                width = batch["input_ids"].shape[1]
                out += [self.answer_prefix + a for a in self.tokenizer.batch_decode(ids[:, width:],
                                                                                    skip_special_tokens=True)]
        finally:
            self.tokenizer.padding_side = side
            self.model.train(training)
        return out

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        if not requests:
            return []
        start = time.perf_counter()
        answers = self.answers([build_messages(r) for r in requests])
        latency_s = (time.perf_counter() - start) / len(requests)
        return [forecast_from_answer(r, a, self.name, self.version, latency_s=latency_s)
                for r, a in zip(requests, answers)]


def evaluate_pairs(forecaster, pairs: pd.DataFrame) -> dict[str, float]:
    """``kernelcast evaluate``'s metrics of ``forecaster`` on pair rows; rankings are within one
    (op, cases, GPU type, anchor), where the measured speedups share a denominator.

    Pairs that hold failures (true bin 0, an LLM corpus) are scored over bins 0..8 with the
    failure-aware yardsticks (``metrics.outcome_summary``: failure AUROC, Spearman over the
    kernels that ran, ...) and Brier, CRPS, NLL over the 9 outcomes; a forecast that says nothing
    of failure counts as P(fail) 0, as in the rewards."""
    if pairs.empty:
        raise ValueError("no pairs to evaluate on")
    start = time.perf_counter()
    forecasts = forecaster.forecast(requests_of(pairs))
    seconds = time.perf_counter() - start
    speed = {"forecasts_per_second": len(forecasts) / seconds if seconds > 0 else math.nan}
    probs, true_bins = np.array([f.probabilities for f in forecasts]), pairs["true_bin"].to_numpy()
    parsed, expected = [f.parsed for f in forecasts], [f.expected_speedup for f in forecasts]
    if (true_bins == 0).any():
        p_fail = np.nan_to_num([f.failure_probability for f in forecasts], nan=0.0)
        outcome_probs = metrics.with_failure(probs, p_fail)
        out = metrics.outcome_summary(outcome_probs, true_bins, expected, pairs["speedup"].to_numpy())
        return {**out, "brier": metrics.brier(outcome_probs, true_bins),
                "crps": metrics.ordinal_crps(outcome_probs, true_bins), "nll": metrics.nll(outcome_probs, true_bins),
                "sharpness": metrics.sharpness(outcome_probs), "parse_rate": metrics.parse_rate(parsed), **speed}
    cases = pairs["case_names"].map(",".join)
    groups = (pairs["op"] + "/" + cases + "/" + pairs["gpu_type"] + "/" + pairs["anchor_id"]).to_numpy()
    out = metrics.summary(probs, true_bins, pairs["speedup"].to_numpy(), groups, parsed=parsed, expected=expected)
    return {**out, **speed}
