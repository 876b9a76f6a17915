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

The child's life, a module a part (kernelcast.kernels.harness.*):
  job            what the worker tells the child (``Job``)
  at_start       what it notes before candidate code runs, to hold its process against later
  before_lock    on the CPU, before the lock: compiling ahead, the device's size, the CUDA context
  under_lock     the GPU lock (``DeviceLock``) and the device phases under it: first calls, checks, recheck
  case_timing    timing of the cases, the timed calls' outputs recorded for the judge
  window_checks  verification of each timed window
  anchoring      cases timed beside the operation's reference

The child enters its sandbox (kernelcast.kernels.harness.sandbox) before loading any candidate code,
and reports to its parent over a pipe: ("sandbox", summary) once confined, ("phase", name,
detail, t) as it moves between phases (waiting for the lock, holding it, first calls done,
timing, released), then ("result", dict). If it crashes or hangs, the parent classifies
it from outside.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import nullcontext

import torch
import triton  # imported here so the fork server preloads it
import triton.language as tl

from kernelcast.kernels.formats.common import unmet_requirement
from kernelcast.kernels.harness import ahead, at_start, budget, channel, cores, prebuild, sandbox
from kernelcast.kernels.harness.anticheat import Rejected, install_stream_guard, scan_source, warm_comparisons
from kernelcast.kernels.harness.before_lock import (_CAPTURES, _arch, _device_bytes, _warm_context, _warm_profiler,
                                                    compile_ahead, warm_triton_utils)
from kernelcast.kernels.harness.correctness import CandidateLoadError, describe, load_launch
from kernelcast.kernels.harness.job import Job
from kernelcast.kernels.harness.under_lock import DeviceLock, _under_lock
from kernelcast.kernels.ops import get_operation

# Read from here by others: the worker (JUDGED: its children's folders of judged outputs) and
# benchmarks/anchored_pairs.py (ANCHOR_SLOWED).
from kernelcast.kernels.harness.anchoring import ANCHOR_SLOWED  # noqa: F401
from kernelcast.kernels.harness.under_lock import JUDGED  # noqa: F401


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


def evaluate(job: Job, notify=lambda *msg: None, draw=None) -> dict:
    """Run the stages and return a flat result dict (status, error, per-case timings, seconds). ``draw(case, keys)``:
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
    at_start.take(job.verify)  # before any candidate code runs
    # Outside the lock: CPU only.
    if gpu and "load_inline" in cand.source:  # CUDA extensions whose text says what they build: built now
        built = prebuild.build_ahead(cand.source, _arch(job.compile_target))
        result["prebuilt"] = built
        phase("prebuilt", {k: built[k] for k in ("built", "failed", "seconds")})
    unbuilt = warm_triton_utils() if gpu else ""  # else built at the first launch, under the lock
    try:
        deferred = compile_ahead(job, op, cases)
    except Rejected as exc:
        return fail("rejected", str(exc))
    except Exception as exc:  # a Triton compile failure
        return fail("compile_error", f"compiling ahead: {describe(exc)}")
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
    phase("ahead_done", {"deferred": sorted(deferred), "cpus": sorted(os.sched_getaffinity(0)),
                         **({"triton_utils_unbuilt": unbuilt} if unbuilt else {})})
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


def child_main(job: Job, conn, seeds=None) -> None:
    """Entry point of the isolated child process: phases and the result go on ``conn``; the seeds of its inputs are
    asked for on ``seeds`` (the worker's SeedServer; ``conn`` where none is given)."""
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
                          draw=lambda case, keys: channel.request_seeds(seeds or conn, case, keys))
    except BaseException as exc:  # a harness bug must still come back as a classified result
        result = {"status": "runtime_error", "error": describe(exc)}
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
        channel.send(conn, "probe", {"ok": False, "sandbox": "", "error": describe(exc)})
    conn.close()
    os._exit(0)
