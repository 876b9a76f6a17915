"""Verification of a timed window: the checks of kernelcast.kernels.harness.verify run on each case as it is timed
(``_verify_case``) and on the figure it keeps (``_check_timed``).

Per case: the timer's functions unchanged, one call traced between two markers, calls on inputs the candidate never
saw with the reference's own first calls as the control, and integrity again; per kept figure: the trace's busy time
and the case's physical floor. A cheat raises ``Rejected``; a wrong output on unseen inputs is the verdict
``incorrect`` (``_Incorrect``).
"""

from __future__ import annotations

from kernelcast.kernels.harness import at_start, verify
from kernelcast.kernels.harness.anticheat import Checker, Rejected
from kernelcast.kernels.harness.correctness import describe
from kernelcast.kernels.harness.job import Job
from kernelcast.kernels.harness.timing import Timing


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
    verify.check_integrity(at_start.HARNESS, where)
    if result.get("window_check", "profiled") == "profiled":
        try:
            activities = verify.profile_window(lambda: call(0), pacer)
        except Rejected:
            raise
        except Exception as exc:  # noqa: BLE001 - tracing failed here: the synced check below still runs
            result["window_check"] = f"unavailable: {describe(exc)[:200]}"
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
    verify.check_integrity(at_start.HARNESS, where)
    if first:  # what the case's own window is held against (``timing.disturbed``)
        result.setdefault("fastest_call_us", {})[case.name] = min(w.timed_us for w in first + again)
    phase("verified", {"case": case.name, **seen})
    return None


class _NoControl(Exception):
    """The reference cannot run in this child as the unseen-input check's control."""
