"""A child's result as its measurement row (``row_fields``), the row's checks read back (``host_sensitive_in``,
``anchored_slowed_in``, ``reference_process_figures``), and one row for a reference measured in several processes
(``host_paced`` says which need more; ``combine_reference_takes`` makes the row).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Iterable

from kernelcast.kernels.harness.sweep_report import cases_in
from kernelcast.kernels.records import Measurement


def row_fields(res: dict) -> dict:
    """A child's result (the judge's and the worker's findings added) as the fields of its ``Measurement``."""
    return {"status": res.get("status", "runtime_error"), "error": res.get("error", ""),
            "case_names": tuple(res.get("case_names", ())),
            "runtime_us_median": tuple(res.get("runtime_us_median", ())),
            "runtime_us_iqr": tuple(res.get("runtime_us_iqr", ())),
            "repetitions": tuple(res.get("repetitions", ())),
            "compile_seconds": float(res.get("compile_seconds", 0.0)),
            "gpu_seconds": float(res.get("gpu_seconds", 0.0)),
            "precision": str(res.get("precision", "")),
            "error_rel": tuple(res.get("error_rel", ())),
            "reference_error_rel": tuple(res.get("reference_error_rel", ())),
            "checks": "; ".join([f"{k}: {res[k]}" for k in ("window_check", "memcheck", "models_built", "judged",
                                                            "seeds", "windows", "state")
                                 if res.get(k)]
                                + ([f"timed outputs: {'; '.join(res['timed_outputs'])}"]
                                   if res.get("timed_outputs") else [])
                                + ([f"{REFERENCE_PROCESSES_MARK}{res['reference_processes']}"]
                                   if res.get("reference_processes") else [])
                                + _anchoring(res) + _host_sensitive(res) + _controlled(res))}


def _controlled(res: dict) -> list[str]:
    """The cases whose first calls on unseen inputs were slower than their repeats, as the reference's own were
    (``window_checks._verify_case``'s control): kept in the row, since the reused-work check let them pass on that
    ground."""
    return [f"unseen-input control: {'; '.join(res['unseen_control'])}"] if res.get("unseen_control") else []


HOST_SENSITIVE = "host-sensitive: "


def _host_sensitive(res: dict) -> list[str]:
    """The cases whose own timing was host-sensitive ("none": none), as the row records them: for an op's reference,
    the cases its candidates time beside it (``MeasureWorker.adopt_reference`` reads them back). Nothing where the
    candidate was not timed."""
    if "host_sensitive_cases" not in res:
        return []
    return [f"{HOST_SENSITIVE}{', '.join(res['host_sensitive_cases']) or 'none'}"]


def host_sensitive_in(checks: str) -> tuple[str, ...] | None:
    """The cases a row's checks say were host-sensitive; None where the row does not say (measured before it did)."""
    return cases_in(checks, HOST_SENSITIVE)


def _anchoring(res: dict) -> list[str]:
    """The cases timed beside the reference, as the row records them: whether a speedup is a paired ratio or a
    runtime over the reference's stored one ("none": so for the reference itself) is otherwise only in the
    timeline. Nothing where the candidate was not timed. The cases whose reference ran well past its stored runtime
    beside the candidate are named apart with both figures (``ANCHORED_SLOWED``)."""
    if "anchored_cases" not in res:
        return []
    slowed = [f"{case} {here:.1f}/{stored:.1f} us" for case, (here, stored) in res.get("anchored_slowed", {}).items()]
    return [f"anchored: {', '.join(res['anchored_cases']) or 'none'}"] + (
        [f"{ANCHORED_SLOWED}{', '.join(slowed)}"] if slowed else [])


# The anchored cases whose reference, beside the candidate, ran well past its stored runtime (anchoring.ANCHOR_SLOWED):
# "CASE here/stored us" each.
ANCHORED_SLOWED = "anchored beside a slowed reference: "


def anchored_slowed_in(checks: str) -> dict[str, float]:
    """{case: how many times its stored runtime the reference ran beside the candidate} for the anchored cases a
    row's checks name as paired beside a slowed reference; {} where none (or the row predates the mark)."""
    out = {}
    for item in cases_in(checks, ANCHORED_SLOWED) or ():
        case, figures, _ = item.rsplit(" ", 2)  # "CASE here/stored us"
        here, _, stored = figures.partition("/")
        out[case] = float(here) / float(stored)
    return out


REFERENCE_PROCESSES_MARK = "reference processes: "


# A case is host-paced where the host's time to issue a call reaches this share of the call's runtime: the device
# waits on the host, so the figure is the process's. Measured on one H200 host (2026-11-29, 19 references in three
# processes, five runs): every reference whose processes spread past 1% had host time at least its runtime (1.00-4.2x)
# in every process; every one whose processes agreed within 1% had at most 0.91 of it.
HOST_PACED_SHARE = 0.95


def host_paced(res: dict, m: Measurement) -> bool:
    """Whether a reference's first process found a case both host-sensitive (the pairing rule's test, against the
    flush) and host-paced (``HOST_PACED_SHARE``): the cases a further process can change. A result without host
    times (an older child) counts host-sensitive alone."""
    sensitive = set(res.get("host_sensitive_cases", ()))
    host = res.get("host_us")
    if not sensitive or host is None:
        return bool(sensitive)
    return any(name in sensitive and h >= HOST_PACED_SHARE * t
               for name, h, t in zip(m.case_names, host, m.runtime_us_median))


def combine_reference_takes(takes: list[tuple[dict, Measurement]]) -> tuple[Measurement, dict]:
    """One row for a reference measured in several processes (``WorkerConfig.reference_processes``), and its result.

    Per case, the figures (median, IQR, repetitions) of its fastest ok process, as a case's fastest window counts
    within a process: the process whose host was least slowed. (Measured on one H200 host, 2026-11-29: the fastest of
    three repeated across runs where the first process alone and the median of three did not; docs/harness.md.) A
    case is host-sensitive where more than half of the ok processes found it so. The row is charged every process's
    time, and its checks name each process's figure and host time of every case some process found host-sensitive
    (``reference_process_figures`` reads them back)."""
    ok = [(res, m) for res, m in takes if m.status == "ok" and m.runtime_us_median]
    first_res, first = ok[0]
    names = list(first.case_names)
    res = dict(first_res)
    medians, iqrs, reps = [], [], []
    for i in range(len(names)):
        figures = [m.runtime_us_median[i] for _, m in ok]
        pick = figures.index(min(figures))
        medians.append(figures[pick])
        iqrs.append(ok[pick][1].runtime_us_iqr[i] if i < len(ok[pick][1].runtime_us_iqr) else 0.0)
        reps.append(ok[pick][1].repetitions[i] if i < len(ok[pick][1].repetitions) else 0)
    found = Counter(c for r, _ in ok for c in r.get("host_sensitive_cases", ()))
    res["host_sensitive_cases"] = [c for c in names if 2 * found[c] > len(ok)]
    detail = []
    for i, name in enumerate(names):
        if found[name]:
            us = "/".join(f"{m.runtime_us_median[i]:.1f}" for _, m in ok)
            host = "/".join(f"{r['host_us'][i]:.1f}" if i < len(r.get("host_us", ())) else "-" for r, _ in ok)
            detail.append(f"{name} {us} us (host {host} us)")
    failed = [f"{m.status}" for _, m in takes if not (m.status == "ok" and m.runtime_us_median)]
    res["reference_processes"] = (f"{len(ok)} of {len(takes)} ok" + (f" ({', '.join(failed)})" if failed else "")
                                  + "".join(f" | {d}" for d in detail))  # no "; ": it parts the row's checks
    fields = row_fields(res)
    fields.update(runtime_us_median=tuple(medians), runtime_us_iqr=tuple(iqrs), repetitions=tuple(reps),
                  compile_seconds=sum(m.compile_seconds for _, m in takes),
                  gpu_seconds=sum(m.gpu_seconds for _, m in takes))
    return replace(first, wall_seconds=sum(m.wall_seconds for _, m in takes), **fields), res


def reference_process_figures(checks: str) -> dict[str, list[float]]:
    """Each case's figure (us) in each process of a reference measured in several, in the order they ran, from a
    row's checks (``combine_reference_takes``); {} for a row measured in one process."""
    for part in (checks or "").split("; "):
        if part.startswith(REFERENCE_PROCESSES_MARK):
            figures = {}
            for item in part.split(" | ")[1:]:
                name, us = item.split(" ")[:2]
                figures[name] = [float(x) for x in us.split("/")]
            return figures
    return {}


def geometric_mean(values: Iterable[float]) -> float | None:
    values = list(values)
    if not values or any(v <= 0 or not math.isfinite(v) for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
