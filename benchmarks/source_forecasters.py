"""Forecasters of written kernels, failure included, held out by operation: source, learned, roofline, random.

    python benchmarks/source_forecasters.py --data data/pools --llm data/pools/llm --gpu-type h100 \
        [--draws 1000] [--out docs/measured/source_forecasters/source_forecasters]

Every measured kernel of the corpus with source (``kernelcast.surrogate.dataset.source_pairs``: the template
variants against the op's eager reference, the language model's children against the parent they
rewrote, failed ones included) is forecast by a forecaster fit on the other operations only
(leave-one-operation-out). The learned forecaster's rank models fit on the other operations'
per-case pairs (``case_pairs``), its source model on their kernels. Roofline and random say
nothing of failure: roofline is given the training kernels' failure rate (the best constant),
random a uniform draw.

The scores are over bins 0..8 (``kernelcast.surrogate.metrics.outcome_summary``), on three sets: all
kernels, the language model's children only, and the template variants only; each with a
bootstrap 95% interval. ECE after recalibration, two ways, each scored on kernels its fit did
not see. ``ece_recalibrated``: as a search does it (``kernelcast.surrogate.evaluate``'s protocol), a random
20% of the held-out operation's kernels count as measured; a forecaster with a Gaussian over log
speedup is recentred per operation on those that ran (``kernelcast.surrogate.evaluate.recentred``), then a
Platt map of the 9-bin confidence is fit on them; ECE is scored on the other 80%.
``ece_recalibrated_other_ops``: a Platt map fit on the other operations' forecasts of the same
set, nothing of the held-out operation seen. Forecasts per second: forecast calls on cold
feature caches, one thread.

With ``--llm-url URL --llm-model NAME --llm-sample N`` (each may repeat: one model per URL, one
sample size for all or one per model) the scores are instead over sets ``llm_sample_<N>``: the
first N of the language model's children in one order stratified by operation and status with a
fixed seed (``llm_sample``), forecast zero-shot by each model whose sample holds them, through
``OpenAIForecaster`` (the search's own client and prompt), beside the forecasters above, whose
leave-one-operation-out forecasts of the same kernels are scored. A forecast that says nothing
of failure (an answer without it, or none that parsed) counts as P(fail) 0.5; parse rate and the
share of answers that gave a failure probability are reported, and forecasts per second of
server time. ``--llm-cache DIR`` keeps the answers and each one's server seconds: a rerun, or a
larger sample, asks nothing again.

Prints the table and writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

GOALS = {"failure_auroc": (">=", 0.85), "spearman_valid": (">=", 0.5), "ece_recalibrated": ("<=", 0.05),
         "aurc_over_random_forecaster": ("<=", 0.5)}
FORECASTERS = ("source", "learned", "roofline", "random")
SUBSETS = {"all": lambda f: np.ones(len(f), bool), "llm": lambda f: (f["origin"] == "llm").to_numpy(),
           "template": lambda f: (f["origin"] == "template").to_numpy()}
COLUMNS = ("n", "failed", "parse_rate", "failure_given", "failure_auroc", "spearman_valid", "bin_accuracy", "ece", "ece_recalibrated",
           "ece_recalibrated_other_ops", "aurc", "random_aurc", "aurc_over_random_forecaster", "forecasts_per_s")
MEASURED_FRACTION = 0.2


def _clear_caches() -> None:
    from kernelcast.surrogate.features import clear_feature_caches
    from kernelcast.surrogate.source import change_features, code_features

    clear_feature_caches()
    code_features.cache_clear()
    change_features.cache_clear()


def _fit(name: str, cases: pd.DataFrame, kernels: pd.DataFrame):
    from kernelcast.surrogate.registry import get_forecaster_factory

    forecaster = get_forecaster_factory(name)()
    if name == "learned":
        return forecaster.fit(cases, sources=kernels)
    return forecaster.fit(kernels)


def held_out_forecasts(kernels: pd.DataFrame, cases: pd.DataFrame, name: str, seed: int = 0) -> dict:
    """Leave-one-operation-out forecasts of ``name`` for every row of ``kernels``: (n, 9) probabilities,
    expected speedups, the seconds spent forecasting, and each row's held-out operation."""
    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.metrics import with_failure

    n = len(kernels)
    probs, expected, seconds = np.zeros((n, 9)), np.zeros(n), 0.0
    mean, sigma = np.full(n, np.nan), np.full(n, np.nan)
    rng = np.random.default_rng(seed)
    for op in sorted(kernels["op"].unique()):
        test = (kernels["op"] == op).to_numpy()
        train = kernels[~test]
        forecaster = _fit(name, cases[cases["op"] != op], train)
        requests = source_requests(kernels[test])
        _clear_caches()
        t0 = time.perf_counter()
        out = forecaster.forecast(requests)
        seconds += time.perf_counter() - t0
        p_fail = np.array([f.failure_probability for f in out])
        if name == "roofline":
            p_fail = np.full(len(out), train["failed"].mean())
        elif name == "random":
            p_fail = rng.random(len(out))
        probs[test] = with_failure(np.array([f.probabilities for f in out]), p_fail)
        expected[test] = [f.expected_speedup for f in out]
        mean[test] = [f.extra.get("log_speedup_mean", np.nan) for f in out]
        sigma[test] = [f.extra.get("log_speedup_sigma", np.nan) for f in out]
        print(f"  {name} held out {op}: {int(test.sum())} kernels", flush=True)
    return {"probs": probs, "expected": expected, "mean": mean, "sigma": sigma, "seconds": seconds}


def llm_sample(kernels: pd.DataFrame, n: int, seed: int = 0) -> np.ndarray:
    """Row positions of ``n`` of the language model's children, stratified by (op, status), in the
    order they are asked: round-robin over the strata (visited in a seeded order), a seeded draw
    within each. Any first k are a stratified sample of k: one kernel per stratum before any
    stratum gets a second, so a run cut short still scores a spread of operations and statuses,
    and small strata (the children that ran) are over-represented against the corpus."""
    children = np.flatnonzero((kernels["origin"] == "llm").to_numpy())
    if not 0 < n <= len(children):
        raise ValueError(f"--llm-sample must lie in 1..{len(children)} (the language model's children), got {n}")
    rng = np.random.default_rng(seed)
    strata = kernels.iloc[children].groupby(["op", "status"]).indices  # (op, status) -> positions in children
    queues = [list(children[strata[k]][rng.permutation(len(strata[k]))]) for k in sorted(strata)]
    queues = [queues[i] for i in rng.permutation(len(queues))]
    order = [q[depth] for depth in range(max(map(len, queues))) for q in queues if depth < len(q)]
    return np.array(order[:n])


def llm_forecasts(kernels: pd.DataFrame, rows: np.ndarray, url: str, model: str, cache_dir: str | None,
                  schema_style: str, deadline: float = math.inf, concurrency: int = 1) -> dict:
    """Zero-shot forecasts of the kernels at ``rows`` by ``model`` served at ``url``, over bins 0..8, and
    per kernel: the server seconds its answer took, whether it parsed, whether it gave a failure probability.
    Asked in order until ``time.monotonic()`` passes ``deadline``: the kernels answered by then are
    the first k of ``rows`` (cached answers are free), and only those are returned."""
    from benchmarks.llm_forecaster import timed_forecasts
    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.llm import OpenAIForecaster
    from kernelcast.surrogate.metrics import with_failure

    cache = os.path.join(cache_dir, model) if cache_dir else None
    llm = OpenAIForecaster(url, model, schema_style=schema_style, concurrency=1, timeout_s=900, retries=1,
                           cache_dir=cache)
    llm.probe()
    out, seconds = [], []
    requests = source_requests(kernels.iloc[rows])
    for start in range(0, len(requests), concurrency):  # in groups: the deadline is checked between them
        if time.monotonic() > deadline:
            print(f"  {model}: the time for language models ran out after {len(out)} of {len(rows)} kernels",
                  flush=True)
            break
        group = requests[start:start + concurrency]
        forecasts, spent = timed_forecasts(llm, group, Path(cache) if cache else None, concurrency)
        out += forecasts
        seconds += list(spent)
        print(f"  {model}: {len(out)}/{len(rows)} answered, {max(spent):.0f} s for the last {len(group)}", flush=True)
    p_fail = np.array([f.failure_probability for f in out])
    given = np.isfinite(p_fail)
    for f in [f for f in out if not f.parsed][:3]:
        print(f"  {model} unparsed: {f.raw_response[:160]!r}", flush=True)
    bins = np.array([f.probabilities for f in out]).reshape(len(out), 8)
    return {"probs": with_failure(bins, np.where(given, p_fail, 0.5)),
            "expected": np.array([f.expected_speedup for f in out]), "mean": np.full(len(out), np.nan),
            "sigma": np.full(len(out), np.nan), "seconds": np.asarray(seconds, dtype=float),
            "parsed": np.array([f.parsed for f in out], dtype=float), "failure_given": given.astype(float)}


def recalibrated_on_measured(probs: np.ndarray, mean: np.ndarray, sigma: np.ndarray, frame: pd.DataFrame,
                             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(9-bin probabilities recalibrated per operation on a random 20% of its kernels, mask of the rows
    scored: those not measured, in operations where a fit was possible)."""
    from kernelcast.surrogate.calibration import PlattCalibrator
    from kernelcast.surrogate.evaluate import measured_candidates, recentred

    out, scored = probs.copy(), np.zeros(len(frame), bool)
    true_bins, ran = frame["true_bin"].to_numpy(), (frame["true_bin"] > 0).to_numpy()
    for k, op in enumerate(sorted(frame["op"].unique())):
        mine = (frame["op"] == op).to_numpy()
        if mine.sum() < 2:
            continue  # nothing would be left to score
        measured = np.zeros(len(frame), bool)
        measured[mine] = measured_candidates(frame[mine], MEASURED_FRACTION, seed + k)
        speed = probs[:, 1:] / probs[:, 1:].sum(axis=1, keepdims=True)
        rows = mine & ran
        if rows.any():  # the speed bins of the kernels that ran, recentred where enough of them were measured
            speed[rows] = recentred(speed[rows], mean[rows], sigma[rows], frame[rows], measured[rows])[0]
        nine = np.hstack([probs[:, :1], speed * (1 - probs[:, :1])])
        out[mine & ~measured] = PlattCalibrator().fit(nine[measured], true_bins[measured]).transform(
            nine[mine & ~measured])
        scored |= mine & ~measured
    return out, scored


def recalibrated(probs: np.ndarray, true_bins: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """Each operation's 9-bin forecasts Platt-recalibrated by a fit on the other operations' forecasts."""
    from kernelcast.surrogate.calibration import PlattCalibrator

    out = probs.copy()
    for op in np.unique(ops):
        mine = ops == op
        if (~mine).sum() >= 2:
            out[mine] = PlattCalibrator().fit(probs[~mine], true_bins[~mine]).transform(probs[mine])
    return out


def main() -> int:
    from threadpoolctl import threadpool_limits

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs, source_pairs
    from kernelcast.surrogate import metrics
    from kernelcast.surrogate.metrics import outcome_summary

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/pools")
    p.add_argument("--llm", default="data/pools/llm")
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--forecasters", default=",".join(FORECASTERS))
    p.add_argument("--draws", type=int, default=1000, help="bootstrap draws per interval")
    p.add_argument("--out", default=None, help="path stem of the JSON and Markdown results")
    p.add_argument("--llm-url", action="append", default=[], help="an OpenAI-compatible server (repeatable)")
    p.add_argument("--llm-model", action="append", default=[], help="the model each --llm-url serves")
    p.add_argument("--llm-sample", type=int, action="append", default=[],
                   help="children the language models forecast (40): one for all, or one per --llm-model")
    p.add_argument("--llm-schema-style", default="json_object",
                   help="how the server is asked for the answer schema (json_object: llama-cpp-python's server)")
    p.add_argument("--llm-cache", default=None, help="folder of the language models' answers, reused on a rerun")
    p.add_argument("--llm-concurrency", type=int, default=1,
                   help="requests in flight at once (a batching server, such as kernelcast.infra.engine or vLLM, answers "
                        "them together; then each answer's seconds are its latency in the batch)")
    p.add_argument("--llm-minutes", type=float, default=math.inf,
                   help="stop asking the language models after this long; each is scored on what it answered")
    args = p.parse_args()
    if len(args.llm_url) != len(args.llm_model):
        p.error(f"each --llm-url needs its --llm-model: got {len(args.llm_url)} URLs, {len(args.llm_model)} models")
    sizes = args.llm_sample or [40]
    if len(sizes) not in (1, len(args.llm_model)):
        p.error(f"give one --llm-sample, or one per --llm-model: got {len(sizes)} for {len(args.llm_model)} models")
    sizes = dict(zip(args.llm_model, sizes * len(args.llm_model) if len(sizes) == 1 else sizes))

    t0 = time.perf_counter()
    kernels = source_pairs(DataRoot(args.data), DataRoot(args.llm), gpu_type=args.gpu_type)
    cases = case_pairs(DataRoot(args.data), gpu_type=args.gpu_type)
    print(f"{len(kernels)} kernels ({int(kernels['failed'].sum())} failed, "
          f"{int((kernels['origin'] == 'llm').sum())} written by the language model), "
          f"{kernels['op'].nunique()} operations, {args.gpu_type}; {len(cases)} per-case pairs for the rank models",
          flush=True)
    true_bins, speedups = kernels["true_bin"].to_numpy(), kernels["speedup"].to_numpy(dtype=float)
    ops = kernels["op"].to_numpy()
    subsets, asked = SUBSETS, None
    if args.llm_url:
        # One set per sample size, each the first n of one stratified order: every model is scored on
        # the sets no larger than its own sample, beside the other forecasters on the same kernels.
        sample = llm_sample(kernels, max(sizes.values()))
        subsets = {f"llm_sample_{n}": _first(sample, n, len(kernels)) for n in sorted(set(sizes.values()))}
        for name, pick in subsets.items():
            mask = pick(kernels)
            print(f"{name}: {int(mask.sum())} children ({int(kernels['failed'].to_numpy()[mask].sum())} failed), "
                  f"stratified by operation and status", flush=True)
        # The servers answer while the other forecasters fit here: the client thread only waits on HTTP.
        deadline = time.monotonic() + 60 * args.llm_minutes
        asked = ThreadPoolExecutor(max_workers=1).submit(
            lambda: {model: llm_forecasts(kernels, sample[:sizes[model]], url, model, args.llm_cache,
                                          args.llm_schema_style, deadline, args.llm_concurrency)
                     for url, model in zip(args.llm_url, args.llm_model)})
    forecasts = {}
    with threadpool_limits(1):
        for name in args.forecasters.split(","):
            t = time.perf_counter()
            forecasts[name] = held_out_forecasts(kernels, cases, name)
            print(f"{name}: {time.perf_counter() - t:.0f} s", flush=True)
    for model, f in (asked.result() if asked else {}).items():
        sizes[model] = len(f["probs"])  # what it answered in time
        forecasts[model] = {k: _scattered(v, sample[:sizes[model]], len(kernels)) for k, v in f.items()}
        print(f"{model}: {np.nansum(f['seconds']):.0f} s of server time, parse rate {f['parsed'].mean():.3f}, "
              f"failure given {f['failure_given'].mean():.3f}", flush=True)

    if args.llm_url:  # the sets again: a model that ran out of time is scored on what it answered
        subsets = {f"llm_sample_{n}": _first(sample, n, len(kernels)) for n in sorted(set(sizes.values())) if n}
    rows = []
    for subset, pick in subsets.items():
        mask = pick(kernels)
        for name, f in forecasts.items():
            if not np.isfinite(f["expected"][mask]).all():
                continue  # a language model's sample is smaller than this set
            probs = f["probs"][mask]
            summary = outcome_summary(probs, true_bins[mask], f["expected"][mask], speedups[mask],
                                      recalibrated=recalibrated(probs, true_bins[mask], ops[mask]), draws=args.draws)
            summary = {k.replace("ece_recalibrated", "ece_recalibrated_other_ops"): v for k, v in summary.items()}
            cal, scored = recalibrated_on_measured(probs, f["mean"][mask], f["sigma"][mask], kernels[mask])
            if scored.any():  # no operation of a small set may have two kernels to fit on
                summary["ece_recalibrated"] = metrics.ece(cal[scored], true_bins[mask][scored])
                summary["ece_recalibrated_lo"], summary["ece_recalibrated_hi"] = metrics.bootstrap_interval(
                    lambda p, t: metrics.ece(p, t), cal[scored], true_bins[mask][scored], draws=args.draws)
                summary["ece_raw_on_those"] = metrics.ece(probs[scored], true_bins[mask][scored])
            else:
                summary |= {k: np.nan for k in ("ece_recalibrated", "ece_recalibrated_lo", "ece_recalibrated_hi",
                                                "ece_raw_on_those")}
            if "parsed" in f:  # a language model: rates and server seconds of the set's own answers
                seconds = f["seconds"][mask]
                timed = seconds > 0  # a cached answer whose first run's seconds were not kept counts out
                summary |= {"parse_rate": f["parsed"][mask].mean(), "failure_given": f["failure_given"][mask].mean(),
                            "forecasts_per_s": timed.sum() / seconds[timed].sum() if timed.any() else np.nan}
            else:
                summary |= {"parse_rate": 1.0, "failure_given": np.nan, "forecasts_per_s": len(kernels) / f["seconds"]}
            rows.append({"set": subset, "forecaster": name, **summary})
        if "random" in forecasts:
            random_aurc = next(r["aurc"] for r in rows if r["set"] == subset and r["forecaster"] == "random")
            for r in rows:
                if r["set"] == subset:
                    r["aurc_over_random_forecaster"] = r["aurc"] / random_aurc
    table = pd.DataFrame(rows)
    telling = _telling_features(kernels[SUBSETS["llm"](kernels)])
    print("the language model's children, mean of features that tell failure:")
    print(telling.round(3).to_string())
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table[["set", "forecaster", *[c for c in COLUMNS if c in table]]].round(3).to_string(index=False))
    goals = _goals(table, ["source", *args.llm_model])
    for line in goals:
        print(line)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.out:
        flags = [(k, x) for k, v in vars(args).items() for x in (v if isinstance(v, list) else [v]) if x is not None]
        meta = {"command": "python benchmarks/source_forecasters.py " + " ".join(
                    f"--{k.replace('_', '-')} {v}" for k, v in flags),
                "kernels": len(kernels), "failed": int(kernels["failed"].sum()),
                "llm_children": int((kernels["origin"] == "llm").sum()), "gpu_type": args.gpu_type,
                "split": "leave-one-operation-out", "operations": sorted(kernels["op"].unique())}
        if args.llm_url:
            meta |= {"llm_sample": [kernels["candidate_id"].iloc[i] for i in sample], "llm_sample_sizes": sizes,
                     "llm_sample_status": kernels["status"].to_numpy()[sample].tolist()}
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out + ".json", "w") as fh:
            json.dump({**meta, "rows": table.to_dict("records"), "goals": goals,
                       "telling_features_llm": telling.to_dict()}, fh, indent=1, default=float)
        with open(args.out + ".md", "w") as fh:
            fh.write(_markdown(table, goals, meta))
    return 0


TELLING = ("undefined_name", "calls_removed", "token_edit_ratio", "unjitted_launches", "missing_tl_attributes",
           "parses")


def _telling_features(kernels: pd.DataFrame) -> pd.DataFrame:
    """Mean of a few source features over the kernels that failed and those that ran."""
    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.source import SourceFeatures

    X = pd.DataFrame(SourceFeatures().matrix(source_requests(kernels)), columns=SourceFeatures.names)
    failed = kernels["failed"].to_numpy()
    return pd.DataFrame({"failed": X[failed][list(TELLING)].mean(), "ran": X[~failed][list(TELLING)].mean()})


def _first(sample: np.ndarray, n: int, size: int):
    """The set of the first ``n`` kernels of ``sample``: a function of the frame, as SUBSETS are."""
    mask = np.zeros(size, bool)
    mask[sample[:n]] = True
    return lambda f: mask


def _scattered(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``values`` of ``rows`` (positions, in that order) at their place among ``n`` rows (NaN elsewhere)."""
    out = np.full((n, *values.shape[1:]), np.nan)
    out[rows] = values
    return out


def _goals(table: pd.DataFrame, forecasters: list[str]) -> list[str]:
    """One line per goal for each of ``forecasters`` on each set: met or not, with the interval."""
    lines = []
    for r in table[table["forecaster"].isin(forecasters)].to_dict("records"):
        for key, (sense, bound) in GOALS.items():
            value = r.get(key, float("nan"))
            if not np.isfinite(value):
                lines.append(f"{r['forecaster']} on {r['set']}: {key} undefined on this set (one outcome only, "
                             "or no operation with kernels to fit on)")
                continue
            met = value >= bound if sense == ">=" else value <= bound
            interval = f" [{r[key + '_lo']:.3f}, {r[key + '_hi']:.3f}]" if key + "_lo" in r else ""
            lines.append(f"{r['forecaster']} on {r['set']}: {key} {value:.3f}{interval} (goal {sense} {bound}): "
                         f"{'met' if met else 'NOT met'}")
    return lines


def _cell(r: dict, key: str) -> str:
    value = r.get(key, float("nan"))
    if key + "_lo" in r and np.isfinite(r[key + "_lo"]):
        return f"{value:.3f} [{r[key + '_lo']:.2f}, {r[key + '_hi']:.2f}]"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _markdown(table: pd.DataFrame, goals: list[str], meta: dict) -> str:
    keys = ("failure_auroc", "spearman_valid", "bin_accuracy", "ece", "ece_recalibrated",
            "ece_recalibrated_other_ops", "aurc", "aurc_over_random_forecaster")
    lines = [f"`{meta['command']}`", "",
             "| set | forecaster | kernels (failed) | parse rate | failure given | failure AUROC | Spearman (ran) | "
             "9-bin acc. | ECE | ECE recal. (20% measured) | ECE recal. (other ops) | AURC | AURC / random's | "
             "forecasts/s |",
             "|" + "---|" * 14]
    for r in table.to_dict("records"):
        lines.append(f"| {r['set']} | {r['forecaster']} | {r['n']} ({r['failed']}) | {r['parse_rate']:.3f} | "
                     f"{r['failure_given']:.3f} | " + " | ".join(_cell(r, k) for k in keys)
                     + f" | {r['forecasts_per_s']:.3g} |")
    return "\n".join(lines + ["", *[f"- {g}" for g in goals], ""])


if __name__ == "__main__":
    raise SystemExit(main())
