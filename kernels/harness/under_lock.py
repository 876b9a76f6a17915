"""The child's device phases under the GPU lock (``_under_lock``), and the lock itself (``DeviceLock``).

Under the lock: first calls of the cases not compiled ahead, the correctness checks, the timing
(kernelcast.kernels.harness.case_timing), the recheck, and the child's device memory freed before the lock goes.

The GPU lock (an flock, released by the kernel if the child dies) is held from the first
device allocation to the end: inputs are made, first calls, checks and timing run, and
the child's device memory (inputs, outputs, cached models, the allocator's cache) is
freed before the lock is released. Outside the lock a child uses the CPU only (a CUDA
context, no allocations, no kernels), so children compiling at once never hold case
data on the device and never run work beside the child being timed.

Where the worker allows it (``Job.shared_checks``: small cases of known size, no first call
that autotunes; kernelcast.kernels.harness.budget.shares_checks), the lock is held shared for the first
calls and checks, beside other children's checks, exclusive for the timing and its verification,
and shared again for the recheck and freeing: no child ever runs device work beside a child being
timed, and the first launches of a fresh process (each module loaded on its first use) are paid by
several children at once.
"""

from __future__ import annotations

import fcntl
import gc
import math
import os
import time

import torch

from kernelcast.kernels.harness import cores, judge
from kernelcast.kernels.harness.anticheat import Checker, Rejected
from kernelcast.kernels.harness.case_timing import _time_cases
from kernelcast.kernels.harness.correctness import (CandidateLoadError, describe, is_compile_failure, is_oom,
                                                    load_launch)
from kernelcast.kernels.harness.job import Job
from kernelcast.kernels.harness.window_checks import _Incorrect
from kernelcast.kernels.ops import Operation
from kernelcast.kernels.records import is_lower, strict_error

_RECHECK_SEED = 9000  # the recheck's inputs (timing sets from case_timing._TIMING_SEED)
JUDGED = "judged"  # the child's folder of recorded outputs (judge.OutputLog), read by the judge


class DeviceLock:
    """A child's hold on the GPU lock: exclusive, or shared until ``exclusive`` (``Job.shared_checks``).

    Shared holders run beside each other and never beside an exclusive one, so a child's checks may overlap other
    children's checks and nothing overlaps its timing. ``exclusive`` gives the shared hold up and waits for the lock
    alone (flock converts so: two children converting at once never deadlock); waiting counts against no limit (the
    worker hears ``exclusive_wait`` and ``exclusive``). A gate letting a child waiting to hold it alone go before
    children arriving to share it was measured and taken out (docs/measured/judge_h100_2026-12-06/README.md: 52
    candidates a GPU-minute with it, 58 without, the same H100 back to back)."""

    def __init__(self, path: str, shared: bool, phase, timing_cpus: tuple[int, ...] = (), gpu: bool = True):
        self.path, self.shared, self._phase, self._timing_cpus, self._gpu = path, shared, phase, timing_cpus, gpu
        self.admitted = shared  # its checks may share the device (Job.shared_checks): its recheck may too
        self._file = None
        self._cpus = sorted(os.sched_getaffinity(0))  # the cores it compiled on, where its shared holds run
        self.waited_s = 0.0  # waiting for the lock between holds (alone, or shared again): not time it was held

    def __enter__(self) -> "DeviceLock":
        # Opened read-only: flock needs no write access, and the sandbox allows none outside the scratch dir.
        self._file = open(self.path, "r")
        fcntl.flock(self._file, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
        _prime_thread_pools()
        self.threads_at_lock = _threads()
        return self

    def pin(self) -> list[int]:
        """The cores this child runs on now: the reserved timing cores once it holds the device alone; while shared,
        those it compiled on (several children check at once: one core would serialise them)."""
        if self._timing_cpus and not self.shared:
            return list(cores.pin(self._timing_cpus))
        return sorted(os.sched_getaffinity(0))

    def exclusive(self) -> None:
        """Hold the device alone from here on (a no-op when already so); what the allocator cached goes back first,
        so a child waiting here holds no more of the device than its own live tensors."""
        if not self.shared:
            return
        if self._gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        # Between its holds the child runs nothing of its own, but a thread its candidate started in the checks could
        # launch work then, beside another child's timing: such a candidate is refused before it lets the hold go.
        # (Measured on an H200, 2026-11-29: 314 children of 157 KernelBench tasks checked shared, none started one.)
        threads = _threads()
        self._phase("exclusive_wait", {"threads_at_lock": self.threads_at_lock, "threads": threads})
        if threads > self.threads_at_lock:
            raise Rejected(f"started {threads - self.threads_at_lock} thread(s) in its correctness checks, which ran "
                           f"beside other candidates' checks: a thread of its own could launch device work while "
                           f"another candidate is timed; start no threads in a kernel's call")
        t = time.perf_counter()
        fcntl.flock(self._file, fcntl.LOCK_EX)
        self.waited_s += time.perf_counter() - t
        self.shared = False
        self._phase("exclusive", {"cpus": self.pin()})

    def share_again(self) -> None:
        """Hold the device shared again once everything timed is done (a no-op for a child not admitted to share):
        the recheck and freeing ask nothing of an idle device, and other children's checks may run beside them.
        flock turns the exclusive lock shared at once unless a child waiting for it alone gets it in between; then
        this waits (``share_wait``, counted against no limit) for that child's timing to end."""
        if not self.admitted or self.shared:
            return
        if self._gpu:
            torch.cuda.synchronize()  # nothing of its own still running on the device beside the next one's timing
        if self._timing_cpus:
            cores.pin(self._cpus)
        try:
            fcntl.flock(self._file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self._phase("share_wait")
            t = time.perf_counter()
            fcntl.flock(self._file, fcntl.LOCK_SH)
            self.waited_s += time.perf_counter() - t
        self.shared = True
        self._phase("shared_again", {"cpus": self.pin()})

    def __exit__(self, *exc) -> None:
        try:
            fcntl.flock(self._file, fcntl.LOCK_UN)
        finally:
            self._file.close()


def _prime_thread_pools() -> None:
    """Start torch's own worker threads now, so that the thread count taken at the lock holds them: its intra-op
    pool starts at the first parallel operation (a reference's on the CPU, the interpreter's), which would
    otherwise count as a thread the candidate started in its checks."""
    if torch.get_num_threads() > 1:
        torch.ones(1 << 18).add_(1.0)  # past the parallel grain: every intra-op thread starts


def _threads() -> int:
    """The threads of this process, native ones included (0 where /proc cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _under_lock(job: Job, op, cases, first_calls, device: str, launch, result: dict, phase,
                output_bytes: dict[str, int], lock: DeviceLock, draw=None) -> None:
    """The device phase: first calls (of cases not compiled ahead), checks, then the device held alone (``lock``)
    for timing and the recheck; device memory freed before returning. ``gpu_seconds``: the time the lock was held,
    not the time waited between its shared and exclusive holds."""
    gpu = job.mode == "gpu"
    cand = job.candidate
    t_gpu = time.perf_counter()

    def fail(status: str, message: str) -> None:
        result.update(status=status, error=message)

    checker = None
    # the outputs the judge reads: written to files only where the device is not held alone (``flush``)
    log = judge.OutputLog(os.path.join(job.scratch_dir, JUDGED), deferred=True,
                          sample=type(op).check is Operation.check, device=device)
    try:
        if launch is None:
            launch = load_launch(cand.source, job.scratch_dir)
        built = op.prepare(launch, cand.source, device)
        if built:
            result["models_built"] = built
        # the worker scales a reference's limit by how long its calls take: told before the checks' own calls
        checker = Checker(op, cand, launch, device, on_inputs=lambda: phase("first_inputs"), measure_precision=True,
                          on_first_call=lambda name, seconds: phase("call", {"case": name, "seconds": seconds}),
                          on_first_call_start=lambda name: phase("calling", {"case": name}),
                          draw=draw, record=log.write)
        for case in first_calls:  # the others compiled ahead: their first checked call loads what was built
            try:
                checker.first_call(case)
            except Rejected as exc:
                return fail("rejected", f"case {case.name}: {exc}")
            except Exception as exc:
                result["out_of_memory"] = is_oom(exc)
                status = "compile_error" if is_compile_failure(exc) else "runtime_error"
                return fail(status, f"case {case.name}: {describe(exc)}")
        phase("checks")
        for case in cases:
            for seed in range(1, job.seeds + 1):
                phase("check", {"case": case.name, "seed": seed})
                was_first = case.name not in checker.first_call_seconds
                problem = checker.check(case, seed)
                if problem:
                    return fail("incorrect", f"seed {seed}: {problem}")
                if checker.enough_seeds(case, was_first):
                    break
        lower = _record_precision(checker, cases, result)
        if lower and job.precision == "strict":
            return fail("incorrect", strict_error(lower))
        phase("checked")
        log.flush()
        lock.exclusive()
        if gpu:
            try:
                _time_cases(job, op, cases, launch, checker, result, phase, output_bytes)
            except _Incorrect as exc:
                return fail("incorrect", str(exc))
        # Nothing is timed from here on: a child whose checks shared the device shares it again.
        lock.share_again()
        log.flush()
        # Once more on fresh inputs and outputs, after all the calls above: a kernel that computes only on its first
        # calls, or replays a cached answer, fails here. Timed and verified, the child has done this already: the
        # verification's calls on unseen inputs (fresh outputs, made after the timing) are the recheck, the first of
        # each case recorded for the judge as this round's was, and the timed calls' own outputs are judged.
        for case in (cases if job.recheck and not (gpu and job.verify) else ()):
            phase("recheck", {"case": case.name})
            problem = checker.check(case, _RECHECK_SEED, role="recheck")
            if problem:
                return fail("incorrect", f"after {checker.calls} calls, on fresh inputs: {problem}")
    except Rejected as exc:
        return fail("rejected", str(exc))
    except CandidateLoadError as exc:
        return fail("compile_error", str(exc))
    except Exception as exc:
        result["out_of_memory"] = is_oom(exc)
        return fail("runtime_error", describe(exc))
    finally:
        checker = None
        try:
            log.flush()
        except OSError as exc:  # the judge then finds records missing: no verdict of the child's stands
            result.setdefault("timed_outputs", []).append(f"outputs not written for the judge: {exc}")
        try:
            left = _release_device(launch, op, gpu)
        except Exception:  # noqa: BLE001 - a broken context (illegal address): the process exit frees it
            left = -1
        result["gpu_seconds"] = time.perf_counter() - t_gpu - lock.waited_s
        phase("releasing", {"device_bytes_left": left})


def _record_precision(checker: Checker, cases, result: dict) -> str | None:
    """Each case's error against float64 into the result, and the verdict's precision; the flag's text, if any."""
    found = [checker.precision.get(c.name, {}) for c in cases]
    result["error_rel"] = [f.get("error_rel", math.nan) for f in found]
    result["reference_error_rel"] = [f.get("reference_error_rel", math.nan) for f in found]
    lower = [f"case {c.name}: {f['precision']}" for c, f in zip(cases, found) if is_lower(f.get("precision", ""))]
    texts = list(dict.fromkeys(f.get("precision", "not measured") for f in found))
    result["precision"] = "; ".join(lower) if lower else ", ".join(texts)
    return "; ".join(lower) or None


def _release_device(launch, op, gpu: bool) -> int:
    """Free what this child holds on the device before the lock goes; returns the bytes still allocated."""
    globals_ = getattr(launch, "__globals__", None)
    if isinstance(globals_, dict):
        globals_.clear()  # the candidate's module-level caches (models, buffers); it is not called again
    op.clear_caches()
    gc.collect()  # the objects made since the child froze the rest (evaluate): cycles holding tensors
    if not gpu:
        return 0
    left = _empty_device()
    if left:  # something made before the freeze still holds device memory: every object, then
        gc.unfreeze()
        gc.collect()
        left = _empty_device()
    return left


def _empty_device() -> int:
    """Give the allocator's cached blocks and cuBLAS's workspaces back to the device; the bytes still allocated."""
    torch.cuda.synchronize()
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):  # cuBLAS keeps its workspaces in the allocator
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()
