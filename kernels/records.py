"""Typed records that travel between the steps: candidates, hardware specs, measurements.

Each record maps one-to-one to a Parquet table whose pyarrow schema lives in
``storage/schema.py``. Records are frozen; a step that changes one makes a new one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

BACKENDS = ("triton", "cuda", "torch")
ORIGINS = ("template", "llm", "seed", "import", "variant")  # a variant's origin names it: "variant:cuda-graph"
STATUSES = ("ok", "compile_error", "runtime_error", "incorrect", "timeout", "crashed", "rejected")
MODES = ("gpu", "interpreter", "replay")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def canonical_params(params: Mapping[str, Any]) -> str:
    """Launch parameters as one canonical JSON string (sorted keys, no spaces)."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def is_lower(precision: str) -> bool:
    """Whether a measurement's precision text flags a lower class than the reference's: one case's
    (``lower: ...``) or a result's, whose flagged cases read ``case NAME: lower: ...``."""
    return precision.startswith("lower") or ": lower: " in precision


# How a correct result of a lower precision class than the reference's counts: ok and flagged (the format's own
# tolerance), or failed as incorrect (strict).
PRECISION_MODES = ("tolerance", "strict")


def fails_strict(status: str, precision: str) -> bool:
    """Whether a verdict fails under ``precision strict``: correct, in a lower precision class than the reference."""
    return status == "ok" and is_lower(precision or "")


def strict_error(precision: str) -> str:
    """The error of a result that ``precision strict`` fails."""
    return f"lower precision than the reference (precision strict): {precision}"


@dataclass(frozen=True)
class Candidate:
    """One kernel to try: real source code plus the launch parameters it is called with.

    The source is a Python module defining ``launch(*inputs, *outputs, **params)``;
    it writes the op's outputs into the tensors the harness allocates (or returns them).
    """

    op: str
    backend: str
    source: str
    params: Mapping[str, Any] = field(default_factory=dict)
    template: str | None = None  # "softmax/online" for template variants, None otherwise
    parent_id: str | None = None
    origin: str = "template"
    created_at: datetime = field(default_factory=utc_now, compare=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        kind, colon, name = self.origin.partition(":")
        if kind not in ORIGINS or bool(colon) != (kind == "variant") or (colon and not name):
            raise ValueError(f"unknown origin {self.origin!r}; known: {', '.join(ORIGINS)}")
        object.__setattr__(self, "params", dict(sorted(dict(self.params).items())))

    @functools.cached_property  # content never changes (frozen), so the hash is computed once
    def candidate_id(self) -> str:
        """Content hash of op, backend, source and launch parameters (16 hex digits)."""
        h = hashlib.sha256()
        for part in (self.op, self.backend, self.source, canonical_params(self.params)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]

    def with_params(self, **changes: Any) -> "Candidate":
        return dataclasses.replace(self, params={**self.params, **changes})


@dataclass(frozen=True)
class HardwareSpec:
    """What a measurement ran on; every field that a forecaster or a roofline needs."""

    gpu_type: str  # short routing name: "h100", "h200", or "interpreter"
    device_name: str
    compute_capability: str = ""
    sm_count: int = 0
    sm_clock_mhz: int = 0
    mem_clock_mhz: int = 0
    bus_width_bits: int = 0
    memory_gib: float = 0.0
    l2_mib: float = 0.0
    threads_per_sm: int = 0
    driver_version: str = ""
    cuda_version: str = ""
    torch_version: str = ""
    triton_version: str = ""

    @property
    def peak_bandwidth_gbps(self) -> float:
        """Datasheet DRAM bandwidth from memory clock and bus width (double data rate)."""
        return 2.0 * self.mem_clock_mhz * 1e6 * self.bus_width_bits / 8 / 1e9


@dataclass(frozen=True)
class Measurement:
    """One candidate evaluated on one GPU type: status first, then per-case timings.

    Per-case lists are aligned with ``case_names``. Timing fields are empty when
    the status is not ``ok`` or when the mode records no timing (interpreter).
    """

    candidate_id: str
    op: str
    gpu_type: str
    status: str
    mode: str
    error: str = ""
    case_names: tuple[str, ...] = ()
    runtime_us_median: tuple[float, ...] = ()
    runtime_us_iqr: tuple[float, ...] = ()
    repetitions: tuple[int, ...] = ()
    reference_us_median: tuple[float, ...] = ()
    speedup: float | None = None  # geometric mean over cases of reference / candidate
    compile_seconds: float = 0.0
    gpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    hardware: HardwareSpec | None = None
    replayed: bool = False
    measured_at: datetime = field(default_factory=utc_now)
    # Precision as a fact of the verdict (kernelcast.kernels.harness.precision): the class of the candidate's error
    # against a float64 reference, or "lower: ..." when below the reference's; per case, both errors.
    precision: str = ""
    error_rel: tuple[float, ...] = ()
    reference_error_rel: tuple[float, ...] = ()
    checks: str = ""  # how the timed window was checked ("profiled", or why not) and the memcheck's outcome
    protocol: str = "kernelcast"  # how it was timed (kernelcast.kernels.harness.timing.PROTOCOLS); kernelbench, gpumode: means

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; known: {', '.join(STATUSES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {', '.join(MODES)}")

    def held_to(self, precision: str) -> "Measurement":
        """This verdict under a precision mode (``PRECISION_MODES``): under strict, a correct result of a lower
        precision class than the reference's is incorrect, with no speedup (stored rows keep their own verdict)."""
        if precision not in PRECISION_MODES:
            raise ValueError(f"unknown precision mode {precision!r}; known: {', '.join(PRECISION_MODES)}")
        if precision == "strict" and fails_strict(self.status, self.precision):
            return dataclasses.replace(self, status="incorrect", speedup=None, error=strict_error(self.precision))
        return self


# ---- the search's own records: one row per decision, per generation, per run ------------------

DECISIONS = ("measure", "trust", "drop")


@dataclass(frozen=True)
class Decision:
    """What the policy did with one child in one generation of one search run."""

    run_id: str
    generation: int
    candidate_id: str
    op: str
    gpu_type: str
    decision: str  # measure | trust | drop
    policy: str
    parent_id: str | None = None
    predicted_bin: int = 0  # 0 when no forecast was made (surrogate off)
    expected_speedup: float | None = None
    confidence: float | None = None
    decided_at: datetime = field(default_factory=utc_now)

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"unknown decision {self.decision!r}; known: {', '.join(DECISIONS)}")


@dataclass(frozen=True)
class GenerationSummary:
    """One finished generation: what was spent, what was decided, the best measured kernel so far."""

    run_id: str
    generation: int
    op: str
    gpu_type: str
    surrogate: str
    policy: str
    generated: int
    forecast: int
    measured: int  # measurements this generation charged to the budget
    reused: int  # of those, answered from measurements already stored (no GPU time spent again)
    trusted: int
    dropped: int
    failed: int  # measured, but not ok
    budget_used: int  # measurements charged so far, all generations
    budget_left: int
    gpu_seconds: float  # this generation's GPU seconds charged
    gpu_seconds_total: float
    best_candidate_id: str | None
    best_speedup: float | None  # always a measured speedup, never a forecast
    surrogate_bin_accuracy: float | None  # forecast bin == measured bin, over this generation's measured
    surrogate_within_one: float | None
    wall_seconds: float
    overhead_seconds: float  # wall time less measuring and forecasting
    # What the model's answers came to (LLM generators; kernelcast.kernels.screen.SCREEN_REASONS): asked, kept, and
    # dropped before forecasting by reason.
    generator_asked: int = 0
    generator_children: int = 0
    screened_request_failed: int = 0
    screened_no_code: int = 0
    screened_unparsable: int = 0
    screened_no_entry: int = 0
    screened_signature: int = 0
    screened_undefined: int = 0
    screened_forbidden: int = 0
    screened_duplicate: int = 0
    # The budget in its own units (SearchConfig.budget_kind: measurements, gpu_seconds, gpu_compile_seconds):
    # spent over all generations and left; and the compile seconds the measurements charged.
    budget_kind: str = "measurements"
    budget_spent: float = 0.0
    budget_remaining: float = 0.0
    compile_seconds: float = 0.0
    compile_seconds_total: float = 0.0
    finished_at: datetime = field(default_factory=utc_now)


@dataclass(frozen=True)
class Provenance:
    """Who wrote an LLM child, and how: enough to tell one model, prompt or sampling from another."""

    run_id: str  # the search (or corpus round) that asked for it
    candidate_id: str
    op: str
    parent_id: str | None
    generator: str  # llm-variant (a template variant) | llm-source (a rewritten whole source)
    model: str  # the model's name at its endpoint
    model_sha256: str  # of its weights file, when known ("" otherwise)
    prompt_version: str
    temperature: float
    seed: int  # the request's sampling seed
    generation: int
    answer_chars: int  # length of the model's whole answer
    seconds: float  # the request's wall time
    created_at: datetime = field(default_factory=utc_now)


@dataclass(frozen=True)
class SearchRun:
    """A search run's identity: which operation and GPU type it searches, and its whole configuration."""

    run_id: str
    op: str
    gpu_type: str
    config: str  # canonical JSON of the search configuration
    created_at: datetime = field(default_factory=utc_now)
