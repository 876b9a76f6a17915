"""The child process that evaluates one candidate, in stages, inside its own sandbox.

Stages, each with its own failure status (after KernelBench's eval):
  scan     — static anti-cheat scan of the source                 -> rejected
  ahead    — on the CPU, outside the GPU lock: the first call per
             case on meta tensors, Triton kernels compiled for the
             GPU's target without running (kernelcast.kernels.harness.ahead) -> compile_error / rejected
  load     — source parses and defines ``launch``               -> compile_error
  fit      — the case's correctness check fits the device         -> rejected (names the bytes)
  first    — under the lock: the first real call per case (a case
             that could not be compiled ahead compiles here)      -> compile_error / runtime_error
  correct  — fresh seeded inputs, harness-allocated NaN-poisoned
             outputs, compared with the fp32 reference; inputs
             checked unchanged and unaliased, forbidden calls
             refused (see anticheat)                             -> incorrect / rejected / runtime_error
  time     — CUDA events, L2 flushed, adaptive repetitions       -> ok
  recheck  — fresh inputs and outputs once more, after timing:
             a kernel that stops computing is caught here        -> rejected / incorrect

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

The child enters its sandbox (kernelcast.kernels.harness.sandbox) before loading any candidate code,
and reports to its parent over a pipe: ("sandbox", summary) once confined, ("phase", name,
detail, t) as it moves between phases (waiting for the lock, holding it, first calls done,
timing, released), then ("result", dict). If it crashes or hangs, the parent classifies
it from outside.
"""

from __future__ import annotations

import fcntl
import gc
import math
import os
import random
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import triton  # imported here so the fork server preloads it
import triton.language as tl

from kernelcast.kernels.formats.common import unmet_requirement
from kernelcast.kernels.harness import ahead, budget, channel, cores, judge, prebuild, sandbox, state, verify
from kernelcast.kernels.harness.anticheat import (CallGuard, Checker, Rejected, install_stream_guard, scan_source,
                                      warm_comparisons)
from kernelcast.kernels.harness.correctness import CandidateLoadError, call_candidate, load_launch, poisoned_outputs
from kernelcast.kernels.harness.timing import (FORMAT_PROTOCOLS, Timing, fastest, flush_us, l2_flush_buffer, time_again, time_call,
                                    time_gpumode, time_pair, time_trials)
from kernelcast.kernels.ops import Operation, get_operation
from kernelcast.kernels.records import Candidate, is_lower, strict_error

# Seeds of the inputs: compile call 0, correctness 1..seeds, timing sets from 1000, recheck 9000.
_TIMING_SEED, _RECHECK_SEED = 1000, 9000
JUDGED = "judged"  # the child's folder of recorded outputs (judge.OutputLog), read by the judge
TIMED_RECORDS = 2  # timed input sets per case whose outputs the judge checks: the latest call's and one other

# The timers of the formats' own harnesses (Job.protocol): KernelBench's 100 trials, GPU MODE's adaptive runs.
_FORMAT_TIMERS = {"kernelbench": time_trials, "gpumode": time_gpumode}


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
    compile_target: str = ""  # "cuda:90": compile ahead for this target with no CUDA call; "": ask the device
    device_memory_bytes: int | None = None  # the device's memory for the fit check; None: ask the device
    alone: bool = False  # a retry after running out of device memory, with no other child running
    environment: tuple[tuple[str, str], ...] = ()  # variables the op's own code needs (set before CUDA starts)
    compile_cpus: tuple[int, ...] = ()  # where the child runs until it holds the lock (kernelcast.kernels.harness.cores)
    timing_cpus: tuple[int, ...] = ()  # where it runs while it holds the lock; () for both: wherever it may
    host_bound_windows: int = 5  # timing windows for a case whose host side outlasts the flush (the fastest counts)
    # The op's reference runtime per case, as the worker measured it; given, a host-bound case is timed
    # in one window with the reference and reported as this runtime times their ratio (``anchored``).
    reference_us: tuple[float, ...] = ()
    verify: bool = True  # the checks of kernelcast.kernels.harness.verify after each case is timed
    fresh_calls: int = 3  # verification calls on unseen inputs per case, each beside a call on a timing set
    peak_bandwidth_gbps: float | None = None  # the device's, for the physics floor; None: no floor
    peak_tflops: float | None = None
    l2_bytes: int = 0  # outputs up to this size may still sit in the L2 when the timed call ends
    precision: str = "tolerance"  # "strict": a result of a lower precision class than the reference fails
    protocol: str = "kernelcast"  # how cases are timed (kernelcast.kernels.harness.timing.PROTOCOLS)
    model_build: str = "auto"  # where an imported task's models are built (kernelcast.kernels.ops.base.MODEL_BUILDS)
    anchor_all: bool = False  # every case of a candidate timed again beside the reference, not only host-bound ones
    reference_host_bound: tuple[str, ...] = ()  # cases where the reference's own timing was host-bound
    warm_checks: bool = False  # the checks' comparisons and the libraries' handles warmed before the lock
    shared_checks: bool = False  # first calls and checks with the lock held shared (DeviceLock), timing alone

    def policy(self) -> sandbox.SandboxPolicy:
        return sandbox.SandboxPolicy(scratch_dir=self.scratch_dir, triton_cache_dir=self.triton_cache_dir,
                                     gpu=self.mode == "gpu", network=self.network, filesystem=self.filesystem,
                                     cpu_seconds=self.cpu_seconds, address_space_bytes=self.address_space_bytes,
                                     file_size_bytes=self.file_size_bytes,
                                     readable=(self.lock_path,) if self.lock_path else ())


def scrub_environment() -> None:
    """Remove credential-looking variables from this process's environment."""
    sandbox.scrub_environment()


def enter_sandbox(job: Job) -> sandbox.SandboxReport:
    """Confine the child (see kernelcast.kernels.harness.sandbox), then send its output to a log in the scratch dir."""
    report = sandbox.enter(job.policy())
    os.environ.update(dict(job.environment))
    if job.mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
    log = os.open(os.path.join(job.scratch_dir, "child.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    return report


class DeviceLock:
    """A child's hold on the GPU lock: exclusive, or shared until ``exclusive`` (``Job.shared_checks``).

    Shared holders run beside each other and never beside an exclusive one, so a child's checks may overlap other
    children's checks and nothing overlaps its timing. ``exclusive`` gives the shared hold up and waits for the lock
    alone (flock converts so: two children converting at once never deadlock); waiting counts against no limit (the
    worker hears ``exclusive_wait`` and ``exclusive``)."""

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


def _is_compile_failure(exc: BaseException) -> bool:
    """Triton raises compile failures from its compiler and backends; anything else ran and failed."""
    if type(exc).__name__ in ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure"):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return any("/triton/compiler/" in f.filename or "/triton/backends/" in f.filename for f in frames)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip() + sandbox.denied_write(exc)
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or budget.is_out_of_memory(_describe(exc))


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
                if gpu and _is_compile_failure(exc):
                    raise
                deferred[case.name] = _describe(exc)
    if _dynamo_frames() > compiled_frames:  # torch.compile: its real compile waits for real tensors
        deferred.update({c.name: "torch.compile compiles at the first call on the device" for c in cases
                         if c.name not in deferred})
    return deferred


def _dynamo_frames() -> int:
    """Frames torch.compile has compiled in this process (0 when it was never imported)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["frames"]["total"]) if dynamo is not None else 0


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
        result["window_check"] = f"unavailable: {_describe(exc)[:200]}"


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


def _arch(target: str) -> str:
    """'cuda:90' -> '9.0' (torch's TORCH_CUDA_ARCH_LIST form); '' for none."""
    digits = target.partition(":")[2]
    return f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 and digits.isdigit() else ""


def evaluate(job: Job, notify=lambda *msg: None, draw=None) -> dict:
    """Run the stages and return a flat result dict (status, error, per-case timings, seconds). ``draw(case, key)``:
    the seed of an input set, drawn when first used (the worker's, in a child; the operating system's here)."""
    cand = job.candidate
    op = get_operation(cand.op)
    gpu = job.mode == "gpu"
    device = "cuda" if gpu else "cpu"
    cases = op.cases if gpu else op.interpret_cases
    result = {"status": "ok", "error": "", "case_names": [c.name for c in cases], "compile_seconds": 0.0,
              "gpu_seconds": 0.0, "runtime_us_median": [], "runtime_us_iqr": [], "repetitions": [],
              "out_of_memory": False}
    t0 = time.perf_counter()

    def phase(name: str, detail=None) -> None:
        notify("phase", name, detail, time.monotonic())

    def fail(status: str, message: str) -> dict:
        result.update(status=status, error=message)
        return result

    refused = scan_source(cand, op)
    if refused:
        return fail("rejected", refused)
    op.configure_models(job.model_build, job.protocol)  # the reference's models and every loaded launch's alike
    global _TORCH_AT_START, _HARNESS_AT_START, _STATE_AT_START
    _TORCH_AT_START = torch_fingerprint()  # before any candidate code runs (see _anchored)
    _STATE_AT_START = state.snapshot()  # torch's process-wide switches, as the reference is timed under them
    _HARNESS_AT_START = verify.harness_fingerprint() if job.verify else {}
    # Outside the lock: CPU only.
    if gpu and "load_inline" in cand.source:  # CUDA extensions whose text says what they build: built now
        built = prebuild.build_ahead(cand.source, _arch(job.compile_target))
        result["prebuilt"] = built
        phase("prebuilt", {k: built[k] for k in ("built", "failed", "seconds")})
    try:
        deferred = compile_ahead(job, op, cases)
    except Rejected as exc:
        return fail("rejected", str(exc))
    except Exception as exc:  # a Triton compile failure
        return fail("compile_error", f"compiling ahead: {_describe(exc)}")
    load_under_lock = False
    try:
        with ahead.DeviceGuard("cuda") if gpu else nullcontext():
            launch = load_launch(cand.source, job.scratch_dir)
    except ahead.NeedsDevice:
        load_under_lock = True  # it makes CUDA tensors when imported
    except CandidateLoadError as exc:
        return fail("compile_error", str(exc))
    except Rejected as exc:  # a stream made at import time
        return fail("rejected", str(exc))
    if op.requires:  # a task whose code needs a newer GPU: refused before any device work where this one is older
        unmet = unmet_requirement(op.requires, torch.cuda.get_device_capability() if gpu else None)
        if unmet:
            return fail("rejected", unmet)
    total = _device_bytes(job)
    output_bytes: dict[str, int] = {}
    for case in cases:
        try:
            fp = budget.footprint(op, case)
        except Exception:  # noqa: BLE001 - inputs that meta tensors cannot describe: measured under the lock
            continue
        output_bytes[case.name] = fp.output_bytes
        too_big = budget.refusal(fp, total, "the device" if gpu or job.device_memory_bytes is not None
                                 else "the interpreter's address-space limit")
        if too_big:
            return fail("rejected", too_big)
    if gpu:
        _warm_context(libraries=job.warm_checks or any(word in cand.source for word in _CAPTURES))
        if job.warm_checks:
            t_warm = time.perf_counter()
            warmed = warm_comparisons(op, cases, "cuda")
            phase("warmed_checks", {"dtypes": warmed, "seconds": time.perf_counter() - t_warm})
        if job.verify:
            _warm_profiler(result)
    result["compile_seconds"] = time.perf_counter() - t0
    phase("ahead_done", {"deferred": sorted(deferred), "cpus": sorted(os.sched_getaffinity(0))})
    # What exists now (torch, Triton, the compiled kernels: some 180,000 objects) is never garbage that holds
    # device memory: frozen, no collection under the lock walks it (a full one took 0.1 s on an H200's host).
    gc.freeze()

    phase("waiting")
    with DeviceLock(job.lock_path, job.shared_checks, phase, job.timing_cpus, gpu) as lock:
        first_calls = cases if load_under_lock else [c for c in cases if c.name in deferred]
        phase("locked", {"first_calls_to_compile": len(first_calls), "cpus": lock.pin(),
                         "frozen_objects": gc.get_freeze_count(), "shared": lock.shared})
        _under_lock(job, op, cases, first_calls, device, None if load_under_lock else launch, result, phase,
                    output_bytes, lock, draw)
    phase("released")
    return result


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
                          sample=type(op).check is Operation.check)
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
                result["out_of_memory"] = _is_oom(exc)
                status = "compile_error" if _is_compile_failure(exc) else "runtime_error"
                return fail(status, f"case {case.name}: {_describe(exc)}")
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
        # Once more on fresh inputs and outputs, after all the calls above: a kernel that
        # computes only on its first calls, or replays a cached answer, fails here. Nothing is timed from here on:
        # a child whose checks shared the device shares it again (measured on an H200, 2026-11-29: the recheck was
        # 2-4% of the time KernelBench tasks' children held the device, about 6% on the template batch).
        lock.share_again()
        log.flush()
        for case in cases:
            phase("recheck", {"case": case.name})
            problem = checker.check(case, _RECHECK_SEED, role="recheck")
            if problem:
                return fail("incorrect", f"after {checker.calls} calls, on fresh inputs: {problem}")
    except Rejected as exc:
        return fail("rejected", str(exc))
    except CandidateLoadError as exc:
        return fail("compile_error", str(exc))
    except Exception as exc:
        result["out_of_memory"] = _is_oom(exc)
        return fail("runtime_error", _describe(exc))
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


def _time_cases(job: Job, op, cases, launch, checker: Checker, result: dict, phase,
                footprints: dict[str, int]) -> None:
    """Time every case, one case's inputs on the device at a time; then time the host-bound cases again.

    A case whose host side outlasts the flush's head start is timed by the host's speed, which
    a shared machine varies from one second to the next. Such cases get ``job.host_bound_windows``
    windows at most, in passes over the cases (so the windows of one case lie apart in time) while
    they disagree by more than 1%, and the fastest window counts: the call's cost on a host that was
    not slowed meanwhile."""
    flush = l2_flush_buffer()
    stream = torch.cuda.current_stream()
    head_start_us = flush_us(flush)

    reference = dict(zip((c.name for c in cases), job.reference_us))
    pacer = verify.Pacer(flush) if job.verify else None

    def time_case(case, max_seconds: float = job.max_seconds_per_case, anchor=None, check: bool = False):
        phase("case_inputs", case.name)  # the rotation sets are made from here until "timing"
        first = checker.inputs(case, _TIMING_SEED)
        first_outs = poisoned_outputs(op, case, "cuda")
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        # outputs the candidate returns (imported ops) are allocated by its calls: counted as the footprint's
        out_bytes = max(budget.tensor_bytes(first_outs), footprints.get(case.name, 0))
        # the anchor (the reference) writes outputs of its own: the sets are sized for both
        n_sets = budget.rotation_sets(free, budget.tensor_bytes(first), out_bytes * (2 if anchor else 1))
        if job.protocol in FORMAT_PROTOCOLS:
            n_sets = 1  # their harnesses call the model on the same inputs every time
        sets = [first] + [checker.inputs(case, _TIMING_SEED + k) for k in range(1, n_sets)]
        outs = [first_outs] + [poisoned_outputs(op, case, "cuda") for _ in range(1, n_sets)]
        params = job.candidate.params
        returned = [None] * len(sets)  # what the latest timed call on each set gave back: the judge checks it
        last = [0]  # the set of the latest timed call

        def call(i: int) -> None:
            k = i % len(sets)
            returned[k] = launch(*sets[k], *outs[k], **params)
            last[0] = k

        # The candidate's calls run under the switches it set; the reference's beside them under the harness's own.
        own = state.snapshot()
        changed = state.differing(_STATE_AT_START, own)
        l2 = state.reset_persisting_l2()
        if changed or l2:
            result["state"] = "; ".join(([f"set otherwise by the candidate, put back for the reference's calls: "
                                          f"{', '.join(changed)}"] if changed else []) + ([l2] if l2 else []))
        phase("timing", case.name)
        if anchor is not None:
            ref_launch, ref_params = anchor
            ref_outs = [poisoned_outputs(op, case, "cuda") for _ in range(n_sets)]
            to_harness, to_candidate = state.swap(_STATE_AT_START, own)

            def call_reference(i: int) -> None:
                k = i % len(sets)
                if to_harness is not None:
                    to_harness()
                ref_launch(*sets[k], *ref_outs[k], **ref_params)
                if to_candidate is not None:
                    to_candidate()

            if job.protocol in FORMAT_PROTOCOLS:  # their harnesses: the reference's trials, then the candidate's
                ref_timing = _FORMAT_TIMERS[job.protocol](call_reference, flush)
                timing = (_FORMAT_TIMERS[job.protocol](call, flush), ref_timing)
            else:
                timing = time_pair(call, call_reference, flush, max_seconds=max_seconds)
            del ref_outs
        elif job.protocol in FORMAT_PROTOCOLS:
            timing = _FORMAT_TIMERS[job.protocol](call, flush)
        else:
            timing = time_call(call, flush, max_seconds=max_seconds)
        phase("timed", {"case": case.name, "us": (timing[0] if anchor else timing).runtime_us_median,
                        "reps": (timing[0] if anchor else timing).repetitions,
                        "host_us": (timing[0] if anchor else timing).host_us_median, "flush_us": head_start_us,
                        **({"reference_us": timing[1].runtime_us_median, "reference_reps": timing[1].repetitions,
                            "reference_host_us": timing[1].host_us_median} if anchor else {})})
        if torch.cuda.current_stream() != stream:
            raise Rejected(f"case {case.name}: left another CUDA stream current; kernels must run on the "
                           f"harness's stream, where they are timed")
        for k in range(n_sets):
            checker.note(case, _TIMING_SEED + k)
        _record_timed(checker, case, outs, returned, last[0], result)
        returned[:] = [None] * len(returned)  # kept for the verification's calls, which ``call`` still makes
        if check:  # the first set stays for the calls beside the fresh ones: it has been seen many times
            del sets[1:], outs[1:]
            torch.cuda.empty_cache()
            problem = _verify_case(job, case, checker, call, pacer, result, phase,
                                   (timing[0] if anchor else timing).runtime_us_median,
                                   control=lambda unseen, slow: reference_control(case, sets[0], unseen, slow))
            if problem:
                raise _Incorrect(problem)
        del sets, outs, first, first_outs
        torch.cuda.empty_cache()  # the next case starts from a clean pool
        return timing, n_sets

    def reference_control(case, seen_inputs, unseen, slow: bool):
        """The reference's first and repeated call on ``unseen``, made as the candidate's were (after an untimed
        call on inputs it has seen); None where the reference cannot run in this process."""
        loaded = _control_launch(job, op, phase, control_cache)
        if loaded is None:
            return None
        ref_launch, ref_params = loaded
        if not slow:
            outs = poisoned_outputs(op, case, "cuda")
            verify.synced_call(lambda: ref_launch(*seen_inputs, *outs, **ref_params), flush)
        outs = poisoned_outputs(op, case, "cuda")
        touch = (*unseen.inputs, *outs)
        return tuple(verify.synced_call(lambda: ref_launch(*unseen.inputs, *outs, **ref_params), flush, touch)[0]
                     for _ in range(2))

    control_cache: dict[str, object] = {}  # the reference loaded once for every case's control

    def time_pair_case(case, anchor):
        return time_case(case, max_seconds=job.max_seconds_per_case, anchor=anchor)[0]

    # Cases paired whatever the candidate's own windows say (the reference's host-bound ones; every case under a
    # format's protocol) are timed beside the reference from the start, and verified there: a window of their own
    # first would be timed and then not used. (Measured on an H100: linalg/eigh's null spent 638 s on such windows
    # of its 13 cases before the 520 s of their pairs, and ran out of its call's time.)
    ahead = {c.name for c in cases_to_pair(job, cases, ())} & set(reference)
    anchor = _anchor_launch(job, op, phase) if ahead else None
    keep = lambda timing: keeps_anchor(job, timing, head_start_us)  # noqa: E731 - one rule for both pairings
    slowed: dict[str, tuple[float, float]] = {}  # pairs whose reference ran well past its stored runtime
    windows, rotation, anchored = _first_windows(cases, ahead, anchor, lambda case, anchor=None: time_case(
        case, anchor=anchor, check=job.verify), reference, phase, keep, slowed)
    host_bound = [c for c in cases if windows[c.name][0].host_bound(head_start_us)]
    sensitive = [c for c in cases if windows[c.name][0].host_sensitive(head_start_us)]  # host_bound among them
    result["host_sensitive_cases"] = [c.name for c in sensitive]  # a reference's: its candidates pair them too
    paired = cases_to_pair(job, cases, sensitive)  # those paired ahead were paired once: their figure stands
    anchored.update(_anchored(job, op, [c for c in paired if c.name in reference and c.name not in ahead],
                              time_pair_case, result, phase, anchor, keep, windows, slowed))
    result["anchored_cases"] = sorted(anchored)  # those of the first windows and those paired after them
    result["anchored_slowed"] = {case: slowed[case] for case in sorted(anchored) if case in slowed}
    # Other host-bound cases, and short GPU-bound ones, again in passes over the cases until their two fastest
    # windows agree (kernelcast's protocol only: KernelBench's takes one window as it comes).
    bound = {c.name for c in host_bound}
    for _ in range(job.host_bound_windows - 1 if job.protocol == "kernelcast" else 0):
        again = [c for c in cases if c.name not in anchored
                 and time_again(windows[c.name], c.name in bound, job.host_bound_windows,
                                result.get("fastest_call_us", {}).get(c.name))]
        for case in again:
            windows[case.name].append(time_case(case, max_seconds=job.max_seconds_per_case / 4)[0])
    timings = {name: anchored.get(name) or fastest(w) for name, w in windows.items()}
    for case in cases:
        timing = timings[case.name]
        if job.verify:
            _check_timed(case.name, timing, fastest(windows[case.name]),
                         result.get("traced_busy_us", {}).get(case.name),
                         verify.floor_us(op, case, job.peak_bandwidth_gbps, job.peak_tflops, job.l2_bytes))
        result["runtime_us_median"].append(timing.runtime_us_median)
        result["runtime_us_iqr"].append(timing.runtime_us_iqr)
        result["repetitions"].append(timing.repetitions)
        result.setdefault("host_us", []).append(timing.host_us_median)  # how long the host took to issue a call
        result.setdefault("rotation_sets", []).append(rotation[case.name])
    del flush
    torch.cuda.empty_cache()


def _record_timed(checker: Checker, case, outs, returned, last: int, result: dict) -> None:
    """The timed calls' outputs for the judge: the latest call's, and those of up to ``TIMED_RECORDS - 1`` other input
    sets chosen now that the calls are made. An output the latest call overwrote (one buffer returned for every call,
    as a CUDA graph's static outputs are) cannot show an earlier call's work: its set is left out, and the row says
    so; so is one whose earlier outputs can no longer be read (torch.compile's CUDA-graph trees refuse it)."""
    def got_of(k):
        r = returned[k]
        return outs[k] if r is None else (r,) if isinstance(r, torch.Tensor) else tuple(r)

    latest = got_of(last)
    checker.record(case, _TIMING_SEED + last, "timed", latest)
    others = [k for k in range(len(outs)) if k != last]
    mine = {t.untyped_storage().data_ptr() for t in latest if isinstance(t, torch.Tensor) and t.numel()}
    for k in sorted(random.SystemRandom().sample(others, min(len(others), TIMED_RECORDS - 1))):
        try:
            got = got_of(k)
            if any(isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() in mine for t in got):
                result.setdefault("timed_outputs", []).append(f"{case.name}: one buffer returned for every call; its "
                                                              f"latest call's outputs judged")
                break
            checker.record(case, _TIMING_SEED + k, "timed", got)
        except RuntimeError as exc:  # an output a later call overwrote and torch now refuses to read
            result.setdefault("timed_outputs", []).append(f"{case.name}: earlier calls' outputs unreadable "
                                                          f"({_describe(exc)[:120]}); its latest call's judged")
            break


def _check_timed(case_name: str, timing: Timing, here: Timing, traced_us: float | None, floor_us: float) -> None:
    """A case's figure against what the device did: the trace's busy time against the candidate's runtime in this
    process (``here``, its fastest own window), as the trace was taken here; the case's floor against the figure it
    reports (``timing``, anchored to the reference's stored runtime where it was paired). Set against an anchored
    figure, the trace would judge the host's drift: on an H100, one case's reference took 45.8 us in its own process
    and 223 us beside a candidate, and the candidate's 52.5 us there became 12.2 us anchored."""
    verify.check_traced_work(case_name, here.runtime_us_median, traced_us)
    verify.check_physics(case_name, timing.runtime_us_median, floor_us)


class _Incorrect(Exception):
    """A verification call's outputs were wrong: the verdict is ``incorrect``, with this text."""


def _verify_case(job: Job, case, checker: Checker, call, pacer: verify.Pacer, result: dict, phase,
                 runtime_us: float = 0.0, control=None) -> str | None:
    """The checks of kernelcast.kernels.harness.verify on one timed case; a cheat raises ``Rejected``, a wrong output
    on unseen inputs comes back as the problem.

    ``control(unseen, slow)``: the reference's (first, again) windows on ``unseen`` inputs, or None where the
    reference cannot be run here. Where both rounds say the candidate reuses work, a third round decides: each
    of its candidate's calls on unseen inputs is followed by the reference's on the same inputs, which tell how
    much slower this host made first calls at that moment (``verify.reuses_work``)."""
    where = f"case {case.name}"
    verify.check_integrity(_HARNESS_AT_START, where)
    if result.get("window_check", "profiled") == "profiled":
        try:
            activities = verify.profile_window(lambda: call(0), pacer)
        except Rejected:
            raise
        except Exception as exc:  # noqa: BLE001 - tracing failed here: the synced check below still runs
            result["window_check"] = f"unavailable: {_describe(exc)[:200]}"
        else:
            outside = verify.outside_window(activities)
            result["window_check"] = "profiled" if verify.has_marks(activities) else "unavailable: no markers traced"
            if outside:
                raise Rejected(f"{where}: {outside}")
            try:
                busy = verify.traced_work_settled(runtime_us, verify.traced_busy_us(activities),
                                                  lambda: verify.profile_window(lambda: call(0), pacer))
            except Rejected as exc:
                raise Rejected(f"{where}: {exc}") from None
            result.setdefault("traced_busy_us", {})[case.name] = busy
        phase("traced", {"case": case.name})
    found, hidden, seen = None, None, {}
    traced = result.get("window_check") == "profiled"
    fresh_calls = verify.fresh_calls_for(runtime_us, job.fresh_calls)
    slow = verify.slow_call(runtime_us)

    def unseen_calls(seed: int, first: list, again: list, after=None) -> str | None:
        """The candidate's first and repeated call on the unseen inputs of ``seed`` (into ``first``, ``again``),
        after an untimed call on inputs it has seen; ``after(unseen)`` runs next, on the same inputs. A wrong
        output comes back as the problem."""
        unseen = checker.prepare(case, seed)
        # an untimed call first: making the inputs took the allocator's cached blocks that the call's own
        # temporaries would have reused, and the fresh call would pay for new ones where the second did not
        if not slow:
            verify.synced_call(lambda: call(0), pacer.flush)
        for timed in (first, again):
            def run(fn, timed=timed, touch=(*unseen.inputs, *unseen.outputs)):
                window, got = verify.synced_call(fn, pacer.flush, touch)
                timed.append(window)
                return got

            problem = checker.fresh(unseen, run)
            if problem:
                return f"after timing, on inputs it had not seen: {problem}"
        if after is not None:
            after(unseen)
        return None

    for attempt in range(2):  # a round that finds something runs again on other inputs: a verdict needs both
        first, again, paced, idle = [], [], [], []
        for j in range(fresh_calls):
            problem = unseen_calls(verify.FRESH_SEED + attempt * job.fresh_calls + j, first, again)
            if problem:
                return problem
            if not slow:
                paced += [pacer.window(first[-1].timed_us), pacer.window(again[-1].timed_us)]
                idle.append(pacer.idle_window(first[-1].timed_us))
        seen = {"first_us": [w.timed_us for w in first], "again_us": [w.timed_us for w in again],
                "synced_gap_us": [w.synced_us - w.timed_us for w in first + again],
                "host_waited_us": [w.waited_us for w in first + again],  # taken off the gaps (verify.gap_us)
                "paced_gap_us": [w.synced_us - w.timed_us for w in paced],  # none for a call of seconds
                "idle_gap_us": [w.synced_us - w.timed_us for w in idle]}
        share = verify.TRACED_SHARE if traced else 0.1
        floor = verify.TRACED_FLOOR_US if traced else 5.0
        hidden = verify.hidden_work(first + again, paced, share, idle, floor)
        found = hidden or verify.reuses_work(first, again)
        if found is None:
            break
    if found and not hidden and control is not None:
        # The deciding round: the candidate's calls and the reference's on the same unseen inputs, one after
        # the other, so that a host slower for a while slows both. (Measured on an H200 with a pool's children
        # compiling beside it: a host-bound reference found itself 1.35-1.5x slower on unseen inputs in both
        # rounds, and 1.00-1.04x in a control round made after them.)
        first, again, controls = [], [], ([], [])

        def reference_calls(unseen) -> None:
            got = control(unseen, slow)
            if got is None:
                raise _NoControl
            controls[0].append(got[0])
            controls[1].append(got[1])

        try:
            for j in range(fresh_calls):
                problem = unseen_calls(verify.FRESH_SEED + 2 * job.fresh_calls + j, first, again, reference_calls)
                if problem:
                    return problem
        except _NoControl:
            pass
        else:
            found = verify.reuses_work(first, again, controls)
            seen |= {"decided_first_us": [w.timed_us for w in first],
                     "decided_again_us": [w.timed_us for w in again],
                     "control_first_us": [w.timed_us for w in controls[0]],
                     "control_again_us": [w.timed_us for w in controls[1]]}
            if found is None:  # said in the verdict's checks: the reference's own first calls excused this case's
                result.setdefault("unseen_control", []).append(
                    f"{case.name} ({verify.control_note(first, again, controls)})")
    if found:
        raise Rejected(f"{where}: {found}")
    verify.check_integrity(_HARNESS_AT_START, where)
    if first:  # what the case's own window is held against (``timing.disturbed``)
        result.setdefault("fastest_call_us", {})[case.name] = min(w.timed_us for w in first + again)
    phase("verified", {"case": case.name, **seen})
    return None


class _NoControl(Exception):
    """The reference cannot run in this child as the unseen-input check's control."""


_HARNESS_AT_START: dict[str, tuple[int, int]] = {}
_TORCH_AT_START: dict[str, int] = {}
_STATE_AT_START: dict[str, object] = {}
_REWRAPPED = {"torch.manual_seed"}  # torch._dynamo wraps it when first imported (torch.compile)


def torch_fingerprint() -> dict[str, int]:
    """The identity of every public function of torch, torch.nn.functional and torch.Tensor.

    Taken before a candidate's code runs and compared before the reference is timed in the
    same process: a candidate that replaced one of them could slow the reference it is
    measured against."""
    import torch.nn.functional as F

    found = {}
    for prefix, holder in (("torch.", torch), ("F.", F), ("Tensor.", torch.Tensor)):
        for name in dir(holder):
            if not name.startswith("_") and prefix + name not in _REWRAPPED:
                value = getattr(holder, name, None)
                if callable(value):
                    found[prefix + name] = id(value)
    return found


def cases_to_pair(job: Job, cases, sensitive) -> list:
    """The cases timed again beside the reference (where the candidate has one to meet).

    kernelcast's protocol pairs the ``sensitive`` cases (``Timing.host_sensitive``) and those where the reference's
    own timing was (``job.reference_host_bound``: its stored runtime moves with the host, and so would a GPU-bound
    candidate's speedup over it; measured on an H100, KernelBench level2/98's reference at 50, 76 and 189 us in
    three runs gave one CUDA-L1 kernel 1.13x, 1.62x and 6.72x), or every case with ``job.anchor_all``. A format's
    protocol pairs every case: its harness times the reference and the candidate one after the other in
    one process, while the reference's runtime stored by the worker was taken at another moment. Which figure a
    pair reports is ``keeps_anchor``'s: a GPU-bound candidate keeps its own series there, so its speedup stands on
    the reference's stored runtime, which one data root keeps for all its workers (``MeasureWorker.adopt_reference``)."""
    if job.protocol in FORMAT_PROTOCOLS or job.anchor_all:
        return list(cases)
    mine = {c.name for c in sensitive}
    return [c for c in cases if c.name in mine or c.name in job.reference_host_bound]


def _torch_replaced(phase) -> bool:
    """Whether a public function of torch was replaced since the child started (timeline mark ``not_anchored``):
    the reference timed beside the candidate would run the candidate's replacement, slowed as it likes."""
    now = torch_fingerprint()
    changed = sorted(k for k, v in _TORCH_AT_START.items() if now.get(k) != v)
    if changed:
        phase("not_anchored", {"replaced": changed[:8]})
    return bool(changed)


def _anchor_launch(job: Job, op, phase):
    """(launch, params) of the op's reference, loaded in this child to be timed beside the candidate; None where
    nothing is anchored: for the reference itself (no ``job.reference_us``), where torch's functions were
    replaced (``_torch_replaced``), or where the reference cannot be loaded here (said in the timeline)."""
    if not job.reference_us or not _TORCH_AT_START or _torch_replaced(phase):
        return None
    seed = op.seed_candidates()[0]
    try:
        launch = load_launch(seed.source, job.scratch_dir, module_name="anchor_reference")
        op.prepare(launch, seed.source, "cuda" if job.mode == "gpu" else "cpu")
        return launch, seed.params
    except Exception as exc:  # noqa: BLE001 - the reference cannot be loaded here: windows as before
        phase("not_anchored", {"error": _describe(exc)})
        return None


def _control_launch(job: Job, op, phase, loaded: dict):
    """(launch, params) of the op's reference loaded in this child as the unseen-input check's control, once
    (``loaded`` keeps it); None where torch's functions were replaced (the candidate's replacement would run in the
    reference too) or the reference cannot be loaded here. Loaded for the reference's own measurement as well: it
    is the control of any code, its own included."""
    if "launch" not in loaded:
        loaded["launch"] = None
        if _TORCH_AT_START and not _torch_replaced(phase):
            seed = op.seed_candidates()[0]
            try:
                launch = load_launch(seed.source, job.scratch_dir, module_name="control_reference")
                op.prepare(launch, seed.source, "cuda" if job.mode == "gpu" else "cpu")
                loaded["launch"] = (launch, seed.params)
            except Exception as exc:  # noqa: BLE001 - no control: the verdict stands as the two rounds gave it
                phase("no_control", {"error": _describe(exc)})
    return loaded["launch"]


def keeps_anchor(job: Job, timing: Timing, head_start_us: float) -> bool:
    """Whether a case timed beside the reference reports the anchored figure (the reference's runtime times their
    ratio) rather than its own series in the pair: under a format's protocol and with ``job.anchor_all``, always;
    under kernelcast's, where the candidate's own host time there came near the flush (``Timing.host_sensitive``).

    A GPU-bound candidate's own time does not follow the host, so anchored to a host-bound reference it would take
    that reference's drift. Measured on an H200 (2026-11-29, template pools, the reference kept from run to run):
    its 18 paired case series varied by a median CV of 5.9% against 0.19% for the 30 timed in their own windows;
    and the suite's pending_copy, whose work is device work, was reported at 0.77 of its true runtime. The reference's
    twin, the same code, has the reference's host time and stays anchored."""
    return job.protocol in FORMAT_PROTOCOLS or job.anchor_all or timing.host_sensitive(head_start_us)


# A pair whose reference ran this much slower than its stored runtime met a slower host than the stored figure did, and
# its ratio carries to that figure only where both calls follow the host alike. Measured on H200s (2026-11-30, fresh
# CUDA-L1 problems, docs/harness.md): l2-076's kernel, device-paced at 28 us, came out at 0.76-0.84x of a reference
# stored at 21-22 us when timed alone, and at 1.77-2.44x in pairs where the reference ran at 1.25-5.8x its stored
# figure. The row says so (``anchored_slowed``) rather than hiding it: the ratio stands in the figure.
ANCHOR_SLOWED = 1.25


def _anchored_timing(case_name: str, timing: Timing, ref: Timing, reference_us: float, phase,
                     slowed: dict | None = None) -> Timing:
    """The candidate's timing from a pair with the reference: its cost relative to the reference's there (the
    median of per-round ratios, ``timing.paired_ratio``; the ratio of medians where a format's timer gave none)
    times the reference's runtime as the worker measured it (identical code gets the reference's runtime).
    ``slowed`` gets {case: (the reference's runtime in the pair, its stored runtime)} where the first passed
    ``ANCHOR_SLOWED`` times the second."""
    medians = timing.runtime_us_median / ref.runtime_us_median
    ratio = timing.paired_ratio or medians
    if slowed is not None and reference_us > 0 and ref.runtime_us_median > ANCHOR_SLOWED * reference_us:
        slowed[case_name] = (ref.runtime_us_median, reference_us)
    phase("anchored", {"case": case_name, "ratio": ratio, "ratio_of_medians": medians,
                       "round_ratios": [round(r, 5) for r in timing.round_ratios],
                       "round_reference_us": [round(u, 2) for u in timing.round_anchor_us],
                       "us": timing.runtime_us_median,
                       "reference_us_here": ref.runtime_us_median, "reference_us": reference_us})
    return Timing(reference_us * ratio, timing.runtime_us_iqr * reference_us / ref.runtime_us_median,
                  timing.repetitions, timing.host_us_median, 1)


def _first_windows(cases, ahead: set[str], anchor, time_case, reference: dict[str, float], phase,
                   keep=lambda timing: True, slowed: dict | None = None):
    """Each case's first window, {case: [Timing]}, its rotation sets, and the cases anchored in it.

    ``time_case(case, anchor=None)`` times (and verifies) one case: alone, or beside the reference where ``anchor``
    is given, then giving (candidate's, reference's) timings. The ``ahead`` cases are timed beside it from the start
    while there is an ``anchor``; one that fails there (the reference beside this candidate, say) is timed alone, and
    once torch's functions are found replaced (``_torch_replaced``) no later case is paired. A pair whose candidate
    side ``keep`` refuses (``keeps_anchor``) leaves the candidate's own series in it as the case's window; ``slowed``
    as ``_anchored_timing`` fills it."""
    windows, rotation, anchored = {}, {}, {}
    for case in cases:
        timing = None
        if anchor is not None and case.name in ahead:
            try:
                (timing, ref), rotation[case.name] = time_case(case, anchor=anchor)
            except (Rejected, _Incorrect):  # the candidate's own verdict: it stands
                raise
            except Exception as exc:  # noqa: BLE001 - the pair failed: alone, where the candidate's errors are its own
                phase("not_anchored", {"case": case.name, "error": _describe(exc)})
            else:
                if _torch_replaced(phase):  # replaced while timed beside the reference: the pair is only a window
                    anchor = None
                elif keep(timing):
                    anchored[case.name] = _anchored_timing(case.name, timing, ref, reference[case.name], phase,
                                                           slowed)
                else:
                    _own_figure(case.name, timing, ref, phase)
        if timing is None:
            timing, rotation[case.name] = time_case(case)
        windows[case.name] = [timing]
    return windows, rotation, anchored


def _own_figure(case_name: str, timing: Timing, ref: Timing, phase) -> None:
    """Timeline mark of a pair whose candidate keeps its own series (``keeps_anchor``): what it was, for the record."""
    phase("own_figure", {"case": case_name, "us": timing.runtime_us_median, "host_us": timing.host_us_median,
                         "ratio": timing.paired_ratio, "reference_us_here": ref.runtime_us_median})


def _anchored(job: Job, op, cases, time_pair_case, result: dict, phase, anchor=None, keep=lambda timing: True,
              windows: dict | None = None, slowed: dict | None = None) -> dict[str, Timing]:
    """Host-bound cases timed beside the op's reference in one window, as the reference's runtime times their ratio.

    A host-bound call's time follows the host's speed, which moves between the reference's
    measurement and the candidate's. Timed in alternating rounds of one window with the
    reference (loaded here from the op's own source), both meet the same host, and the
    candidate's cost relative to the reference's there (the median of per-round ratios)
    carries over to the reference's runtime as the worker measured it (``_anchored_timing``).
    Nothing is anchored where ``_anchor_launch`` finds nothing to anchor to: those cases keep
    their fastest window. ``anchor``: the reference already loaded for the first windows (one
    model of it in this child, not two), still refused once torch's functions are replaced. A pair whose
    candidate side ``keep`` refuses adds its own series to ``windows`` instead; ``slowed`` as ``_anchored_timing``
    fills it."""
    if not cases:
        return {}
    if anchor is None:
        anchor = _anchor_launch(job, op, phase)
    elif _torch_replaced(phase):
        anchor = None
    if anchor is None:
        return {}
    reference = dict(zip((c.name for c in op.cases), job.reference_us))
    anchored = {}
    for case in cases:
        try:
            timing, ref = time_pair_case(case, anchor)
        except Exception as exc:  # noqa: BLE001 - the reference failed beside the candidate: its fastest window
            phase("not_anchored", {"case": case.name, "error": _describe(exc)})
            continue
        if keep(timing):
            anchored[case.name] = _anchored_timing(case.name, timing, ref, reference[case.name], phase, slowed)
        else:
            _own_figure(case.name, timing, ref, phase)
            if windows is not None:
                windows.setdefault(case.name, []).append(timing)
    result["anchored_cases"] = sorted(anchored)
    return anchored


def child_main(job: Job, conn) -> None:
    """Entry point of the isolated child process."""
    try:
        if job.compile_cpus:  # before any thread starts: the threads started later run there too
            cores.pin(job.compile_cpus)
        report = enter_sandbox(job)
        channel.send(conn, "sandbox", report.summary())
        # Verified on a GPU, a candidate's own streams are allowed: the trace shows what escapes the timer. Without
        # the verification, or in the interpreter (no device, no trace), another stream is refused as it is made.
        if not job.verify or job.mode != "gpu":
            install_stream_guard()
        result = evaluate(job, notify=lambda *msg: channel.send(conn, *msg),
                          draw=lambda case, key: channel.request_seed(conn, case, key))
    except BaseException as exc:  # a harness bug must still come back as a classified result
        result = {"status": "runtime_error", "error": _describe(exc)}
    channel.send(conn, "result", result)
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
        channel.send(conn, "probe", {"ok": ok, "sandbox": report.summary(), "error": "" if ok else "wrong result"})
    except BaseException as exc:
        channel.send(conn, "probe", {"ok": False, "sandbox": "", "error": _describe(exc)})
    conn.close()
    os._exit(0)
