"""The paper's speedup bins: speedup S = reference runtime / candidate runtime.

Bin 0 is failure (any status but ok: does not compile, is incorrect, crashes, times out or is
rejected as a cheat); bins 1-8 have upper edges
0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0 and infinity.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

import numpy as np

UPPER_EDGES = (0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0, math.inf)
N_BINS = len(UPPER_EDGES)  # 8 speedup bins, numbered 1..8
FAILURE_BIN = 0
# A representative speedup per bin: the geometric midpoint of its edges (the open
# ends use the next edge's ratio), used to turn a bin distribution into a speedup.
_LOWER = (UPPER_EDGES[0] / 2,) + UPPER_EDGES[:-1]
_UPPER = UPPER_EDGES[:-1] + (UPPER_EDGES[-2] * 2,)
BIN_SPEEDUP = tuple(math.sqrt(lo * hi) for lo, hi in zip(_LOWER, _UPPER))


def speedup_bin(speedup: float | None) -> int:
    """Bin 1..8 of a measured speedup; 0 for a failed candidate (None, NaN or non-positive)."""
    if speedup is None or math.isnan(speedup) or speedup <= 0:
        return FAILURE_BIN
    return bisect.bisect_left(UPPER_EDGES, speedup) + 1


def expected_speedup(probabilities: Sequence[float]) -> float:
    """Expected speedup under 8 bin probabilities, averaged in log space (speedups are ratios)."""
    if len(probabilities) != N_BINS:
        raise ValueError(f"expected {N_BINS} bin probabilities, got {len(probabilities)}")
    total = float(sum(probabilities))
    if not total > 0:
        raise ValueError("bin probabilities sum to zero")
    return math.exp(sum(p * math.log(s) for p, s in zip(probabilities, BIN_SPEEDUP)) / total)


def first_bin(probs) -> int:
    """The bin of column 0: 1 for the 8 speedup bins, 0 (failure) when failure is a ninth column."""
    width = np.shape(probs)[-1]
    if width == N_BINS:
        return 1
    if width == N_BINS + 1:
        return FAILURE_BIN
    raise ValueError(f"bin probabilities have {N_BINS} columns (bins 1..8) or {N_BINS + 1} (bins 0..8), "
                     f"got {width}")


def predicted_bins(probs) -> np.ndarray:
    """The most probable bin of each forecast, numbered as its columns are."""
    return np.asarray(probs).argmax(axis=1) + first_bin(probs)


_LOG_EDGES = np.log(np.array(UPPER_EDGES[:-1]))


def bin_probabilities(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """(n, 8) bin probabilities of a Gaussian N(mu, sigma) over log speedup."""
    # imported here: the storage schema imports this module, and a command refusing a bad flag should not pay
    # the most of a second that scipy.stats takes
    from scipy.stats import norm

    cdf = norm.cdf((_LOG_EDGES[None, :] - mu[:, None]) / sigma[:, None])
    cdf = np.hstack([np.zeros((len(mu), 1)), cdf, np.ones((len(mu), 1))])
    return np.clip(np.diff(cdf, axis=1), 1e-9, None)
