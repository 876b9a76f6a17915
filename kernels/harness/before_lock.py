"""The child's work before it holds the GPU lock, on the CPU: each case's first call compiled ahead
(``compile_ahead``), the device's size for the fit check, and the CUDA context, its libraries and activity tracing
set up.

Outside the lock a child allocates nothing on the device and runs no kernel (kernelcast.kernels.harness.ahead's
``DeviceGuard``), so children compiling at once never hold case data on the device or run work beside the child being
timed. A case whose first call cannot be made ahead is named, and made under the lock
(kernelcast.kernels.harness.under_lock).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import torch

from kernelcast.kernels.harness import ahead, budget, verify
from kernelcast.kernels.harness.anticheat import CallGuard, Rejected
from kernelcast.kernels.harness.correctness import (CandidateLoadError, call_candidate, describe, is_compile_failure,
                                                    load_launch, poisoned_outputs)
from kernelcast.kernels.harness.job import Job


def compile_ahead(job: Job, op, cases) -> dict[str, str]:
    """The first call per case on meta tensors, outside the lock; returns case -> why it must be made under it.

    Raises ``Rejected`` (a forbidden call, a stream) and Triton compile failures: those are
    verdicts. Any other failure only means the case's first call is made under the lock.
    """
    gpu = job.mode == "gpu"
    folder = os.path.join(job.scratch_dir, "ahead")
    os.makedirs(folder, exist_ok=True)
    try:
        with ahead.DeviceGuard("cuda"):
            launch = load_launch(job.candidate.source, folder, module_name="candidate_ahead")
    except (CandidateLoadError, ahead.NeedsDevice) as exc:  # the load stage proper reports load failures
        return {c.name: f"not loadable ahead: {exc}" for c in cases}
    deferred: dict[str, str] = {}
    compiled_frames = _dynamo_frames()
    target = ahead.parse_target(job.compile_target) if gpu else None
    with ahead.compile_only(target, interpreted=not gpu):
        for case in cases:
            try:
                inputs = budget.meta_inputs(op, case)
                outputs = poisoned_outputs(op, case, "meta")
                guard = CallGuard(op, job.candidate)
                with guard, ahead.DeviceGuard("cuda"):
                    call_candidate(launch, inputs, outputs, job.candidate.params)
                if guard.reason():
                    raise Rejected(guard.reason())
            except Rejected:
                raise
            except Exception as exc:  # noqa: BLE001 - sorted below: a compile failure is a verdict
                if gpu and is_compile_failure(exc):
                    raise
                deferred[case.name] = describe(exc)
    if _dynamo_frames() > compiled_frames:  # torch.compile: its real compile waits for real tensors
        deferred.update({c.name: "torch.compile compiles at the first call on the device" for c in cases
                         if c.name not in deferred})
    return deferred


def _dynamo_frames() -> int:
    """Frames torch.compile has compiled in this process (0 when it was never imported)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["frames"]["total"]) if dynamo is not None else 0


def warm_triton_utils() -> str:
    """Build Triton's CUDA utilities now, on the CPU, outside the lock; "" when built, else why not.

    Triton compiles them (a C module, about a third of a second of a C compiler) at its first launch, into the
    child's own Triton cache (kernelcast.kernels.harness.sandbox: a cache children shared would let one plant a
    kernel for another): without this, every child paid for it at its first call, under the lock (measured on an
    H100, 2026-12-06: a child's first call took 0.2-0.5 s against 0.1-0.2 s with a cache children shared). Built
    before the kernels are compiled ahead, their launchers taking tensor descriptors are built ahead too
    (``ahead.warmable``). Loading the module asks nothing of the device."""
    try:
        from triton.backends.nvidia.driver import CudaUtils

        CudaUtils()
    except Exception as exc:  # noqa: BLE001 - no C compiler or libcuda here: built at the first launch, as before
        return describe(exc)[:200]
    return ""


def build_triton_utils(cache_dir: str) -> bool:
    """The worker's part (GPU mode): build Triton's CUDA utilities once, in a process of its own, into ``cache_dir``,
    which the worker copies into each child's own Triton cache before the child starts (``seed_triton_cache``). A
    copy, not a link: a child may do what it likes with its copy and with nothing else. True when built."""
    code = "from triton.backends.nvidia.driver import CudaUtils; CudaUtils()"
    env = {**os.environ, "TRITON_CACHE_DIR": cache_dir}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def seed_triton_cache(built: str, scratch_dir: str) -> None:
    """Copy what ``build_triton_utils`` built into a child's own Triton cache (kernelcast.kernels.harness.sandbox's
    ``triton-cache`` in its scratch folder); its first launch then loads them instead of compiling them."""
    shutil.copytree(built, os.path.join(scratch_dir, "triton-cache"), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("lock", "*.tmp*"))


def _device_bytes(job: Job) -> int:
    if job.device_memory_bytes is not None:
        return job.device_memory_bytes
    if job.mode != "gpu":  # the host: what the child's address-space limit leaves
        return job.address_space_bytes or 1 << 62
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def _warm_context(libraries: bool = False) -> None:
    """Create the CUDA context now, outside the lock: it allocates no tensors and runs no kernel.

    With ``libraries``, cuBLAS, cuBLASLt and cuDNN make their handles too, with a few tiny kernels: a
    candidate that captures a CUDA graph on its first call, as KernelBench-style code does without a
    warm-up, would otherwise create them inside the capture, which CUDA refuses (the capture is
    invalidated). Any PyTorch process that ran its reference first has them; so does this one."""
    torch.cuda.init()
    if libraries:
        a = torch.ones(16, 16, device="cuda")
        torch.mm(a, a)
        torch.addmm(a[0], a, a)
        torch.nn.functional.conv2d(torch.ones(1, 2, 4, 4, device="cuda"), torch.ones(2, 2, 3, 3, device="cuda"))
        del a
    torch.cuda.synchronize()


_CAPTURES = ("CUDAGraph", "cuda.graph", "make_graphed_callables")


def _warm_profiler(result: dict) -> None:
    """Set CUDA's activity tracing up outside the lock; where it cannot start, the window check is skipped."""
    try:
        verify.warm_profiler()
    except Exception as exc:  # noqa: BLE001 - no tracing in this process: the synced check still runs
        result["window_check"] = f"unavailable: {describe(exc)[:200]}"


def _arch(target: str) -> str:
    """'cuda:90' -> '9.0' (torch's TORCH_CUDA_ARCH_LIST form); '' for none."""
    digits = target.partition(":")[2]
    return f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 and digits.isdigit() else ""
