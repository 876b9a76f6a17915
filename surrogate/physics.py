"""The physics forecaster: what each kernel makes the device do (``kernelcast.kernels.facts``), timed by a model of
the GPU type (``kernelcast.kernels.gpumodel``), against its anchor timed the same way.

Per request: the anchor's and the candidate's facts on each case, found on the CPU (no GPU), their modelled
runtimes, and the log of their ratio as the mean log speedup; where the model's constants are wrong both
sides are wrong alike, and most of it cancels. A kernel that does not compile for the target is forecast to
fail (``COMPILE_FAILURE``); a kernel whose host code cannot run on meta tensors says nothing of what it does,
and gets the pool's prior (no speedup, a wide spread, the base failure rate).

``fit`` (optional) learns a correction of that mean from measured pairs whose facts can be found: a boosted
regression of the residual log speedup on the facts themselves (``facts_features``), with the spread from its
out-of-fold residuals, and the base failure rate from the pairs. Unfit, the forecaster is the model alone,
with ``PRIOR_SIGMA``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Sequence

import numpy as np

from kernelcast.kernels.facts import DEFAULT_CACHE_DIR
from kernelcast.surrogate.forecast import ForecastRequest, gaussian_forecasts

COMPILE_FAILURE = 0.97  # P(fails) of a kernel that does not compile for the target: a compiler's verdict
PRIOR_SIGMA = 0.45  # spread of the model's log speedup before any fit (about 1.6x either way)
UNKNOWN_SIGMA = 1.0  # where the facts could not be found
BASE_FAILURE = 0.12  # P(fails) of a kernel that compiles, before a fit: wrong math is not seen here
TIE = 1e-9  # log speedups this close are one forecast (the contenders of physics-probe-top)
PROBED_WRONG = 0.95  # P(fails) of a kernel the interpreted harness found wrong (``probe``): a check's verdict
_BOUNDS = ("memory", "compute", "latency", "launch", "resources", "unknown")
FACT_FEATURES = ("model_log_speedup", "log_candidate_us", "log_anchor_us", "log_launch_ratio", "log_bytes_ratio",
                 "candidate_launches", "triton_launches", "occupancy", "log_waves", "registers", "spill_bytes",
                 "load_bits", "compiled", "graphed", "cublas", "cudnn", "sdpa", "tensor_cores",
                 *(f"bound_{b}" for b in _BOUNDS))
# The facts that break a rule the harness judges by (docs/harness.md) or that CUDA enforces: a write into an input,
# an output that is an input, a CUDA graph whose replays read the first call's inputs or a tensor let go after its
# capture, a capture on the default stream, outputs unlike the reference's in shape, dtype or layout. A kernel with
# one is forecast to fail at RULE_FAILURE: a check's verdict found on meta tensors.
RULE_FACTS = ("writes_input", "returns_input", "graph_stale_input", "graph_reads_freed", "graph_default_stream",
              "outputs_unlike")
RULE_FAILURE = 0.9
# What the learned forecaster's source part reads of the facts (``facts_matrix``): FACT_FEATURES, and what a
# kernel's facts say outright, absolute bytes and FLOPs, extension calls, whether the facts are a compile error (a
# failure found without a GPU) or unknown (host code that does not run on meta tensors), the rules it breaks, and
# two leanings: cuDNN autotuning turned on, arithmetic in half precision where the anchor has none
LEARNED_FACT_FEATURES = (*FACT_FEATURES, "log_bytes", "log_flops", "log_anchor_launches", "cuda_calls",
                         "compile_error", "facts_unknown", *RULE_FACTS, "cudnn_benchmark", "lower_precision")
RULE_TEXT = {"writes_input": "writes into an input", "returns_input": "returns an input (or a view of one)",
             "graph_stale_input": "a CUDA graph whose replays read the first call's inputs",
             "graph_reads_freed": "a CUDA graph whose replays read a tensor let go after its capture",
             "graph_default_stream": "a CUDA graph captured on the default stream",
             "outputs_unlike": "outputs unlike the reference's in shape, dtype or layout"}
_HALF = ("float16", "bfloat16")


def _case_of(op, name: str):
    return next((c for c in op.cases if c.name == name), None)


def _cases(op, request: ForecastRequest):
    named = [c for c in (_case_of(op, n) for n in request.case_names) if c is not None]
    return named or list(op.cases[:1])


def target_of_gpu(hardware) -> str:
    """The compile target of the request's GPU: its compute capability, else the GPU type's (sm_90 for Hopper)."""
    from kernelcast.kernels.harness.ahead import target_of

    known = {"h100": "cuda:90", "h200": "cuda:90", "gh200": "cuda:90", "h20": "cuda:90", "a100": "cuda:80",
             "l40s": "cuda:89", "l40": "cuda:89", "l4": "cuda:89", "rtx3090": "cuda:86", "rtx4090": "cuda:89",
             "b200": "cuda:100"}
    return target_of(hardware.compute_capability) or known.get(hardware.gpu_type, "cuda:90")


def modelled(op, candidate, case, hardware, reference_flops: float = 0.0, isolated: bool = False,
             cache_dir: str | None = None):
    """(facts, estimate) of ``candidate`` on ``case`` for ``hardware``'s GPU type."""
    from kernelcast.kernels.facts import extract
    from kernelcast.kernels.gpumodel import estimate, gpu_model

    facts = extract(op, candidate, case, target_of_gpu(hardware), isolated, cache_dir)
    gpu = gpu_model(hardware.gpu_type if hardware.gpu_type in _known_gpus() else "h100")
    return facts, estimate(facts, gpu, reference_flops)


def _known_gpus():
    from kernelcast.kernels.gpumodel import MODELS

    return MODELS


def find_facts(requests: Sequence[ForecastRequest], isolated: bool = False, cache_dir: str | None = None) -> None:
    """Find (and cache, in ``cache_dir`` too when given) the facts of every anchor and candidate of ``requests`` at
    once: in child processes where ``isolated`` (``kernelcast.kernels.facts.extract_many``)."""
    from kernelcast.kernels.facts import extract_many
    from kernelcast.kernels.ops import get_operation

    jobs = []
    for r in requests:
        op = get_operation(r.op)
        for case in _cases(op, r):
            jobs += [(op, r.anchor, case, target_of_gpu(r.hardware)), (op, r.candidate, case, target_of_gpu(r.hardware))]
    if jobs:
        extract_many(jobs, isolated, cache_dir)


def request_facts(request: ForecastRequest, isolated: bool = False, cache_dir: str | None = None) -> dict:
    """The facts and modelled times of one request, summed (times, bytes, launches) or taken from the longest
    Triton launch (occupancy, registers) over its cases; ``status`` the candidate's worst."""
    from kernelcast.kernels.ops import get_operation

    op = get_operation(request.op)
    out = {"status": "ok", "error": "", "candidate_us": 0.0, "anchor_us": 0.0, "bytes": 0.0, "anchor_bytes": 0.0,
           "flops": 0.0, "launches": 0, "anchor_launches": 0, "triton_launches": 0, "registers": -1,
           "spill_bytes": 0, "load_bits": 0, "occupancy": math.nan, "waves": math.nan, "compiled": False,
           "graphed": False, "libraries": {}, "tensor_cores": False, "bound": "unknown", "seconds": 0.0,
           "cuda_calls": 0, **{r: False for r in RULE_FACTS}, "cudnn_benchmark": False, "lower_precision": False}
    worst = {"ok": 0, "host_error": 1, "unknown": 1, "compile_error": 2}
    for case in _cases(op, request):
        a_facts, a_est = modelled(op, request.anchor, case, request.hardware, isolated=isolated, cache_dir=cache_dir)
        c_facts, c_est = modelled(op, request.candidate, case, request.hardware, a_facts.flops, isolated, cache_dir)
        out["seconds"] += a_facts.seconds + c_facts.seconds
        if worst.get(c_facts.status, 1) > worst[out["status"]]:
            out["status"], out["error"] = c_facts.status, c_facts.error
        if a_facts.status != "ok" and out["status"] == "ok":
            out["status"], out["error"] = "unknown", f"anchor: {a_facts.error}"
        if c_facts.status != "ok" or a_facts.status != "ok":
            continue
        for name, broken in rule_facts(c_facts, a_facts).items():
            out[name] |= broken
        out["candidate_us"] += c_est.runtime_us
        out["anchor_us"] += a_est.runtime_us
        out["bytes"] += _bytes(c_facts)
        out["anchor_bytes"] += _bytes(a_facts)
        out["flops"] += c_facts.flops or a_facts.flops
        out["launches"] += _launches(c_facts)
        out["anchor_launches"] += _launches(a_facts)
        out["triton_launches"] += len(c_facts.triton)
        out["cuda_calls"] += len(c_facts.cuda_kernels)
        out["compiled"] |= c_facts.compiled
        out["graphed"] |= c_facts.graphed
        out["autocast"] = c_facts.autocast or out.get("autocast", "")
        for lib, n in c_facts.libraries().items():
            out["libraries"][lib] = out["libraries"].get(lib, 0) + n
        if c_facts.triton:
            longest = max(c_facts.triton, key=lambda t: t.arg_bytes)
            out["registers"], out["spill_bytes"] = longest.registers, longest.spill_bytes
            out["load_bits"] = longest.load_bits
            out["tensor_cores"] |= any(t.tensor_cores for t in c_facts.triton)
        out["occupancy"], out["waves"], out["bound"] = c_est.occupancy, c_est.waves, c_est.bound
    return out


def _bytes(facts) -> float:
    """The bytes a call moves: under torch.compile its inputs and outputs once and its library calls' own."""
    moved = sum(t.arg_bytes for t in facts.triton) + sum(c["arg_bytes"] for c in facts.cuda_kernels)
    if facts.compiled:
        return moved + facts.input_bytes + facts.output_bytes + sum(o.bytes for o in facts.aten if o.library)
    return moved + facts.aten_bytes


def _launches(facts) -> int:
    """Kernel launches per call: under torch.compile one per reduction plus one, and the library calls."""
    if facts.compiled:
        return 1 + sum(1 for o in facts.aten if o.library or o.reduction) + len(facts.triton)
    return facts.launches


def rule_facts(candidate, anchor) -> dict[str, bool]:
    """What of the harness's rules ``candidate``'s facts break against its anchor's on one case (``RULE_FACTS``), and
    the facts that only tilt a failure forecast: cuDNN autotuning turned on, arithmetic in half precision where the
    anchor has none. Outputs are compared only where no CUDA C++ extension made them (its output is a guess)."""
    def unlike(c, a) -> bool:
        shape_c, stride_c, dtype_c = c
        shape_a, stride_a, dtype_a = a
        dense = math.prod(shape_a) > 1
        return shape_c != shape_a or dtype_c != dtype_a or (dense and stride_c != stride_a)

    def half(facts) -> bool:
        return bool(facts.autocast) or any(o.dtype in _HALF for o in facts.aten)

    compared = not candidate.cuda_kernels and candidate.outputs and anchor.outputs
    return {"writes_input": candidate.writes_input, "returns_input": candidate.returns_input,
            "graph_stale_input": candidate.graph_stale_input, "graph_reads_freed": candidate.graph_reads_freed,
            "graph_default_stream": candidate.graph_default_stream,
            "outputs_unlike": bool(compared) and (len(candidate.outputs) != len(anchor.outputs) or any(
                unlike(c, a) for c, a in zip(candidate.outputs, anchor.outputs))),
            "cudnn_benchmark": candidate.cudnn_benchmark and not anchor.cudnn_benchmark,
            "lower_precision": half(candidate) and not half(anchor)}


def breaks_rule(f: dict) -> bool:
    """Whether one request's facts (``request_facts``) break a rule the harness judges by."""
    return any(f.get(r) for r in RULE_FACTS)


def facts_features(f: dict) -> list[float]:
    """FACT_FEATURES of one request's facts (NaN where unknown)."""
    ok = f["status"] == "ok" and f["candidate_us"] > 0 and f["anchor_us"] > 0
    nan = math.nan
    values = {
        "model_log_speedup": math.log(f["anchor_us"] / f["candidate_us"]) if ok else nan,
        "log_candidate_us": math.log(f["candidate_us"]) if ok else nan,
        "log_anchor_us": math.log(f["anchor_us"]) if ok else nan,
        "log_launch_ratio": math.log((f["launches"] + 1) / (f["anchor_launches"] + 1)) if ok else nan,
        "log_bytes_ratio": math.log((f["bytes"] + 1) / (f["anchor_bytes"] + 1)) if ok else nan,
        "candidate_launches": float(f["launches"]), "triton_launches": float(f["triton_launches"]),
        "occupancy": f["occupancy"], "log_waves": math.log(f["waves"]) if f["waves"] == f["waves"] and f["waves"] > 0
        else nan, "registers": float(f["registers"]), "spill_bytes": float(f["spill_bytes"]),
        "load_bits": float(f["load_bits"]), "compiled": float(f["compiled"]), "graphed": float(f["graphed"]),
        "cublas": float(f["libraries"].get("cublas", 0)), "cudnn": float(f["libraries"].get("cudnn", 0)),
        "sdpa": float(f["libraries"].get("sdpa", 0)), "tensor_cores": float(f["tensor_cores"]),
        **{f"bound_{b}": float(f["bound"] == b) for b in _BOUNDS},
    }
    return [values[n] for n in FACT_FEATURES]


def learned_facts_features(f: dict) -> list[float]:
    """LEARNED_FACT_FEATURES of one request's facts (NaN where unknown)."""
    ok = f["status"] == "ok" and f["candidate_us"] > 0 and f["anchor_us"] > 0
    nan = math.nan
    return [*facts_features(f), math.log1p(f["bytes"]) if ok else nan, math.log1p(f["flops"]) if ok else nan,
            math.log1p(f["anchor_launches"]) if ok else nan, float(f.get("cuda_calls", 0)),
            float(f["status"] == "compile_error"), float(f["status"] not in ("ok", "compile_error")),
            *(float(f.get(r, False)) for r in (*RULE_FACTS, "cudnn_benchmark", "lower_precision"))]


def facts_matrix(requests: Sequence[ForecastRequest], isolated: bool = True, cache_dir: str | None = None) -> np.ndarray:
    """(n, len(LEARNED_FACT_FEATURES)) facts of ``requests``, found at once (``find_facts``) and cached."""
    if not requests:
        return np.empty((0, len(LEARNED_FACT_FEATURES)))
    find_facts(requests, isolated, cache_dir)
    return np.array([learned_facts_features(request_facts(r, isolated, cache_dir)) for r in requests], dtype=float)


def why(f: dict) -> str:
    """One line of what the forecast rests on: bytes, FLOPs, launches, registers, occupancy, the bound."""
    if f["status"] == "compile_error":
        last = [line.strip() for line in f["error"].splitlines() if line.strip()]
        return f"does not compile for the target: {(last[-1] if last else '')[:200]}"
    if f["status"] != "ok":
        return f"what it does is unknown ({f['error'][:160]})"
    libs = ", ".join(f"{k} x{v}" for k, v in sorted(f["libraries"].items())) or "none"
    triton = (f"; Triton: {f['triton_launches']} launches, {f['registers']} registers, "
              f"{f['spill_bytes']} B spilled, {f['load_bits']}-bit loads, occupancy {f['occupancy']:.0%}, "
              f"{f['waves']:.1f} waves" if f["triton_launches"] else "")
    how = " (torch.compile)" if f["compiled"] else ""
    how += f" (autocast {f['autocast']})" if f.get("autocast") else ""
    how += " (CUDA graph)" if f["graphed"] else ""
    broken = [RULE_TEXT[r] for r in RULE_FACTS if f.get(r)]
    how += f"; breaks a check: {', '.join(broken)}" if broken else ""
    if f.get("probe") in ("incorrect", "rejected"):
        how += f"; interpreted on small cases, {f['probe']}: {f.get('probe_error', '')[:120]}"
    return (f"moves {f['bytes'] / 1e6:.1f} MB, {f['flops'] / 1e9:.2f} GFLOP, launches {f['launches']}{how}; "
            f"libraries: {libs}{triton}; modelled {f['candidate_us']:.1f} us vs the anchor's {f['anchor_us']:.1f} us, "
            f"{f['bound']}-bound")


class PhysicsForecaster:
    """Facts found on the CPU, a GPU model, and (when fit) a learned correction of it."""

    name = "physics"

    def __init__(self, max_fit: int = 600, max_iter: int = 150, random_state: int = 0, isolated: bool = True,
                 facts_cache: str | None = DEFAULT_CACHE_DIR, probe: bool = False, probe_top: int | None = None):
        self.max_fit = max_fit
        # each candidate also run in the harness under Triton's interpreter on its small cases
        # (kernelcast.kernels.probe): a kernel found wrong there is forecast to fail; seconds a kernel, not a second
        self.probe = probe
        # probe_top: only the contenders are probed, from the fastest forecast down, until this many of each
        # operation's were not found wrong (None: every candidate)
        self.probe_top = probe_top
        if probe:
            self.name = "physics-probe" if probe_top is None else "physics-probe-top"
        # find facts in a child process per batch: the candidate's host code runs to find them, and it is untrusted
        self.isolated = isolated
        self.facts_cache = facts_cache  # a folder the facts are kept in between runs (None: in memory only)
        self.max_iter = max_iter
        self.random_state = random_state

    @property
    def version(self) -> str:
        return f"facts-gpumodel-{getattr(self, 'n_train_', 0)}"

    def fit(self, pairs=None) -> "PhysicsForecaster":
        """Unfit: the model alone. Given measured pairs (``source_pairs`` or ``case_pairs`` rows), a correction of
        the model's mean on the facts, fit where the facts can be found (at most ``max_fit`` rows)."""
        self.correction_, self.sigma_, self.base_failure_, self.n_train_ = None, PRIOR_SIGMA, BASE_FAILURE, 0
        if pairs is None or len(pairs) == 0:
            return self
        from sklearn.ensemble import HistGradientBoostingRegressor
        from sklearn.model_selection import cross_val_predict

        from kernelcast.surrogate.dataset import requests_from, source_requests

        rows = pairs.sample(min(len(pairs), self.max_fit), random_state=self.random_state) \
            if len(pairs) > self.max_fit else pairs
        requests = source_requests(rows) if "anchor_source" in rows.columns else requests_from(rows)
        speedup = rows["speedup"].to_numpy(dtype=float)
        failed = rows["failed"].to_numpy(dtype=bool) if "failed" in rows.columns else ~(speedup > 0)
        self.base_failure_ = float(np.clip(failed.mean(), 0.02, 0.6))
        X, y = [], []
        find_facts(requests, self.isolated, self.facts_cache)
        for req, s, bad in zip(requests, speedup, failed):
            f = request_facts(req, self.isolated, self.facts_cache)
            if bad or not s > 0 or f["status"] != "ok" or not f["candidate_us"] > 0:
                continue
            X.append(facts_features(f))
            y.append(math.log(s) - math.log(f["anchor_us"] / f["candidate_us"]))
        if len(y) < 20:
            return self
        X, y = np.nan_to_num(np.array(X), nan=-1.0), np.array(y)
        model = HistGradientBoostingRegressor(max_iter=self.max_iter, learning_rate=0.05, max_leaf_nodes=15,
                                              random_state=self.random_state)
        oof = cross_val_predict(model, X, y, cv=min(5, len(y) // 5))
        self.sigma_ = float(max(np.median(np.abs(y - oof)) * 1.4826, 0.05))
        self.correction_ = model.fit(X, y)
        self.n_train_ = len(y)
        return self

    def _ready(self):
        if not hasattr(self, "sigma_"):
            self.fit(None)

    def _predict(self, requests: Sequence[ForecastRequest]):
        self._ready()
        find_facts(requests, self.isolated, self.facts_cache)
        facts = [request_facts(r, self.isolated, self.facts_cache) for r in requests]
        mu = np.zeros(len(requests))
        sigma = np.full(len(requests), UNKNOWN_SIGMA)
        p_fail = np.full(len(requests), self.base_failure_)
        X = []
        for i, f in enumerate(facts):
            if f["status"] == "compile_error":
                p_fail[i] = COMPILE_FAILURE
            elif f["status"] == "ok" and f["candidate_us"] > 0 and f["anchor_us"] > 0:
                mu[i] = math.log(f["anchor_us"] / f["candidate_us"])
                sigma[i] = self.sigma_
            if breaks_rule(f):
                p_fail[i] = max(p_fail[i], RULE_FAILURE)
            X.append(facts_features(f))
        if self.correction_ is not None:
            known = np.array([f["status"] == "ok" and f["candidate_us"] > 0 for f in facts])
            if known.any():
                mu[known] += self.correction_.predict(np.nan_to_num(np.array(X)[known], nan=-1.0))
        if self.probe:
            from kernelcast.kernels import probe

            for i, (status, error) in self._probed(requests, mu, p_fail).items():
                facts[i]["probe"], facts[i]["probe_error"] = status, error
                if status in probe.WRONG and facts[i]["status"] != "compile_error":
                    p_fail[i] = PROBED_WRONG
        return mu, sigma, p_fail, facts

    def _probed(self, requests: Sequence[ForecastRequest], mu: np.ndarray, p_fail: np.ndarray) -> dict:
        """{request index: (status, error)} of the candidates probed: every one, or with ``probe_top`` the contenders
        of each operation, the fastest forecast first (a compile error is known already), a round at a time until
        ``probe_top`` of them were not found wrong and none left is forecast as fast as one of those (twins whose
        facts agree, the right math and the wrong, are told apart by the probe alone)."""
        from kernelcast.kernels import probe

        kept = os.path.join(os.path.dirname(self.facts_cache), "probe") if self.facts_cache else None
        ask = lambda idx: dict(zip(idx, probe.probe_many([requests[i].candidate for i in idx], cache_dir=kept)))
        if self.probe_top is None:
            return ask(list(range(len(requests))))
        by_op: dict[str, list[int]] = {}
        for i in sorted(range(len(requests)), key=lambda i: -mu[i]):
            if p_fail[i] < COMPILE_FAILURE:
                by_op.setdefault(requests[i].candidate.op, []).append(i)
        verdicts: dict[int, tuple[str, str]] = {}
        while True:
            batch = []
            for order in by_op.values():
                fine = [i for i in order if i in verdicts and verdicts[i][0] not in probe.WRONG]
                pending = [i for i in order if i not in verdicts]
                take = pending[:max(0, self.probe_top - len(fine))]
                if len(fine) >= self.probe_top:  # and those tied with a contender: nothing else tells them apart
                    take = [i for i in pending if mu[i] >= min(mu[j] for j in fine) - TIE]
                batch += take
            if not batch:
                return verdicts
            verdicts.update(ask(batch))

    def predict_log_speedup(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray]:
        mu, sigma, _, _ = self._predict(requests)
        return mu, sigma

    def predict_failure(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        return self._predict(requests)[2]

    def forecast(self, requests: Sequence[ForecastRequest]):
        if not requests:
            return []
        t0 = time.perf_counter()
        mu, sigma, p_fail, _ = self._predict(list(requests))
        return gaussian_forecasts(list(requests), self.name, self.version, p_fail, mu, sigma, t0)
