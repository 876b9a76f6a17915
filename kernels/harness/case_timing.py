"""Timing of a candidate's cases, under the GPU lock held alone (``_time_cases``).

Each case's first window, verified as it is timed (kernelcast.kernels.harness.window_checks), beside the reference
from the start where the case is paired whatever its own windows say (kernelcast.kernels.harness.anchoring); the
other paired cases beside the reference after that; the host-bound and short cases again in passes until their
fastest windows agree; each case's figure checked and kept. The timed calls' outputs are recorded for the judge
(``_record_timed``). The timers are kernelcast.kernels.harness.timing's.
"""

from __future__ import annotations

import random

import torch

from kernelcast.kernels.harness import at_start, budget, state, verify
from kernelcast.kernels.harness.anchoring import (_anchor_launch, _anchored, _control_launch, _first_windows,
                                                  cases_to_pair, keeps_anchor)
from kernelcast.kernels.harness.anticheat import Checker, Rejected
from kernelcast.kernels.harness.correctness import describe, poisoned_outputs
from kernelcast.kernels.harness.job import Job
from kernelcast.kernels.harness.timing import (FORMAT_PROTOCOLS, fastest, flush_us, l2_flush_buffer, time_again,
                                               time_call, time_gpumode, time_pair, time_trials)
from kernelcast.kernels.harness.window_checks import _check_timed, _Incorrect, _verify_case

# Seeds of the inputs: compile call 0, correctness 1..seeds, timing sets from 1000, recheck 9000 (under_lock).
_TIMING_SEED = 1000
TIMED_RECORDS = 2  # timed input sets per case whose outputs the judge checks: the latest call's and one other

# The timers of the formats' own harnesses (Job.protocol): KernelBench's 100 trials, GPU MODE's adaptive runs.
_FORMAT_TIMERS = {"kernelbench": time_trials, "gpumode": time_gpumode}


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
        checker.draw(case, [_TIMING_SEED + k for k in range(1, n_sets)])  # one request for all of them
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
        changed = state.differing(at_start.STATE, own)
        l2 = state.reset_persisting_l2()
        if changed or l2:
            result["state"] = "; ".join(([f"set otherwise by the candidate, put back for the reference's calls: "
                                          f"{', '.join(changed)}"] if changed else []) + ([l2] if l2 else []))
        phase("timing", case.name)
        if anchor is not None:
            ref_launch, ref_params = anchor
            ref_outs = [poisoned_outputs(op, case, "cuda") for _ in range(n_sets)]
            to_harness, to_candidate = state.swap(at_start.STATE, own)

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
                                                          f"({describe(exc)[:120]}); its latest call's judged")
            break
