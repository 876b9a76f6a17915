"""The child process that evaluates one candidate, in stages, inside its own sandbox.

Stages, each with its own failure status (after KernelBench's eval):
  load     — source parses and defines ``launch``               -> compile_error
  compile  — first call per case (Triton JIT-compiles here)     -> compile_error / runtime_error
  scan     — static anti-cheat scan of the source                 -> rejected
  correct  — fresh seeded inputs, harness-allocated NaN-poisoned
             outputs, compared with the fp32 reference; inputs
             checked unchanged and unaliased, forbidden calls
             refused (see anticheat)                             -> incorrect / rejected / runtime_error
  time     — CUDA events, L2 flushed, adaptive repetitions       -> ok
  recheck  — fresh inputs and outputs once more, after timing:
             a kernel that stops computing is caught here        -> rejected / incorrect
Load and compile run concurrently with other children on the CPU cores; correctness
and timing hold the GPU lock (an flock, released by the kernel if the child dies), so
exactly one candidate uses the GPU at a time and its timing is not disturbed.

The child enters its sandbox (kernels.harness.sandbox) before loading any candidate code,
and reports to its parent over a pipe: ("sandbox", summary) once confined, ("gpu_stage", t)
when it takes the lock, then ("result", dict). If it crashes or hangs, the parent classifies it from outside.
"""

from __future__ import annotations

import fcntl
import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton  # imported here so the fork server preloads it
import triton.language as tl

from kernels.harness import sandbox
from kernels.harness.anticheat import Checker, Rejected, install_stream_guard, scan_source
from kernels.harness.correctness import CandidateLoadError, load_launch, poisoned_outputs
from kernels.harness.timing import l2_flush_buffer, time_call
from kernels.ops import get_operation
from kernels.records import Candidate

# Device memory a timing run may spend on rotated input sets.
_ROTATION_BYTES = 1 << 30
# Seeds of the inputs: compile call 0, correctness 1..seeds, timing sets from 1000, recheck 9000.
_TIMING_SEED, _RECHECK_SEED = 1000, 9000


@dataclass(frozen=True)
class Job:
    candidate: Candidate
    mode: str  # "gpu" or "interpreter"
    scratch_dir: str
    lock_path: str
    triton_cache_dir: str
    seeds: int = 3
    max_seconds_per_case: float = 1.0
    network: str = "namespace"  # strongest network protection to try (sandbox.NETWORK_CHOICES)
    filesystem: str = "landlock"
    cpu_seconds: int = 600
    address_space_bytes: int | None = 8 << 30  # interpreter mode only
    file_size_bytes: int = 512 << 20

    def policy(self) -> sandbox.SandboxPolicy:
        return sandbox.SandboxPolicy(scratch_dir=self.scratch_dir, triton_cache_dir=self.triton_cache_dir,
                                     gpu=self.mode == "gpu", network=self.network, filesystem=self.filesystem,
                                     cpu_seconds=self.cpu_seconds, address_space_bytes=self.address_space_bytes,
                                     file_size_bytes=self.file_size_bytes)


def scrub_environment() -> None:
    """Remove credential-looking variables from this process's environment."""
    sandbox.scrub_environment()


def enter_sandbox(job: Job) -> sandbox.SandboxReport:
    """Confine the child (see kernels.harness.sandbox), then send its output to a log in the scratch dir."""
    report = sandbox.enter(job.policy())
    if job.mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
    log = os.open(os.path.join(job.scratch_dir, "child.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    return report


@contextmanager
def gpu_lock(path: str):
    # Opened read-only: flock needs no write access, and the sandbox allows none outside the scratch dir.
    with open(path, "r") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _is_compile_failure(exc: BaseException) -> bool:
    """Triton raises compile failures from its compiler and backends; anything else ran and failed."""
    if type(exc).__name__ in ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure"):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return any("/triton/compiler/" in f.filename or "/triton/backends/" in f.filename for f in frames)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def evaluate(job: Job, notify=lambda *msg: None) -> dict:
    """Run the stages and return a flat result dict (status, error, per-case timings, seconds)."""
    cand = job.candidate
    op = get_operation(cand.op)
    gpu = job.mode == "gpu"
    device = "cuda" if gpu else "cpu"
    cases = op.cases if gpu else op.interpret_cases
    result = {"status": "ok", "error": "", "case_names": [c.name for c in cases], "compile_seconds": 0.0,
              "gpu_seconds": 0.0, "runtime_us_median": [], "runtime_us_iqr": [], "repetitions": []}
    t0 = time.perf_counter()

    def fail(status: str, message: str) -> dict:
        result.update(status=status, error=message)
        return result

    refused = scan_source(cand, op)
    if refused:
        return fail("rejected", refused)
    try:
        launch = load_launch(cand.source, job.scratch_dir)
    except CandidateLoadError as exc:
        return fail("compile_error", str(exc))
    except Rejected as exc:  # a stream made at import time
        return fail("rejected", str(exc))
    checker = Checker(op, cand, launch, device)
    for case in cases:  # compile stage: first call per case, outside the GPU lock
        try:
            checker.first_call(case)
        except Rejected as exc:
            return fail("rejected", f"case {case.name}: {exc}")
        except Exception as exc:
            status = "compile_error" if _is_compile_failure(exc) else "runtime_error"
            return fail(status, f"case {case.name}: {_describe(exc)}")
    result["compile_seconds"] = time.perf_counter() - t0

    with gpu_lock(job.lock_path):
        t_gpu = time.perf_counter()
        notify("gpu_stage", time.time())
        try:
            for case in cases:
                for seed in range(1, job.seeds + 1):
                    problem = checker.check(case, seed)
                    if problem:
                        return fail("incorrect", f"seed {seed}: {problem}")
            if gpu:
                _time_cases(job, op, cases, launch, checker, result)
            # Once more on fresh inputs and outputs, after all the calls above: a kernel that
            # computes only on its first calls, or replays a cached answer, fails here.
            for case in cases:
                problem = checker.check(case, _RECHECK_SEED)
                if problem:
                    return fail("incorrect", f"after {checker.calls} calls, on fresh inputs: {problem}")
        except Rejected as exc:
            return fail("rejected", str(exc))
        except Exception as exc:
            return fail("runtime_error", _describe(exc))
        finally:
            result["gpu_seconds"] = time.perf_counter() - t_gpu
    return result


def _time_cases(job: Job, op, cases, launch, checker: Checker, result: dict) -> None:
    flush = l2_flush_buffer()
    stream = torch.cuda.current_stream()
    for case in cases:
        first = checker.inputs(case, _TIMING_SEED)
        set_bytes = sum(t.numel() * t.element_size() for t in first) or 1
        n_sets = max(2, min(8, _ROTATION_BYTES // set_bytes))
        sets = [first] + [checker.inputs(case, _TIMING_SEED + k) for k in range(1, n_sets)]
        outs = [poisoned_outputs(op, case, "cuda") for _ in range(n_sets)]
        params = job.candidate.params

        def call(i: int, sets=sets, outs=outs) -> None:
            k = i % len(sets)
            launch(*sets[k], *outs[k], **params)

        timing = time_call(call, flush, max_seconds=job.max_seconds_per_case)
        if torch.cuda.current_stream() != stream:
            raise Rejected(f"case {case.name}: left another CUDA stream current; kernels must run on the "
                           f"harness's stream, where they are timed")
        for k in range(n_sets):
            checker.note(case, _TIMING_SEED + k)
        result["runtime_us_median"].append(timing.runtime_us_median)
        result["runtime_us_iqr"].append(timing.runtime_us_iqr)
        result["repetitions"].append(timing.repetitions)
        del sets, outs
    del flush
    torch.cuda.empty_cache()


def child_main(job: Job, conn) -> None:
    """Entry point of the isolated child process."""
    try:
        report = enter_sandbox(job)
        conn.send(("sandbox", report.summary()))
        install_stream_guard()
        result = evaluate(job, notify=lambda *msg: conn.send(msg))
    except BaseException as exc:  # a harness bug must still come back as a classified result
        result = {"status": "runtime_error", "error": _describe(exc)}
    conn.send(("result", result))
    conn.close()
    # Leave at once: CUDA teardown after an illegal access can hang, and nothing is left to do.
    os._exit(0)


@triton.jit
def _probe_add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def probe_main(job: Job, conn) -> None:
    """Check that CUDA and a Triton kernel still work inside the sandbox ``job`` describes.

    A user namespace or Landlock can break the CUDA driver or Triton's launcher build on
    some platforms; the worker runs this once and steps down to weaker protections if needed.
    """
    try:
        report = enter_sandbox(job)
        device = "cuda" if job.mode == "gpu" else "cpu"
        x = torch.zeros(100, device=device)
        _probe_add_one[(1,)](x, 100, BLOCK=128)
        ok = bool((x == 1).all())
        conn.send(("probe", {"ok": ok, "sandbox": report.summary(), "error": "" if ok else "wrong result"}))
    except BaseException as exc:
        conn.send(("probe", {"ok": False, "sandbox": "", "error": _describe(exc)}))
    conn.close()
    os._exit(0)
