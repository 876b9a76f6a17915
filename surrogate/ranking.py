"""Forecasters judged where ranking matters: whole problems held out, each problem's pool ranked.

A *problem* is one operation with its eager reference (the anchor of every pair) and a small pool
of implementations. A forecaster is fit on other problems only (``problem_folds``: grouped k-fold;
``level_folds``: leave one KernelBench level out) and ranks the held-out problem's pool. What a
search needs of that ranking is scored per problem, so every interval is a bootstrap over
problems, not over candidates (the candidates of one problem are not independent draws):

- within-problem Spearman of the forecast speedup against the measured one, over the kernels that
  ran (problems with at least ``MIN_RANKED`` of them);
- top-1: whether the candidate ranked first measures within 10% of the pool's best;
- selection (the paper's protocol): measure only the top ``fraction`` of the pool as ranked (at
  least one candidate); is the best found within 20% of the pool's best;
- failure AUROC, ECE and AURC over the 9 bins (``kernelcast.surrogate.metrics``), over the candidates.

The ranking score is the forecast speedup times the forecast chance that the kernel runs: a kernel
that fails finds nothing, so its measured worth is 0.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from kernelcast.surrogate import metrics, registry

MIN_RANKED = 3  # kernels that ran, for a problem's Spearman to count
TOP1_TOLERANCE = 0.10
SELECTION_TOLERANCE = 0.20
SELECTION_FRACTIONS = (0.10, 0.20, 0.30)
INNER_FOLDS = 4  # grouped folds of a fold's training problems, for a calibrator fit on held-out forecasts
_LEVEL = re.compile(r"-l(\d+)-")


def problem_level(op: str) -> int:
    """The KernelBench level of a problem named like ``kb.cudal1-l2-017``."""
    found = _LEVEL.search(op)
    if not found:
        raise ValueError(f"operation {op!r} names no KernelBench level (expected '-l<level>-' as in kb.cudal1-l2-017)")
    return int(found.group(1))


def problem_folds(problems: Sequence[str], k: int = 5, seed: int = 0) -> list[tuple[str, frozenset]]:
    """(fold name, held-out problems) of a grouped k-fold: each problem held out exactly once, the
    problems shuffled with ``seed`` and dealt round-robin."""
    names = sorted(set(problems))
    if k < 2 or len(names) < 2:
        raise ValueError(f"grouped cross-validation needs k >= 2 and two or more problems, got k={k} "
                         f"and {len(names)} problem(s)")
    order = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    k = min(k, len(names))
    return [(f"fold {i + 1}/{k}", frozenset(order[i::k])) for i in range(k)]


SEALED_SHARE = 0.2


def sealed_problems(problems: Sequence[str], share: float = SEALED_SHARE) -> frozenset:
    """The problems kept out of a forecaster's development: those whose name's SHA-1 falls in the first ``share``
    of its range. Fixed by the names alone, so a problem added later joins one side for good."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"the sealed share must lie strictly between 0 and 1, got {share}")
    return frozenset(p for p in set(problems)
                     if int(hashlib.sha1(p.encode()).hexdigest()[:8], 16) < share * 16 ** 8)


def level_folds(problems: Sequence[str]) -> list[tuple[str, frozenset]]:
    """(fold name, held-out problems) holding out one level at a time."""
    by_level: dict[int, set] = {}
    for op in set(problems):
        by_level.setdefault(problem_level(op), set()).add(op)
    if len(by_level) < 2:
        raise ValueError(f"leave-one-level-out needs two or more levels, the problems have {sorted(by_level)}")
    return [(f"level {lv}", frozenset(ops)) for lv, ops in sorted(by_level.items())]


def ready(name: str, cases: pd.DataFrame, kernels: pd.DataFrame, folder: str | None = None,
          options: dict | None = None):
    """Forecaster ``name`` as a search readies it: read from its trained ``folder``, fit on the measured
    ``cases`` and ``kernels``, or used as it is; ``options``, keyword arguments of its factory."""
    if registry.reads_folder(name):
        return registry.load_trained(name, folder)
    forecaster = registry.get_forecaster_factory(name)(**(options or {}))
    if registry.fits_on_prior(name):
        return registry.fit_prior(name, forecaster, cases, kernels)
    return forecaster.fit(None)


def held_out_forecasts(kernels: pd.DataFrame, cases: pd.DataFrame, name: str, folds: Sequence[tuple[str, frozenset]],
                       also_kernels: pd.DataFrame | None = None, also_cases: pd.DataFrame | None = None,
                       folder: str | None = None, log: Callable[[str], None] = lambda _: None,
                       options: dict | None = None) -> pd.DataFrame:
    """Each row of ``kernels`` (``kernelcast.surrogate.dataset.source_pairs``) forecast by ``name`` fit on the other
    folds' problems (and ``also_*``, other pools' pairs; ``options``, the forecaster's keyword arguments):
    columns fold, p_fail, expected (speedup if it runs), probs (9 bins, 0 = failure), aligned with ``kernels``.
    A forecaster that says nothing of failure gets its training kernels' failure rate, the best constant."""
    out = pd.DataFrame(index=kernels.index, columns=["fold", "p_fail", "expected", "probs"], dtype=object)
    for fold, held in folds:
        test = kernels["op"].isin(held).to_numpy()
        if not test.any():
            continue
        train_k, train_c = _training(kernels[~test], cases[~cases["op"].isin(held)], also_kernels, also_cases)
        forecaster = ready(name, train_c, train_k, folder, options)
        rows = kernels.index[test]
        got = fold_forecasts(forecaster, kernels[test], float(train_k["failed"].mean()))
        out.loc[rows, "fold"] = fold
        for column in ("p_fail", "expected", "probs"):
            out.loc[rows, column] = got[column]
        log(f"  {name} {fold}: {int(test.sum())} kernels of {len(held)} problems held out")
    return out


def recalibrated(forecasts: pd.DataFrame, kernels: pd.DataFrame, cases: pd.DataFrame, name: str,
                 folds: Sequence[tuple[str, frozenset]], calibrator: str, also_kernels: pd.DataFrame | None = None,
                 also_cases: pd.DataFrame | None = None, options: dict | None = None,
                 inner_folds: int = INNER_FOLDS) -> pd.DataFrame:
    """``forecasts`` (``held_out_forecasts`` of forecaster ``name`` under ``folds``) with each fold's bin
    distributions recalibrated by ``calibrator`` (``kernelcast.surrogate.calibration.CALIBRATORS``), fit on the forecaster's
    own held-out forecasts of that fold's training problems (``calibrated_on_training``): no held-out problem's
    measurement reaches it. It maps the confidence only, so the ranking (expected speedup, failure probability)
    stays the uncalibrated one."""
    if registry.reads_folder(name):
        raise ValueError(f"{name} is read from a trained folder: it cannot be fit again on inner folds to be "
                         "calibrated here (calibrate it where it is trained)")
    out = forecasts.copy()
    for _, held in folds:
        test = (kernels["op"].isin(held) & forecasts["fold"].notna()).to_numpy()
        if not test.any():
            continue
        fitted = calibrated_on_training(name, kernels[~kernels["op"].isin(held)], cases[~cases["op"].isin(held)],
                                        calibrator, also_kernels, also_cases, options, inner_folds)
        rows = kernels.index[test]
        out.loc[rows, "probs"] = pd.Series(list(fitted.transform(np.vstack(forecasts.loc[rows, "probs"].to_list()))),
                                           index=rows)
    return out


def _training(kernels, cases, also_kernels, also_cases) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The kernels and cases a forecaster is fit on: the pool's training rows and the other pools' (``also_*``)."""
    return (pd.concat([kernels, *([also_kernels] if also_kernels is not None else [])], ignore_index=True),
            pd.concat([cases, *([also_cases] if also_cases is not None else [])], ignore_index=True))


def calibrated_on_training(name: str, kernels: pd.DataFrame, cases: pd.DataFrame, calibrator: str,
                           also_kernels: pd.DataFrame | None = None, also_cases: pd.DataFrame | None = None,
                           options: dict | None = None, inner_folds: int = INNER_FOLDS, seed: int = 0):
    """A ``calibrator`` fit on forecaster ``name``'s held-out forecasts of the training problems ``kernels``:
    grouped folds of those problems, each forecast by the forecaster fit on the others (and ``also_*``)."""
    from kernelcast.surrogate.calibration import CALIBRATORS

    if calibrator not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {calibrator!r}; known: {', '.join(CALIBRATORS)}")
    inner = problem_folds(sorted(kernels["op"].unique()), inner_folds, seed)
    probs, bins = [], []
    for _, held in inner:
        test = kernels["op"].isin(held).to_numpy()
        train_k, train_c = _training(kernels[~test], cases[~cases["op"].isin(held)], also_kernels, also_cases)
        got = fold_forecasts(ready(name, train_c, train_k, None, options), kernels[test],
                             float(train_k["failed"].mean()))
        probs.append(np.vstack(got["probs"].to_list()))
        bins.append(kernels.loc[test, "true_bin"].to_numpy())
    return CALIBRATORS[calibrator]().fit(np.vstack(probs), np.concatenate(bins))


def stored_forecasts(kernels: pd.DataFrame, tables: Sequence[pd.DataFrame],
                     folds: Sequence[tuple[str, frozenset]]) -> pd.DataFrame:
    """Held-out forecasts made elsewhere (say, a forecaster trained on a GPU once per fold), aligned with
    ``kernels`` as ``held_out_forecasts`` returns them. Each table has op, candidate_id, fold, p_fail,
    expected and probs; a kernel forecast under another fold than ``folds`` gives it, or a kernel of a
    held-out problem not forecast at all, is refused by name: its forecaster may have trained on it. A
    kernel of a problem no fold holds out (the development problems, when only the sealed ones are) is
    left unforecast (fold NaN), as ``held_out_forecasts`` leaves it."""
    table = pd.concat(list(tables), ignore_index=True)
    fold_of = {op: name for name, held in folds for op in held}
    other = table[table["op"].map(fold_of) != table["fold"]]
    if len(other):
        first = other.iloc[0]
        raise ValueError(f"{len(other)} stored forecast(s) were made under other folds than this run's, e.g. "
                         f"{first['op']} ({first['candidate_id']}) in {first['fold']!r}, here in "
                         f"{fold_of.get(first['op'])!r}: give the same --folds and --seed, on the same pool")
    if table.duplicated(["op", "candidate_id"]).any():
        raise ValueError("the stored forecasts hold a kernel twice: give each fold's file once")
    merged = kernels[["op", "candidate_id"]].merge(table, on=["op", "candidate_id"], how="left")
    held = kernels["op"].isin(fold_of).to_numpy()
    missing = merged["p_fail"].isna().to_numpy() & held
    if missing.any():
        raise ValueError(f"{int(missing.sum())} of {int(held.sum())} kernels have no stored forecast, e.g. "
                         f"{merged.loc[missing, 'op'].iloc[0]} {merged.loc[missing, 'candidate_id'].iloc[0]}")
    out = pd.DataFrame(index=kernels.index, columns=["fold", "p_fail", "expected", "probs"], dtype=object)
    for column in ("fold", "p_fail", "expected"):
        out[column] = merged[column].to_numpy()
    out["probs"] = pd.Series([np.asarray(p, dtype=float) for p in merged["probs"]], index=kernels.index)
    return out


def blended(first: pd.DataFrame, second: pd.DataFrame, weight: float = 0.5) -> pd.DataFrame:
    """Two forecasters' held-out forecasts of the same kernels (aligned, as ``held_out_forecasts`` and
    ``stored_forecasts`` return them) as one: a mixture of their bin distributions and failure probabilities, and the
    weighted geometric mean of their expected speedups, ``weight`` on ``second``'s. A kernel either leaves
    unforecast stays unforecast; two forecasts of it made under different folds are refused."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"a blend's weight lies in [0, 1], got {weight}")
    if not first.index.equals(second.index):
        raise ValueError("a blend needs forecasts of the same kernels, aligned")
    both = (first["fold"].notna() & second["fold"].notna()).to_numpy()
    clash = both & (first["fold"].astype(object) != second["fold"].astype(object)).to_numpy()
    if clash.any():
        raise ValueError(f"{int(clash.sum())} kernel(s) were held out of different folds by the two forecasters: "
                         "blend forecasts dealt by the same folds")
    out = first.copy()
    out.loc[~both, "fold"] = np.nan
    a, b = 1.0 - weight, weight
    out["p_fail"] = a * first["p_fail"].astype(float) + b * second["p_fail"].astype(float)
    out["expected"] = np.exp(a * np.log(first["expected"].astype(float)) + b * np.log(second["expected"].astype(float)))
    out["probs"] = [a * np.asarray(x, dtype=float) + b * np.asarray(y, dtype=float) if keep else np.asarray(x)
                    for x, y, keep in zip(first["probs"], second["probs"], both)]
    return out


def fold_forecasts(forecaster, kernels: pd.DataFrame, train_failure_rate: float) -> pd.DataFrame:
    """``forecaster``'s forecasts of the rows of ``kernels`` (p_fail, expected, probs), indexed as they are;
    a forecaster that says nothing of failure gets ``train_failure_rate``, the best constant."""
    from kernelcast.surrogate.dataset import source_requests

    forecasts = forecaster.forecast(source_requests(kernels))
    p_fail = np.array([f.failure_probability for f in forecasts], dtype=float)
    p_fail = np.where(np.isfinite(p_fail), p_fail, train_failure_rate)
    probs = metrics.with_failure(np.array([f.probabilities for f in forecasts]), p_fail)
    return pd.DataFrame({"p_fail": p_fail, "expected": [f.expected_speedup for f in forecasts],
                         "probs": list(probs)}, index=kernels.index)


def ranking_score(expected, p_fail) -> np.ndarray:
    """What a candidate is worth measuring: forecast speedup if it runs, times the chance that it runs."""
    return np.asarray(expected, dtype=float) * (1.0 - np.asarray(p_fail, dtype=float))


def worth(speedups, failed) -> np.ndarray:
    """What measuring each candidate found: its speedup, or 0 where it failed."""
    return np.where(np.asarray(failed, dtype=bool), 0.0, np.nan_to_num(np.asarray(speedups, dtype=float)))


def within_problem_spearman(pred, speedups, ran, problems, min_ranked: int = MIN_RANKED) -> pd.Series:
    """Per problem with at least ``min_ranked`` kernels that ran: Spearman of ``pred`` against the
    measured speedup over those kernels (NaN where either side is constant)."""
    frame = pd.DataFrame({"pred": np.asarray(pred, float), "truth": np.asarray(speedups, float),
                          "problem": list(problems)})[np.asarray(ran, bool)]
    out = {}
    for problem, g in frame.groupby("problem"):
        if len(g) >= min_ranked:
            constant = g["pred"].nunique() < 2 or g["truth"].nunique() < 2
            out[problem] = np.nan if constant else float(spearmanr(g["pred"], g["truth"]).statistic)
    return pd.Series(out, dtype=float)


def found_within(score, found, problems, fraction: float, tolerance: float) -> pd.Series:
    """Per problem whose best candidate found anything: whether the best among the top ``fraction`` of
    its pool by ``score`` (at least one) is within ``tolerance`` of the pool's best
    (``kernelcast.surrogate.metrics.topk_recovery``)."""
    frame = pd.DataFrame({"score": np.asarray(score, float), "found": np.asarray(found, float),
                          "problem": list(problems)})
    frame = frame[frame.groupby("problem")["found"].transform("max") > 0]
    if frame.empty:
        return pd.Series(dtype=bool)
    recovery = metrics.topk_recovery(frame["score"].to_numpy(), frame["found"].to_numpy(), frame["problem"], fraction)
    return pd.Series(recovery >= 1.0 - tolerance - 1e-12, index=sorted(frame["problem"].unique()))


def _interval(statistic, values, draws: int, seed: int) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    return metrics.bootstrap_interval(statistic, values, draws=draws, seed=seed)


def _rows_of_problems(kernels: pd.DataFrame) -> list[np.ndarray]:
    """Per problem (sorted by name), the positions of its rows in ``kernels``: what a bootstrap over problems draws."""
    problems = kernels["op"].to_numpy()
    return [np.flatnonzero(problems == p) for p in sorted(set(problems))]


def _over_problems(statistic, rows_of: list[np.ndarray], draws: int, seed: int) -> tuple[float, float]:
    """Bootstrap interval of a statistic of candidate rows, resampling whole problems."""
    return metrics.bootstrap_interval(lambda ids: statistic(np.concatenate([rows_of[i] for i in ids])),
                                      np.arange(len(rows_of)), draws=draws, seed=seed)


def per_problem_figures(kernels: pd.DataFrame, rank, order=None,
                        fractions: Sequence[float] = SELECTION_FRACTIONS) -> dict[str, pd.Series]:
    """Per problem, the yardsticks of one ranking of ``kernels`` (op, speedup, failed): within-problem Spearman of
    ``order`` (``rank`` when not given) against the measured speedup, top-1 and the selections by ``rank``."""
    failed = kernels["failed"].to_numpy(dtype=bool)
    speedups = kernels["speedup"].to_numpy(dtype=float)
    problems = kernels["op"].to_numpy()
    rank = np.asarray(rank, dtype=float)
    found = worth(speedups, failed)
    out = {"spearman": within_problem_spearman(rank if order is None else order, speedups, ~failed, problems),
           "top1_within_10pct": found_within(rank, found, problems, 0.0, TOP1_TOLERANCE)}
    for fraction in fractions:
        out[f"select_top{round(100 * fraction)}_within_20pct"] = found_within(rank, found, problems, fraction,
                                                                             SELECTION_TOLERANCE)
    return {key: values.astype(float) for key, values in out.items()}


def ranking_figures(kernels: pd.DataFrame, rank, order=None, draws: int = 1000, seed: int = 0,
                    fractions: Sequence[float] = SELECTION_FRACTIONS) -> dict:
    """The per-problem yardsticks of one ranking of ``kernels`` (``per_problem_figures``), each the mean over
    problems with its bootstrap 95% interval over problems. Whatever ranks (a forecaster, or another measurement
    of the same kernels) is judged by the same figures."""
    per_problem = per_problem_figures(kernels, rank, order, fractions)
    out = {"problems": int(kernels["op"].nunique()), "kernels": int(len(kernels)),
           "failed": int(kernels["failed"].sum()), "spearman_problems": int(per_problem["spearman"].notna().sum())}
    for key, values in per_problem.items():
        values = values.to_numpy()
        out[key] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
        out[f"{key}_lo"], out[f"{key}_hi"] = _interval(np.mean, values, draws, seed)
    return out


def _candidate_figures(kernels: pd.DataFrame, forecasts: pd.DataFrame) -> dict:
    """{figure: statistic of candidate rows}: failure AUROC, ECE and AURC of ``forecasts`` of ``kernels``."""
    failed = kernels["failed"].to_numpy(dtype=bool)
    p_fail = forecasts["p_fail"].to_numpy(dtype=float)
    probs = np.vstack(forecasts["probs"].to_list())
    true_bins = kernels["true_bin"].to_numpy()
    losses = metrics.selective_loss(probs, true_bins)
    confidence = probs.max(axis=1)
    return {"failure_auroc": lambda r: metrics.auroc(p_fail[r], failed[r]),
            "ece": lambda r: metrics.ece(probs[r], true_bins[r]),
            "aurc": lambda r: metrics.aurc(confidence[r], losses[r])}


def rank_of(forecasts: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(ranking score, expected speedup) of held-out ``forecasts``: how they rank a pool, and what Spearman reads."""
    expected = forecasts["expected"].to_numpy(dtype=float)
    return ranking_score(expected, forecasts["p_fail"].to_numpy(dtype=float)), expected


def score(kernels: pd.DataFrame, forecasts: pd.DataFrame, draws: int = 1000, seed: int = 0,
          fractions: Sequence[float] = SELECTION_FRACTIONS) -> dict:
    """Every yardstick of held-out ``forecasts`` (``held_out_forecasts``) of ``kernels``, each with its
    bootstrap 95% interval over problems (``<key>_lo``, ``<key>_hi``)."""
    done = forecasts["fold"].notna().to_numpy()
    kernels, forecasts = kernels[done], forecasts[done]
    out = ranking_figures(kernels, *rank_of(forecasts), draws, seed, fractions)
    rows_of = _rows_of_problems(kernels)
    for key, statistic in _candidate_figures(kernels, forecasts).items():
        out[key] = statistic(np.arange(len(kernels)))
        out[f"{key}_lo"], out[f"{key}_hi"] = _over_problems(statistic, rows_of, draws, seed)
    return out


def paired_difference(kernels: pd.DataFrame, mine: pd.DataFrame, theirs: pd.DataFrame, draws: int = 1000,
                      seed: int = 0, fractions: Sequence[float] = SELECTION_FRACTIONS) -> dict:
    """Each yardstick of held-out forecasts ``mine`` less that of ``theirs``, on the kernels both forecast, with
    a bootstrap 95% interval over problems that resamples the same problems for both: whether one forecaster
    beats another by more than a tie (``<key>_lo`` > 0 or ``<key>_hi`` < 0), which two intervals of their own,
    each drawn alone, cannot say. Per-problem figures: the mean over problems of the difference (problems where
    both have the figure); candidate-level ones (AUROC, ECE, AURC): the difference of the two statistics."""
    both = (mine["fold"].notna() & theirs["fold"].notna()).to_numpy()
    if not both.any():
        raise ValueError("the two forecasters forecast no kernel in common")
    kernels, mine, theirs = kernels[both], mine[both], theirs[both]
    a, b = per_problem_figures(kernels, *rank_of(mine), fractions), per_problem_figures(kernels, *rank_of(theirs),
                                                                                          fractions)
    out = {"problems": int(kernels["op"].nunique()), "kernels": int(len(kernels))}
    for key in a:
        diff = (a[key] - b[key]).to_numpy()
        out[key] = float(np.nanmean(diff)) if np.isfinite(diff).any() else float("nan")
        out[f"{key}_lo"], out[f"{key}_hi"] = _interval(np.mean, diff, draws, seed)
    rows_of = _rows_of_problems(kernels)
    ours, other = _candidate_figures(kernels, mine), _candidate_figures(kernels, theirs)
    for key in ours:
        statistic = lambda r, key=key: ours[key](r) - other[key](r)  # noqa: E731
        out[key] = statistic(np.arange(len(kernels)))
        out[f"{key}_lo"], out[f"{key}_hi"] = _over_problems(statistic, rows_of, draws, seed)
    return out


REPLAY_BUDGETS = (1, 2)
_TIE_ORDERS = 64  # random orders of tied forecasts a replay averages over


def baseline_best(found: np.ndarray, budget: int) -> float:
    """The best of ``budget`` kernels measured as they come: the mean over every order of ``found``, exactly (the
    i-th smallest is the best of a random draw of ``budget`` with probability C(i-1, budget-1) / C(n, budget))."""
    from math import comb

    values = np.sort(np.asarray(found, dtype=float))
    n, b = len(values), min(budget, len(values))
    return float(sum(v * comb(i, b - 1) for i, v in enumerate(values)) / comb(n, b))


def replayed_search(kernels: pd.DataFrame, score, budgets: Sequence[int] = REPLAY_BUDGETS, draws: int = 1000,
                    seed: int = 0) -> dict:
    """A search over each problem's kernels replayed from their measurements: every kernel a child (the reference's
    resubmission and the written ones alike; none measured for free), measured in the order of ``score`` (ties in a
    random order, the mean of ``_TIE_ORDERS``), against the baseline measuring them as they come (the mean over
    every order) and the perfect forecaster. Per budget: the geometric mean over problems of the best found over the
    baseline's (``best_at_B``, with its bootstrap interval over problems, and the ceiling ``oracle_at_B``); and the
    measurements until a kernel within TOP1_TOLERANCE of the problem's best is found (``to_best``, the baseline's
    (n + 1) / (m + 1) for m such kernels). The best found is never below the reference's 1.0: a search holds its
    reference measured, so a child that fails or runs slower leaves it the reference. Problems where nothing ran
    are left out."""
    rng = np.random.default_rng(seed)
    found = worth(kernels["speedup"], kernels["failed"])
    kept = np.maximum(found, 1.0)  # what the search holds after measuring each: that kernel or its reference
    score = np.asarray(score, dtype=float)
    rows: dict[str, list[float]] = {k: [] for k in ("to_best", "baseline_to_best",
                                                    *(f"{w}_at_{b}" for b in budgets for w in ("best", "oracle")))}
    for rows_of in _rows_of_problems(kernels):
        got, s = found[rows_of], score[rows_of]
        if got.max() <= 0:
            continue
        good = got >= (1.0 - TOP1_TOLERANCE) * got.max() - 1e-12
        orders = [np.lexsort((rng.random(len(s)), -s)) for _ in range(_TIE_ORDERS)]
        rows["to_best"].append(float(np.mean([1 + np.flatnonzero(good[o])[0] for o in orders])))
        rows["baseline_to_best"].append((len(got) + 1) / (good.sum() + 1))
        held = kept[rows_of]
        for b in budgets:
            base = baseline_best(held, b)
            rows[f"best_at_{b}"].append(np.log(np.mean([held[o[:b]].max() for o in orders]) / base))
            rows[f"oracle_at_{b}"].append(np.log(held.max() / base))
    out = {"problems": len(rows["to_best"])}
    for key, values in rows.items():
        values = np.array(values)
        geometric = key.startswith(("best", "oracle"))
        out[key] = float(np.exp(values.mean()) if geometric else values.mean())
        lo, hi = _interval(np.mean, values, draws, seed)
        out[f"{key}_lo"], out[f"{key}_hi"] = (float(np.exp(lo)), float(np.exp(hi))) if geometric else (lo, hi)
    return out
