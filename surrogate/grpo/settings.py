"""One GRPO run's settings (``GRPOSettings``, validated when made) and what the run returns (``GRPOResult``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

from kernelcast.surrogate.grpo.answers import ANSWER_OPENING, REWARDS, sft_target


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
