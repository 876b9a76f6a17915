"""The child process that evaluates one candidate, in stages, inside its own sandbox.

Stages, each with its own failure status (after KernelBench's eval):
  load     — source parses and defines ``launch``               -> compile_error
  compile  — first call per case (Triton JIT-compiles here)     -> compile_error / runtime_error
  correct  — fresh seeded inputs, harness-allocated NaN-poisoned
             outputs, compared with the fp32 reference           -> incorrect / runtime_error
  time     — CUDA events, L2 flushed, adaptive repetitions       -> ok
Load and compile run concurrently with other children on the CPU cores; correctness
and timing hold the GPU lock (an flock, released by the kernel if the child dies), so
exactly one candidate uses the GPU at a time and its timing is not disturbed.

The child reports to its parent over a pipe: ("gpu_stage", t) when it takes the lock,
then ("result", dict). If it crashes or hangs, the parent classifies it from outside.
"""

from __future__ import annotations

import fcntl
import os
import re
import resource
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton  # noqa: F401  (imported here so the fork server preloads it)

from kernels.harness.correctness import (CandidateLoadError, call_candidate, check_once, load_launch,
                                          poisoned_outputs)
from kernels.harness.timing import l2_flush_buffer, time_call
from kernels.ops import get_operation
from kernels.records import Candidate

# Variables whose names look like credentials never reach candidate code.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION)", re.I)
_SECRET_PREFIXES = ("AWS_", "MLFLOW_", "PREFECT_", "HF_", "HUGGING", "OPENAI", "AZURE_", "GOOGLE_", "GCP_",
                    "S3_", "RAY_")
# Device memory a timing run may spend on rotated input sets.
_ROTATION_BYTES = 1 << 30


@dataclass(frozen=True)
class Job:
    candidate: Candidate
    mode: str  # "gpu" or "interpreter"
    scratch_dir: str
    lock_path: str
    triton_cache_dir: str
    seeds: int = 3
    max_seconds_per_case: float = 1.0


def scrub_environment() -> None:
    for name in list(os.environ):
        if _SECRET_NAME.search(name) or name.upper().startswith(_SECRET_PREFIXES):
            del os.environ[name]


def enter_sandbox(job: Job) -> None:
    """Isolate the child: its own scratch directory and log, no secrets, no core dumps."""
    scrub_environment()
    os.chdir(job.scratch_dir)
    os.environ["TMPDIR"] = job.scratch_dir
    os.environ["TRITON_CACHE_DIR"] = job.triton_cache_dir
    if job.mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    log = os.open(os.path.join(job.scratch_dir, "child.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)


@contextmanager
def gpu_lock(path: str):
    with open(path, "a") as f:
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

    try:
        launch = load_launch(cand.source, job.scratch_dir)
    except CandidateLoadError as exc:
        return fail("compile_error", str(exc))
    for case in cases:  # compile stage: first call per case, outside the GPU lock
        try:
            gen = torch.Generator(device=device)
            gen.manual_seed(0)
            inputs = op.make_inputs(case, gen, device)
            call_candidate(launch, inputs, poisoned_outputs(op, case, device), cand.params)
            if gpu:
                torch.cuda.synchronize()
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
                    problem = check_once(op, case, launch, cand.params, seed, device)
                    if problem:
                        return fail("incorrect", f"seed {seed}: {problem}")
            if gpu:
                _time_cases(job, op, cases, launch, result)
        except Exception as exc:
            return fail("runtime_error", _describe(exc))
        finally:
            result["gpu_seconds"] = time.perf_counter() - t_gpu
    return result


def _time_cases(job: Job, op, cases, launch, result: dict) -> None:
    flush = l2_flush_buffer()
    for case in cases:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1000)
        first = op.make_inputs(case, gen, "cuda")
        set_bytes = sum(t.numel() * t.element_size() for t in first) or 1
        n_sets = max(2, min(8, _ROTATION_BYTES // set_bytes))
        sets = [first] + [op.make_inputs(case, gen, "cuda") for _ in range(n_sets - 1)]
        outs = [poisoned_outputs(op, case, "cuda") for _ in range(n_sets)]
        params = job.candidate.params

        def call(i: int, sets=sets, outs=outs) -> None:
            k = i % len(sets)
            launch(*sets[k], *outs[k], **params)

        timing = time_call(call, flush, max_seconds=job.max_seconds_per_case)
        result["runtime_us_median"].append(timing.runtime_us_median)
        result["runtime_us_iqr"].append(timing.runtime_us_iqr)
        result["repetitions"].append(timing.repetitions)
        del sets, outs
    del flush
    torch.cuda.empty_cache()


def child_main(job: Job, conn) -> None:
    """Entry point of the isolated child process."""
    enter_sandbox(job)
    try:
        result = evaluate(job, notify=lambda *msg: conn.send(msg))
    except BaseException as exc:  # a harness bug must still come back as a classified result
        result = {"status": "runtime_error", "error": _describe(exc)}
    conn.send(("result", result))
    conn.close()
    # Leave at once: CUDA teardown after an illegal access can hang, and nothing is left to do.
    os._exit(0)

