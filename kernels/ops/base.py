"""What every operation is: the ``Operation`` contract, input cases, dtypes, tolerances, the comparison.

An operation says what a kernel must compute, on which inputs, within which tolerance: a
float32 reference (the correctness oracle), an eager PyTorch implementation (the timed
baseline every speedup is measured against), input cases (GPU cases sized to fill an H100;
tiny cases for Triton's CPU interpreter), per-dtype tolerances, a bytes/FLOPs model that
turns a runtime into GB/s or TFLOP/s, and its template space (Triton source templates and
their launch-parameter axes, searched by ``kernelcast.kernels.spaces``).

Candidate kernels follow one calling convention: ``launch(*inputs, *outputs, **params)``
writes into output tensors the harness allocates (or returns a tuple of outputs).

This module sits below everything else about operations: the operation modules, the
registry (``kernelcast.kernels.ops``), the template spaces and the harness import it; it imports
nothing of theirs.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from kernelcast.kernels.records import Candidate

# Where models are built (Operation.configure_models): "auto" as the operation's format decides, "host" (built on
# the CPU and then moved, as KernelBench's own eval does) or "device" (built on the measuring device).
MODEL_BUILDS = ("auto", "host", "device")

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "int64": torch.int64,
}
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

# Output tolerances by output dtype: (rtol, atol). bf16 keeps 8 mantissa bits, so
# rtol 1.6e-2 is two units in the last place; fp8 e4m3 keeps 3, one unit is 12.5%.
DEFAULT_TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float8_e4m3fn: (0.13, 2e-3),
}


@dataclass(frozen=True)
class Case:
    """One input configuration of an operation: named sizes and the input dtype."""

    dims: tuple[tuple[str, int], ...]
    dtype: str

    def __getitem__(self, key: str) -> int:
        for name, value in self.dims:
            if name == key:
                return value
        raise KeyError(f"case has no dimension {key!r}; it has {', '.join(n for n, _ in self.dims)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def name(self) -> str:
        sizes = "x".join(str(v) for _, v in self.dims)
        return f"{sizes}-{SHORT_DTYPE.get(self.dtype, self.dtype)}"


def case(dtype: str, **dims: int) -> Case:
    return Case(tuple(dims.items()), dtype)


@dataclass(frozen=True)
class Algorithm:
    """One source template of an operation's template space and the parameter axes its ``launch`` accepts."""

    name: str
    source: str
    axes: Mapping[str, Sequence[Any]]


class Operation:
    """Base class; a subclass fills in the names, cases, the methods below and its template space."""

    name: str
    summary: str
    bound: str  # "memory" or "compute": which roofline the bytes/FLOPs model is judged by
    cases: tuple[Case, ...]
    interpret_cases: tuple[Case, ...]
    eager_source: str
    tolerance_overrides: dict = {}
    # Torch functions a non-torch candidate may not call: the routes to the answer it should compute.
    forbidden_calls: tuple[str, ...] = ()
    # Environment variables the op's own code needs in the measuring process (set before CUDA starts).
    environment: dict = {}
    # The compute capability the op's code needs ({"compute_capability", "on_cpu", "why"}), or None: any device.
    requires: dict | None = None
    # The template space (searched by ``kernelcast.kernels.spaces``): one Algorithm per source template.
    # Empty for an operation without one (an imported task: its children come from an LLM).
    algorithms: tuple[Algorithm, ...] = ()

    @staticmethod
    def valid_variant(algorithm: str, params: Mapping[str, Any]) -> bool:
        """Whether a variant of the template space is worth generating (rules out spills, idle lanes, ...)."""
        return True

    def make_inputs(self, case: Case, gen: torch.Generator, device) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def output_specs(self, case: Case) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
        raise NotImplementedError

    def reference(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def reference_float64(self, case: Case, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The reference computed in float64 on the same inputs: the truth a candidate's error is measured against."""
        return self.reference(*(t.double() if t.dtype.is_floating_point else t for t in inputs))

    def bytes_moved(self, case: Case) -> int:
        """The fewest bytes a kernel must move through device memory (inputs once, outputs once)."""
        raise NotImplementedError

    def flops(self, case: Case) -> int:
        raise NotImplementedError

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerance_overrides.get(dtype, DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0)))

    def parameter_bytes(self, case: Case) -> int:
        """Device bytes a call needs besides its inputs and outputs (a model's weights); the memory budget counts them."""
        return 0

    def configure_models(self, build: str, protocol: str) -> None:
        """Where this process builds the models its calls use (``MODEL_BUILDS``), under a timing ``protocol``:
        said once per measuring process, before any call. Operations without models ignore it."""

    def prepare(self, launch, source: str, device) -> str:
        """Make ready what a loaded ``launch`` (of ``source``) builds on its first call per case, the way this
        operation builds its reference's (``configure_models``); what was done, in words ("" for nothing)."""
        return ""

    def clear_caches(self) -> None:
        """Drop what this process keeps between calls (built models): the harness frees device memory before it
        releases the GPU."""

    def check(self, case: Case, inputs, got) -> str | None:
        """None when ``got`` (a candidate's outputs on ``inputs``) is correct, else what is wrong.

        The reference within tolerance; an operation with its own judge (an imported GPU MODE
        task's ``check_implementation``) overrides this.
        """
        return mismatch(self, case, tuple(got), self.reference(*inputs))

    def input_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def writable_inputs(self, case: Case) -> tuple[int, ...]:
        """Positions of inputs that are output buffers the kernel writes (a GPU MODE task's ``data``); the rest are read-only."""
        return ()

    def null_submission(self) -> str | None:
        """The reference as a submission in the op's own format (imported ops); None: the eager baseline serves."""
        return None

    def seed_candidates(self) -> list[Candidate]:
        """The eager PyTorch baseline as a measurable candidate (origin ``seed``)."""
        return [Candidate(op=self.name, backend="torch", source=self.eager_source,
                          template=f"{self.name}/eager", origin="seed")]

    def achieved(self, case: Case, runtime_us: float) -> tuple[float, float]:
        """(GB/s, TFLOP/s) achieved by a kernel that took ``runtime_us`` on ``case``."""
        seconds = runtime_us * 1e-6
        return self.bytes_moved(case) / seconds / 1e9, self.flops(case) / seconds / 1e12


def mismatch(op: Operation, case: Case, got, expected) -> str | None:
    """None when every output matches the reference within tolerance, else what is wrong."""
    if len(got) != len(expected):
        return f"returned {len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if not isinstance(g, torch.Tensor):
            return f"output {i} is a {type(g).__name__}, not a tensor"
        if tuple(g.shape) != tuple(e.shape):
            return f"output {i} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        if g.dtype != e.dtype:
            return f"output {i} has dtype {g.dtype}, expected {e.dtype}"
        gf, ef = g.float(), e.float()
        bad_nonfinite = (~torch.isfinite(gf)) & torch.isfinite(ef)
        if bad_nonfinite.any():
            n = int(bad_nonfinite.sum())
            return f"output {i} has {n} NaN/Inf values (or unwritten elements) on case {case.name}"
        rtol, atol = op.tolerance(e.dtype)
        err = (gf - ef).abs()
        allowed = atol + rtol * ef.abs()
        over = err > allowed
        if over.any():
            n = int(over.sum())
            worst = float(err.max())
            return (f"output {i} differs from the reference on case {case.name}: {n} of {err.numel()} "
                    f"elements out of tolerance (rtol {rtol}, atol {atol}), max abs error {worst:.3g}")
    return None


# ---- helpers the operation modules share ----------------------------------------------------------

def randn(shape, dtype, gen, device, scale=1.0, shift=0.0) -> torch.Tensor:
    """Seeded normal inputs, drawn in fp32 (the same values whatever the dtype) then cast."""
    if torch.device(device).type == "meta":  # no values to draw; torch's meta randn imports torch._dynamo (2 s)
        return torch.empty(shape, dtype=dtype, device=device)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (x * scale + shift).to(dtype)


def src(text: str) -> str:
    """Source text written indented in a class body, as the module a candidate's file holds."""
    return textwrap.dedent(text).lstrip()


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype]).element_size()
