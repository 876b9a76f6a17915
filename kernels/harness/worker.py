"""The measurement worker for one GPU: runs each candidate in its own child process.

Children come from a fork server that has already imported torch and Triton, so a
child starts in milliseconds and with no CUDA state. Up to ``concurrency`` children
load and compile at once on the CPU cores while one of them holds the GPU lock for
correctness and timing. The worker watches every child from outside: a crash
(segfault, illegal address that kills the process) becomes ``crashed``, a child past
its time limit (overall, or once it holds the GPU) is killed and becomes ``timeout``.
A child whose resident memory passes ``host_memory_gib`` is killed too (the GPU-mode
guard against host OOM, where no address-space limit can be set), as is whatever it
forked (its process group). Either way only that candidate is lost; the worker goes on
with the next.

Every child enters the sandbox (kernels.harness.sandbox) and reports which protections
took effect; in GPU mode the worker first probes, once, which protections leave CUDA
and Triton working and uses the strongest such set.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import shutil
import signal
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from typing import Iterable, Iterator

from kernels.harness import sandbox
from kernels.harness.runner import Job, child_main, probe_main
from kernels.hardware import INTERPRETER
from kernels.ops import get_operation
from kernels.records import Candidate, HardwareSpec, Measurement


@dataclass(frozen=True)
class WorkerConfig:
    mode: str = "gpu"  # "gpu" or "interpreter"
    concurrency: int = 4  # children loading/compiling at once
    timeout_s: float = 300.0  # a child's whole life
    gpu_timeout_s: float = 60.0  # from taking the GPU lock to its result
    seeds: int = 3  # seeded correctness inputs per case
    max_seconds_per_case: float = 1.0  # timing budget per case
    network: str = "namespace"  # strongest network protection to try: namespace, seccomp, off
    filesystem: str = "landlock"  # landlock or off
    address_space_gib: float | None = 8.0  # RLIMIT_AS, interpreter mode only (CUDA reserves huge ranges)
    host_memory_gib: float = 32.0  # resident memory past which the worker kills a child
    file_size_mib: int = 512  # largest file a child may write
    # CPU seconds a child may use; the wall-clock limits normally fire first, this catches the rest.
    cpu_seconds: int | None = None  # None: twice timeout_s


@dataclass
class WorkerStats:
    """What the worker's children did: the reliability report's restart and protection counts."""

    children: int = 0
    crashed: int = 0  # died before reporting
    killed: int = 0  # killed by the worker: time or memory limit
    sandboxes: Counter = field(default_factory=Counter)  # sandbox summary -> children that entered it


@dataclass
class _Running:
    candidate: Candidate
    process: mp.process.BaseProcess
    conn: object
    scratch: str
    started: float
    gpu_started: float | None = None
    result: dict | None = None
    peak_rss_bytes: int = 0


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["kernels.harness.runner"])
    _start_scrubbed_forkserver()
    return ctx


def _start_scrubbed_forkserver() -> None:
    """Run the fork server with no credentials in its environment.

    Deleting variables in a child leaves them in /proc/self/environ, which shows the
    environment the process was exec'd with, i.e. the fork server's; so the fork server
    itself must start without them. One started earlier with secrets is restarted.
    """
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                names = [item.split(b"=", 1)[0].decode(errors="replace") for item in f.read().split(b"\0") if item]
        except OSError:
            names = []
        if any(sandbox.is_secret_name(n) for n in names):
            server._stop()
    saved = dict(os.environ)
    try:
        sandbox.scrub_environment()
        server.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _log_tail(scratch: str, limit: int = 1500) -> str:
    try:
        with open(os.path.join(scratch, "child.log"), errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text[-limit:].strip()


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _kill_group(pid: int | None) -> None:
    """Kill the child's process group: whatever the candidate forked goes with it."""
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def geometric_mean(values: Iterable[float]) -> float | None:
    values = list(values)
    if not values or any(v <= 0 or not math.isfinite(v) for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


class MeasureWorker:
    """Measures candidates on one device (or the CPU interpreter); yields ``Measurement``s."""

    def __init__(self, hardware: HardwareSpec, config: WorkerConfig = WorkerConfig()):
        if config.mode == "gpu" and hardware.gpu_type == INTERPRETER:
            raise ValueError("no CUDA GPU is visible; measure in interpreter mode (correctness only)")
        if config.mode not in ("gpu", "interpreter"):
            raise ValueError(f"unknown measurement mode {config.mode!r}; known: gpu, interpreter")
        # Triton decides at import time whether its jit functions are interpreted, so the
        # fork server (started on first use, inheriting this environment) must see the switch.
        if config.mode == "interpreter":
            os.environ["TRITON_INTERPRET"] = "1"
        elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            raise ValueError("TRITON_INTERPRET is set in this process; GPU measurement needs it unset")
        self.hardware = hardware
        self.config = config
        self._ctx = _context()
        self._root = tempfile.mkdtemp(prefix="kernelcast-worker-")
        self._lock_path = os.path.join(self._root, "gpu.lock")
        open(self._lock_path, "a").close()  # children open it read-only: they may not create files here
        self._cache = os.path.join(self._root, "triton-cache")
        os.makedirs(self._cache, exist_ok=True)
        self.stats = WorkerStats()
        self._protection = (config.network, config.filesystem)  # in GPU mode, settled by a probe
        self._probed = config.mode != "gpu"
        self.reference_us: dict[str, tuple[float, ...]] = {}  # op -> eager runtime per case
        self.busy_gpu_seconds = 0.0

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def measure(self, candidates: Iterable[Candidate]) -> Iterator[Measurement]:
        """Measure each candidate (the op's eager reference first, once), yielding results as they finish."""
        candidates = list(candidates)
        if not self._probed:
            self.probe_sandbox()
        for op_name in dict.fromkeys(c.op for c in candidates):
            get_operation(op_name)  # fail on an unknown op before any child starts
            if self.config.mode == "gpu" and op_name not in self.reference_us:
                seed = get_operation(op_name).seed_candidates()[0]
                for m in self._run([seed]):
                    if m.status == "ok":
                        self.reference_us[op_name] = m.runtime_us_median
                    m = self._with_speedup(m)
                    yield m
                candidates = [c for c in candidates if c.candidate_id != seed.candidate_id]
        for m in self._run(candidates):
            yield self._with_speedup(m)

    def _with_speedup(self, m: Measurement) -> Measurement:
        ref = self.reference_us.get(m.op)
        if m.status != "ok" or not ref or not m.runtime_us_median:
            return m
        speedup = geometric_mean(r / t for r, t in zip(ref, m.runtime_us_median))
        return replace(m, reference_us_median=tuple(ref), speedup=speedup)

    def _job(self, cand: Candidate, scratch: str, network: str, filesystem: str) -> Job:
        cfg = self.config
        return Job(candidate=cand, mode=cfg.mode, scratch_dir=scratch, lock_path=self._lock_path,
                   triton_cache_dir=self._cache, seeds=cfg.seeds, max_seconds_per_case=cfg.max_seconds_per_case,
                   network=network, filesystem=filesystem,
                   cpu_seconds=int(cfg.cpu_seconds or max(10, 2 * cfg.timeout_s)),
                   address_space_bytes=int(cfg.address_space_gib * 2**30) if cfg.address_space_gib else None,
                   file_size_bytes=cfg.file_size_mib << 20)

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
                    answer = parent_conn.recv()[1]
                except (EOFError, OSError):
                    answer = {"ok": False, "error": f"probe died ({proc.exitcode})"}
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

    def _start(self, cand: Candidate) -> _Running:
        scratch = tempfile.mkdtemp(prefix="cand-", dir=self._root)
        job = self._job(cand, scratch, *self._protection)
        parent_conn, child_conn = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=child_main, args=(job, child_conn), daemon=True,
                                 name=f"kernelcast-{cand.candidate_id}")
        proc.start()
        child_conn.close()
        self.stats.children += 1
        return _Running(cand, proc, parent_conn, scratch, time.monotonic())

    def _run(self, candidates: list[Candidate]) -> Iterator[Measurement]:
        pending = deque(candidates)
        running: list[_Running] = []
        try:
            while pending or running:
                while pending and len(running) < self.config.concurrency:
                    running.append(self._start(pending.popleft()))
                wait([r.conn for r in running] + [r.process.sentinel for r in running], timeout=0.5)
                still = []
                for r in running:
                    done = self._poll(r)
                    if done is None:
                        still.append(r)
                    else:
                        yield done
                running = still
        finally:
            for r in running:  # the caller stopped early: leave no child behind
                r.process.kill()
                r.process.join(5)
                _kill_group(r.process.pid)
                shutil.rmtree(r.scratch, ignore_errors=True)

    def _poll(self, r: _Running) -> Measurement | None:
        """The finished measurement of a child, or None while it is still running within its limits."""
        try:
            while r.conn.poll():
                kind, payload = r.conn.recv()
                if kind == "gpu_stage":
                    r.gpu_started = time.monotonic()
                elif kind == "sandbox":
                    self.stats.sandboxes[payload] += 1
                elif kind == "result":
                    r.result = payload
        except (EOFError, OSError):
            pass
        now = time.monotonic()
        if r.result is not None:
            r.process.join(10)
            if r.process.is_alive():
                r.process.kill()
            return self._finish(r, **self._from_result(r.result))
        if not r.process.is_alive():
            r.process.join()
            code = r.process.exitcode
            if code == -signal.SIGXCPU:
                limit = self._job(r.candidate, r.scratch, *self._protection).cpu_seconds
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
        if now - r.started > self.config.timeout_s:
            return self._kill(r, f"exceeded its time limit of {self.config.timeout_s:.0f} s", now)
        if r.gpu_started is not None and now - r.gpu_started > self.config.gpu_timeout_s:
            return self._kill(r, f"held the GPU past its limit of {self.config.gpu_timeout_s:.0f} s", now)
        return None

    def _gpu_held(self, r: _Running, now: float) -> float:
        return now - r.gpu_started if r.gpu_started is not None else 0.0

    def _kill(self, r: _Running, why: str, now: float) -> Measurement:
        r.process.kill()
        r.process.join(10)
        self.stats.killed += 1
        return self._finish(r, status="timeout", error=f"candidate {why}; killed", gpu_seconds=self._gpu_held(r, now))

    @staticmethod
    def _from_result(res: dict) -> dict:
        return {"status": res.get("status", "runtime_error"), "error": res.get("error", ""),
                "case_names": tuple(res.get("case_names", ())),
                "runtime_us_median": tuple(res.get("runtime_us_median", ())),
                "runtime_us_iqr": tuple(res.get("runtime_us_iqr", ())),
                "repetitions": tuple(res.get("repetitions", ())),
                "compile_seconds": float(res.get("compile_seconds", 0.0)),
                "gpu_seconds": float(res.get("gpu_seconds", 0.0))}

    def _finish(self, r: _Running, **fields) -> Measurement:
        _kill_group(r.process.pid)
        shutil.rmtree(r.scratch, ignore_errors=True)
        try:
            r.conn.close()
        except OSError:
            pass
        self.busy_gpu_seconds += fields.get("gpu_seconds", 0.0)
        if fields.get("status") != "ok":  # a failed candidate carries no timings
            fields.update(runtime_us_median=(), runtime_us_iqr=(), repetitions=())
        return Measurement(candidate_id=r.candidate.candidate_id, op=r.candidate.op,
                           gpu_type=self.hardware.gpu_type, mode=self.config.mode,
                           wall_seconds=time.monotonic() - r.started, hardware=self.hardware, **fields)
