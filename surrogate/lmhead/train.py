"""Training the lmhead forecaster on measured pairs, with whole problems held out.

The pairs are a ``kernelcast pairs`` file (or any table with the columns of ``REQUIRED``): the
group is the operation (a problem), the failure flag is a status other than ``ok``, the target
is the log of the measured speedup against the anchor. The problems are split into k folds
(``GroupKFold``); one is the test fold, and a share of the other problems is the calibration
split, kept out of training. Training minimises the failure head's cross-entropy on every pair
plus the speed head's Gaussian negative log-likelihood on the pairs that ran; then the
calibration is fit on the calibration split and the held-out metrics are taken on the test fold.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from kernelcast.surrogate.lmhead.model import (HeadConfig, LMHeadForecaster, PairModel, default_device, fit_calibration,
                                    write_json)

REQUIRED = ("op", "anchor_source", "candidate_source", "status", "speedup")
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class TrainSettings:
    """One training run: which fold is held out, how long and how hard it trains."""

    folds: int = 5
    fold: int = 0
    calibration_fraction: float = 0.2  # share of the training problems kept for calibration
    epochs: int = 1
    max_steps: int = 0  # 0: as many as the epochs take
    batch_size: int = 8
    learning_rate: float = 2e-4  # the LoRA weights
    head_learning_rate: float = 1e-3
    max_seconds: float = 0.0  # 0: no limit; else training stops in time to calibrate, score and save
    # Recompute the decoder's activations in the backward pass: longer pairs or a larger model fit in memory.
    gradient_checkpointing: bool = False
    seed: int = 0
    # The problems to hold out for testing, in place of fold ``fold`` of ``folds`` (the same split as
    # another forecaster's, say); the calibration split is still a share of the rest.
    held_out: tuple = ()
    # Calibrate on the training problems whose name starts with this (kb.cudal1-: the pool the forecaster is
    # judged on), not on a share of every pool's: "" for any problem.
    calibrate_on: str = ""
    # Weight of a within-problem ranking term: for two kernels of one problem in a batch that both ran and
    # differ by more than RANK_MARGIN, a logistic loss on the order of their forecast means. Batches then hold
    # whole problems (``problem_batches``). 0: the per-pair losses alone, batches drawn at random.
    rank_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ValueError(f"folds must be at least 2 (one is held out), got {self.folds}")
        if not 0 <= self.fold < self.folds:
            raise ValueError(f"fold must lie in 0..{self.folds - 1}, got {self.fold}")
        if not 0.0 < self.calibration_fraction < 1.0:
            raise ValueError(f"calibration_fraction must lie in (0, 1), got {self.calibration_fraction}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not (self.rank_weight >= 0 and math.isfinite(self.rank_weight)):
            raise ValueError(f"rank_weight must be a finite number, 0 or more, got {self.rank_weight}")
        if self.max_steps < 0 or self.max_seconds < 0:
            raise ValueError(f"max_steps and max_seconds must not be negative, got {self.max_steps}, {self.max_seconds}")


def targets(pairs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(failed, log speedup (NaN where it failed or has no speedup), group) of each pair; a table
    without a needed column is refused by name."""
    missing = [c for c in REQUIRED if c not in pairs.columns]
    if missing:
        raise ValueError(f"the pairs lack the column(s) {', '.join(missing)}; `kernelcast pairs` writes them "
                         f"(needed: {', '.join(REQUIRED)})")
    if len(pairs) == 0:
        raise ValueError("no pairs to train on")
    failed = (pairs["status"] != "ok").to_numpy()
    speedup = pairs["speedup"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_speedup = np.where(~failed & (speedup > 0), np.log(speedup), np.nan)
    return failed, log_speedup, pairs["op"].astype(str).to_numpy()


def grouped_split(groups: np.ndarray, folds: int, fold: int, calibration_fraction: float,
                  seed: int = 0, held_out=(), calibrate_on: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, calibration, test) row indices: the test fold is fold ``fold`` of a ``GroupKFold`` over
    the problems, the calibration split a seeded share of the other problems (of those whose name starts
    with ``calibrate_on``, when given); no problem is in two."""
    from sklearn.model_selection import GroupKFold

    problems = sorted(set(groups))
    if len(problems) < max(folds, 3):
        raise ValueError(f"{len(problems)} problem(s) ({', '.join(problems)}) cannot be split into {folds} folds "
                         "with a calibration split: need at least max(folds, 3)")
    if held_out:
        unknown = sorted(set(held_out) - set(problems))
        if unknown:
            raise ValueError(f"held-out problem(s) {', '.join(unknown)} have no pairs")
        is_test = np.isin(groups, list(held_out))
        if is_test.all():
            raise ValueError("every problem is held out: nothing is left to train on")
        train, test = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    else:
        train, test = list(GroupKFold(n_splits=folds).split(np.zeros(len(groups)), groups=groups))[fold]
    rest = sorted(set(groups[train]))
    eligible = [g for g in rest if str(g).startswith(calibrate_on)]
    if not eligible:
        raise ValueError(f"calibrate on {calibrate_on!r}: no training problem's name starts with it")
    # a share of the eligible problems, one at least, and one training problem left at least
    n_calibration = min(len(rest) - 1, len(eligible), max(1, round(calibration_fraction * len(eligible))))
    calibration = set(np.random.default_rng(seed).choice(eligible, n_calibration, replace=False))
    held = np.isin(groups[train], list(calibration))
    return np.sort(train[~held]), np.sort(train[held]), np.sort(test)


def gaussian_nll(mean, log_var, y):
    """Per-pair negative log-likelihood of ``y`` under N(mean, exp(log_var)), the constant left out."""
    return 0.5 * (log_var + (y - mean) ** 2 / log_var.exp())


# Two kernels of a problem are ordered by the ranking term when their measured speedups differ by more than 2%
# (about the harness's repeatability on a null twin); the order's logistic loss reads mean differences in units
# of RANK_TEMPERATURE (log speedup).
RANK_MARGIN = math.log(1.02)
RANK_TEMPERATURE = 0.1


def rank_loss(mean, log_speedup, groups):
    """Mean logistic loss over the ordered pairs of one batch: kernels of one problem (``groups``, integer codes)
    that both ran and whose measured log speedups differ by more than RANK_MARGIN, penalised unless the faster
    one's forecast mean is the higher; None when the batch holds no such pair."""
    import torch

    ran = ~torch.isnan(log_speedup)
    y = torch.nan_to_num(log_speedup)
    ordered = ((groups[:, None] == groups[None, :]) & ran[:, None] & ran[None, :]
               & (y[:, None] - y[None, :] > RANK_MARGIN))
    if not ordered.any():
        return None
    gap = (mean[:, None] - mean[None, :])[ordered] / RANK_TEMPERATURE
    return torch.nn.functional.softplus(-gap).mean()


def pair_loss(net: PairModel, texts, failed, log_speedup, groups=None, rank_weight: float = 0.0):
    """Failure cross-entropy on every pair plus the Gaussian NLL on the pairs that ran (torch tensors), plus
    ``rank_weight`` times the within-problem ranking term when ``groups`` are given."""
    import torch

    logit, mean, log_var = net.outputs(texts)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, failed)
    ran = ~torch.isnan(log_speedup)
    if ran.any():
        loss = loss + gaussian_nll(mean[ran], log_var[ran], log_speedup[ran]).mean()
    if rank_weight and groups is not None:
        ranked = rank_loss(mean, log_speedup, groups)
        if ranked is not None:
            loss = loss + rank_weight * ranked
    return loss


def problem_batches(indices: np.ndarray, groups: np.ndarray, batch_size: int, rng) -> list[np.ndarray]:
    """``indices`` in batches of whole problems: the problems in a random order, each one's rows shuffled and
    packed into the current batch while they fit (a problem with more rows than a batch fills batches of its
    own), so that a batch holds kernels to rank against each other."""
    by_problem: dict = {}
    for i in indices:
        by_problem.setdefault(groups[i], []).append(i)
    problems = sorted(by_problem)
    batches, current = [], []
    for k in rng.permutation(len(problems)):
        rows = list(rng.permutation(by_problem[problems[k]]))
        if current and len(current) + len(rows) > batch_size:
            batches.append(np.array(current))
            current = []
        while len(rows) > batch_size:
            batches.append(np.array(rows[:batch_size]))
            rows = rows[batch_size:]
        current += rows
    if current:
        batches.append(np.array(current))
    return batches


def mean_loss(net: PairModel, texts, failed: np.ndarray, log_speedup: np.ndarray, batch_size: int) -> float:
    """The training loss over ``texts`` in evaluation mode, averaged over batches weighted by size."""
    import torch

    net.train(False)
    total = 0.0
    with torch.inference_mode():
        for idx in net.batches(texts, batch_size):
            total += len(idx) * float(pair_loss(net, [texts[i] for i in idx], *_tensors(net, failed, log_speedup, idx)))
    return total / len(texts)


def _tensors(net: PairModel, failed, log_speedup, idx):
    import torch

    return (torch.tensor(failed[idx], dtype=torch.float32, device=net.device),
            torch.tensor(log_speedup[idx], dtype=torch.float32, device=net.device))


def held_out_metrics(p_fail, mean, sigma, failed, log_speedup, groups) -> dict:
    """Failure AUROC and Brier score, Spearman of predicted and measured log speedup (pooled and
    within each problem, averaged over problems with 3 or more pairs that ran), the ECE of the
    failure-aware bins (0..8), and the Gaussian NLL, on the pairs given."""
    from kernelcast.surrogate import metrics
    from kernelcast.surrogate.bins import speedup_bin
    from kernelcast.surrogate.learned import bin_probabilities

    ran = ~failed & np.isfinite(log_speedup)
    within = [metrics._spearman(mean[ran & (groups == g)], log_speedup[ran & (groups == g)])
              for g in sorted(set(groups[ran])) if (ran & (groups == g)).sum() >= 3]
    within = [w for w in within if np.isfinite(w)]
    probs = bin_probabilities(mean, sigma)
    true_bins = np.array([0 if not r else speedup_bin(math.exp(y)) for r, y in zip(ran, log_speedup)])
    nll = 0.5 * np.log(2 * np.pi * sigma[ran] ** 2) + 0.5 * ((log_speedup[ran] - mean[ran]) / sigma[ran]) ** 2
    return {"n_pairs": int(len(failed)), "n_failed": int(failed.sum()), "n_ran": int(ran.sum()),
            "n_problems": int(len(set(groups))),
            "failure_auroc": metrics.auroc(p_fail, failed),
            "failure_brier": float(np.mean((p_fail - failed) ** 2)),
            "spearman": metrics._spearman(mean[ran], log_speedup[ran]) if ran.sum() >= 3 else math.nan,
            "within_problem_spearman": float(np.mean(within)) if within else math.nan,
            "within_problem_count": len(within),
            "ece": metrics.ece(metrics.with_failure(probs, p_fail), true_bins),
            "gaussian_nll": float(np.mean(nll)) if ran.any() else math.nan}


def _out_of_time(settings: TrainSettings, started: float, step_seconds: list, to_read: int) -> bool:
    """Whether training must stop so that reading ``to_read`` pairs (calibration and test) and saving
    still fit in ``max_seconds``. A forward pass is about a third of a training step; the first step
    warms up and is no measure of the others, so it alone never stops training before the deadline."""
    left = settings.max_seconds - (time.monotonic() - started)
    step = float(np.median(step_seconds[1:] or step_seconds))
    reserve = step / settings.batch_size / 3 * to_read + 2 * step
    return left < 0 or (len(step_seconds) > 1 and left < reserve)


@dataclass(frozen=True)
class TrainResult:
    forecaster: LMHeadForecaster
    metrics: dict
    losses: list  # the training loss at each step
    steps: int
    seconds: float
    stopped_early: bool  # max_seconds ran out before the epochs did


def train(pairs: pd.DataFrame, head: HeadConfig, settings: TrainSettings = TrainSettings(), out: str = "",
          device: str = "") -> TrainResult:
    """Train on ``pairs`` (fold ``settings.fold`` held out), calibrate, score the held-out fold, and save
    into ``out`` when given; stops on ``max_seconds`` keeping what it has."""
    import torch

    started = time.monotonic()
    failed, log_speedup, groups = targets(pairs)
    train_ix, calibration_ix, test_ix = grouped_split(groups, settings.folds, settings.fold,
                                                      settings.calibration_fraction, settings.seed, settings.held_out,
                                                      settings.calibrate_on)
    texts = list(zip(pairs["anchor_source"].astype(str), pairs["candidate_source"].astype(str)))
    torch.manual_seed(settings.seed)
    net = PairModel(head, device or default_device())
    if settings.gradient_checkpointing:
        # Not reentrant: the inputs of a checkpointed block need no gradient of their own (LoRA's weights have one).
        net.lm.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ran = log_speedup[train_ix][np.isfinite(log_speedup[train_ix])]
    net.set_base_rates(float(failed[train_ix].mean()), float(ran.mean()) if len(ran) else 0.0,
                       float(ran.var()) if len(ran) > 1 else 1.0)
    optimiser = torch.optim.AdamW([
        {"params": [p for p in net.lm.parameters() if p.requires_grad], "lr": settings.learning_rate},
        {"params": list(net.heads.parameters()), "lr": settings.head_learning_rate}], weight_decay=0.0)
    rng = np.random.default_rng(settings.seed)
    losses, step_seconds, stopped, skipped = [], [], False, 0
    codes = pd.factorize(groups)[0]
    for _ in range(settings.epochs):
        if settings.rank_weight:
            batches = problem_batches(train_ix, groups, settings.batch_size, rng)
        else:
            order = train_ix[rng.permutation(len(train_ix))]
            batches = [order[start:start + settings.batch_size] for start in range(0, len(order), settings.batch_size)]
        for idx in batches:
            t0 = time.monotonic()
            net.train(True)
            loss = pair_loss(net, [texts[i] for i in idx], *_tensors(net, failed, log_speedup, idx),
                             torch.tensor(codes[idx], device=net.device), settings.rank_weight)
            optimiser.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            if torch.isfinite(loss) and torch.isfinite(norm):  # one overflowing batch must not poison the weights
                optimiser.step()
            else:
                skipped += 1
            losses.append(float(loss.detach()))
            step_seconds.append(time.monotonic() - t0)
            if settings.max_steps and len(losses) >= settings.max_steps:
                break
            if settings.max_seconds and _out_of_time(settings, started, step_seconds,
                                                     len(calibration_ix) + len(test_ix)):
                stopped = True
                break
        if stopped or (settings.max_steps and len(losses) >= settings.max_steps):
            break
    steps = len(losses)
    raw_calibration = net.predict_raw([texts[i] for i in calibration_ix], settings.batch_size)
    calibration = fit_calibration(raw_calibration, failed[calibration_ix], log_speedup[calibration_ix])
    forecaster = LMHeadForecaster.of(net, calibration, steps, settings.batch_size)
    raw = net.predict_raw([texts[i] for i in test_ix], settings.batch_size)
    mean, sigma = calibration.gaussian(raw[:, 1], raw[:, 2])
    scores = held_out_metrics(calibration.failure(raw[:, 0]), mean, sigma, failed[test_ix], log_speedup[test_ix],
                              groups[test_ix])
    seconds = time.monotonic() - started
    if out:
        training = {**asdict(settings), "steps": steps, "skipped_steps": skipped, "seconds": seconds,
                    "stopped_early": stopped,
                    "device": net.device, "train_pairs": len(train_ix), "calibration_pairs": len(calibration_ix),
                    "test_pairs": len(test_ix), "train_problems": sorted(set(groups[train_ix])),
                    "calibration_problems": sorted(set(groups[calibration_ix])),
                    "test_problems": sorted(set(groups[test_ix])), "first_loss": losses[0] if losses else None,
                    "last_loss": losses[-1] if losses else None}
        forecaster.save(out, training)
        write_json(out, METRICS_FILE, {"held_out": scores, "calibration": asdict(calibration)})
    return TrainResult(forecaster, scores, losses, steps, seconds, stopped)

