"""What the model reads and writes in GRPO training: the prompt text (``render_prompt``), the
answer's opening (``ANSWER_OPENING``), the rewards that score an answer against the pair's true
bin 0..8 (``REWARDS``, ``reward``), and the warm-up's target answers (``sft_target``).

An answer that does not parse scores 0 on every calibration term and ``PARSE_FAILURE`` on one
more, so it scores below every parsed answer under every reward (see the package's docstring).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from kernelcast.surrogate import metrics
from kernelcast.surrogate.llm import AnswerError, parse_answer

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
