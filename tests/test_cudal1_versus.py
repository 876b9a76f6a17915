"""benchmarks/cudal1_forecast.py --versus with several forecasters: each other forecaster paired against each named
one, on the same problems (unit level: the held-out forecasts made up, three problems of four kernels)."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from benchmarks import cudal1_forecast


def _held_out(kernels: pd.DataFrame, expected) -> pd.DataFrame:
    probs = [np.full(9, 1 / 9) for _ in range(len(kernels))]
    return pd.DataFrame({"fold": "fold 1/3", "p_fail": 0.1, "expected": np.asarray(expected, float), "probs": probs},
                        index=kernels.index)


def test_versus_names_several_forecasters_and_pairs_every_other_one_against_each():
    speedup = np.tile([0.5, 1.0, 2.0, 4.0], 3)
    kernels = pd.DataFrame({"op": np.repeat(["p1", "p2", "p3"], 4), "speedup": speedup, "failed": False,
                            "true_bin": 5})
    forecasts = {"labels": _held_out(kernels, np.ones(12) + np.arange(12) % 2),
                 "learned": _held_out(kernels, speedup), "learned-facts": _held_out(kernels, speedup[::-1])}
    args = argparse.Namespace(versus="labels,learned,absent", draws=50, seed=0)
    rows = cudal1_forecast.versus(args, kernels, forecasts)
    assert sorted(zip(rows["versus"], rows["forecaster"])) == [
        ("labels", "learned"), ("labels", "learned-facts"), ("learned", "labels"), ("learned", "learned-facts")]
    by = rows.set_index(["versus", "forecaster"])
    assert by.loc[("learned", "learned-facts"), "spearman"] == -2.0  # the reverse of a perfect ranking
    assert (rows["problems"] == 3).all()
