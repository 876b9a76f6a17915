"""Crash-resume drills: kill -9 a search at random points, rerun it until it finishes, compare with an unbroken run.

Each drill runs a search as a real child process (this file, ``child`` mode: the Search core
of ``tasks/search.py`` on the replay backend against the committed pool, without Prefect,
whose start-up would dwarf the search), kills it with SIGKILL at a seeded random point (a
random event of its trace, then a random delay of up to 50 ms), and reruns it with the same
run id, killing again, until a rerun finishes. The finished data root must then hold the
same archive as an uninterrupted reference run of the same config and seed: the same
generations table, best candidate, measured candidates and decisions; every measurement key
exactly once in the files themselves (not only after the readers' de-duplication); and
every visible Parquet file whole.

The child writes a trace (one line per event, unbuffered) so that each kill can be placed:
during start-up, between writes of a generation, or inside a table write (and inside the
file's write-and-rename when a hidden temp file is left behind).

    PYTHONPATH=$PWD python benchmarks/drills.py --drills 10 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Many short generations: most of a run is then generations and their writes, where kills matter.
DRILL_CONFIG = dict(op="softmax", gpu_type="h100", budget=64, generations=16, children=48, surrogate="roofline",
                    seed=7, backend="replay", run_id="drill")
# Columns of the generations table that timing or a resumed run may change without the search differing.
_UNSTABLE = ("wall_seconds", "overhead_seconds", "finished_at", "reused")


# ---- the child: one search, traced -------------------------------------------------------

class _Trace:
    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, event: str) -> None:
        os.write(self.fd, f"{time.time():.6f} {event}\n".encode())  # unbuffered: survives SIGKILL


def child(config_json: str, trace_path: str) -> int:
    """Run one search to the end (resuming its run id), tracing start-up, generations and table writes."""
    trace = _Trace(trace_path)
    from kernelcast.storage.dataset import DataRoot, RetryPolicy
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.search import Search
    from kernelcast.tasks.setup import forecaster, measure_pool, resolve

    class TracedRoot(DataRoot):
        def write(self, table, rows):
            trace(f"write-begin {table}")
            written = super().write(table, rows)
            trace(f"write-end {table} {written}")
            return written

    config = resolve(SearchConfig.from_mapping(json.loads(config_json)))
    root = TracedRoot(config.data, retry=RetryPolicy(budget_s=config.storage_retry_s))
    trace("ready")
    pool = measure_pool(config)
    try:
        search = Search(config, root, pool, forecaster(config, root)).start()
        trace("started")
        for g in range(config.generations):
            if search.should_stop():
                break
            trace(f"generation-begin {g}")
            search.run_generation(g)
            trace(f"generation-end {g}")
        result = search.finish()
    finally:
        pool.close()
    trace("done")
    print(json.dumps({"best_candidate_id": result.best_candidate_id, "best_speedup": result.best_speedup,
                      "budget_used": result.budget_used, "generations": len(result.generations)}))
    return 0


# ---- the parent: kill, rerun, compare ----------------------------------------------------

@dataclass
class Attempt:
    finished: bool
    killed_at: str = ""  # where the kill landed, from the trace
    result: dict = field(default_factory=dict)
    events: int = 0  # traced after "ready"


def _events(trace: Path) -> list[tuple[float, str]]:
    if not trace.exists():
        return []
    out = []
    for line in trace.read_text().splitlines():
        stamp, _, event = line.partition(" ")
        out.append((float(stamp), event))
    return out


def _temp_files(data: Path) -> set[str]:
    return {str(p) for p in data.rglob(".*.tmp")} if data.exists() else set()


def _where(events: list[str], new_temp_files: bool) -> str:
    """Where in the search the last traced event leaves the killed process."""
    generations = [e for e in events if e.startswith("generation-")]
    if "started" not in events:
        phase = "start-up"
    elif generations and generations[-1].startswith("generation-begin"):
        phase = f"generation {generations[-1].split()[1]}"
    else:
        phase = "between generations"
    writes = [e for e in events if e.startswith("write-")]
    if writes and writes[-1].startswith("write-begin"):
        return f"{phase}, inside a write of {writes[-1].split()[1]}" + (" (temp file left)" if new_temp_files else "")
    return f"{phase}, between writes"


def _seen_in_order(events: list[str], wanted: tuple[str, ...]) -> bool:
    i = 0
    for e in events:
        if i < len(wanted) and e.startswith(wanted[i]):
            i += 1
    return i == len(wanted)


def run_child(config: dict, trace: Path, kill_at: tuple[int, float] | None = None, kill_on: tuple[str, ...] = (),
              timeout_s: float = 300.0) -> Attempt:
    """One run of the search, killed at a point: ``kill_at`` = (n, s) is ``s`` seconds after its n-th
    traced event; ``kill_on`` is as soon as those events have been traced in that order (e.g. a
    generation's start, then a write in it). A point set by events, not by time since start, lands
    within the run however fast or loaded the machine is."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    trace.unlink(missing_ok=True)
    data = Path(config["data"])
    temps_before = _temp_files(data)
    with open(trace.with_suffix(".stderr"), "w+") as errors:  # a file, not a pipe nobody reads while polling
        process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "child", json.dumps(config),
                                    str(trace)], stdout=subprocess.PIPE, stderr=errors, env=env, text=True)
        deadline = time.monotonic() + timeout_s
        reached_at, killed = None, False
        while process.poll() is None and time.monotonic() < deadline:
            events = [e for _, e in _events(trace)]
            if kill_at is not None and reached_at is None and len(events) > kill_at[0]:
                reached_at = time.monotonic()
            due = (reached_at is not None and time.monotonic() - reached_at >= kill_at[1]) \
                or (bool(kill_on) and _seen_in_order(events, kill_on))
            if due:
                os.kill(process.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.005)
        if process.poll() is None and not killed:
            process.kill()
            process.wait()
            raise RuntimeError(f"the search child did not finish within {timeout_s:.0f} s")
        out, _ = process.communicate()
        errors.seek(0)
        err = errors.read()
    events = _events(trace)
    if process.returncode == 0:
        return Attempt(True, result=json.loads(out.strip().splitlines()[-1]), events=len(events) - 1)
    if not (killed and process.returncode == -signal.SIGKILL):
        raise RuntimeError(f"the search child failed with status {process.returncode}:\n{err[-3000:]}")
    where = _where([e for _, e in events], new_temp_files=bool(_temp_files(data) - temps_before))
    return Attempt(False, killed_at=where, events=len(events) - 1)


def physical_rows(data: Path, table: str):
    """Every row of every visible Parquet file of ``table``, without the readers' de-duplication,
    and the visible files that could not be read whole."""
    import pandas as pd
    import pyarrow.parquet as pq

    frames, broken = [], []
    for path in sorted((data / table).rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in path.relative_to(data).parts):
            continue
        try:
            frame = pq.read_table(path).to_pandas()
        except Exception as exc:  # noqa: BLE001 - a visible file that does not read is what we look for
            broken.append(f"{path.relative_to(data)}: {type(exc).__name__}: {exc}")
            continue
        for part in path.relative_to(data / table).parts[:-1]:
            column, _, value = part.partition("=")
            frame[column] = value
        frames.append(frame)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), broken


def _compare_tables(ref, got, op: str, gpu_type: str, run_id: str, problems: list[str]) -> set[str]:
    """Append to ``problems`` how the drilled tables differ from the reference's; returns the measurements missing."""

    def generations(root):
        frame = root.read_run_rows("generations", run_id, op=op).sort_values("generation")
        return frame.drop(columns=[c for c in _UNSTABLE if c in frame]).reset_index(drop=True)

    a, b = generations(ref), generations(got)
    if len(a) != len(b) or not a.equals(b):
        problems.append(f"generations table differs: reference {len(a)} rows, drilled {len(b)} rows")
    elif len(a) and a["best_candidate_id"].iloc[-1] != b["best_candidate_id"].iloc[-1]:
        problems.append("best candidate differs")

    def measured(root):
        frame = root.read_measurements(op=op, gpu_type=gpu_type)
        return {r.candidate_id: (r.status, r.speedup) for r in frame.itertuples()}

    ma, mb = measured(ref), measured(got)
    missing, extra = set(ma) - set(mb), set(mb) - set(ma)
    if missing or extra:
        problems.append(f"measured candidates differ: {len(missing)} missing, {len(extra)} extra")
    elif ma != mb:
        problems.append("a measured candidate's status or speedup differs")
    for table, key in (("decisions", ["generation", "candidate_id", "decision"]),
                       ("forecasts", ["generation", "candidate_id"]), ("candidates", ["candidate_id"])):
        rows_of = (lambda root: root.read_candidates(op)) if table == "candidates" else \
            (lambda root: root.read_run_rows(table, run_id, op=op))
        ka = set(map(tuple, rows_of(ref)[key].values.tolist()))
        kb = set(map(tuple, rows_of(got)[key].values.tolist()))
        if ka != kb:
            problems.append(f"{table} differ: {len(ka - kb)} missing, {len(kb - ka)} extra")
    return missing


def compare(reference: Path, drilled: Path, config: dict) -> tuple[list[str], dict]:
    """Differences between a drilled data root and the reference's (empty: the same archive), and counts."""
    from kernelcast.storage.dataset import DataRoot, StorageError

    problems: list[str] = []
    try:
        missing = _compare_tables(DataRoot(str(reference)), DataRoot(str(drilled)), config["op"],
                                  config["gpu_type"], config["run_id"], problems)
    except StorageError as exc:  # a visible file that does not read breaks the readers too
        problems.append(f"the drilled data root does not read: {exc}")
        missing = set()
    rows, broken = physical_rows(drilled, "measurements")
    duplicated = int(rows.duplicated(["candidate_id", "gpu_type"]).sum()) if len(rows) else 0
    if duplicated:
        problems.append(f"{duplicated} measurement rows duplicated in the files")
    for table in ("candidates", "forecasts", "decisions", "generations", "runs"):
        broken += physical_rows(drilled, table)[1]
    problems += [f"visible file does not read whole: {b}" for b in broken]
    visible = sum(1 for p in drilled.rglob("*.parquet") if not p.name.startswith("."))
    temps = sum(1 for p in drilled.rglob(".*.tmp"))
    return problems, {"measurements": int(rows["candidate_id"].nunique()) if len(rows) else 0,
                      "duplicated": duplicated, "missing": len(missing), "visible_files": visible,
                      "broken_files": len(broken), "hidden_temp_files": temps}


@dataclass
class DrillResult:
    index: int
    kills: list[str]
    runs: int
    problems: list[str]
    counts: dict

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.kills)


def reference_run(workdir: Path, config: dict) -> tuple[Path, int, dict]:
    """An uninterrupted run: its data root, how many events it traced after "ready", its result."""
    data = workdir / "reference"
    attempt = run_child({**config, "data": str(data)}, workdir / "reference.trace")
    return data, attempt.events, attempt.result


def drill(index: int, workdir: Path, config: dict, reference: Path, reference_events: int, rng: random.Random,
          max_kills: int = 3, kill_on: tuple[str, ...] = ()) -> DrillResult:
    """Kill the search up to ``max_kills`` times (after random delays, or first once ``kill_on`` is traced),
    then rerun it to the end, and compare it with the reference."""
    data = workdir / f"drill-{index}"
    cfg = {**config, "data": str(data)}
    kills, runs = [], 0
    for k in range(max_kills + 1):
        last = k == max_kills
        # A random event of a whole run (short of its last few, which 50 ms could outrun), then up to
        # 50 ms (a write takes some ms to some tens): the first run is always killed; a rerun, which
        # replays finished generations quickly, may finish first.
        point = None if last or kill_on else (rng.randrange(max(1, reference_events - 8)), rng.uniform(0.0, 0.05))
        attempt = run_child(cfg, workdir / f"drill-{index}-{k}.trace", kill_at=point,
                            kill_on=() if last else kill_on)
        runs += 1
        if attempt.finished:
            break
        kills.append(attempt.killed_at)
        kill_on = ()  # a trigger fires once; later reruns go to the end or take random kills
    problems, counts = compare(reference, data, config)
    if not kills:
        problems.append("no kill landed: every run finished before its delay")
    return DrillResult(index, kills, runs, problems, counts)


def report(results: list[DrillResult], config: dict, seconds: float) -> list[str]:
    kills = [k for r in results for k in r.kills]
    mid_gen = [k for k in kills if k.startswith("generation")]
    mid_write = [k for k in kills if "inside a write" in k]
    lines = [f"crash-resume drills: {config['op']} on {config['gpu_type']} (replay), {config['generations']} "
             f"generations, budget {config['budget']}, {config['children']} children, surrogate "
             f"{config['surrogate']}, seed {config['seed']}; kill -9, rerun with the same run id until it finishes",
             f"{'drill':>5}  {'kills':>5}  {'runs':>4}  result       where the kills landed"]
    for r in results:
        lines.append(f"{r.index:>5}  {len(r.kills):>5}  {r.runs:>4}  "
                     f"{'same archive' if r.passed else 'FAILED':<12} " + "; ".join(r.kills))
        lines += [f"{'':>13}problem: {p}" for p in r.problems]
    by_table = Counter(k.split("inside a write of ")[1].split()[0] for k in mid_write)
    lines.append(f"kills: {len(kills)} ({len(kills) - len(mid_gen)} during start-up or between generations, "
                 f"{len(mid_gen)} mid-generation; {len(mid_write)} inside a table write: "
                 + ", ".join(f"{t} {n}" for t, n in sorted(by_table.items())) + ")")
    lines.append(f"measurements: {sum(r.counts.get('duplicated', 0) for r in results)} duplicated, "
                 f"{sum(r.counts.get('missing', 0) for r in results)} missing over "
                 f"{sum(r.counts.get('measurements', 0) for r in results)} rows; visible files "
                 f"{sum(r.counts.get('visible_files', 0) for r in results)}, "
                 f"{sum(r.counts.get('broken_files', 0) for r in results)} not whole; hidden temp files left "
                 f"{sum(r.counts.get('hidden_temp_files', 0) for r in results)}")
    lines.append(f"drills passed {sum(r.passed for r in results)}/{len(results)} in {seconds:.0f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["child"]:
        return child(argv[1], argv[2])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drills", type=int, default=10)
    p.add_argument("--max-kills", type=int, default=3, help="kills per drill before a last run to the end")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill delays")
    p.add_argument("--out", default=None, help="folder for drills.json and drills.txt")
    p.add_argument("--work", default=None, help="folder for the drills' data roots (default: a temp folder)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="drills-") as tmp:
        workdir = Path(args.work or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        reference, reference_events, _ = reference_run(workdir, DRILL_CONFIG)
        rng = random.Random(args.seed)
        results = []
        for i in range(1, args.drills + 1):
            results.append(drill(i, workdir, DRILL_CONFIG, reference, reference_events, rng, args.max_kills))
            print(f"drill {i}: {'passed' if results[-1].passed else 'FAILED'} ({len(results[-1].kills)} kills)",
                  file=sys.stderr, flush=True)
    lines = report(results, DRILL_CONFIG, time.monotonic() - t0)
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "drills.txt").write_text("\n".join(lines) + "\n")
        (out / "drills.json").write_text(json.dumps(
            {"config": DRILL_CONFIG, "reference_events": reference_events, "seed": args.seed,
             "drills": [{"index": r.index, "kills": r.kills, "runs": r.runs, "problems": r.problems,
                         "passed": r.passed, **r.counts} for r in results]}, indent=2))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
