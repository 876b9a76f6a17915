"""The measurement worker for one GPU: runs each candidate in its own child process.

Children come from a fork server that has already imported torch and Triton, so a
child starts in milliseconds and with no CUDA state. Up to ``concurrency`` children
load and compile ahead at once on the CPU cores (no device memory, no kernels: see
kernelcast.kernels.harness.runner) while one of them holds the GPU lock, from its first device
allocation to the end of its timing. Each op's reference is measured first (all ops'
references at once), so every candidate's limits can follow from the reference's
runtime; a reference whose figure its host sets is measured in further processes and
its fastest kept (``WorkerConfig.reference_processes``). The worker watches every
child from outside: a crash (segfault, illegal address that kills the process)
becomes ``crashed``, a child past its time limit is
killed and becomes ``timeout``. Limits come per phase from kernelcast.kernels.harness.budget
(compiling outside the lock; holding it), scale with the op's case sizes and the
reference's runtime, and are the same for every candidate of one op; time spent
waiting for the lock counts against none. A candidate that runs out of device memory
is measured once more, alone, before its verdict.
A child whose resident memory passes ``host_memory_gib`` is killed too (the GPU-mode
guard against host OOM, where no address-space limit can be set), as is whatever it
forked (its process group). Either way only that candidate is lost; the worker goes on
with the next.

Every child enters the sandbox (kernelcast.kernels.harness.sandbox) and reports which protections
took effect; in GPU mode the worker first probes, once, which protections leave CUDA
and Triton working and uses the strongest such set.

Beside it: kernelcast.kernels.harness.children (its side of the child processes),
kernelcast.kernels.harness.judges (the judge processes it asks) and kernelcast.kernels.harness.rows
(a child's result as its row, and what a row's checks say read back).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from typing import Iterable, Iterator

from kernelcast.kernels.harness import ahead, budget, channel, cores, memcheck, precision, verify
from kernelcast.kernels.harness.children import (SeedServer, _context, _doing, _kill_group, _log_tail, _observe_window,
                                                 _rss_bytes, _Running, _signal_name, attempt_of, figure_problem,
                                                 observe_anchored, window_text, WINDOW_LOOK_S)
from kernelcast.kernels.harness.before_lock import build_triton_utils, seed_triton_cache
from kernelcast.kernels.harness.judges import Judges
from kernelcast.kernels.harness.rows import (combine_reference_takes, geometric_mean, host_paced, host_sensitive_in,
                                             row_fields)
from kernelcast.kernels.harness.runner import JUDGED, Job, child_main, probe_main
from kernelcast.kernels.harness.sweep_report import held_seconds
from kernelcast.kernels.harness.timing import ANCHORS, PROTOCOLS
from kernelcast.kernels.formats import tasks_dir
from kernelcast.kernels.formats.common import is_imported_name
from kernelcast.kernels.hardware import INTERPRETER, peak_tflops
from kernelcast.kernels.null import NULL_MARK
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.ops.base import MODEL_BUILDS
from kernelcast.kernels.records import Candidate, HardwareSpec, Measurement

# Read from here by others: flows/report.py and benchmarks/pool_runs_compare.py.
from kernelcast.kernels.harness.rows import anchored_slowed_in, reference_process_figures  # noqa: F401


GPU_LOCK_ENV = "KERNELCAST_GPU_LOCK"


@dataclass(frozen=True)
class WorkerConfig:
    mode: str = "gpu"  # "gpu" or "interpreter"
    concurrency: int = 4  # children loading/compiling at once
    judges: int = 2  # judge processes deciding children's verdicts at once
    timeout_s: float = 300.0  # loading and compiling ahead, outside the lock (waiting for it not counted)
    gpu_timeout_s: float = 60.0  # holding the GPU lock, for the smallest case; grows with case size and runtime
    seeds: int = 3  # seeded correctness inputs per case
    # the recheck round where nothing is verified (the interpreter, verify off): off only where a verdict says no
    # more than whether the outputs are right (kernelcast.kernels.probe: an interpreted call of a BLOCK-32 kernel
    # on a million elements takes 19 s)
    recheck: bool = True
    max_seconds_per_case: float = 1.0  # timing budget per case
    network: str = "namespace"  # strongest network protection to try: namespace, seccomp, off
    filesystem: str = "landlock"  # landlock or off
    address_space_gib: float | None = 8.0  # RLIMIT_AS, interpreter mode only (CUDA reserves huge ranges)
    host_memory_gib: float = 32.0  # resident memory past which the worker kills a child
    file_size_mib: int = 512  # largest file a child may write
    # CPU seconds a child may use; the wall-clock limits normally fire first, this catches the rest.
    cpu_seconds: int | None = None  # None: twice the sum of the op's limits
    device_memory_gib: float | None = None  # the device memory cases must fit in; None: the device's own
    # A core (with its hyperthreads) kept for the child holding the lock, the others for compiling
    # (kernelcast.kernels.harness.cores); None: in GPU mode, where host time is timed, and not in interpreter mode.
    reserve_timing_core: bool | None = None
    # The cores this worker's children may use (None: all this process may, or in GPU mode, where the process sees
    # one of the machine's several GPUs, that GPU's share: kernelcast.kernels.harness.cores.this_gpus_share): one share per GPU
    # where several workers measure on one machine (kernelcast.kernels.harness.cores.share).
    cpus: tuple[int, ...] | None = None
    host_bound_windows: int = 5  # timing windows at most for a case whose host side outlasts the L2 flush
    # After each case is timed: its call profiled, calls on unseen inputs beside timed ones, the timer checked
    # unpatched, the runtime checked against the case's floor (kernelcast.kernels.harness.verify).
    verify: bool = True
    fresh_calls: int = 3
    # Every correct result's error against a float64 reference is recorded; "strict" fails a result of a
    # lower precision class than the reference's (kernelcast.kernels.harness.precision), "tolerance" only flags it.
    precision: str = "tolerance"
    # One call on the smallest case under compute-sanitizer's memcheck once the checks pass: "auto" for
    # imported tasks' candidates (they allocate their own outputs), "all", or "off" (kernelcast.kernels.harness.memcheck).
    memcheck: str = "auto"
    # How cases are timed: kernelcast's own (rotated inputs, repetitions until the median is pinned down,
    # host-bound cases anchored to the reference) or "kernelbench" (its harness's: same inputs, 100 trials,
    # the mean), to compare with figures published under it (kernelcast.kernels.harness.timing).
    protocol: str = "kernelcast"
    # Where an imported task's models are built (kernelcast.kernels.ops.base.MODEL_BUILDS): "auto" as its format decides
    # (KernelBench: on the CPU and then moved, as its own eval does, but for a huge model under kernelcast's
    # protocol), "host" or "device" everywhere.
    model_build: str = "auto"
    memcheck_timeout_s: float = 180.0
    # A first call per case of a kernel that autotunes on the device (torch.compile's max-autotune modes:
    # budget.autotunes) may take this long, its real cost rather than a hang.
    autotune_call_s: float = 900.0
    # Which of a candidate's cases are timed again in one window beside its op's reference, and reported as
    # the reference's runtime times their ratio (anchoring._anchored): "host-bound" (whose host
    # side nears the flush: timing.Timing.host_sensitive), "all" (every case: drift of the clocks and the host
    # between the reference's measurement and the candidate's cancels, for about twice the timing), or "off"
    # (the fastest window).
    anchor: str = "host-bound"
    # A lock file shared with the machine's other GPU users (an inference engine started with the same
    # --gpu-lock): children take it for their GPU work as they take the worker's own, so nothing else runs
    # on the GPU while a kernel is timed. None: the worker's private lock. Default: $KERNELCAST_GPU_LOCK.
    gpu_lock: str | None = field(default_factory=lambda: os.environ.get(GPU_LOCK_ENV) or None)
    # Before the lock, the checks' comparisons run once on four-element tensors of each output dtype and the
    # libraries make their handles (kernelcast.kernels.harness.anticheat.warm_comparisons): the first launch of each
    # kernel loads it, about 200 ms of a child's first check under the lock on an H100. Off until measured.
    warm_checks: bool = False
    # A child's first calls and checks run with the GPU lock held shared, beside other children's checks and never
    # beside a child being timed; its timing, verification and recheck hold the lock alone (under_lock.DeviceLock). Only
    # where budget.shares_checks allows: every case's bytes known and small, no first call that autotunes (its own
    # choice of kernel would be skewed by other children's work: budget.BENCHMARKS_FIRST).
    shared_checks: bool = True
    # Processes a reference is measured in where its first one found a case host-sensitive and host-paced (only a
    # timed one can; ``host_paced``): a host-bound call's figure moves with the speed its process happens to get (one
    # H200 host, one run: a reference of 19.9, 59.1 and 135.1 us in three processes), so such a reference's stored
    # runtime per case is its fastest process's (``combine_reference_takes``); its row keeps every process's figure.
    # Stopping the worker's other children while one times was tried and taken out: with them stopped, host-paced
    # references ran slower and spread more over runs (2.3x against 1.05x; docs/measured/harness_repeatability/README.md, "Quiet timing, measured").
    reference_processes: int = 3


@dataclass
class WorkerStats:
    """What the worker's children did: the reliability report's restart and protection counts."""

    children: int = 0
    crashed: int = 0  # died before reporting
    killed: int = 0  # killed by the worker: time or memory limit
    retried_alone: int = 0  # ran out of device memory, or its window was unexplained, beside others: measured again alone
    shared_checks: int = 0  # children whose checks held the lock shared (WorkerConfig.shared_checks)
    sandboxes: Counter = field(default_factory=Counter)  # sandbox summary -> children that entered it


class MeasureWorker:
    """Measures candidates on one device (or the CPU interpreter); yields ``Measurement``s."""

    def __init__(self, hardware: HardwareSpec, config: WorkerConfig = WorkerConfig()):
        if config.mode == "gpu" and hardware.gpu_type == INTERPRETER:
            raise ValueError("no CUDA GPU is visible; measure in interpreter mode (correctness only)")
        if config.mode not in ("gpu", "interpreter"):
            raise ValueError(f"unknown measurement mode {config.mode!r}; known: gpu, interpreter")
        if config.protocol not in PROTOCOLS:
            raise ValueError(f"unknown timing protocol {config.protocol!r}; known: {', '.join(PROTOCOLS)}")
        if config.model_build not in MODEL_BUILDS:
            raise ValueError(f"unknown model build {config.model_build!r}; known: {', '.join(MODEL_BUILDS)}")
        if isinstance(config.reference_processes, bool) or not isinstance(config.reference_processes, int) \
                or config.reference_processes < 1:
            raise ValueError(f"reference_processes must be a whole number of processes, 1 or more; got "
                             f"{config.reference_processes!r}")
        if config.anchor not in ANCHORS:
            raise ValueError(f"unknown anchor setting {config.anchor!r}; known: {', '.join(ANCHORS)}")
        if config.memcheck not in memcheck.MODES:
            raise ValueError(f"unknown memcheck setting {config.memcheck!r}; known: {', '.join(memcheck.MODES)}")
        if config.precision not in precision.MODES:
            raise ValueError(f"unknown precision setting {config.precision!r}; known: {', '.join(precision.MODES)}")
        # Triton decides at import time whether its jit functions are interpreted, so the
        # fork server (started on first use, inheriting this environment) must see the switch.
        if config.mode == "interpreter":
            os.environ["TRITON_INTERPRET"] = "1"
        elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            raise ValueError("TRITON_INTERPRET is set in this process; GPU measurement needs it unset")
        self.hardware = hardware
        self.config = config
        self._ctx = _context()
        self._judge = Judges(self._ctx, config.judges)
        self._judge.start()
        self._seeds = SeedServer()
        self._root = tempfile.mkdtemp(prefix="kernelcast-worker-")
        self._lock_path = config.gpu_lock or os.path.join(self._root, "gpu.lock")
        open(self._lock_path, "a").close()  # children open it read-only: they may not create files here
        self._cache = os.path.join(self._root, "triton-cache")
        os.makedirs(self._cache, exist_ok=True)
        # Triton's CUDA utilities, built once here for every child's own cache (before_lock.build_triton_utils); a
        # child started before they are built builds its own, ahead of the lock (before_lock.warm_triton_utils).
        self._utils = os.path.join(self._root, "triton-utils")
        self._utils_built = threading.Event()
        if config.mode == "gpu":
            threading.Thread(target=lambda: build_triton_utils(self._utils) and self._utils_built.set(),
                             daemon=True).start()
        self.stats = WorkerStats()
        reserve = config.reserve_timing_core if config.reserve_timing_core is not None else config.mode == "gpu"
        # A process told to measure on one of the machine's GPUs takes that GPU's share of the cores unless given some.
        own = config.cpus if config.cpus is not None or config.mode != "gpu" else cores.this_gpus_share()
        self.cores = cores.plan(own, reserve=reserve)
        self._protection = (config.network, config.filesystem)  # in GPU mode, settled by a probe
        self._probed = config.mode != "gpu"
        self.reference_us: dict[str, tuple[float, ...]] = {}  # op -> eager runtime per case
        self.reference_host_bound: dict[str, tuple[str, ...]] = {}  # op -> the reference's host-bound cases
        self.busy_gpu_seconds = 0.0  # the device time charged to the candidates (each child's holds, its own)
        # every hold of the GPU lock by a child, (start, end, shared): shared holds may overlap (``held_gpu_seconds``)
        self.holds: list[tuple[float, float, bool]] = []
        self._case_bytes: dict[str, list[int | None]] = {}  # op -> per case, None where meta tensors cannot tell
        # (candidate id, take) -> its out-of-memory attempt
        self._first_attempt: dict[tuple[str, int], Measurement] = {}
        self._takes: dict[str, list[tuple[dict, Measurement]]] = {}  # op -> its reference's processes so far
        self._reference_call_us: dict[str, dict[str, float]] = {}  # op -> case -> its reference's first call  # op -> per case, one set's bytes plus parameters
        # (candidate id, attempt, phase, monotonic time, detail) for every phase of every child, in order
        # (the latest 100,000): shows when each held the GPU lock and what ran beside it.
        self.timeline: deque[tuple[str, int, str, float, object]] = deque(maxlen=100_000)

    @property
    def held_gpu_seconds(self) -> float:
        """How long some child held the GPU lock, overlapping shared holds counted once: the device's busy time."""
        return held_seconds(self.holds)["held"]

    def close(self) -> None:
        self._judge.close()
        self._seeds.close()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def measure(self, candidates: Iterable[Candidate]) -> Iterator[Measurement]:
        """Measure each candidate (each op's eager reference first, once), yielding results as they finish."""
        candidates = list(candidates)
        if not self._probed:
            self.probe_sandbox()
        ops = list(dict.fromkeys(c.op for c in candidates))
        for op_name in ops:
            get_operation(op_name)  # fail on an unknown op before any child starts
        seeds = [get_operation(o).seed_candidates()[0] for o in ops if o not in self.reference_us]
        if self.config.mode != "gpu":  # no timing to anchor: only the references asked for, first all the same
            asked = {c.candidate_id for c in candidates}
            seeds = [c for c in seeds if c.candidate_id in asked]
        # The references first; each op's candidates once its own reference is in (its runtime sets their limits
        # and anchors them), so one slow reference holds back its own candidates only.
        seed_ids = {s.candidate_id for s in seeds}
        waiting: dict[str, list[Candidate]] = {s.candidate_id: [] for s in seeds}
        by_op = {s.op: s.candidate_id for s in seeds}
        ready = []
        for c in candidates:
            if c.candidate_id not in seed_ids:
                (waiting[by_op[c.op]] if c.op in by_op else ready).append(c)
        for m in self._run(seeds + ready, waiting):
            yield self._with_speedup(m)

    def limits(self, op_name: str) -> budget.Limits:
        """The limits of every candidate of ``op_name``: from its case sizes and, once measured, its reference's runtime."""
        cfg = self.config
        op = get_operation(op_name)
        cases = op.cases if cfg.mode == "gpu" else op.interpret_cases
        # inputs meta tensors cannot describe: the bytes model
        case_bytes = [op.bytes_moved(case) if size is None else size for case, size in zip(cases, self._bytes(op_name))]
        # The reference's runtime per case: its timed median, or (the larger) its first call, which its
        # own measurement reports as it goes; the same figures for every candidate of the op.
        medians = dict(zip((c.name for c in cases), self.reference_us.get(op_name, ())))
        calls = self._reference_call_us.get(op_name, {})
        runtime = [max(medians.get(c.name, 0.0), calls.get(c.name, 0.0)) for c in cases]
        return budget.limits_for(case_bytes, mode=cfg.mode, seeds=cfg.seeds,
                                 max_seconds_per_case=cfg.max_seconds_per_case,
                                 reference_us=runtime if any(runtime) else None,
                                 base_device_s=cfg.gpu_timeout_s, compile_s=cfg.timeout_s)

    def checks_alone(self, cand: Candidate) -> str | None:
        """Why the candidate's checks must hold the device alone (``budget.shares_checks``), or None."""
        cfg = self.config
        if cfg.device_memory_gib:
            total = cfg.device_memory_gib * 2**30
        elif cfg.mode == "gpu":
            total = self.hardware.memory_gib * 2**30
        else:  # the interpreter's device is the host
            total = (cfg.address_space_gib or cfg.host_memory_gib) * 2**30
        return budget.shares_checks(self._bytes(cand.op), cfg.concurrency, int(total), cand.source)

    def _bytes(self, op_name: str) -> list[int | None]:
        """Per case of the op, one set's bytes plus parameters from meta tensors (None where they cannot tell), once."""
        if op_name not in self._case_bytes:
            op = get_operation(op_name)
            self._case_bytes[op_name] = budget.case_bytes(op, op.cases if self.config.mode == "gpu" else op.interpret_cases)
        return self._case_bytes[op_name]

    def candidate_limits(self, cand: Candidate) -> budget.Limits:
        """``limits`` of the candidate's op, with first calls of ``autotune_call_s`` where it autotunes."""
        limits = self.limits(cand.op)
        return budget.with_autotuning(limits, self.config.autotune_call_s) if budget.autotunes(cand.source) else limits

    def _with_speedup(self, m: Measurement) -> Measurement:
        ref = self.reference_us.get(m.op)
        if m.status != "ok" or not ref or not m.runtime_us_median:
            return m
        speedup = geometric_mean(r / t for r, t in zip(ref, m.runtime_us_median))
        return replace(m, reference_us_median=tuple(ref), speedup=speedup)

    def _job(self, cand: Candidate, scratch: str, network: str, filesystem: str, limits: budget.Limits | None = None,
             alone: bool = False) -> Job:
        cfg = self.config
        whole = (limits.ahead_s + limits.first_calls_s + limits.device_s) if limits else cfg.timeout_s
        return Job(candidate=cand, mode=cfg.mode, scratch_dir=scratch, lock_path=self._lock_path,
                   triton_cache_dir=self._cache, seeds=cfg.seeds, recheck=cfg.recheck,
                   max_seconds_per_case=cfg.max_seconds_per_case,
                   network=network, filesystem=filesystem,
                   cpu_seconds=int(cfg.cpu_seconds or max(10, 2 * whole)),
                   address_space_bytes=int(cfg.address_space_gib * 2**30) if cfg.address_space_gib else None,
                   file_size_bytes=cfg.file_size_mib << 20,
                   compile_target=ahead.target_of(self.hardware.compute_capability) if cfg.mode == "gpu" else "",
                   device_memory_bytes=int(cfg.device_memory_gib * 2**30) if cfg.device_memory_gib else None,
                   alone=alone, environment=tuple(sorted(get_operation(cand.op).environment.items())),
                   compile_cpus=self.cores.compile, timing_cpus=self.cores.timing,
                   host_bound_windows=cfg.host_bound_windows, reference_us=self._anchor(cand),
                   reference_host_bound=self._reference_host_bound(cand),
                   verify=cfg.verify, fresh_calls=cfg.fresh_calls, precision=cfg.precision,
                   protocol=cfg.protocol, model_build=cfg.model_build, anchor_all=cfg.anchor == "all",
                   warm_checks=cfg.warm_checks,
                   shared_checks=cfg.shared_checks and not alone and self.checks_alone(cand) is None,
                   peak_bandwidth_gbps=self.hardware.peak_bandwidth_gbps if cfg.mode == "gpu" else None,
                   peak_tflops=peak_tflops(self.hardware.gpu_type) if cfg.mode == "gpu" else None,
                   l2_bytes=int(self.hardware.l2_mib * 2**20))

    @staticmethod
    def _is_reference(cand: Candidate) -> bool:
        """The op's reference, or its null candidate (the same code): trusted, not memchecked."""
        op = get_operation(cand.op)
        return cand.candidate_id == op.seed_candidates()[0].candidate_id or NULL_MARK in cand.source

    def _anchor(self, cand: Candidate) -> tuple[float, ...]:
        """The reference runtimes a candidate's host-bound cases are anchored to; () for none (the reference itself)."""
        if self.config.mode != "gpu" or self.config.anchor == "off":
            return ()
        if cand.candidate_id == get_operation(cand.op).seed_candidates()[0].candidate_id:
            return ()
        return tuple(self.reference_us.get(cand.op, ()))

    def adopt_reference(self, m: Measurement) -> str | None:
        """Take ``m``, a stored measurement of its op's reference, as this worker's: its runtimes set the limits and
        the speedups of the op's candidates, and the cases it was host-sensitive on are paired, as if this worker had
        measured it (it then measures no reference of its own for the op). Runs that adopt the same measurement
        agree on both, where each measuring its own reference would decide its paired cases afresh and set its
        candidates against a runtime of that moment's host. Returns why ``m`` cannot be adopted, or None."""
        op = get_operation(m.op)
        hw, mine = m.hardware, self.hardware
        why = (f"{m.candidate_id} is not the reference of {m.op}" if m.candidate_id != op.seed_candidates()[0].candidate_id
               else f"its status is {m.status}" if m.status != "ok"
               else f"it has no timings (mode {m.mode})" if m.mode != "gpu" or not m.runtime_us_median
               else f"it was measured on {m.gpu_type}, this worker's GPU is {mine.gpu_type}" if m.gpu_type != mine.gpu_type
               else "it does not say what it ran on" if hw is None
               else None)
        if why is None:
            theirs = (hw.device_name, hw.driver_version, hw.torch_version, hw.triton_version)
            ours = (mine.device_name, mine.driver_version, mine.torch_version, mine.triton_version)
            if theirs != ours:
                why = f"it ran on {'/'.join(theirs)}, this worker on {'/'.join(ours)}"
        names = [c.name for c in op.cases]
        host_bound = host_sensitive_in(m.checks) if why is None else None
        if why is None and host_bound is None:
            why = "its row does not say which cases were host-sensitive (measured before rows did)"
        if why is None and (tuple(m.case_names) != tuple(names) or len(m.runtime_us_median) != len(names)):
            why = f"its cases ({', '.join(m.case_names)}) are not the op's ({', '.join(names)})"
        if why is not None:
            return f"not adopting {m.op}'s reference measurement: {why}"
        self.reference_us[m.op] = tuple(m.runtime_us_median)
        self.reference_host_bound[m.op] = host_bound
        return None

    def _reference_host_bound(self, cand: Candidate) -> tuple[str, ...]:
        """The cases a candidate times beside the reference because the reference's own timing was host-bound."""
        return self.reference_host_bound.get(cand.op, ()) if self._anchor(cand) else ()

    def probe_sandbox(self) -> str:
        """Find the strongest protections under which CUDA and a Triton kernel still work; returns them.

        Tried in order: namespace + Landlock, seccomp + Landlock, seccomp alone, none. The
        outcome of each try is kept in ``probe_log`` for the reliability report.
        """
        ladder = [(self.config.network, self.config.filesystem), ("seccomp", self.config.filesystem),
                  ("seccomp", "off"), ("off", "off")]
        self.probe_log: list[str] = []
        probe = get_operation("softmax").seed_candidates()[0]
        for network, filesystem in dict.fromkeys(ladder):
            scratch = tempfile.mkdtemp(prefix="probe-", dir=self._root)
            parent_conn, child_conn = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(target=probe_main, args=(self._job(probe, scratch, network, filesystem),
                                                              child_conn), daemon=True, name="kernelcast-probe")
            proc.start()
            child_conn.close()
            answer = {"ok": False, "error": "no answer within 300 s"}
            if parent_conn.poll(300):
                try:
                    answer = channel.receive(parent_conn)[1]
                except (EOFError, OSError):
                    answer = {"ok": False, "error": f"probe died ({proc.exitcode})"}
                except channel.ChannelError as exc:
                    answer = {"ok": False, "error": f"probe sent a malformed answer: {exc}"}
            proc.kill()
            proc.join(10)
            shutil.rmtree(scratch, ignore_errors=True)
            self.probe_log.append(f"network={network} filesystem={filesystem}: "
                                  + ("works: " + answer.get("sandbox", "") if answer["ok"] else answer["error"]))
            if answer["ok"]:
                self._protection = (network, filesystem)
                break
        self._probed = True
        return self.probe_log[-1]

    def _start(self, cand: Candidate, alone: bool = False, take: int = 1) -> _Running:
        scratch = tempfile.mkdtemp(prefix="cand-", dir=self._root)
        if self._utils_built.is_set():
            seed_triton_cache(self._utils, scratch)
        limits = self.candidate_limits(cand)
        job = self._job(cand, scratch, *self._protection, limits=limits, alone=alone)
        # The child's phases and result come on one pipe; its requests for its inputs' seeds (channel.request_seeds) on
        # another, answered at once by the seed server's thread.
        parent_conn, child_conn = self._ctx.Pipe(duplex=False)
        seeds_conn, child_seeds = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=child_main, args=(job, child_conn, child_seeds), daemon=True,
                                 name=f"kernelcast-{cand.candidate_id}")
        proc.start()
        child_conn.close()
        child_seeds.close()
        self.stats.children += 1
        r = _Running(cand, proc, parent_conn, scratch, time.monotonic(), limits=limits, alone=alone, take=take,
                     seeds_conn=seeds_conn, references=tuple(job.reference_us))
        self._seeds.add(seeds_conn, r)
        self._note(r, "started", r.started, limits)
        return r

    def _note(self, r: _Running, phase: str, t: float, detail=None) -> None:
        self.timeline.append((r.candidate.candidate_id, attempt_of(r.alone, r.take), phase, t, detail))

    def _run(self, candidates: list[Candidate],
             waiting: dict[str, list[Candidate]] | None = None) -> Iterator[Measurement]:
        """Measure ``candidates``, ``concurrency`` at a time, yielding each verdict as it comes; ``waiting``: an
        op's reference id -> candidates started once that reference is measured (its runtime kept when ok)."""
        waiting = dict(waiting or {})
        pending = deque(candidates)
        solo: deque[tuple[Candidate, Measurement, int]] = deque()  # ran out of device memory: again, alone
        takes: deque[tuple[Candidate, int]] = deque()  # a host-bound reference's further processes, first in line
        running: list[_Running] = []
        try:
            while pending or running or solo or takes:
                if solo and not running:
                    cand, first, take = solo.popleft()
                    running.append(self._start(cand, alone=True, take=take))
                    self._first_attempt[cand.candidate_id, take] = first
                alone = solo or any(r.alone for r in running)  # a retry runs with no other child beside it
                while not alone and (takes or pending) and len(running) < self.config.concurrency:
                    if takes:
                        cand, take = takes.popleft()
                        running.append(self._start(cand, take=take))
                    else:
                        running.append(self._start(pending.popleft()))
                # while a child times, look at its pipe often: each empty look bounds its window from below
                timing = any(r.window_open is not None for r in running)
                wait([r.conn for r in running] + [r.process.sentinel for r in running],
                     timeout=WINDOW_LOOK_S if timing else 0.5)
                still = []
                for r in running:
                    done = self._poll(r)
                    if done is None:
                        still.append(r)
                    elif not r.alone and (self._out_of_memory(r, done) or (r.understated and self.config.mode == "gpu")):
                        self.stats.retried_alone += 1
                        solo.append((r.candidate, done, r.take))  # no verdict yet: others held the device beside it
                    else:
                        m = self._after_retry(r, done)
                        if m.candidate_id in waiting:  # a reference: what its candidates are measured against
                            taken = self._reference_take(r, m, takes)
                            if taken is None:
                                continue  # more of its processes to come
                            m, res = taken
                            if m.status == "ok":
                                self.reference_us[m.op] = m.runtime_us_median
                                # its candidates time these cases beside it too: a host-bound reference's own
                                # runtime moves with the host, and a GPU-bound candidate's speedup with it
                                self.reference_host_bound[m.op] = tuple(res.get("host_sensitive_cases", ()))
                            pending.extend(waiting.pop(m.candidate_id))
                        yield m
                running = still
        finally:
            for r in running:  # the caller stopped early: leave no child behind
                r.process.kill()
                r.process.join(5)
                _kill_group(r.process.pid)
                shutil.rmtree(r.scratch, ignore_errors=True)

    def _reference_take(self, r: _Running, m: Measurement,
                        takes: deque[tuple[Candidate, int]]) -> tuple[Measurement, dict] | None:
        """A reference's measurement and result once all its processes are in, or None while some are to come.

        One process where its first fails, finds no case host-sensitive and host-paced (``host_paced``), or the config
        asks for one: its own row.
        Otherwise its further processes go first in line (loading beside one another, timed one at a time under the
        lock) and the row is ``combine_reference_takes`` of them all."""
        res = r.result or {}
        op = m.op
        if op not in self._takes:
            wanted = self.config.reference_processes  # only a timed process finds a case host-sensitive
            if m.status != "ok" or not m.runtime_us_median or wanted <= 1 or not host_paced(res, m):
                return m, res
            self._takes[op] = []
            takes.extend((r.candidate, k) for k in range(2, wanted + 1))
        self._takes[op].append((res, m))
        if len(self._takes[op]) < self.config.reference_processes:
            return None
        return combine_reference_takes(self._takes.pop(op))

    @staticmethod
    def _out_of_memory(r: _Running, m: Measurement) -> bool:
        if m.status not in ("runtime_error", "crashed"):
            return False
        return bool((r.result or {}).get("out_of_memory")) or budget.is_out_of_memory(m.error)

    def _after_retry(self, r: _Running, m: Measurement) -> Measurement:
        """A retried candidate's verdict, charged for both attempts; others unchanged."""
        first = self._first_attempt.pop((r.candidate.candidate_id, r.take), None)
        if first is None:
            return m
        fields = {"gpu_seconds": m.gpu_seconds + first.gpu_seconds, "wall_seconds": m.wall_seconds + first.wall_seconds}
        if self._out_of_memory(r, m):
            fields["error"] = f"out of device memory even when measured alone: {m.error}"
        return replace(m, **fields)

    def _poll(self, r: _Running) -> Measurement | None:
        """The finished measurement of a child, or None while it is still running within its limits."""
        try:
            while not r.broken and r.result is None:
                looked = time.monotonic()
                if not r.conn.poll():
                    r.quiet_at = looked  # nothing had come by then: the next message was sent after it
                    break
                message = channel.receive(r.conn)  # bytes, validated: nothing a child writes is unpickled
                kind = message[0]
                if kind == "phase":
                    # the child's time for it, but no earlier than its last phase and no later than read here
                    name, detail, t = message[1:]
                    read_at = time.monotonic()
                    r.last_phase_t = min(max(t, r.last_phase_t, r.started), read_at)
                    self._phase(r, name, detail, r.last_phase_t)
                    if name in ("timing", "timed"):
                        _observe_window(r, name, detail, read_at, max(r.quiet_at, r.started), self.config.protocol)
                    elif name == "anchored":
                        observe_anchored(r, detail)
                elif kind == "sandbox":
                    self.stats.sandboxes[message[1]] += 1
                elif kind == "seed":  # asked on the seeds' own pipe (SeedServer), never on this one
                    raise channel.ChannelError("a seed request on the phases' pipe")
                elif kind == "result":
                    r.result = message[1]
        except channel.ChannelError as exc:
            r.broken = str(exc)
        except (EOFError, OSError):
            pass
        now = time.monotonic()
        if r.broken:
            r.process.kill()
            r.process.join(10)
            self.stats.crashed += 1
            return self._finish(r, status="crashed", gpu_seconds=self._gpu_held(r, now),
                                error=f"the child's channel carried a message the harness does not send ({r.broken}); "
                                      f"its process is untrusted from then on and gets no verdict of its own")
        if r.result is not None:
            if r.judging is None:
                r.process.join(10)
                if r.process.is_alive():
                    r.process.kill()
                r.judging = threading.Thread(target=self._judge_child, args=(r,), daemon=True)
                r.judging.start()
            if r.judging.is_alive():
                return None
            if r.memcheck is None and self._memchecks(r):
                r.memcheck = threading.Thread(target=self._memcheck, args=(r,), daemon=True)
                r.memcheck.start()
            if r.memcheck is not None and r.memcheck.is_alive():
                return None
            return self._finish(r, **self._from_result(r.result))
        if not r.process.is_alive():
            r.process.join()
            code = r.process.exitcode
            if code == -signal.SIGXCPU:
                limit = self._job(r.candidate, r.scratch, *self._protection, limits=r.limits).cpu_seconds
                return self._finish(r, status="timeout", error=f"candidate used its CPU-time limit of {limit} s; "
                                    f"killed by {_signal_name(code)}", gpu_seconds=self._gpu_held(r, now))
            how = f"killed by {_signal_name(code)}" if code and code < 0 else f"exited with code {code}"
            tail = _log_tail(r.scratch)
            message = f"child process {how} before reporting a result" + (f"; its output ended: {tail}" if tail else "")
            self.stats.crashed += 1
            return self._finish(r, status="crashed", error=message, gpu_seconds=self._gpu_held(r, now))
        rss = _rss_bytes(r.process.pid)
        r.peak_rss_bytes = max(r.peak_rss_bytes, rss)
        if rss > self.config.host_memory_gib * 2**30:
            r.process.kill()
            r.process.join(10)
            self.stats.killed += 1
            return self._finish(r, status="runtime_error", gpu_seconds=self._gpu_held(r, now),
                                error=f"candidate used {rss / 2**30:.1f} GiB of host memory, over its limit of "
                                      f"{self.config.host_memory_gib:g} GiB; killed")
        over = self._over_limit(r, now)
        return self._kill(r, over, now) if over else None

    def _phase(self, r: _Running, name: str, detail, t: float) -> None:
        self._note(r, name, t, detail)
        r.doing = _doing(name, detail) or r.doing
        r.calling = (detail["case"], t) if name == "calling" else None if name == "call" else r.calling
        if name in ("exclusive_wait", "share_wait", "shared_again", "releasing"):
            self._end_hold(r, t)
        if name in ("locked", "exclusive", "shared_again"):
            r.holding = (t, name == "shared_again" or (name == "locked" and bool((detail or {}).get("shared"))))
        if name == "waiting":
            r.waiting_since = t
        elif name == "locked":
            r.gpu_started = t
            r.compiles_under_lock = bool((detail or {}).get("first_calls_to_compile"))
            self.stats.shared_checks += bool((detail or {}).get("shared"))
        elif name in ("exclusive_wait", "share_wait"):
            r.paused_since = t
        elif name in ("exclusive", "shared_again", "releasing") and r.paused_since is not None:
            # the wait held nothing: the limits resume (or the child was refused before it got the lock alone)
            waited = t - r.paused_since
            r.gpu_started = None if r.gpu_started is None else r.gpu_started + waited
            r.checks_started = None if r.checks_started is None else r.checks_started + waited
            r.paused_since = None
        elif name == "checks":
            r.checks_started = t
        elif name == "call" and r.candidate.origin == "seed" and r.candidate.op not in self.reference_us:
            # the reference, measuring: its limits grow with its own calls, as its candidates' will
            self._reference_call_us.setdefault(r.candidate.op, {})[detail["case"]] = detail["seconds"] * 1e6
            r.limits = self.candidate_limits(r.candidate)
            self._note(r, "limits", t, r.limits)
        elif name == "released":
            r.released = t

    def _end_hold(self, r: _Running, t: float) -> None:
        if r.holding is not None:
            self.holds.append((r.holding[0], t, r.holding[1]))
            r.holding = None

    def _over_limit(self, r: _Running, now: float) -> str | None:
        """Which limit a running child has passed, or None. Waiting for the lock counts against none."""
        if r.paused_since is not None:
            return None
        lim = r.limits
        device = "the GPU" if self.config.mode == "gpu" else "the interpreter (the CPU)"
        doing = f", {r.doing}" if r.doing else ""
        if r.waiting_since is None and now - r.started > lim.ahead_s:
            return f"exceeded its time limit of {lim.ahead_s:.0f} s for loading and compiling (outside the GPU lock)"
        if r.released is not None and now - r.released > 30:
            return "released the GPU but sent no result within the 30 s limit"
        if r.calling is not None and lim.call_s:
            case, since = r.calling
            names = [c.name for c in self._cases(r.candidate.op)]
            limit = lim.call_s[names.index(case)] if case in names and names.index(case) < len(lim.call_s) else None
            if limit is not None and now - since > limit:
                known = bool(self._reference_call_us.get(r.candidate.op, {}).get(case))
                basis = "the case's bytes and its reference's first call" if known else "the case's bytes"
                who = "the task's reference itself: too slow to check here" if r.candidate.origin == "seed" else ""
                return (f"held {device} past its limit of {limit:.0f} s (from {basis}) for the first call of case "
                        f"{case}" + (f"; {who}" if who else ""))
        if r.checks_started is not None:
            if now - r.checks_started > lim.device_s:
                return f"held {device} past its limit of {lim.device_s:.0f} s{doing}"
        elif r.gpu_started is not None:
            first = lim.first_calls_s if r.compiles_under_lock else lim.device_s
            if now - r.gpu_started > first:
                return f"held {device} past its limit of {first:.0f} s for its first calls{doing}"
        return None

    def _cases(self, op_name: str):
        op = get_operation(op_name)
        return op.cases if self.config.mode == "gpu" else op.interpret_cases

    def _gpu_held(self, r: _Running, now: float) -> float:
        return (r.paused_since or now) - r.gpu_started if r.gpu_started is not None else 0.0

    def _kill(self, r: _Running, why: str, now: float) -> Measurement:
        r.process.kill()
        r.process.join(10)
        self.stats.killed += 1
        return self._finish(r, status="timeout", error=f"candidate {why}; killed", gpu_seconds=self._gpu_held(r, now))

    def _judge_child(self, r: _Running) -> None:
        """The judge's verdict on what a child that says ``ok`` recorded (from a thread of the worker): its checked,
        timed and rechecked calls' outputs against the reference, computed in the judge's own process on the inputs
        of the seeds this worker drew. A child's ``ok`` stands only where the judge agrees."""
        res = r.result
        if res.get("status") != "ok":
            return
        problem = self._refuted_figures(r)
        if problem:
            res.update(status="rejected", error=problem)
            return
        gpu = self.config.mode == "gpu"
        # a rechecked call: the round's, or the verification's first on unseen inputs where cases are verified
        rechecked = self.config.recheck or (gpu and self.config.verify)
        roles = ("check",) + (("recheck",) if rechecked else ()) + (("timed",) if gpu else ())
        request = {"op_name": r.candidate.op, "mode": self.config.mode, "folder": os.path.join(r.scratch, JUDGED),
                   "served": dict(r.served), "model_build": self.config.model_build,
                   "protocol": self.config.protocol, "lock_path": self._lock_path, "roles_needed": roles}
        t = time.monotonic()
        self._note(r, "judging", t, None)
        try:
            answer = self._judge.ask(request)
        except Exception as exc:  # noqa: BLE001 - the judge failed: no verdict of the child's stands without it
            res.update(status="runtime_error", error=f"the judge could not judge this candidate: {exc}")
            return
        seconds = time.monotonic() - t
        self._note(r, "judged", time.monotonic(), answer)
        caught = "; ".join(f"{case}: {', '.join(names)}" for case, names in sorted(answer["trivial"].items()))
        res["judged"] = (f"{answer['records']} calls ({seconds:.1f} s)"
                         + (f", trivial outputs the tolerance alone accepts, refused: {caught}" if caught else ""))
        res["seeds"] = len(r.served)
        if r.windows:
            res["windows"] = window_text(r.windows)
        if answer["problem"]:
            res.update(status="incorrect", error=answer["problem"])

    def _refuted_figures(self, r: _Running) -> str:
        """What the worker's own observations say against a child's figures (GPU mode), or "": every case it reports
        was timed in a window the worker saw open and close, the calls it says it timed there fit in that window,
        and no figure lies below the case's floor, which the worker computes itself (its bytes at the device's peak
        bandwidth, its FLOPs at the top rate). The child's process holds candidate code: its own floor check and
        the runtimes it reports are its say alone."""
        if self.config.mode != "gpu":
            return ""
        if r.claim_problem:
            return r.claim_problem
        res = r.result
        op = get_operation(r.candidate.op)
        cases = {c.name: c for c in op.cases}
        peak = peak_tflops(self.hardware.gpu_type)
        for name, us in zip(res.get("case_names") or [], res.get("runtime_us_median") or []):
            if name not in cases:
                return f"a figure for case {str(name)[:60]!r}, which {r.candidate.op} does not have"
            if name not in r.windows:
                return (f"case {name}: a figure of {us:.3g} us with no timing window of that case seen by the worker: "
                        f"the figure is not one the harness took")
            told = figure_problem(r, name, us, r.references)
            if told:
                return told
            floor = verify.floor_us(op, cases[name], self.hardware.peak_bandwidth_gbps, peak,
                                    int(self.hardware.l2_mib * 2**20))
            if floor and us < floor * verify.FLOOR_MARGIN:
                return (f"case {name}: {us:.3g} us is below the case's floor of {floor:.3g} us by the worker's own "
                        f"computation (its bytes at the device's peak bandwidth, its FLOPs at its top rate)")
        return ""

    def _memchecks(self, r: _Running) -> bool:
        cand = r.candidate
        return (self.config.mode == "gpu" and r.result.get("status") == "ok"
                and memcheck.applies(self.config.memcheck, is_imported_name(cand.op), self._is_reference(cand)))

    def _memcheck(self, r: _Running) -> None:
        """One call on the smallest case under compute-sanitizer (from a thread of the worker).

        Started here, not in the child: the child's sandbox lets only the child itself write beneath
        /proc, which a new process needs to start CUDA; the sanitized process takes the lock, starts
        CUDA and enters the same sandbox itself before it loads the candidate."""
        cand, res = r.candidate, r.result
        op = get_operation(cand.op)
        case = min(op.cases, key=op.bytes_moved)
        job = self._job(cand, r.scratch, *self._protection, limits=r.limits)
        t = time.monotonic()
        self._note(r, "memcheck", t, case.name)
        try:
            finding = memcheck.run(cand, case.name, job.policy(), dict(job.environment), str(tasks_dir().resolve()),
                                   self.config.memcheck_timeout_s, lock_path=self._lock_path)
        except RuntimeError as exc:  # the check could not be made: said so in the verdict, not held against it
            res["memcheck"] = f"not made: {exc}"
            return
        res["memcheck"] = f"{'clean' if finding is None else 'found'} ({time.monotonic() - t:.1f} s)"
        if finding:
            res.update(status="rejected", error=f"case {case.name}: {finding}")

    _from_result = staticmethod(row_fields)  # a child's result as its row's fields

    def _finish(self, r: _Running, **fields) -> Measurement:
        self._note(r, "ended", time.monotonic(), fields.get("status"))
        _kill_group(r.process.pid)
        shutil.rmtree(r.scratch, ignore_errors=True)
        self._seeds.remove(r.seeds_conn)
        for conn in (r.conn, r.seeds_conn):
            try:
                conn.close()
            except OSError:
                pass
        self._end_hold(r, time.monotonic())  # a child that died or was killed holding the lock
        self.busy_gpu_seconds += fields.get("gpu_seconds", 0.0)
        if fields.get("status") != "ok":  # a failed candidate carries no timings
            fields.update(runtime_us_median=(), runtime_us_iqr=(), repetitions=())
        return Measurement(candidate_id=r.candidate.candidate_id, op=r.candidate.op,
                           gpu_type=self.hardware.gpu_type, mode=self.config.mode, protocol=self.config.protocol,
                           wall_seconds=time.monotonic() - r.started, hardware=self.hardware, **fields)
