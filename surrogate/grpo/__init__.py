"""GRPO training of an LLM surrogate with calibration-shaped rewards (TRL's GRPOTrainer, LoRA via peft).

The model answers the forecaster's own prompt (``kernelcast.surrogate.llm.build_messages``) for each
training pair, ``num_generations`` times; each answer is parsed by the forecaster's own
parser and scored against the pair's true bin:

- ``correctness``: 1 when the most probable outcome is the true bin, else 0;
- ``brier``: correctness + (1 - Brier score of the outcome probabilities);
- ``crps``: correctness + (1 - ordinal CRPS of the outcome probabilities).

The outcomes are bins 0..8, failure (bin 0) first (``outcomes``): pairs from an LLM corpus hold
children that failed, and saying which fail is half the forecaster's job. On a pair that ran,
an answer with P(fail) 0 scores as it would over the 8 speed bins alone (CRPS spread over 8
steps rather than 7).

Brier and CRPS are ``kernelcast.surrogate.metrics``'s definitions, so training optimises what
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
held-out operations greedily (as a search would) and is scored with ``kernelcast.surrogate.metrics.summary``.
The LoRA adapter is written under ``out_dir``; metrics go to ``out_dir/metrics.jsonl`` and, with a
tracking URI, to MLflow through the ``kernelcast.storage.tracking.Tracker`` the caller passes
(``kernelcast.tasks.setup.grpo_tracker``), together with the adapter. transformers, trl, peft and datasets
are imported only in this package (the ``train`` extra): the core runs without them.

One module per job:

- ``answers``: the prompt text, the answer's opening, the rewards and the warm-up's targets;
- ``settings``: ``GRPOSettings`` and ``GRPOResult``;
- ``model``: loading a model or a trained adapter, ``TransformersForecaster``, ``evaluate_pairs``;
- ``train``: ``train_grpo``, the warm-up, the run log and the wall-clock deadline.
"""

from kernelcast.surrogate.grpo.answers import (ANSWER_OPENING, PARSE_FAILURE, REWARDS, SCORES, SFT_FAILED, SFT_FAILED_RANGE,
                                    SFT_FLAT, SFT_RAN, SFT_RAN_RANGE, SFT_TRUE_MASS, SFT_TRUE_MASS_RANGE, correctness,
                                    hundredths, one_minus_brier, one_minus_crps, outcome_reward, outcomes,
                                    parse_failure, render_prompt, reward, sft_probabilities, sft_target)
from kernelcast.surrogate.grpo.model import (PRECISIONS, TransformersForecaster, evaluate_pairs, load_adapter, load_causal_lm,
                                  load_model)
from kernelcast.surrogate.grpo.settings import GRPOResult, GRPOSettings
from kernelcast.surrogate.grpo.train import (ADAPTER_FOLDER, Deadline, RunLog, prompt_dataset, scored_pairs, sft_batch, train_grpo,
                                  warm_up)

__all__ = ["ADAPTER_FOLDER", "ANSWER_OPENING", "PARSE_FAILURE", "PRECISIONS", "REWARDS", "SCORES", "SFT_FAILED",
           "SFT_FAILED_RANGE", "SFT_FLAT", "SFT_RAN", "SFT_RAN_RANGE", "SFT_TRUE_MASS", "SFT_TRUE_MASS_RANGE",
           "Deadline", "GRPOResult", "GRPOSettings", "RunLog", "TransformersForecaster", "correctness",
           "evaluate_pairs", "hundredths", "load_adapter", "load_causal_lm", "load_model", "one_minus_brier",
           "one_minus_crps", "outcome_reward", "outcomes", "parse_failure", "prompt_dataset", "render_prompt",
           "reward", "scored_pairs", "sft_batch", "sft_probabilities", "sft_target", "train_grpo", "warm_up"]
