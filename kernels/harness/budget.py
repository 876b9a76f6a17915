"""Device memory and time, budgeted per case: what a case needs, what fits, how long it may take.

Plain functions of sizes and runtimes, so the rules can be read and tested without a GPU:

  footprint       — a case's bytes (inputs, outputs, model parameters), from meta tensors:
                    nothing is allocated to find them.
  refusal         — a case whose correctness check cannot fit in the device's memory is
                    refused before any input is made, naming the bytes it needs and has.
  rotation_sets   — how many input sets the timing loop rotates through: up to 1 GiB of
                    inputs, as many as the device memory free after the checks holds.
  limits_for      — the time a child may hold the GPU, from the op's case sizes and, once
                    measured, the reference's own runtime. A function of the op alone: a
                    reference and a candidate of the same op get the same limits.
  is_out_of_memory — whether a failure was the device running out of memory (the worker
                    then retries the candidate once, alone on the GPU).
  shares_checks   — whether a candidate's checks may run beside other children's checks
                    (the lock held shared), or hold the device alone from its first allocation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import torch

GIB = 1 << 30
# Timing rotates through 2 to 8 input sets of about this many bytes of inputs in all: no call
# finds its operands in the L2 (or TLB) left by the previous one.
ROTATION_BYTES = 1 << 30
MAX_ROTATION_SETS = 8
# Device memory kept free beyond a case's own bytes: the L2 flush buffer (256 MiB), the
# CUDA context's own allocations, library workspaces (cuBLAS, cuDNN) and allocator slack.
RESERVE_BYTES = 1 * GIB


@dataclass(frozen=True)
class Footprint:
    """The device bytes of one case: one set of inputs, the outputs, the model's parameters."""

    case: str
    input_bytes: int
    output_bytes: int
    parameter_bytes: int = 0

    @property
    def set_bytes(self) -> int:
        """One timed call's operands: its inputs and its outputs."""
        return self.input_bytes + self.output_bytes

    @property
    def check_bytes(self) -> int:
        """What a checked call holds at once: inputs and their read-only copy, the candidate's and
        the reference's outputs, the candidate's and the reference's parameters."""
        return 2 * (self.input_bytes + self.output_bytes + self.parameter_bytes)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def meta_inputs(op, case) -> tuple:
    """``case``'s inputs made on the meta device (shapes and dtypes, no memory), from a fixed seed."""
    gen = torch.Generator()
    gen.manual_seed(0)
    return op.make_inputs(case, gen, "meta")


def footprint(op, case) -> Footprint:
    """The case's bytes from meta inputs (no memory), the op's output specs and its bytes model."""
    inputs = meta_inputs(op, case)
    in_bytes = tensor_bytes(inputs)
    spec_bytes = sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                     for shape, dtype in op.output_specs(case))
    # Ops whose candidates return their outputs declare none; their bytes model is inputs plus outputs.
    out_bytes = max(spec_bytes, op.bytes_moved(case) - in_bytes, 0)
    return Footprint(case.name, in_bytes, out_bytes, op.parameter_bytes(case))


def case_bytes(op, cases) -> list[int | None]:
    """Per case, its inputs', outputs' and parameters' bytes (``footprint``); None where meta tensors cannot
    describe its inputs (only the device can make them)."""
    sizes = []
    for case in cases:
        try:
            fp = footprint(op, case)
            sizes.append(fp.set_bytes + fp.parameter_bytes)
        except Exception:  # noqa: BLE001 - inputs only the device can make
            sizes.append(None)
    return sizes


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def refusal(fp: Footprint, total_bytes: int, holder: str = "the device") -> str | None:
    """Why a case cannot be checked in ``total_bytes`` of ``holder``, or None when it can.

    Judged against the device's whole memory (or, on the host, the child's address-space limit)
    less a fixed reserve, not against what is free at the moment: the verdict must not depend on
    what other processes hold.
    """
    usable = total_bytes - RESERVE_BYTES
    if fp.check_bytes <= usable:
        return None
    parts = f"inputs {_gib(fp.input_bytes)}, outputs {_gib(fp.output_bytes)}"
    if fp.parameter_bytes:
        parts += f", parameters {_gib(fp.parameter_bytes)}"
    where = "on the device" if holder == "the device" else f"in {holder}"
    return (f"case {fp.case} does not fit {where}: its correctness check needs {_gib(fp.check_bytes)} "
            f"({fp.check_bytes} bytes: {parts}, each twice, the candidate's and the reference's) but {holder} "
            f"has {_gib(usable)} usable ({usable} bytes: {_gib(total_bytes)} less {_gib(RESERVE_BYTES)} reserved)")


def rotation_sets(free_bytes: int, input_bytes: int, output_bytes: int = 0,
                  reserve_bytes: int = RESERVE_BYTES) -> int:
    """Input sets to rotate through while timing: 2 to 8 whose inputs fill ROTATION_BYTES, as many of those
    (with their outputs) as the free device memory holds beyond the reserve, at least 1."""
    wanted = max(2, min(MAX_ROTATION_SETS, ROTATION_BYTES // max(1, input_bytes)))
    room = max(0, free_bytes - reserve_bytes)
    return max(1, min(wanted, room // max(1, input_bytes + output_bytes)))


# ---- time limits -----------------------------------------------------------------------------------

# Rates below which no healthy stage runs: making inputs (on the device: gigabytes in milliseconds),
# copying and comparing them. Deliberately slow: a limit must not cut a correct reference short;
# it only bounds what a hang costs. (A task that can only make its inputs on the host, at well under
# a gigabyte per second, may pass it on huge cases: its reference and candidates alike.)
GPU_FLOOR_BYTES_PER_S = 2e9
INTERPRETER_FLOOR_BYTES_PER_S = 0.05e9
# Calls of the candidate or the reference per case under the lock: first call, correctness
# seeds with their reference calls, recheck, timing warm-up and minimum repetitions.
CALLS_PER_CASE = 40
# A candidate may be this many times slower than the reference and still be measured.
RUNTIME_SLACK = 10.0


@dataclass(frozen=True)
class Limits:
    """How long a child may take, per phase. The same for every candidate of one op."""

    ahead_s: float  # outside the lock: load, compile ahead (waiting for the lock is not counted)
    first_calls_s: float  # under the lock, the first call per case when it could not be made ahead
    device_s: float  # under the lock, from the first calls' end to the result
    # per case, in the op's case order: its first call alone (inputs made, one call, finished). A call
    # that runs past it is named with its case, long before the whole device limit would end it.
    call_s: tuple[float, ...] = ()


def limits_for(case_bytes: list[int], *, mode: str, seeds: int, max_seconds_per_case: float,
               reference_us: list[float] | None = None, base_device_s: float = 60.0,
               compile_s: float = 300.0) -> Limits:
    """Limits that grow with each case's bytes and, once it is known, the reference's runtime per case.

    ``case_bytes``: per case, the bytes of one set of inputs and outputs (``Footprint.set_bytes``)
    plus its parameters. ``compile_s`` bounds what happens outside the lock (and a first call
    that had to compile under it).
    """
    floor = GPU_FLOOR_BYTES_PER_S if mode == "gpu" else INTERPRETER_FLOOR_BYTES_PER_S
    device = base_device_s
    calls = []
    for i, nbytes in enumerate(case_bytes):
        # inputs made for the first call, each seed, the recheck and the rotation sets; copied and compared
        device += (seeds + 4 + MAX_ROTATION_SETS) * 2 * nbytes / floor + max_seconds_per_case
        # one call: its inputs made, read and its outputs written at the floor rate; on a GPU it may compile
        # (and autotune) as well. Once the reference's first call is known, ten times that if longer.
        call = (compile_s if mode == "gpu" else base_device_s) + 4 * nbytes / floor
        if reference_us and i < len(reference_us) and reference_us[i] and math.isfinite(reference_us[i]):
            device += CALLS_PER_CASE * RUNTIME_SLACK * reference_us[i] * 1e-6
            call = max(call, RUNTIME_SLACK * reference_us[i] * 1e-6)
        calls.append(call)
    first = compile_s + sum(2 * b / floor for b in case_bytes)
    return Limits(ahead_s=compile_s, first_calls_s=first, device_s=device, call_s=tuple(calls))


def autotunes(source: str) -> bool:
    """Whether a kernel's first call on each case autotunes on the device: torch.compile's max-autotune modes,
    which benchmark their generated kernels under the GPU lock for minutes (``with_autotuning``)."""
    return "max-autotune" in source or "max_autotune" in source


def with_autotuning(limits: Limits, call_s: float) -> Limits:
    """``limits`` for a kernel that ``autotunes``: each case's first call ``call_s`` at least, and all of them
    together as long. Measured on an H100 (2026-11-27): torch.compile in max-autotune-no-cudagraphs mode of
    KernelBench level3/15 and level3/20 ran past the 300 s a first call had, and was killed; that time is the
    child's real cost, which a search charges as GPU seconds (it holds the lock), not a hang."""
    calls = tuple(max(c, call_s) for c in limits.call_s)
    return replace(limits, first_calls_s=max(limits.first_calls_s, call_s * max(1, len(calls))), call_s=calls)


# A share of the device's memory that the checks of every child running at once may hold together (``shares_checks``).
SHARED_CHECKS_SHARE = 0.25
# What in a kernel's source says its first calls may time alternatives on the device and keep the fastest: torch.compile's
# max-autotune modes and Triton's autotuner ("autotune"), torch.compile in any mode (Inductor times the configs of a
# generated kernel that has several at its first run), cuDNN's algorithm search, Triton's timer called by the kernel.
BENCHMARKS_FIRST = ("autotune", "torch.compile", "cudnn.benchmark", "do_bench")


def shares_checks(case_bytes, children: int, total_bytes: int, source: str) -> str | None:
    """Why a candidate's first calls and checks must hold the device alone, or None when they may run beside other
    children's (the GPU lock held shared; its timing always holds it alone).

    They may when nothing of them depends on the device being idle and their memory is known and small: every case's
    bytes known (``case_bytes``: one set's inputs, outputs and parameters, None where meta tensors cannot tell), a
    check's twice that (the candidate's and the reference's), for ``children`` children at once within
    ``SHARED_CHECKS_SHARE`` of ``total_bytes``; and no first call that benchmarks on the device (``BENCHMARKS_FIRST``:
    torch.compile's max-autotune modes, Triton's autotuner, cuDNN's, a kernel timing its own choices), whose choice
    another process's kernels would skew."""
    found = [mark for mark in BENCHMARKS_FIRST if mark in source]
    if found:
        return f"its first calls benchmark on the device ({found[0]})"
    if not case_bytes or any(b is None for b in case_bytes):
        return "the bytes of a case are not known before it runs"
    need = 2 * max(case_bytes) * max(1, children)
    if need > SHARED_CHECKS_SHARE * total_bytes:
        return (f"its largest check ({_gib(2 * max(case_bytes))}) times {children} children would pass "
                f"{SHARED_CHECKS_SHARE:g} of the device's {_gib(total_bytes)}")
    return None


# ---- out of memory -----------------------------------------------------------------------------------

_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
                  r"cudaErrorMemoryAllocation|out of memory", re.I)


def is_out_of_memory(error: str) -> bool:
    """Whether a failure's message says the device ran out of memory."""
    return bool(_OOM.search(error or ""))
