"""The worker's side of its child processes: what it knows of each while it runs (``_Running``), the fork server
they come from, started without credentials (``_context``), and what it reads of a child from outside: its exit
signal, its log, its resident memory, what it said it was doing, the timing windows it opened and closed
(``_observe_window``); its process group killed (``_kill_group``).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import signal
import threading
from dataclasses import dataclass, field

from kernelcast.kernels.harness import budget, sandbox
from kernelcast.kernels.formats import TASKS_ENV
from kernelcast.kernels.records import Candidate


@dataclass
class _Running:
    candidate: Candidate
    process: mp.process.BaseProcess
    conn: object
    scratch: str
    started: float
    limits: budget.Limits
    alone: bool = False
    take: int = 1  # a reference's process: 1 its first, 2 and on its further ones (WorkerConfig.reference_processes)
    waiting_since: float | None = None
    gpu_started: float | None = None
    compiles_under_lock: bool = False
    checks_started: float | None = None
    doing: str = ""  # what the child said it was doing last, for a timeout's message
    calling: tuple[str, float] | None = None  # (case, since) while a case's first call runs
    released: float | None = None
    paused_since: float | None = None  # waiting for the lock alone after shared checks: no limit runs meanwhile
    holding: tuple[float, bool] | None = None  # the child's present hold of the lock: (since, shared)
    result: dict | None = None
    peak_rss_bytes: int = 0
    memcheck: threading.Thread | None = None  # the sanitizer's call, made by the worker once the child is done
    last_phase_t: float = 0.0  # the time of the child's latest phase, as the worker clamped it
    served: dict = field(default_factory=dict)  # seed -> case: the seeds the worker drew for this child's inputs
    judging: threading.Thread | None = None  # the judge's reading of the child's recorded outputs
    window_open: tuple[str, float, float] | None = None  # the case whose window the child opened, opened after, read at
    quiet_at: float = 0.0  # the worker's latest look at the child's pipe that found nothing: what comes next was sent after
    # case -> [(the window's most seconds by the worker's clock, the least its calls take, its fewest seconds or None,
    # the calls' count times median, the most seconds its calls' figures explain)]
    windows: dict = field(default_factory=dict)
    claim_problem: str = ""  # a child's figures that the worker's own observations refute
    understated: bool = False  # claim_problem: a window its calls' figures leave unexplained (retried alone first)
    # case -> the figures its windows told: [(the candidate's microseconds, the reference's beside them or None)], and
    # its pairs' [(us, reference_us_here, ratio, reference_us)]: a result's figure must be one of them (figure_problem)
    timed_seen: dict = field(default_factory=dict)
    anchored_seen: dict = field(default_factory=dict)
    references: tuple = ()  # the reference's runtimes the worker gave the child to anchor its pairs to
    broken: str = ""  # why a message of the child's was refused (channel.ChannelError): it gets no verdict of its own
    seeds_conn: object = None  # the pipe the child asks for its inputs' seeds on (SeedServer)


WINDOW_SLACK_S = 0.05  # the worker reads a child's phases as its loop comes to them: up to this late, and 10%
# What a timed window may hold beyond its calls' figures, by the worker's clock: each call's flush, events and host
# issue up to CALL_OVERHEAD_S, the warm-up calls each series makes first (WARMUP_CALLS, GPU MODE's timer up to
# FORMAT_WARMUP_S more), all of it UNEXPLAINED_FACTOR over, and UNEXPLAINED_SLACK_S whatever the window.
CALL_OVERHEAD_S = 200e-6
# How often the worker looks at a timing child's pipe (measured on an H100 at its loop's half-second: 154 of 289
# honest windows had no empty look inside them, so no lower bound; tens of milliseconds are typical windows)
WINDOW_LOOK_S = 0.002
WARMUP_CALLS = 3
FORMAT_WARMUP_S = {"gpumode": 0.15}
UNEXPLAINED_FACTOR = 2.0
UNEXPLAINED_SLACK_S = 0.03


def explained_s(series, protocol: str = "kernelcast") -> float:
    """The most seconds an honest window of these series ``[(repetitions, microseconds a call), ...]`` takes at
    the worker's clock: what a window seen to take longer leaves unexplained. Honest calls fill their window but
    for the flush and events between them and the warm-up before (measured on H100s: see docs/harness.md)."""
    need = sum((reps + WARMUP_CALLS) * (us / 1e6 + CALL_OVERHEAD_S) for reps, us in series)
    return UNEXPLAINED_FACTOR * (need + FORMAT_WARMUP_S.get(protocol, 0.0)) + UNEXPLAINED_SLACK_S


def _observe_window(r: _Running, name: str, detail, read_at: float, sent_after: float | None = None,
                    protocol: str = "kernelcast") -> None:
    """A timing window's opening and closing as the worker reads them, and what the child says it timed there: the
    calls of each series (the candidate's, and the reference's beside it) at half their count times their median,
    the least time calls with that median can have taken. A child whose claims need more time than the window can
    have taken made its figures up (a reference said to be slower than it was, to inflate the speedup).

    The window is bounded from above, never estimated: it opened after ``sent_after`` (the worker's latest look at
    the pipe that found it empty before the opening came; the reading time where not given) and closed before the
    closing is read at ``read_at``. A worker busy elsewhere reads both messages late, and the same pass can read both:
    the bound grows with its lateness, so an honest child's claims always fit (measured: a reference refused under
    KernelBench's protocol, its 0.18 s of calls read as a window of no time, before the bound).

    Bounded from below too, where the worker looked at the pipe and found it empty after reading the opening (the
    closing was sent after that look): kept with the calls' full time (count times median) in ``windows``, for the
    row; a window seen to take longer than its calls' figures can explain (``explained_s``) refutes them: figures
    rewritten in the child's process (its timer hooked, its message rewritten on the way out) understate what its
    calls took. Such a child is marked ``understated``: the worker measures it again alone before it believes that
    (a host busy with other children can stall an honest child's window)."""
    looked, sent_after = sent_after, read_at if sent_after is None else min(sent_after, read_at)
    if name == "timing":
        r.window_open = (detail, sent_after, read_at) if isinstance(detail, str) else None
        return
    opened, r.window_open = r.window_open, None
    case = detail.get("case") if isinstance(detail, dict) else None
    if opened is None or case != opened[0]:
        r.claim_problem = r.claim_problem or f"a timed window of case {str(case)[:60]!r} that the worker never saw open"
        return
    claimed = calls = 0.0
    series = []
    for reps, us in ((detail.get("reps"), detail.get("us")), (detail.get("reference_reps"), detail.get("reference_us"))):
        if reps is None and us is None:
            continue
        if not (isinstance(reps, int) and isinstance(us, (int, float)) and reps >= 0 and us >= 0):
            r.claim_problem = r.claim_problem or f"case {case}: a timed window without its calls' count and runtime"
            return
        claimed += reps * us / 2e6
        calls += reps * us / 1e6
        series.append((reps, us))
    r.timed_seen.setdefault(case, []).append((detail.get("us"), detail.get("reference_us")))
    wall = read_at - opened[1]
    # None: no empty look inside the window (or none told)
    at_least = looked - opened[2] if looked is not None and looked > opened[2] else None
    explained = explained_s(series, protocol)
    r.windows.setdefault(case, []).append((wall, claimed, at_least, calls, explained))
    if claimed > wall * 1.1 + WINDOW_SLACK_S:
        r.claim_problem = r.claim_problem or (
            f"case {case}: the calls it says it timed need at least {claimed:.3f} s; the worker saw the window take "
            f"{wall:.3f} s at most: its figures are not what its calls took")
    if at_least is not None and at_least > explained and not r.claim_problem:
        r.understated = True
        r.claim_problem = (
            f"case {case}: the worker saw the window take at least {at_least:.3f} s; the calls it says it timed there "
            f"({', '.join(f'{n} at {us:.4g} us' for n, us in series)}), their warm-up, flushes and events explain "
            f"{explained:.3f} s at most: its figures understate what its calls took")


# A pair's median of per-round ratios against its ratio of medians: at most this apart (measured on an H100, the
# nulls of 31 anchored sweep tasks: 1.0124 at most)
PAIRED_RATIO_SPREAD = 1.5


def observe_anchored(r: _Running, detail) -> None:
    """A pair's figures as the child told them (its ``anchored`` phase), for ``figure_problem``."""
    if not isinstance(detail, dict):
        return
    keys = ("us", "reference_us_here", "ratio", "reference_us")
    if all(isinstance(detail.get(k), (int, float)) for k in keys):
        r.anchored_seen.setdefault(detail.get("case"), []).append(tuple(float(detail[k]) for k in keys))


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def figure_problem(r: _Running, case: str, figure: float, references: tuple[float, ...] = ()) -> str:
    """Why the figure a child's result gives ``case`` is not one its windows told the worker, or "". An honest
    child's figure is its fastest window's median as that window's ``timed`` phase told it, or a pair's: the
    reference's runtime the worker gave it (``references``) times the pair's ratio, the pair's medians being a
    window's and its ratio near theirs. A child that rewrote its result alone, or its pair's ratio, or the
    reference's runtime, is refuted here; one that rewrote its windows' figures too meets the windows' bounds."""
    told = r.timed_seen.get(case, [])
    if any(isinstance(us, (int, float)) and _same(us, figure) for us, _ in told):
        return ""
    for us, here, ratio, reference_us in r.anchored_seen.get(case, []):
        if not _same(reference_us * ratio, figure):
            continue
        if not any(_same(us, u) and isinstance(h, (int, float)) and _same(here, h) for u, h in told):
            return f"case {case}: a pair's medians ({us:.4g} and {here:.4g} us) that none of its windows told"
        if references and not any(_same(reference_us, x) for x in references):
            return f"case {case}: anchored to a reference runtime of {reference_us:.4g} us, which the worker never gave it"
        medians = us / here if here > 0 else float("inf")
        if not (medians / PAIRED_RATIO_SPREAD <= ratio <= medians * PAIRED_RATIO_SPREAD):
            return (f"case {case}: a pair's ratio of {ratio:.4g} against its medians' {medians:.4g}: more than "
                    f"{PAIRED_RATIO_SPREAD:g} times apart")
        return ""
    return f"case {case}: a figure of {figure:.4g} us that none of its timed windows told the worker"


def window_text(windows: dict) -> str:
    """The timed windows as the worker saw them, for the row: 'CASE 0.301-0.312 s, calls 0.286 s (explains 0.640 s)'
    a window (the fewest and the most seconds it can have taken by the worker's clock, '?' where it cannot tell the
    fewest; the calls' count times their median, the candidate's and the reference's beside it; the most seconds
    those figures explain, ``explained_s``)."""
    return ", ".join(f"{case} {'?' if low is None else f'{low:.3f}'}-{high:.3f} s, calls {calls:.3f} s "
                     f"(explains {explained:.3f} s)" for case, seen in windows.items()
                     for high, _, low, calls, explained in seen)


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["kernelcast.kernels.harness.runner"])
    _start_scrubbed_forkserver()
    return ctx


def _start_scrubbed_forkserver() -> None:
    """Run the fork server with no credentials in its environment.

    Deleting variables in a child leaves them in /proc/self/environ, which shows the
    environment the process was exec'd with, i.e. the fork server's; so the fork server
    itself must start without them. One started earlier with secrets is restarted, and so is
    one whose tasks folder (``KERNELCAST_TASKS``) is not this process's: its children would look
    for imported tasks where the caller did not install them.
    """
    # This process's environment and memory hold the credentials: non-dumpable, no child of its user can read them
    # through /proc/<pid> (environ, mem, maps) without a capability it has dropped (kernelcast.kernels.harness.sandbox).
    sandbox.hide_this_process()
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                items = [item.decode(errors="replace").split("=", 1) for item in f.read().split(b"\0") if item]
        except OSError:
            items = []
        env = {kv[0]: kv[1] if len(kv) > 1 else "" for kv in items}
        moved = bool(env) and env.get(TASKS_ENV, "") != os.environ.get(TASKS_ENV, "")
        if moved or any(sandbox.is_secret_name(n) for n in env):
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


def _doing(phase: str, detail) -> str:
    """A child's phase in words, for the message of a limit it passed ('' for phases that say nothing new)."""
    if phase == "timing":
        return f"timing case {detail}"
    detail = detail if isinstance(detail, dict) else {}
    if phase == "locked":
        return "making its first inputs"
    if phase == "calling":
        return f"in the first call of case {detail.get('case')}"
    if phase == "call":
        return f"after the first call of case {detail.get('case')}"
    if phase == "check":
        return f"in the correctness check of case {detail.get('case')}, seed {detail.get('seed')}"
    if phase == "recheck":
        return f"in the recheck of case {detail.get('case')} after timing"
    return ""


def attempt_of(alone: bool, take: int) -> int:
    """A child's attempt number in the worker's timeline: 1 a candidate's first process, 2 its retry alone (after
    running out of device memory beside others), 3 and on a host-bound reference's further processes (take 2 is 3)."""
    return 2 if alone else (1 if take == 1 else take + 1)


class SeedServer:
    """Answers children's requests for the seeds of their input sets (``channel.request_seeds``) from a thread of its
    own, on a pipe of each child's own, as soon as they come: a child asks while it holds the device alone, and the
    worker's loop, busy starting and judging other children, answered in 10-20 ms a request (measured on an H100,
    2026-12-06: a child making its timing sets and its unseen inputs held the device about 170 ms longer than before
    seeds were drawn by the worker). Each seed is drawn from the operating system when asked for and kept in the
    child's ``served`` for the judge; a request that is not of the channel's schema marks the child ``broken``."""

    def __init__(self):
        self._pipes: dict[object, _Running] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="kernelcast-seeds")
        self._thread.start()

    def add(self, conn, r: _Running) -> None:
        with self._lock:
            self._pipes[conn] = r
        self._wake_w.send_bytes(b"")

    def remove(self, conn) -> None:
        with self._lock:
            self._pipes.pop(conn, None)
        self._wake_w.send_bytes(b"")

    def close(self) -> None:
        self._stopped = True
        self._wake_w.send_bytes(b"")
        self._thread.join(5)

    def _serve(self) -> None:
        from multiprocessing.connection import wait

        from kernelcast.kernels.harness import channel

        while not self._stopped:
            with self._lock:
                pipes = dict(self._pipes)
            for ready in wait([self._wake_r, *pipes], timeout=1.0):
                if ready is self._wake_r:
                    self._wake_r.recv_bytes()
                    continue
                r = pipes[ready]
                try:
                    message = channel.receive(ready)
                    if message[0] != "seed":
                        raise channel.ChannelError(f"a {message[0]} message on the seeds' pipe")
                    seeds = [channel.draw_seed() for _ in message[2]]
                    r.served.update(dict.fromkeys(seeds, message[1]))
                    channel.answer_seeds(ready, seeds)
                except channel.ChannelError as exc:
                    r.broken = r.broken or str(exc)
                    self.remove(ready)
                except (EOFError, OSError):  # the child is gone: its pipe with it
                    self.remove(ready)
