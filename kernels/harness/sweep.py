"""Sweep a folder of public tasks through the harness: import each, measure its reference and its null candidate.

    kernelcast sweep TASKS_DIR --out DIR [--max-minutes 8]
    PYTHONPATH=$PWD python benchmarks/task_sweep.py --tasks TASKS_DIR --out DIR   (the same, torch and triton only)

Finds every KernelBench problem file (``Model``, ``get_inputs``, ``get_init_inputs``) and
every GPU MODE task folder (``reference.py`` beside ``task.yml``) under the folder, imports
each as an operation (shapes from the meta device: nothing is allocated), then measures
the task's reference and its null candidate (the reference's own code submitted as a
candidate, kernelcast.kernels.null) with the measurement worker at its default settings. Identical
code must come out at 1.00x: the null speedup is the harness's error on that task; the
sweep is the health check of a GPU machine.

Resumable: one JSON row per finished task is appended to ``DIR/sweep.jsonl`` as soon as
both measurements are in, and tasks already there are skipped, so the sweep can be
spread over several calls (``--max-minutes`` stops starting new chunks of tasks after that
long). A task's reference measured ok before its null is also kept, in ``DIR/references.jsonl``: the next call
on the same device measures only the null against it, so a task whose pair outlasts one call (GPU MODE's
linalg/eigh, whose reference alone held an H100 for 17 minutes) finishes over two; ``--case-parts N`` goes further
and measures each task in N parts of its cases, a row a part (``kernelcast.kernels.harness.case_parts``), so a null that
outlasts a call finishes too. Each call prints the table of
every task so far and the summary against the goals
(``kernelcast.kernels.harness.sweep_report``), and writes ``DIR/sweep.md`` and ``DIR/summary.json``.

Needs torch and triton only (the harness's path imports nothing else; GPU MODE's task.yml
is read without PyYAML where it is missing). Without a GPU it runs under Triton's CPU
interpreter on the tasks' interpreter cases: correctness only, no speedups.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kernelcast.kernels.harness.case_parts import (check_parts, complete, mode_cases, parse_part_key, part_key, part_operation,
                                        partition, sliced_reference)
from kernelcast.kernels.harness.sweep_report import lock_breakdown, markdown, summarize, task_line


@dataclass(frozen=True)
class Task:
    key: str  # the task's path under the swept folder: the row's identity across calls
    format: str  # kernelbench | gpumode
    path: Path  # the problem file, or the GPU MODE reference.py
    name: str  # the task name the op is imported under


def _task_name(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "_", text.lower()).strip("_-")[:48].rstrip("_-") or "task"


def discover(root: Path) -> list[Task]:
    """KernelBench problem files and GPU MODE task folders under ``root``, sorted by path."""
    from kernelcast.kernels.formats import TaskFormatError, read_source, top_level_names
    from kernelcast.kernels.formats.kernelbench import REFERENCE_NEEDS

    found: list[Task] = []
    gpumode_dirs = {p.parent for p in root.rglob("task.yml") if (p.parent / "reference.py").is_file()}
    for folder in sorted(gpumode_dirs):
        found.append(Task(str(folder.relative_to(root)), "gpumode", folder / "reference.py",
                          _task_name(folder.name.removesuffix("_py"))))
    for path in sorted(root.rglob("*.py")):
        if path.parent in gpumode_dirs or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        try:
            names = top_level_names(read_source(path, "file"), str(path))
        except TaskFormatError:
            continue
        if all(names.get(n) in (kind, "value") for n, kind in REFERENCE_NEEDS.items()):
            level = re.fullmatch(r"level(\d+)", path.parent.name)
            prefix = f"l{level.group(1)}_" if level else ""
            found.append(Task(str(path.relative_to(root)), "kernelbench", path, _task_name(prefix + path.stem)))
    names: dict[str, int] = {}
    unique = []
    for t in sorted(found, key=lambda t: t.key):
        n = names.get(t.name, 0)
        names[t.name] = n + 1
        unique.append(t if n == 0 else Task(t.key, t.format, t.path, f"{t.name[:44]}-{n}"))
    return unique


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line cut short by a killed call: that task is simply measured again
    return rows


def _geomean(values) -> float | None:
    values = [v for v in values or () if v and math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _import(task: Task):
    """(op, seconds, error): the task imported under its name, or why it could not be."""
    from kernelcast.kernels.formats import import_task

    t0 = time.perf_counter()
    try:
        op, _ = import_task(task.format, str(task.path), name=task.name)
        return op, time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001 - a task that cannot be imported is a row with the reason
        return None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:600]


def _import_in_worker(task: Task) -> tuple[str | None, float, str]:
    """(op name, seconds, error) of one task imported and installed by a worker process (op objects stay here)."""
    op, seconds, error = _import(task)
    return (op.name if op is not None else None), seconds, error


def import_all(tasks: list[Task], workers: int) -> list[tuple[Task, object, float, str]]:
    """(task, op or None, seconds, error) of every task, imported ``workers`` at a time in fresh processes (each
    installs its task where the harness's children look; this process then loads it by name). Imports are the
    tasks' own Python (meta-device shapes, GPU MODE's input generators): on an H100 host, one at a time, the 182
    tasks of a sweep's rows took 216 s (1.2 s a task), all of it before the first measurement."""
    if workers <= 1 or len(tasks) < 2:
        return [(task, *_import(task)) for task in tasks]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from kernelcast.kernels.formats import load_operation

    # spawned, not forked: this process may have started CUDA (the device's properties) already
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_import_in_worker, tasks))
    out = []
    for task, (name, seconds, error) in zip(tasks, done):
        op = None
        if name is not None:
            try:
                op = load_operation(name)
            except Exception as exc:  # noqa: BLE001 - installed by the worker but not loadable here: a row with why
                error = f"{type(exc).__name__}: {exc}"[:600]
        out.append((task, op, seconds, error))
    return out


def _status_row(m) -> dict:
    return {"status": m.status, "error": m.error[:600], "us": list(m.runtime_us_median),
            "gpu_s": round(m.gpu_seconds, 3), "wall_s": round(m.wall_seconds, 3)}


def kept_reference(m, device: str, host_sensitive, windows: int) -> dict:
    """What ``references.jsonl`` keeps of a reference measured ok before its null: enough to time the null
    against it in a later call on the same device, and to write the task's row then."""
    return {"device": device, "op": m.op, "candidate_id": m.candidate_id, "gpu_type": m.gpu_type, "mode": m.mode,
            "us": list(m.runtime_us_median), "gpu_s": m.gpu_seconds, "wall_s": m.wall_seconds,
            "host_sensitive_cases": list(host_sensitive), "windows": windows,
            "measured_at": m.measured_at.isoformat()}


def read_references(path: Path, device: str) -> dict[str, dict]:
    """Task key -> the latest reference kept for it on ``device`` (``kept_reference``), from ``references.jsonl``."""
    return {r["task"]: r for r in read_rows(path) if r.get("device") == device and r.get("us")}


def _stored_reference(kept: dict):
    """The kept reference as the measurement a row is written from (its candidate already measured)."""
    from kernelcast.kernels.records import Measurement

    return Measurement(candidate_id=kept["candidate_id"], op=kept["op"], gpu_type=kept["gpu_type"], status="ok",
                       mode=kept["mode"], runtime_us_median=tuple(kept["us"]), gpu_seconds=kept["gpu_s"],
                       wall_seconds=kept["wall_s"])


def _row(task: Task, op, import_s: float, import_error: str, ref=None, null=None, chunk: str = "",
         mode: str = "", windows: dict | None = None) -> dict:
    row = {"task": task.key, "format": task.format, "op": op.name if op else "", "mode": mode,
           "imported": op is not None, "import_error": import_error, "import_s": round(import_s, 3), "chunk": chunk}
    if op is not None:
        sizes = _case_bytes(op, mode)
        row.update(cases=len(sizes), case_bytes_max=max((s for s in sizes if s), default=None),
                   case_names=[c.name for c in mode_cases(op, mode)])
        if getattr(op, "manifest", {}).get("part_of"):  # a part of a task's cases (case_parts)
            row["part_of"] = op.manifest["part_of"]
    if ref is not None and null is not None:
        r, n = _status_row(ref), _status_row(null)
        # refused before any device work: too big for it, or its code needs a newer GPU
        refused = ("size" if re.search(r"does not fit (on the device|in the interpreter)", r["error"]) else
                   "requirement" if re.search(r"needs (a CUDA GPU of )?compute capability", r["error"]) else None)
        row.update({f"reference_{k}": v for k, v in r.items()})
        row.update({f"null_{k}": v for k, v in n.items()})
        row.update({f"{role}_timing_windows": w for role, w in (windows or {}).items()})
        row.update(fits=not refused, refused=refused, measured=r["status"] == "ok" and n["status"] == "ok",
                   reference_us_geomean=_geomean(r["us"]), null_speedup=null.speedup,
                   wall_s=round(import_s + r["wall_s"] + n["wall_s"], 3))
    else:
        row.update(fits=None, measured=False, wall_s=round(import_s, 3))
    return row


def _case_bytes(op, mode: str) -> list[int | None]:
    """Per case the mode runs, its bytes (``budget.case_bytes``); None where only the device can make its inputs."""
    from kernelcast.kernels.harness.budget import case_bytes

    return case_bytes(op, mode_cases(op, mode))


def _size(op, mode: str) -> float:
    """The bytes of a task's largest case, to order the sweep by; inf where any case's is unknown."""
    sizes = _case_bytes(op, mode)
    return math.inf if not sizes or None in sizes else float(max(sizes))


def _capability(mode: str):
    import torch

    return tuple(torch.cuda.get_device_capability()) if mode == "gpu" else None


def order(imported: list, capability) -> list:
    """(size, task, op, import seconds) items in the order the sweep measures them: the tasks this device cannot
    run first (their children refuse them by name before any device work, in seconds), then smallest first."""
    from kernelcast.kernels.formats.common import unmet_requirement

    return sorted(imported, key=lambda item: (unmet_requirement(item[2].requires, capability) is None, item[0]))


def chunks(imported: list, chunk_size: int) -> list[tuple[int, list]]:
    """The ordered (size, ...) items cut into the chunks measured together, each with its first index: tasks of known
    size ``chunk_size`` at a time, then those whose size only their own code knows (``_size`` inf) a quarter as
    many at a time, never in a chunk with the others.

    A task's null waits for the GPU lock with every other child of its chunk, and one reference can hold the lock
    for many minutes: on an H100, GPU MODE amd/moe's held it for 1,133 s (calls of 9 s) while the nulls of 25
    tasks measured before it waited, and none of their rows was written before the call's time ran out."""
    out, start = [], 0
    while start < len(imported):  # runs of consecutive items alike in whether their size is known, in order
        known = math.isfinite(imported[start][0])
        end = start
        while end < len(imported) and math.isfinite(imported[end][0]) == known:
            end += 1
        size = chunk_size if known else max(1, chunk_size // 4)
        out += [(k, imported[k:min(k + size, end)]) for k in range(start, end, size)]
        start = end
    return out


class Journal:
    """The worker's timeline written to ``timeline.jsonl`` as it grows (every ``every`` seconds, from a thread),
    each event named by task and role: a sweep cut short by its caller still says what each child was doing."""

    def __init__(self, worker, path: Path, names: dict, every: float = 20.0):
        import threading

        self.worker, self.path, self.names, self.written = worker, path, names, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.flush()

    def flush(self) -> None:
        for _ in range(3):  # the deque may grow while it is copied
            try:
                events = list(self.worker.timeline)
                break
            except RuntimeError:
                time.sleep(0.01)
        else:
            return
        new, self.written = events[self.written:], len(events)
        with self.path.open("a") as sink:
            for cid, slots, phase, t, detail in new:
                task, role = self.names.get(cid, ("", ""))
                sink.write(json.dumps({"task": task, "role": role, "candidate": cid, "phase": phase,
                                       "t": round(t, 3), "detail": detail}, default=str) + "\n")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()


def sweep(tasks: list[Task], out: Path, *, mode: str, concurrency: int, max_minutes: float | None,
          chunk_size: int, reserve_timing_core: bool | None = None, anchor: str = "host-bound",
          import_workers: int = 1, case_parts: int = 1, part: int | None = None, shared_checks: bool = True,
          reference_processes: int = 3) -> None:
    """Import and measure the tasks not yet in ``out/sweep.jsonl``, appending a row per finished task.

    Every task is imported first (a task that cannot be is a row at once); the rest are measured smallest
    first, by the bytes of their largest case, so that a few slow tasks cannot hold back the verdicts of
    many quick ones, and a call cut short leaves the largest for the next. With ``case_parts`` above 1 each task is
    measured in that many parts of its cases (``kernelcast.kernels.harness.case_parts``; ``part``: this call's one alone),
    a row a part, and the task's row is written once all of its parts are in. ``shared_checks`` False: every child
    holds the GPU lock alone from its first call (``kernelcast measure --checks-alone``). ``reference_processes``:
    ``WorkerConfig.reference_processes``."""
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.null import null_candidate

    journal = out / "sweep.jsonl"
    _complete_parts(journal)
    done = {r["task"] for r in read_rows(journal)}
    todo = [t for t in tasks if t.key not in done]
    print(f"{len(tasks)} tasks, {len(done & {t.key for t in tasks})} done before, {len(todo)} to go", flush=True)
    if not todo:
        return
    started = time.monotonic()
    deadline = started + max_minutes * 60 if max_minutes is not None else None
    hardware = _hardware(mode)
    config = WorkerConfig(mode=mode, concurrency=concurrency, reserve_timing_core=reserve_timing_core, anchor=anchor,
                          shared_checks=shared_checks, reference_processes=reference_processes)
    with journal.open("a") as sink:
        def write(row: dict) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(task_line(row), flush=True)

        imported = []
        for task, op, seconds, error in import_all(todo, import_workers):
            if op is None:
                write(_row(task, None, seconds, error, mode=mode))
            else:
                imported.append((_size(op, mode), task, op, seconds))
        # only a GPU's timing can stand for a later call's null to be timed against
        kept = _Kept(out / "references.jsonl", hardware.device_name) if mode == "gpu" else None
        if case_parts > 1:
            imported = _in_parts(imported, out, mode, case_parts, part, kept, done)
        imported = order(imported, _capability(mode))
        names = {}
        for _, task, op, _ in imported:
            names[op.seed_candidates()[0].candidate_id] = (task.key, "reference")
            names[null_candidate(op).candidate_id] = (task.key, "null")
        with MeasureWorker(hardware, config) as worker:
            print(f"cores: the lock holder on {list(worker.cores.timing)}, children compiling on "
                  f"{len(worker.cores.compile)} others" if worker.cores.reserved else "cores: none reserved", flush=True)
            timeline = Journal(worker, out / "timeline.jsonl", names)
            try:
                _measure_chunks(worker, imported, names, chunk_size, deadline, max_minutes, mode, write, kept)
            finally:
                timeline.close()
            wall = time.monotonic() - started
        _complete_parts(journal, write)  # the tasks whose last part this call measured
    print(f"this call: {wall:.0f} s wall, the device held {worker.held_gpu_seconds:.0f} s "
          f"({worker.busy_gpu_seconds:.0f} device-seconds charged to the children)", flush=True)
    breakdown = lock_breakdown(worker.timeline)  # where the children's time went: compiling, checks, timing
    (out / f"breakdown-{int(time.time())}.json").write_text(json.dumps(
        {"wall_s": round(wall, 1), "device_s": round(worker.busy_gpu_seconds, 1),
         "device_held_s": round(worker.held_gpu_seconds, 1), "segments": breakdown}, indent=1))
    for name, b in breakdown.items():
        print(f"  {name:<16} median {b['median_s']:7.3f} s, total {b['total_s']:8.1f} s over {b['children']} children",
              flush=True)


def _in_parts(imported: list, out: Path, mode: str, n: int, only: int | None, kept, done: set) -> list:
    """The imported (size, task, op, seconds) items as their parts' items (``case_parts``), leaving out the parts
    already in ``done`` and, with ``only``, every part but that one.
    A reference kept for a whole task is sliced for each of its parts that has none of its own."""
    items = []
    for _, task, op, seconds in imported:
        record = kept.get(task.key) if kept is not None else None
        record = record if record is not None and record["op"] == op.name else None
        try:
            parts = partition(out, task.key, op, mode, n, record)
        except ValueError as exc:  # the task changed since its parts were made: measured by nothing, said why
            print(f"  {task.key}: not measured: {exc}", flush=True)
            continue
        names = [c.name for c in mode_cases(op, mode)]
        for i, indices in enumerate(parts, 1):
            key = part_key(task.key, i, len(parts))
            if (only is not None and i != only) or key in done:
                continue
            part_op = part_operation(op, indices, i, len(parts), mode)
            if record is not None and kept.get(key) is None:
                kept.found[key] = sliced_reference(record, indices, names, part_op)
            items.append((_size(part_op, mode), Task(key, task.format, task.path, part_op.name), part_op, seconds))
    return items


def _print_parts_pending(rows: list[dict], pending: set) -> None:
    """Name each task not done whose parts are partly in: which are, of how many."""
    got: dict[str, tuple[int, set]] = {}
    for r in rows:
        parsed = parse_part_key(r["task"])
        if parsed is not None and parsed[0] in pending:
            got.setdefault(parsed[0], (parsed[2], set()))[1].add(parsed[1])
    for task, (n, parts) in sorted(got.items()):
        said = ("they do not add up to its cases (made by different partitions): measure them again into one "
                "folder" if len(parts) == n else "its row comes when all are")
        print(f"{task}: parts {', '.join(map(str, sorted(parts)))} of {n} in; {said}", flush=True)


def _complete_parts(journal: Path, write=None) -> None:
    """Write the row of every task whose parts are all in ``journal`` but which has no row of its own yet: through
    ``write`` (a sweep's own, which prints it too), else appended to ``journal``."""
    for row in complete(read_rows(journal)):
        if write is not None:
            write(row)
        else:
            with journal.open("a") as sink:
                sink.write(json.dumps(row) + "\n")


class _Kept:
    """``references.jsonl``: references measured ok whose null was not yet in, kept for a later call on the same
    device (``kept_reference``)."""

    def __init__(self, path: Path, device: str):
        self.path, self.device = path, device
        self.found = read_references(path, device)

    def get(self, key: str) -> dict | None:
        return self.found.get(key)

    def add(self, key: str, record: dict) -> None:
        with self.path.open("a") as sink:
            sink.write(json.dumps({"task": key, **record}) + "\n")
        self.found[key] = record


def _timed_windows(worker, candidate_id: str) -> int:
    return sum(1 for cid, _, phase, _, _ in worker.timeline if cid == candidate_id and phase == "timed")


def checks_shared(timeline, candidate_id: str) -> bool | None:
    """Whether the candidate's first calls and checks held the GPU lock shared (``WorkerConfig.shared_checks``), from
    its ``locked`` mark; None where it never took the lock (refused or failed before the device)."""
    marks = [d for cid, _, phase, _, d in timeline if cid == candidate_id and phase == "locked"]
    return bool((marks[-1] or {}).get("shared")) if marks else None


def _measure_chunks(worker, imported: list, names: dict, chunk_size: int, deadline: float | None,
                    max_minutes: float | None, mode: str, write, kept: _Kept | None = None) -> None:
    """Measure the imported tasks' references and nulls a chunk at a time, writing each task's row when both are in
    (``names``: each reference's and null's candidate id -> (task key, role)). A reference ``kept`` from an earlier
    call on this device is not measured again: its null is timed against it."""
    from kernelcast.kernels.null import null_candidate

    for first, chunk in chunks(imported, chunk_size):
        if deadline is not None and time.monotonic() > deadline:
            print(f"stopping after {max_minutes:g} minutes; run again to go on", flush=True)
            return
        chunk_id = f"{int(time.time())}-{first}"
        pending = {task.key: (task, op, seconds, {}) for _, task, op, seconds in chunk}
        cands, earlier = [], {}
        for key, (task, op, _, got) in pending.items():
            record = kept.get(key) if kept is not None else None
            if record is not None and record["op"] == op.name:
                worker.reference_us[op.name] = tuple(record["us"])
                worker.reference_host_bound[op.name] = tuple(record["host_sensitive_cases"])
                got["reference"], earlier[key] = _stored_reference(record), record
                print(f"  {key} reference: kept from an earlier call ({record['measured_at']})", flush=True)
            else:
                cands.append(op.seed_candidates()[0])
            cands.append(null_candidate(op))
        for m in worker.measure(cands):
            key, role = names.get(m.candidate_id, (None, None))
            if key not in pending:
                continue
            task, op, seconds, got = pending[key]
            got[role] = m
            print(f"  {task.key} {role}: {m.status} after {m.wall_seconds:.1f} s ({m.gpu_seconds:.1f} s on the "
                  f"device)", flush=True)
            if role == "reference" and m.status == "ok" and len(got) == 1 and kept is not None:
                kept.add(key, kept_reference(m, kept.device, worker.reference_host_bound.get(m.op, ()),
                                             _timed_windows(worker, m.candidate_id)))
            if len(got) == 2:
                # timing windows per case: more than one where a case was host-bound (timed again)
                windows = {role: (earlier[key]["windows"] if role == "reference" and key in earlier
                                  else _timed_windows(worker, got[role].candidate_id)) for role in got}
                row = _row(task, op, seconds, "", got["reference"], got["null"], chunk=chunk_id, mode=mode,
                           windows=windows)
                if key in earlier:
                    row["reference_measured_in"] = f"an earlier call of the sweep ({earlier[key]['measured_at']})"
                # host-bound cases the null was timed beside the reference in (harness.anchoring._anchored)
                row.update(anchored_fields(worker.timeline, got["null"].candidate_id))
                row.update({f"{r}_checks_shared": checks_shared(worker.timeline, got[r].candidate_id)
                            for r in got if not (r == "reference" and key in earlier)})
                write(row)
            if deadline is not None and time.monotonic() > deadline + 60:  # a chunk far past the limit: cut it
                print("past the time limit inside a chunk; its unfinished tasks run next time", flush=True)
                return


def anchored_fields(timeline, candidate_id: str) -> dict[str, dict[str, float]]:
    """A candidate's cases timed beside the reference, from the worker's timeline: ``null_anchored``, each case's
    ratio as the harness used it (the median of per-round ratios), and ``null_anchored_ratio_of_medians``, the
    other estimate of the same pair, so one sweep compares the two."""
    marks = [d for cid, _, phase, _, d in timeline if cid == candidate_id and phase == "anchored"]
    return {"null_anchored": {d["case"]: round(d["ratio"], 4) for d in marks},
            "null_anchored_ratio_of_medians": {d["case"]: round(d.get("ratio_of_medians", d["ratio"]), 4)
                                               for d in marks}}


def _hardware(mode: str):
    import torch
    import triton

    from kernelcast.kernels.hardware import INTERPRETER, detect
    from kernelcast.kernels.records import HardwareSpec

    if mode == "gpu":
        return detect()
    return HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter", torch_version=torch.__version__,
                        triton_version=triton.__version__)


def shard(items, spec: str | None) -> list:
    """Every N-th item from the I-th, for ``spec`` "I/N" (None or '': all of them): one share a GPU of a host."""
    if not spec:
        return list(items)
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ValueError(f"bad --shard {spec!r}: give I/N with 0 <= I < N, e.g. 0/4")
    return list(items)[int(m.group(1))::int(m.group(2))]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's options but the task folder, the same for ``kernelcast sweep`` and the benchmark script."""
    p.add_argument("--out", default="kernelcast-sweep",
                   help="results folder: sweep.jsonl (resumable), sweep.md, summary.json (default: %(default)s)")
    p.add_argument("--max-minutes", type=float, default=None, help="start no new chunk of tasks after this long")
    p.add_argument("--match", default=None, help="only tasks whose path matches this regular expression")
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks (after --match)")
    p.add_argument("--shard", default=None, metavar="I/N", help="only every N-th task from the I-th (after --limit): "
                   "one sweep a GPU of a host, each with its own --out (their sweep.jsonl files concatenate)")
    p.add_argument("--shard-pending", action="store_true", help="share out only the tasks without a row in --out's "
                   "sweep.jsonl, so shards resuming from the same rows split what is left rather than what was")
    p.add_argument("--mode", choices=["auto", "gpu", "interpreter"], default="auto")
    p.add_argument("--concurrency", type=int, default=0, help="children at once (default: cores - 1, the worker's "
                                                               "default in kernelcast measure)")
    p.add_argument("--chunk", type=int, default=0, help="tasks imported and measured together (default: 2 x "
                                                        "concurrency)")
    p.add_argument("--no-reserve", action="store_true", help="no core kept for the child holding the GPU lock "
                                                            "(to compare with the default, which keeps one)")
    p.add_argument("--import-workers", type=int, default=0, help="processes importing the tasks at once before "
                   "the measurements start (default: half the cores, at most 8)")
    p.add_argument("--anchor", choices=("host-bound", "all", "off"), default="host-bound",
                   help="which of the null's cases are timed beside the reference in one process: the host-bound "
                        "ones (default), every case, or none")
    p.add_argument("--case-parts", type=int, default=1, metavar="N",
                   help="measure each task in N parts of its cases, a row a part, and write the task's row once all "
                        "are in: a task whose null outlasts one call finishes over several, or on several GPUs")
    p.add_argument("--part", type=int, default=None, metavar="I",
                   help="with --case-parts N: measure only part I (1 to N) of each task, e.g. one part a GPU")
    p.add_argument("--reference-processes", type=int, default=3, metavar="N", help="processes a task's reference is "
                   "measured in where its first finds a case host-sensitive; its stored runtime is the fastest "
                   "process's (default: %(default)s)")
    p.add_argument("--report-only", action="store_true", help="print the table and summary of what is done")
    p.add_argument("--checks-alone", action="store_true", help="every child holds the GPU lock alone from its first "
                                                               "call, its checks included (default: the checks of "
                                                               "small cases of known size beside other children's)")


def run(tasks_dir: str, args) -> int:
    """Sweep ``tasks_dir`` with the options of ``add_arguments``: resume, measure, print and write the report.

    Exit status 2, with the reason on stderr, when the folder is missing or holds no task."""
    out = Path(args.out).resolve()
    root = Path(tasks_dir).resolve()
    if not root.is_dir():
        print(f"no task folder at {root}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    # Before anything starts the harness's fork server: its children find the imported tasks here.
    os.environ["KERNELCAST_TASKS"] = str(out / "tasks")
    mode = args.mode
    if mode == "auto":
        import torch

        mode = "gpu" if torch.cuda.is_available() else "interpreter"
    if mode == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"  # read by Triton when first imported
    tasks = discover(root)
    if args.match:
        tasks = [t for t in tasks if re.search(args.match, t.key)]
    if args.limit:
        tasks = tasks[:args.limit]
    if args.shard_pending:
        done = {r["task"] for r in read_rows(out / "sweep.jsonl")}
        tasks = [t for t in tasks if t.key not in done]
    try:
        tasks = shard(tasks, args.shard)
        if args.case_parts < 1:
            raise ValueError(f"bad --case-parts {args.case_parts}: give a number of parts, 1 or more")
        if args.part is not None and not 1 <= args.part <= args.case_parts:
            raise ValueError(f"bad --part {args.part}: give a part from 1 to --case-parts ({args.case_parts})")
        if args.case_parts > 1:
            done = {r["task"] for r in read_rows(out / "sweep.jsonl")}
            check_parts(out, [t.key for t in tasks if t.key not in done], args.case_parts)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not tasks:
        print(f"no KernelBench problem or GPU MODE task under {root}", file=sys.stderr)
        return 2
    concurrency = args.concurrency or max(1, (os.cpu_count() or 2) - 1)
    if not args.report_only:
        sweep(tasks, out, mode=mode, concurrency=concurrency, max_minutes=args.max_minutes,
              chunk_size=args.chunk or 2 * concurrency, reserve_timing_core=False if args.no_reserve else None,
              anchor=args.anchor,
              import_workers=args.import_workers or min(8, max(1, (os.cpu_count() or 2) // 2)),
              case_parts=args.case_parts, part=args.part, shared_checks=not args.checks_alone,
              reference_processes=args.reference_processes)
    else:
        _complete_parts(out / "sweep.jsonl")  # parts measured into other folders, their rows gathered into this one
    keys = {t.key for t in tasks}
    every = read_rows(out / "sweep.jsonl")
    rows = [r for r in every if r["task"] in keys]
    _print_parts_pending(every, keys - {r["task"] for r in rows})
    summary = summarize(rows)
    modes = {r.get("mode") for r in rows} - {None, ""}  # a report of rows measured elsewhere says their mode
    summary.update(mode=modes.pop() if len(modes) == 1 else mode, anchor=args.anchor, tasks_swept=len(tasks),
                   tasks_done=len(rows), folder=str(root))
    text = markdown(rows, summary)
    (out / "sweep.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(text)
    measured = [r for r in rows if r.get("imported")]  # a task that could not be imported has a row, no candidate
    if measured and not any(r.get("reference_status") == "ok" or r.get("null_status") == "ok" for r in measured):
        print(f"no task's reference or null was ok ({len(measured)} tasks measured); the report says why",
              file=sys.stderr)
        return 1
    return 0
