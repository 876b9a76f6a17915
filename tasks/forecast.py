"""Forecast a user's kernel files as a search would: ``kernelcast forecast``.

Each file is read as a candidate of the operation, put through the static checks a search puts
a written child through (``kernelcast.kernels.screen``), and, when it passes, forecast by the search's own
surrogate (``kernelcast.tasks.setup.forecaster``: the prior fit on ``prior_data`` and cached under the data
root) through the search's own correction (``kernelcast.surrogate.online.SearchSurrogate``), then judged by
the search's own selection (``kernelcast.tasks.search.select_children``) against the best speedup the data
root has measured. Nothing is measured and nothing is written but the cached prior.

The anchor is what speedups are stated against: the operation's eager reference (default); a
candidate id measured under the data root on the GPU type (the files are then forecast against
it as a search forecasts a child of a measured parent, and its measured speedup is the step
from the reference's scale to the anchor's); or another kernel file, itself forecast, whose
forecast log speedup is that step (its within-pool spread is added to the files', since the
level of the operation both share cancels in the ratio).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from kernelcast.kernels.formats.common import backend_of
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import Candidate, HardwareSpec
from kernelcast.kernels.screen import screen
from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
from kernelcast.surrogate.learned import bin_probabilities
from kernelcast.surrogate.online import SearchSurrogate
from kernelcast.tasks.config import ConfigError, SearchConfig


@dataclass(frozen=True)
class KernelForecast:
    """What ``kernelcast forecast`` says of one kernel file."""

    file: str
    candidate_id: str
    decision: str  # measure, trust or drop: what the search's selection does with it
    reason: str = ""  # a static check's reason when it cannot run (then nothing is forecast)
    detail: str = ""
    failure_probability: float = math.nan  # NaN: the surrogate does not forecast failure
    probabilities: tuple[float, ...] = ()  # the 8 speed bins against the anchor, given that it runs
    expected_speedup: float = math.nan  # against the anchor
    expected_speedup_vs_reference: float = math.nan
    confidence: float = math.nan  # the largest bin probability: what the trust threshold is compared with
    log_speedup_sigma: float = math.nan  # spread of the forecast log speedup against the anchor (NaN: no Gaussian)
    bins_against: str = "anchor"  # "reference" where a forecast without a Gaussian cannot be moved to the anchor
    # what the kernel makes the device do, found on the CPU (kernelcast.surrogate.physics.why): bytes, FLOPs, launches,
    # registers, occupancy, the bound; whichever surrogate forecast it
    why: str = ""


@dataclass(frozen=True)
class ForecastReport:
    op: str
    gpu_type: str
    surrogate: str
    anchor: str  # "reference", a candidate id, or a file
    anchor_speedup: float  # the anchor's speedup over the reference (measured, or forecast for a file)
    anchor_measured: bool
    best_measured: float  # the best speedup measured under the data root (0: none), what selection compares with
    budget: int  # the measurements the selection may spend: a default search's first generation
    kernels: list[KernelForecast] = field(default_factory=list)
    # What the forecasts rest on, so that two data roots' forecasts of one file can be told apart:
    fit_on: str = ""  # the prior's measurements (a data root's URI)
    fit_operations: tuple[str, ...] = ()  # the operations the prior was fit on (prior_scope applied)
    prior_scope: str = ""
    data_root: str = ""  # where this op's own measurements were read
    corrected_by: int = 0  # measurements of this op on this GPU type under data_root that correct the prior


def read_kernel(op, path: str) -> tuple[Candidate, str]:
    """(candidate, the code the static checks read) of a kernel file for ``op``; a clear error if unreadable."""
    try:
        code = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read kernel file {path}: {exc}") from None
    if getattr(op, "entry", None):  # an imported task: the file is a submission, wrapped by its harness
        return op.candidate(code, origin="import"), code
    return Candidate(op=op.name, backend=backend_of(code), source=code, origin="import"), code


def hardware_of(gpu_type: str, *roots: DataRoot, op: str) -> HardwareSpec:
    """The hardware spec of ``gpu_type`` as measured under the first of ``roots`` that has it (``op``'s
    measurements first, then any operation's); a clear error when none does."""
    for root in roots:
        for which in (op, None):
            frame = root.read_measurements(op=which, gpu_type=gpu_type)
            if not frame.empty:
                return measurements_from_frame(frame.head(1))[0].hardware
    raise ConfigError(f"no measurements on GPU type {gpu_type!r} under {', '.join(r.uri for r in roots)}: "
                      f"nothing says what that GPU is; choose --gpu-type from those measured")


def _measured(root: DataRoot, op: str, gpu_type: str):
    """The ok measurements of ``op`` on ``gpu_type`` under ``root``, by candidate id."""
    frame = root.read_measurements(op=op, gpu_type=gpu_type)
    return {m.candidate_id: m for m in measurements_from_frame(frame) if m.status == "ok" and m.speedup}


def forecast_files(config: SearchConfig, root: DataRoot, forecaster, files: Sequence[str],
                   anchor: str | None = None) -> ForecastReport:
    """Forecast each kernel file of ``config.op`` on ``config.gpu_type`` with ``forecaster`` (fit already),
    against ``anchor`` (None: the reference; a measured candidate id; or a kernel file)."""
    from kernelcast.tasks.search import select_children  # the selection a search makes

    op = get_operation(config.op)
    hardware = hardware_of(config.gpu_type, root, DataRoot(config.prior_data), op=config.op)
    measured = _measured(root, config.op, config.gpu_type)
    reference = op.seed_candidates()[0]
    ref = measured.get(reference.candidate_id)
    surrogate = SearchSurrogate(forecaster, config.op, hardware, ref.runtime_us_median if ref else ())
    best = max((m.speedup for m in measured.values()), default=0.0)

    anchor_name, anchor_log, anchor_within, anchor_measured, parent_id = "reference", 0.0, 0.0, True, None
    anchor_speedup = 1.0
    anchor_file = None
    if anchor and Path(anchor).is_file():
        anchor_file, anchor_name, anchor_measured = anchor, anchor, False
    elif anchor and anchor != reference.candidate_id:
        if anchor not in measured:
            raise ConfigError(f"anchor {anchor!r} is neither a kernel file nor a candidate of {config.op} measured "
                              f"running on {config.gpu_type} under {root.uri}")
        known = {c.candidate_id: c for c in candidates_from_frame(root.read_candidates(config.op))}
        surrogate.update(known, [], [measured[anchor]])  # the search's measured parent
        anchor_name, anchor_log, parent_id = anchor, math.log(measured[anchor].speedup), anchor
        anchor_speedup = measured[anchor].speedup

    seen: set[str] = set()
    entries: list[tuple[str, Candidate, str, str]] = []
    for path in files:
        candidate, code = read_kernel(op, path)
        candidate = dataclasses.replace(candidate, parent_id=parent_id)
        reason, detail = screen(op, candidate, code, seen)
        entries.append((path, candidate, reason or "", detail))
    runnable = [c for _, c, reason, _ in entries if not reason]
    if anchor_file is not None:
        a, code = read_kernel(op, anchor_file)
        reason, detail = screen(op, a, code, set())
        if reason:
            raise ConfigError(f"anchor file {anchor_file} cannot run ({reason}: {detail})")
        (fa,) = surrogate.forecast([a])
        anchor_log = fa.extra.get("log_speedup_mean", math.log(fa.expected_speedup))
        anchor_within = fa.extra.get("log_speedup_sigma_within", 0.0)
        anchor_speedup = fa.expected_speedup

    forecasts = surrogate.forecast(runnable)
    _find_facts(op, reference, runnable, hardware)
    budget = config.generation_budgets()[0]
    selection = select_children(config, forecasts, best, 0, budget)
    decided = {i: d for d, ids in (("measure", selection.measure), ("trust", selection.trust),
                                   ("drop", selection.drop)) for i in ids}
    by_id = {f.candidate_id: f for f in forecasts}
    kernels = []
    for path, candidate, reason, detail in entries:
        if reason:
            kernels.append(KernelForecast(path, candidate.candidate_id, "drop", reason, detail))
            continue
        kernels.append(dataclasses.replace(
            _against_anchor(path, by_id[candidate.candidate_id], decided[candidate.candidate_id], anchor_log,
                            anchor_within, anchor_speedup, anchor_name == "reference"),
            why=_why(op, reference, candidate, hardware)))
    return ForecastReport(config.op, config.gpu_type, config.surrogate, anchor_name, anchor_speedup,
                          anchor_measured, best, budget, kernels, fit_on=DataRoot(config.prior_data).uri,
                          fit_operations=_prior_operations(config), prior_scope=config.prior_scope, data_root=root.uri,
                          corrected_by=len(measured))


def _find_facts(op, reference: Candidate, candidates: Sequence[Candidate], hardware: HardwareSpec) -> None:
    """Find what every kernel makes the device do at once, in one child process (cached: a physics surrogate's
    forecast has found them already)."""
    from kernelcast.surrogate.forecast import ForecastRequest
    from kernelcast.surrogate.physics import find_facts

    try:
        find_facts([ForecastRequest(reference, c, op.name, hardware, case_names=tuple(x.name for x in op.cases))
                    for c in candidates], isolated=True)
    except Exception:  # noqa: BLE001 - each kernel's why says what went wrong
        pass


def _why(op, reference: Candidate, candidate: Candidate, hardware: HardwareSpec) -> str:
    """What ``candidate`` makes the device do against the reference, found on the CPU; why not, where it cannot be."""
    from kernelcast.surrogate.forecast import ForecastRequest
    from kernelcast.surrogate.physics import request_facts, why

    try:
        return why(request_facts(ForecastRequest(reference, candidate, op.name, hardware,
                                                 case_names=tuple(c.name for c in op.cases)), isolated=True))
    except Exception as exc:  # noqa: BLE001 - the forecast stands without its facts
        return f"facts not found: {type(exc).__name__}: {str(exc)[:160]}"


def _prior_operations(config: SearchConfig) -> tuple[str, ...]:
    """The operations measured on ``config.gpu_type`` under the prior data that the prior may learn from."""
    frame = DataRoot(config.prior_data).read_measurements(gpu_type=config.gpu_type)
    ops = sorted(set(frame["op"])) if not frame.empty else []
    return tuple(o for o in ops if config.prior_scope == "all" or o != config.op)


def _against_anchor(path: str, f, decision: str, anchor_log: float, anchor_within: float, anchor_speedup: float,
                    is_reference: bool) -> KernelForecast:
    """A forecast on the reference's scale, restated against an anchor whose Gaussian log speedup has mean
    ``anchor_log`` and within-pool spread ``anchor_within``, and whose speedup is ``anchor_speedup`` (measured, or
    its forecast's expected speedup, as the forecast's own expected speedup is stated)."""
    probabilities, sigma, against = tuple(f.probabilities), math.nan, "anchor"
    if "log_speedup_mean" in f.extra:
        mu = f.extra["log_speedup_mean"] - anchor_log
        sigma = math.hypot(f.extra["log_speedup_sigma"], anchor_within)
        if not is_reference:
            p = bin_probabilities(np.array([mu]), np.array([sigma]))[0]
            probabilities = tuple(float(x) for x in p / p.sum())
    elif not is_reference:
        against = "reference"
    expected = f.expected_speedup / anchor_speedup
    return KernelForecast(path, f.candidate_id, decision, failure_probability=f.failure_probability,
                          probabilities=probabilities, expected_speedup=expected,
                          expected_speedup_vs_reference=f.expected_speedup, confidence=max(f.probabilities),
                          log_speedup_sigma=sigma, bins_against=against)
