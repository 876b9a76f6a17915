"""GRPO training of an LLM surrogate with calibration-shaped rewards (TRL's GRPOTrainer, LoRA via peft).

The model answers the forecaster's own prompt (``surrogate.llm.build_messages``) for each
training pair, ``num_generations`` times; each answer is parsed by the forecaster's own
parser and scored against the pair's true bin:

- ``correctness``: 1 when the most probable outcome is the true bin, else 0;
- ``brier``: correctness + (1 - Brier score of the outcome probabilities);
- ``crps``: correctness + (1 - ordinal CRPS of the outcome probabilities).

The outcomes are bins 0..8, failure (bin 0) first (``outcomes``): pairs from an LLM corpus hold
children that failed, and saying which fail is half the forecaster's job. On a pair that ran,
an answer with P(fail) 0 scores as it would over the 8 speed bins alone (CRPS spread over 8
steps rather than 7).

Brier and CRPS are ``surrogate.metrics``'s definitions, so training optimises what
``kernelcast evaluate`` reports. An answer that does not parse scores 0 on those terms and
``PARSE_FAILURE`` on one more (``parse_failure``), so it scores below every parsed answer under
every reward: the worst parsed answer, confident and wrong, scores -1 under ``brier``, and a
failure scoring 0 had taught a model to stop answering (measured: docs/grpo.md).
Answers open with ``{"failure": `` already in place (``answer_prefix``), as a server
decoding under the forecaster's JSON schema forces them (failure first, then the eight
bins given that the kernel runs): a small model then learns the numbers, not the format,
reads in training what it reads when served, and states a failure probability in every
answer.
Correctness alone rewards a confident guess as much as a calibrated one; the calibration
terms pay for probability mass near the truth.

GRPO learns only from groups whose answers score differently. A model that never answers in
the format scores 0 on every answer of every group and learns nothing (measured: SmolLM2-135M-
Instruct on an H100, parse rate 0, every group with zero reward variance for 15 steps). An
optional supervised warm-up (``sft_steps``) first fine-tunes the same LoRA adapter on training
pairs towards well-formed answers (``sft_target``: the forecaster's JSON, a low failure
probability and a smoothed distribution around the true bin for a kernel that ran, a high
one and flat bins for one that failed), then GRPO continues from it.

Before and after training (and after the warm-up, when there is one), the model forecasts
held-out operations greedily (as a search would) and is scored with ``surrogate.metrics.summary``. The LoRA adapter is written under
``out_dir``; metrics go to ``out_dir/metrics.jsonl`` and, with a tracking URI, to MLflow
through the ``storage.tracking.Tracker`` the caller passes (``tasks.setup.grpo_tracker``), together with the adapter. transformers, trl, peft and
datasets are imported only here (the ``train`` extra): the core runs without them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from surrogate import metrics
from surrogate.forecast import Forecast, ForecastRequest
from surrogate.llm import AnswerError, build_messages, forecast_from_answer, parse_answer, prompt_version
from surrogate.pairs import request_of, requests_of

ADAPTER_FOLDER = "adapter"


# How a schema-constrained answer opens. A server that decodes under ANSWER_SCHEMA (vLLM, llama.cpp)
# forces these tokens, so a model trained and evaluated after them reads what it reads when served.
ANSWER_OPENING = '{"failure": '


def _text(completion) -> str:
    """A completion's text: TRL passes chat completions as a list of messages, plain ones as text."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion


def outcomes(text: str) -> np.ndarray:
    """(1, 9) probabilities of bins 0..8 in an answer (``metrics.with_failure``): P(fail), then the 8
    speed bins scaled by P(runs), read by the forecaster's own parser. An answer that names no
    failure says the kernel runs (P(fail) 0), so it earns nothing on a failed pair's bin 0.
    ``AnswerError`` when the answer does not parse."""
    answer = parse_answer(text)
    failure = 0.0 if math.isnan(answer.failure) else answer.failure
    return metrics.with_failure([answer.probabilities], [failure])


def _parsed(completions, prefixes) -> list[np.ndarray | None]:
    """The (1, 9) ``outcomes`` of each answer (its prefix, then the completion), or None where it does not parse."""
    out = []
    for completion, prefix in zip(completions, prefixes or [""] * len(completions)):
        try:
            out.append(outcomes((prefix or "") + _text(completion)))
        except AnswerError:
            out.append(None)
    return out


# How each reward term scores one parsed answer, given as (1, 9) ``outcomes``, against its true bin 0..8.
SCORES = {
    "correctness": lambda p, b: metrics.bin_accuracy(p, [b]),  # the most probable outcome is the true bin
    "one_minus_brier": lambda p, b: 1.0 - metrics.brier(p, [b]),  # in [-1, 1]
    "one_minus_crps": lambda p, b: 1.0 - metrics.ordinal_crps(p, [b]),  # over the ordered outcomes, failure lowest
    "parse_failure": lambda p, b: 0.0,
}


def _scored(term: str, completions, true_bin, answer_prefix) -> list[float]:
    score = SCORES[term]
    return [0.0 if p is None else score(p, int(b)) for p, b in zip(_parsed(completions, answer_prefix), true_bin)]


def correctness(completions, true_bin, answer_prefix=None, **_) -> list[float]:
    """1.0 where the answer's most probable outcome (failure, or one of the 8 bins) is the true bin
    (0..8); 0.0 otherwise or unparsed."""
    return _scored("correctness", completions, true_bin, answer_prefix)


def one_minus_brier(completions, true_bin, answer_prefix=None, **_) -> list[float]:
    """1 - Brier score of the parsed answer over the 9 outcomes (in [-1, 1]); 0.0 when unparsed."""
    return _scored("one_minus_brier", completions, true_bin, answer_prefix)


def one_minus_crps(completions, true_bin, answer_prefix=None, **_) -> list[float]:
    """1 - ordinal CRPS of the parsed answer over the 9 ordered outcomes, failure the lowest (in
    [0, 1]); 0.0 when unparsed."""
    return _scored("one_minus_crps", completions, true_bin, answer_prefix)


PARSE_FAILURE = -2.0  # below the lowest parsed total of every reward (-1: brier's confident and wrong)


def parse_failure(completions, true_bin, answer_prefix=None, **_) -> list[float]:
    """``PARSE_FAILURE`` where the answer does not parse, 0.0 where it does."""
    return [PARSE_FAILURE if p is None else 0.0 for p in _parsed(completions, answer_prefix)]


# Each reward is a sum of terms; TRL logs each term as rewards/<term>/mean and their sum as reward.
REWARDS = {"correctness": (correctness, parse_failure), "brier": (correctness, one_minus_brier, parse_failure),
           "crps": (correctness, one_minus_crps, parse_failure)}


def _known(name: str) -> None:
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known: {', '.join(REWARDS)}")


def reward(name: str, completions, true_bin, answer_prefix: str = "") -> list[float]:
    """The summed reward ``name`` of each completion (read after ``answer_prefix``)."""
    _known(name)
    prefixes = [answer_prefix] * len(completions)
    terms = [fn(completions, true_bin, answer_prefix=prefixes) for fn in REWARDS[name]]
    return [float(sum(t)) for t in zip(*terms)]


def outcome_reward(name: str, outcome_probs, true_bins) -> list[float]:
    """The summed reward ``name`` of parsed answers given as (n, 9) probabilities of bins 0..8
    (``metrics.with_failure``), as ``reward`` scores the answers it parses."""
    _known(name)
    probs = np.asarray(outcome_probs, dtype=float)
    return [float(sum(SCORES[fn.__name__](p[None, :], int(b)) for fn in REWARDS[name]))
            for p, b in zip(probs, true_bins)]


def render_prompt(tokenizer, messages: list[dict], answer_prefix: str = "") -> str:
    """The text the model reads: the forecaster's messages through the model's chat template, the
    assistant turn opened, then ``answer_prefix``. Trainer and evaluation tokenize this same text."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]  # the tokenizer adds it again when it encodes the text
    return text + answer_prefix


# Warm-up targets: this much probability on the true bin, the rest over the other bins by
# 2^-distance from it, in hundredths (so that the printed numbers sum to exactly 1).
SFT_TRUE_MASS = 0.65


def hundredths(weights: Sequence[float]) -> list[float]:
    """``weights`` normalised and rounded to hundredths that sum to exactly 1, by largest remainder
    (ties to the earlier entry)."""
    total = float(sum(weights))
    if not total > 0 or min(weights) < 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    shares = [100 * w / total for w in weights]
    cents = [math.floor(x) for x in shares]
    for i in sorted(range(len(shares)), key=lambda i: (-(shares[i] - cents[i]), i))[:100 - sum(cents)]:
        cents[i] += 1
    return [c / 100 for c in cents]


def sft_probabilities(true_bin: int, n_bins: int = 8, true_mass: float = SFT_TRUE_MASS) -> list[float]:
    """A smoothed distribution centred on ``true_bin`` (1-based), in hundredths summing to 1:
    ``true_mass`` on it, the rest split by 2^-distance."""
    if not 1 <= true_bin <= n_bins:
        raise ValueError(f"true_bin must lie in 1..{n_bins}, got {true_bin}")
    true_mass = round(true_mass, 2)  # exactly this much, in hundredths, on the true bin
    others = {b: 2.0 ** -abs(b - true_bin) for b in range(1, n_bins + 1) if b != true_bin}
    rest = (1 - true_mass) / sum(others.values())
    return hundredths([true_mass if b == true_bin else rest * others[b] for b in range(1, n_bins + 1)])


# Warm-up failure probabilities: what a kernel that failed (true bin 0) and one that ran are taught to say.
SFT_FAILED, SFT_RAN = 0.90, 0.05
# The bins of a kernel that failed say nothing (given that it runs): flat, in hundredths summing to 1.
SFT_FLAT = (0.13, 0.13, 0.12, 0.12, 0.13, 0.13, 0.12, 0.12)


# With a random generator, the warm-up's numbers are drawn from these ranges instead: failure
# probability of a child that failed / ran, and the mass on a running child's true bin; with these the
# most probable of the nine outcomes is always the true one.
SFT_FAILED_RANGE, SFT_RAN_RANGE, SFT_TRUE_MASS_RANGE = (0.55, 0.95), (0.02, 0.2), (0.35, 0.85)


def sft_target(true_bin: int, answer_prefix: str = "", rng: np.random.Generator | None = None) -> str:
    """The warm-up's completion for a pair, minus ``answer_prefix`` (which the prompt already ends with):
    the forecaster's answer JSON, failure first. A pair that ran (bin 1..8): failure ``SFT_RAN`` and
    ``sft_probabilities``; one that failed (bin 0): failure ``SFT_FAILED`` and flat bins.

    With ``rng``, the numbers are drawn around that shape (``SFT_*_RANGE``; a failed child's bins
    from a flat Dirichlet): the model learns the format and the direction without learning one
    fixed answer. Fixed targets made a 0.5B model answer the same text to every prompt, so all
    the answers of a GRPO group were alike and scored alike, and correctness alone never moved it."""
    true_bin = int(true_bin)
    if rng is None:
        failure, probabilities = (SFT_FAILED, SFT_FLAT) if true_bin == 0 else (SFT_RAN, sft_probabilities(true_bin))
    elif true_bin == 0:
        failure, probabilities = rng.uniform(*SFT_FAILED_RANGE), hundredths(rng.dirichlet(np.full(8, 4.0)))
    else:
        failure = rng.uniform(*SFT_RAN_RANGE)
        probabilities = sft_probabilities(true_bin, true_mass=rng.uniform(*SFT_TRUE_MASS_RANGE))
    answer = (f'{{"failure": {failure:.2f}, "probabilities": ['
              + ", ".join(f"{p:.2f}" for p in probabilities) + "]}")
    if not answer.startswith(answer_prefix):
        raise ValueError(f"the warm-up's answers start {answer[:24]!r}..., which does not continue the answer "
                         f"prefix {answer_prefix!r}")
    return answer[len(answer_prefix):]


@dataclass(frozen=True)
class GRPOSettings:
    """One GRPO run. ``batch_size`` counts pairs per step per device; each gets ``num_generations`` answers."""

    model: str  # a local model folder, or a .gguf file (transformers dequantizes it)
    reward: str = "brier"
    num_generations: int = 8
    learning_rate: float = 5e-5  # LoRA trains few weights and takes a larger step than full fine-tuning
    lora_rank: int = 16
    max_completion_tokens: int = 96
    # Appended to the prompt, and read before each completion (see ANSWER_OPENING); "" for none.
    answer_prefix: str = ANSWER_OPENING
    steps: int = 100
    batch_size: int = 4
    temperature: float = 1.0
    eval_pairs: int = 256  # held-out pairs scored before and after; 0: all of them
    eval_batch_size: int = 16
    # Recomputes activations in the backward pass: long prompts times num_generations fit in memory.
    gradient_checkpointing: bool = True
    # Weights and arithmetic on a GPU: "bf16", or "fp32" where bfloat16 training diverges (a 0.5B
    # Qwen's GRPO gradients turned NaN after 12 steps in bfloat16 on an H100). A CPU is always fp32.
    precision: str = "bf16"
    # Supervised format warm-up of the same adapter before GRPO (``sft_target``); 0 steps: none.
    sft_steps: int = 0
    sft_learning_rate: float = 2e-4
    # Warm-up targets drawn at random around their shape (``sft_target``), so that sampled answers still
    # differ after it and GRPO's groups have something to compare; False: one fixed target per bin.
    sft_jitter: bool = True
    # Wall-clock budget of the whole call, in seconds (0: none): the warm-up and GRPO stop early so
    # that the evaluations after them still fit (each reckoned as long as the 'before' one).
    max_seconds: float = 0.0
    seed: int = 0
    out_dir: str = "kernelcast-grpo"
    tracking_uri: str | None = None
    experiment: str = "surrogate-grpo"

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"unknown reward {self.reward!r}; known: {', '.join(REWARDS)}")
        for name in ("num_generations", "lora_rank", "max_completion_tokens", "steps", "batch_size",
                     "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError("num_generations must be at least 2: GRPO compares answers within a group")
        for name in ("learning_rate", "sft_learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.sft_steps < 0 or self.max_seconds < 0:
            raise ValueError(f"sft_steps and max_seconds must not be negative, got {self.sft_steps}, {self.max_seconds}")
        if self.sft_steps:
            sft_target(1, self.answer_prefix)  # a prefix the warm-up's answers cannot continue fails here
        if not os.path.exists(self.model):
            raise ValueError(f"model {self.model!r} does not exist; give a local model folder or .gguf file")


@dataclass(frozen=True)
class GRPOResult:
    out_dir: str
    adapter_dir: str
    mlflow_run_id: str
    before: Mapping[str, float]
    after: Mapping[str, float]
    train_pairs: int
    eval_pairs: int
    train_seconds: float
    pairs_per_second: float  # training pairs (prompts) consumed per second
    completions_per_second: float
    steps: int = 0  # GRPO steps done (fewer than asked when max_seconds ran out)
    after_sft: Mapping[str, float] = dataclasses.field(default_factory=dict)  # empty without a warm-up
    sft_steps: int = 0  # warm-up steps done
    sft_loss: list = dataclasses.field(default_factory=list)  # the warm-up's loss at each step


PRECISIONS = ("bf16", "fp32")


def load_causal_lm(path: str, precision: str = "bf16"):
    """(model, tokenizer) from a local folder or a .gguf file, never from the hub; bfloat16 weights on a
    GPU unless ``precision`` is fp32. A path that does not exist is refused by name."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if not os.path.exists(path):
        raise ValueError(f"model {path!r} does not exist; give a local model folder or .gguf file")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = (os.path.dirname(path) or ".", os.path.basename(path)) if path.endswith(".gguf") else (path, None)
    extra: dict = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
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


def prompt_dataset(pairs: pd.DataFrame, tokenizer, answer_prefix: str = ""):
    """A datasets.Dataset for TRL: the forecaster's prompt rendered as text (``render_prompt``), the
    true bin and the answer prefix, which TRL hands to the reward functions by column name."""
    from datasets import Dataset

    rows = pairs.to_dict("records")
    return Dataset.from_dict({
        "prompt": [render_prompt(tokenizer, build_messages(request_of(r)), answer_prefix) for r in rows],
        "true_bin": [int(r["true_bin"]) for r in rows], "answer_prefix": [answer_prefix] * len(rows)})


class RunLog:
    """Where a run's metrics go: ``metrics.jsonl`` under the run folder, and MLflow when a URI is given."""

    def __init__(self, out_dir: str, make_tracker, params: Mapping[str, object], enabled: bool = True):
        """``make_tracker``: makes a ``storage.tracking.Tracker`` (the caller's: tracking is a layer above
        this one), called in the main process only; None for the run folder alone."""
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled = enabled  # only the main process logs in a multi-GPU run
        self.tracker, self.run_id = None, ""
        if enabled and make_tracker is not None:
            self.tracker = make_tracker()
            name = f"grpo-{params['reward']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            self.run_id = self.tracker.start(name, params, {"kernelcast.surrogate": "llm-grpo"})

    def log(self, values: Mapping[str, float], step: int) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in values.items()
                                                 if isinstance(v, (int, float, np.number))}}) + "\n")
        if self.tracker:
            self.tracker.log_metrics(self.run_id, values, step)

    def log_folder(self, folder: str, name: str) -> None:
        if self.enabled and self.tracker:
            self.tracker.log_folder(self.run_id, folder, name)

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled and self.tracker:
            self.tracker.finish(self.run_id, status)


class Deadline:
    """A wall-clock time after which training stops; every rank of a multi-GPU run takes the main
    rank's word for it, so that they all stop at the same step."""

    def __init__(self, at: float | None, device=None):
        self.at, self.device = at, device

    def passed(self) -> bool:
        if self.at is None:
            return False
        import torch
        import torch.distributed as dist

        late = time.monotonic() > self.at
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([float(late)], device=self.device)
            dist.broadcast(flag, src=0)
            late = bool(flag.item())
        return late


def _stop_at(deadline: Deadline):
    from transformers import TrainerCallback

    class StopAtDeadline(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if deadline.passed():
                control.should_training_stop = True

    return StopAtDeadline()


def sft_batch(tokenizer, rows: Sequence[Mapping], answer_prefix: str, max_completion_tokens: int,
              rng: np.random.Generator | None = None) -> dict:
    """Right-padded (input_ids, attention_mask, labels) of prompt + warm-up target (+ EOS): the
    prompt tokenized as generation reads it, labels -100 everywhere but on the target's tokens.
    ``rng``: targets drawn at random around their shape (``sft_target``)."""
    import torch

    seqs, labels = [], []
    for r in rows:
        prompt = tokenizer(render_prompt(tokenizer, build_messages(request_of(r)), answer_prefix))["input_ids"]
        target = tokenizer(sft_target(int(r["true_bin"]), answer_prefix, rng), add_special_tokens=False)["input_ids"]
        target = (target + [tokenizer.eos_token_id])[:max_completion_tokens]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    return {"input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
            "labels": torch.tensor([x + [-100] * (width - len(x)) for x in labels])}


def warm_up(model, tokenizer, train: pd.DataFrame, settings: GRPOSettings, log: RunLog | None = None,
            deadline: Deadline | None = None) -> list[float]:
    """Fine-tune ``model``'s trainable (LoRA) weights for ``settings.sft_steps`` steps on ``train``
    pairs towards ``sft_target`` answers, ``settings.batch_size`` pairs a step (AdamW, constant
    rate, cross-entropy on the target tokens only). Returns the loss of each step done.

    Pairs whose child failed (true bin 0) are taught a high failure probability, the others a low one
    and their speed bin."""
    import torch

    rows = train.to_dict("records")
    if not rows:
        raise ValueError("no training pairs: the warm-up has no target to train towards")
    order = np.random.default_rng(settings.seed).permutation(len(rows))
    targets = np.random.default_rng(settings.seed + 1) if settings.sft_jitter else None
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable weights to warm up")
    optimizer = torch.optim.AdamW(params, lr=settings.sft_learning_rate, weight_decay=0.0)
    device = next(model.parameters()).device
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and settings.precision == "bf16"
                else torch.autocast(device.type, enabled=False))
    training = model.training
    model.train()
    losses: list[float] = []
    try:
        for step in range(settings.sft_steps):
            if deadline is not None and deadline.passed():
                break
            take = [rows[order[(step * settings.batch_size + i) % len(rows)]] for i in range(settings.batch_size)]
            batch = {k: v.to(device) for k, v in sft_batch(tokenizer, take, settings.answer_prefix,
                                                             settings.max_completion_tokens, targets).items()}
            with autocast:
                loss = model(**batch, use_cache=False).loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if log is not None:
                log.log({"sft.loss": losses[-1], "sft.grad_norm": float(grad_norm)}, step + 1)
    finally:
        model.train(training)
        optimizer.zero_grad(set_to_none=True)
    return losses


def _callback(log: RunLog):
    from transformers import TrainerCallback

    class LogMetrics(TrainerCallback):
        """Every trainer log (loss, reward, rewards/<term>/mean, ...) into the run log, at its step."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            log.log({f"train.{k}": v for k, v in (logs or {}).items()}, state.global_step)

    return LogMetrics()


def scored_pairs(pairs: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """The held-out ('eval') pairs a run scores before and after training: ``n`` of them drawn with
    ``seed`` (all of them when ``n`` is 0 or more than there are)."""
    held_out = pairs[pairs["split"] == "eval"]
    return held_out.sample(n, random_state=seed) if n and len(held_out) > n else held_out


def train_grpo(pairs: pd.DataFrame, settings: GRPOSettings, make_tracker=None) -> GRPOResult:
    """Train a LoRA adapter with GRPO on the 'train' pairs; score before and after on the 'eval' pairs.

    ``make_tracker``: makes the MLflow experiment of ``settings.tracking_uri`` (``tasks.setup.grpo_tracker``),
    called on the main process only; the caller gives it because tracking sits a layer above the surrogates."""
    if settings.tracking_uri and make_tracker is None:
        raise ValueError(f"tracking_uri {settings.tracking_uri!r} is set but no make_tracker was given: "
                         "pass tasks.setup.grpo_tracker(settings)")
    import torch
    from peft import LoraConfig
    from transformers import set_seed
    from trl import GRPOConfig, GRPOTrainer

    started = time.monotonic()
    train = pairs[pairs["split"] == "train"]
    held_out = scored_pairs(pairs, settings.eval_pairs, settings.seed)
    if train.empty or held_out.empty:
        raise ValueError(f"GRPO needs 'train' and 'eval' pairs; got {len(train)} and {len(held_out)}")
    set_seed(settings.seed)
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(settings.model, settings.precision)
    on_gpu = torch.cuda.is_available()
    if on_gpu and settings.precision == "fp32":
        # fp32 weights, optimizer and softmax; matrix products on TF32 tensor cores (fp32 range, 10-bit
        # mantissa in, fp32 sums out), which keeps bfloat16's divergence away at a fraction of fp32's time.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    config = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=settings.steps, learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.batch_size * settings.num_generations,
        num_generations=settings.num_generations, max_completion_length=settings.max_completion_tokens,
        temperature=settings.temperature, logging_steps=1, save_strategy="no", report_to="none",
        gradient_checkpointing=settings.gradient_checkpointing, seed=settings.seed,
        bf16=on_gpu and settings.precision == "bf16",
        use_cpu=not on_gpu, dataloader_num_workers=0, disable_tqdm=True)
    lora = LoraConfig(r=settings.lora_rank, lora_alpha=2 * settings.lora_rank, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=list(REWARDS[settings.reward]), args=config,
                          train_dataset=prompt_dataset(train, tokenizer, settings.answer_prefix), processing_class=tokenizer, peft_config=lora)
    main = trainer.accelerator.is_main_process
    params = {**{k: v for k, v in dataclasses.asdict(settings).items() if k != "tracking_uri"},
              "train_pairs": len(train), "eval_pairs": len(held_out), "prompt_version": prompt_version(),
              "eval_ops": ",".join(sorted(held_out["op"].unique()))}
    log = RunLog(str(out), make_tracker, params, enabled=main)
    trainer.add_callback(_callback(log))
    deadline = Deadline(None, trainer.accelerator.device)
    trainer.add_callback(_stop_at(deadline))
    try:
        def score(label: str) -> dict[str, float]:
            # LoRA's B matrices start at zero, so before training this is exactly the base model.
            forecaster = TransformersForecaster(trainer.model, tokenizer, max_new_tokens=settings.max_completion_tokens,
                                                batch_size=settings.eval_batch_size,
                                                answer_prefix=settings.answer_prefix)
            values = evaluate_pairs(forecaster, held_out) if main else {}
            log.log({f"{label}.{k}": v for k, v in values.items()}, trainer.state.global_step)
            return values

        scoring = time.monotonic()
        before = score("before")
        # Each evaluation still to come is reckoned as long as this one, and a little more.
        reserve = 1.2 * (time.monotonic() - scoring) + 5.0
        end = started + settings.max_seconds - reserve if settings.max_seconds else None
        after_sft, sft_loss, sft_seconds = {}, [], 0.0
        if settings.sft_steps:
            # The warm-up trains the adapter the trainer holds; GRPO then starts from it. It stops
            # early enough to leave room for the 'after_sft' evaluation too.
            start = time.perf_counter()
            deadline.at = None if end is None else end - reserve
            sft_loss = warm_up(trainer.model, tokenizer, train, settings, log, deadline)
            sft_seconds = time.perf_counter() - start
            log.log({"sft.seconds": sft_seconds, "sft.steps": len(sft_loss)}, 0)
            after_sft = score("after_sft")
        deadline.at = end
        start = time.perf_counter()
        if not deadline.passed():
            trainer.train()
        seconds = time.perf_counter() - start
        steps = trainer.state.global_step
        completions = steps * config.per_device_train_batch_size * trainer.accelerator.num_processes
        after = score("after")
        adapter = out / ADAPTER_FOLDER
        trainer.save_model(str(adapter))
        throughput = {"train.seconds": seconds, "train.steps": steps,
                      "train.completions_per_second": completions / seconds if seconds > 0 else 0.0,
                      "train.pairs_per_second": completions / settings.num_generations / seconds if seconds > 0 else 0.0}
        log.log(throughput, trainer.state.global_step)
        log.log_folder(str(adapter), ADAPTER_FOLDER)
        result = GRPOResult(str(out), str(adapter), log.run_id, before, after, len(train), len(held_out), seconds,
                            throughput["train.pairs_per_second"], throughput["train.completions_per_second"],
                            steps=steps, after_sft=after_sft, sft_steps=len(sft_loss), sft_loss=sft_loss)
        if main:
            (out / "evaluation.json").write_text(json.dumps(dataclasses.asdict(result), indent=1, default=float))
    except BaseException:
        log.finish("FAILED")
        raise
    log.finish()
    return result
