"""A measured corpus of LLM-written kernels: children of chosen parents, written by a model, measured on a GPU.

    python -m benchmarks.llm_corpus import-tasks --out ROOT TASK_DIR_OR_FILE ...
    python -m benchmarks.llm_corpus generate --out ROOT --url URL --model NAME --model-sha256 HASH --round 1
    python -m benchmarks.llm_corpus measure --out ROOT --max-minutes 8
    python -m benchmarks.llm_corpus generate --out ROOT ... --round 2      # feedback, and children of the best
    python -m benchmarks.llm_corpus summary --out ROOT [--markdown FILE]

It goes through the search's own parts: children come from ``LLMGenerator`` in free-form
mode (the prompt, the static checks and their drop reasons, the provenance rows), are
written to the same ``candidates`` and ``provenance`` tables, and are measured by
``measure_and_store`` through the isolated harness, as a search's measure step does. What
differs from a search is the choice of parents and that nothing is forecast: a corpus
measures every child, so that forecasters can later be fit and judged on all of them.

Parents, per template operation, from a measured pool: its best variant, a median one
and a poor one (the 10th percentile of speedup); per imported task, its reference.
Round 1 asks ``--children`` rewrites of each, spread over ``--temperatures``. A later
round asks ``--children`` more of each base parent, now shown how its earlier children
fared (status and error), plus rewrites of the best measured children of earlier rounds
(``--best-children`` per operation). Rounds are resumable: a round's requests are seeded
by (round, parent, index), and a child already stored is not stored twice.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POOL = str(REPO / "data" / "pools")


def _root(uri: str):
    from kernelcast.storage.dataset import DataRoot

    return DataRoot(uri)


# ---- parents ---------------------------------------------------------------------------------------

def pool_parents(pool: str, gpu_type: str, ops: list[str]) -> list[tuple[str, str, float]]:
    """(op, candidate_id, speedup) of each op's best, median and poor (10th percentile) template variant."""
    return [(op, c.candidate_id, speedup) for op, c, speedup in _pool_parents(_root(pool), gpu_type, ops)]


def _pool_parents(root, gpu_type: str, ops: list[str]) -> list[tuple]:
    """(op, Candidate, speedup) of each op's best, median and poor template variant on ``gpu_type``."""
    from kernelcast.tasks.generators import template_roots

    return [(op, c, speedup) for op in ops for c, speedup in template_roots(root.uri, op, gpu_type, fallback=False)]


def _candidates(root, op: str) -> dict:
    from kernelcast.storage.schema import candidates_from_frame

    frame = root.read_candidates(op=op)
    return {c.candidate_id: c for c in candidates_from_frame(frame)} if not frame.empty else {}


def _measured(root, op: str, gpu_type: str) -> pd.DataFrame:
    frame = root.read_measurements(op=op, gpu_type=gpu_type)
    return frame.drop_duplicates("candidate_id", keep="last") if not frame.empty else frame


def base_parents(args) -> list:
    """The round's base parents as ``Parent``s (without feedback): pool variants and imported references."""
    from kernelcast.kernels.formats import installed
    from kernelcast.kernels.ops import OPERATIONS, get_operation
    from kernelcast.tasks.llm_generator import Parent

    ops = [o for o in (args.ops.split(",") if args.ops else OPERATIONS)]
    parents = [Parent(candidate, speedup, "ok") for _, candidate, speedup in
               _pool_parents(_root(args.pool), args.gpu_type, ops)]
    for name in installed():
        if name in _imported(args.out):
            parents.append(Parent(get_operation(name).seed_candidates()[0], 1.0, "ok"))
    return parents


def _imported(out: str) -> set[str]:
    from kernelcast.kernels.formats import stored_task_names
    from kernelcast.storage.dataset import DataRoot

    return set(stored_task_names(DataRoot(out)))


def _feedback(root, gpu_type: str, op: str) -> dict[str, tuple[str, ...]]:
    """Per parent id, how its measured children of ``op`` fared, most recent first (what its next prompt is
    told); one read of each table per op."""
    from kernelcast.tasks.llm_generator import FEEDBACK_LINES, feedback_line

    cands, m = root.read_candidates(op=op), _measured(root, op, gpu_type)
    if cands.empty or m.empty:
        return {}
    rows = m.merge(cands[["candidate_id", "parent_id"]], on="candidate_id").dropna(subset=["parent_id"])
    rows = rows.sort_values("measured_at", ascending=False)
    return {pid: tuple(feedback_line(r.status, r.speedup if r.speedup == r.speedup else None, r.error or "")
                       for r in group.head(FEEDBACK_LINES).itertuples())
            for pid, group in rows.groupby("parent_id", sort=False)}


def best_children(root, gpu_type: str, ops: list[str], per_op: int, exclude: set[str]) -> list:
    """The ``per_op`` fastest measured LLM children of each op (not already a parent), as ``Parent``s."""
    from kernelcast.tasks.llm_generator import Parent

    out = []
    for op in ops:
        m = _measured(root, op, gpu_type)
        if m.empty:
            continue
        cands = _candidates(root, op)
        llm = m[(m["status"] == "ok") & m["candidate_id"].map(lambda i: i in cands and cands[i].origin == "llm")]
        llm = llm[~llm["candidate_id"].isin(exclude)].sort_values(["speedup", "candidate_id"], ascending=False)
        out += [Parent(cands[r.candidate_id], float(r.speedup), "ok") for r in llm.head(per_op).itertuples()]
    return out


# ---- commands ------------------------------------------------------------------------------------

def _staged_gpumode(task: Path, staged: Path) -> Path:
    """A GPU MODE task folder with the shared helpers its task.yml names from one level up (``../utils.py``)."""
    import shutil

    import yaml

    folder = staged / task.name
    shutil.copytree(task, folder)
    spec = yaml.safe_load((task / "task.yml").read_text()) or {}
    for entry in spec.get("files", ()):
        source = str(entry.get("source", ""))
        if source.startswith("../") and source.endswith(".py") and (task / source).is_file():
            shutil.copy(task / source, folder / entry["name"])
    return folder


def cmd_import(args) -> int:
    """Import KernelBench problem files and GPU MODE task folders as operations stored under the corpus root."""
    from kernelcast.kernels.formats import import_task

    root = _root(args.out)
    for path in map(Path, args.tasks):
        t0 = time.perf_counter()
        if path.is_dir():
            with tempfile.TemporaryDirectory() as staged:
                op, _ = import_task("gpumode", str(_staged_gpumode(path, Path(staged)) / "reference.py"),
                                    name=path.name.removesuffix("_py"), root=root)
        else:
            op, _ = import_task("kernelbench", str(path), root=root)
        print(f"imported {op.name} ({len(op.cases)} cases) in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def cmd_generate(args) -> int:
    """Ask the model for one round of children; store them with their provenance as each request batch ends.

    The work is cut into jobs of ``--job-size`` requests for one (parent, temperature), run
    ``--jobs`` at a time so the engine always has a full batch; each job's children are
    written when it ends and its key noted, so a rerun of the round (after a deadline or a
    lost machine) asks only the jobs not yet done.
    """
    import threading

    from kernelcast.kernels.formats import install_from_root
    from kernelcast.tasks.llm_generator import LLMGenerator, Parent, fingerprints

    root = _root(args.out)
    for name in _imported(args.out):
        install_from_root(root, name)

    def generator() -> LLMGenerator:  # one per job: a generator's counts and provenance are per call
        return LLMGenerator(args.url, args.model, mode="source", concurrency=args.job_size,
                            max_tokens_source=args.max_tokens, timeout_s=args.timeout, model_sha256=args.model_sha256,
                            measure_anyway=frozenset(filter(None, args.measure_anyway.split(","))))

    generator().probe()
    base = base_parents(args)
    parents = list(base)
    if args.round > 1:
        ops = sorted({p.candidate.op for p in base})
        parents = best_children(root, args.gpu_type, ops, args.best_children, {p.candidate.candidate_id for p in base})
        feedback = {op: _feedback(root, args.gpu_type, op) for op in ops}
        parents += [Parent(p.candidate, p.speedup, p.status, feedback[p.candidate.op].get(p.candidate.candidate_id, ()))
                    for p in base]
    for p in parents:  # the parents themselves are measured in the corpus too, on the same machine
        root.write_candidates([p.candidate])
    temperatures = [float(t) for t in args.temperatures.split(",")]
    run_id = f"corpus-r{args.round}"
    rounds = Path(args.out) / "rounds"
    rounds.mkdir(parents=True, exist_ok=True)
    done_path = rounds / f"round{args.round}.done"
    done = set(done_path.read_text().split()) if done_path.exists() else set()
    jobs = []
    for pi, p in enumerate(parents):
        for ti, temperature in enumerate(temperatures):
            n = args.children // len(temperatures) + (ti < args.children % len(temperatures))
            for start in range(0, n, args.job_size):
                key = f"{p.candidate.candidate_id}:{temperature}:{start}"
                if key not in done:
                    jobs.append((key, p, temperature, min(args.job_size, n - start),
                                 (args.round * 1000 + ti) * 10_000 + pi * 100 + start))
    seen = {op: fingerprints(_candidates(root, op).values()) for op in {p.candidate.op for p in parents}}
    lock = threading.Lock()
    totals: dict[str, Counter] = {}
    deadline = time.monotonic() + 60 * args.max_minutes if args.max_minutes else math.inf
    finished: list[str] = []
    t0 = time.perf_counter()
    print(f"round {args.round}: {len(parents)} parents, {len(jobs)} jobs to ask ({len(done)} done before)", flush=True)

    def one(job):
        key, parent, temperature, n, seed = job
        if time.monotonic() > deadline:
            return
        g = generator()
        op = parent.candidate.op
        kids = g.propose(op, [parent] * n, None, seed=seed, seen=seen[op], temperature=temperature, run_id=run_id,
                         generation=args.round)
        root.write_candidates(kids)
        root.write_records([g.provenance_[c.candidate_id] for c in kids])
        with lock:
            counts = totals.setdefault(op, Counter())
            counts.update(g.last_counts_.screened)
            counts["asked"] += g.last_counts_.asked
            counts["children"] += len(kids)
            with open(done_path, "a") as f:
                f.write(key + "\n")
            finished.append(key)
            write_report()

    report_path = rounds / f"round{args.round}.json"
    prior = json.loads(report_path.read_text()) if report_path.exists() else {"by_op": {}, "seconds": 0.0}

    def write_report() -> None:
        """The round's counts so far, earlier runs of it included: written after every job, so a killed
        run loses none of what it asked."""
        by_op = {op: dict(Counter(prior["by_op"].get(op, {})) + totals.get(op, Counter()))
                 for op in set(prior["by_op"]) | set(totals)}
        report = {"round": args.round, "model": args.model, "model_sha256": args.model_sha256,
                  "parents": len(parents), "seconds": prior["seconds"] + time.perf_counter() - t0, "by_op": by_op,
                  "total": dict(sum((Counter(c) for c in by_op.values()), Counter()))}
        report_path.write_text(json.dumps(report, indent=1, sort_keys=True))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, jobs))
    seconds = time.perf_counter() - t0
    total = sum(totals.values(), Counter())
    left = len(jobs) - len(finished)
    print(f"round {args.round}: asked {total['asked']}, kept {total['children']} in {seconds:.0f} s "
          f"({60 * total['asked'] / max(seconds, 1e-9):.0f} answers/min); {left} jobs left; dropped: "
          + ", ".join(f"{k} {v}" for k, v in sorted(total.items()) if k not in ("asked", "children")), flush=True)
    return 0


def cmd_measure(args) -> int:
    """Measure every stored candidate of the corpus not yet measured on this GPU, in chunks, until the deadline."""
    from kernelcast.infra.measure import LocalMeasurePool, LocalMeasurer
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.tasks.search import measure_and_store

    root = _root(args.out)
    for name in _imported(args.out):
        install_from_root(root, name)
    if args.interpreter:  # correctness only, under Triton's CPU interpreter: a check of the pipeline, no timings
        measurer = LocalMeasurer(concurrency=args.concurrency, timeout_s=args.timeout, mode="interpreter")
    else:
        measurer = LocalMeasurer(concurrency=args.concurrency, timeout_s=args.timeout, gpu_timeout_s=args.gpu_timeout)
    pool = LocalMeasurePool([measurer])
    gpu_type = measurer.gpu_type
    deadline = time.monotonic() + 60 * args.max_minutes
    t0, measured = time.perf_counter(), 0
    try:
        while time.monotonic() < deadline:
            batches = _unmeasured(root, gpu_type, args.chunk, args.shard)
            if not batches:
                if not args.follow:
                    break
                time.sleep(5)  # a generate run beside this one stores more children as its jobs end
                continue
            for op, batch in batches:
                if time.monotonic() > deadline:
                    break
                pool.prepare(op, gpu_type)
                found, _ = measure_and_store(root, pool, batch, gpu_type)
                measured += len(batch)
                statuses = Counter(m.status for m in found.values())
                print(f"{op}: {len(batch)} measured ({dict(statuses)}); {measured} in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
        if _unmeasured(root, gpu_type, args.chunk, args.shard):
            print("deadline reached; rerun to continue", flush=True)
    finally:
        pool.close()
    elapsed = time.perf_counter() - t0
    print(f"measured {measured} candidates in {elapsed:.0f} s ({60 * measured / max(elapsed, 1e-9):.0f}/min)")
    return 0


def _unmeasured(root, gpu_type: str, chunk: int, shard: str = "0/1") -> list[tuple[str, list]]:
    """(op, candidates) chunks of what is stored and not measured on ``gpu_type``, oldest first; with
    ``shard`` "i/n", only the candidates whose id is i modulo n (n measure runs share the work)."""
    index, count = map(int, shard.split("/"))
    from kernelcast.storage.schema import candidates_from_frame

    frame = root.read_candidates()
    measurements = root.read_measurements()
    done = set(measurements[measurements["gpu_type"] == gpu_type]["candidate_id"]) if not measurements.empty \
        else set()
    todo = [c for c in candidates_from_frame(frame.sort_values(["created_at", "candidate_id"]))
            if c.candidate_id not in done and int(c.candidate_id, 16) % count == index]
    by_op: dict[str, list] = {}
    for c in todo:
        by_op.setdefault(c.op, []).append(c)
    batches = [(op, cs[i:i + chunk]) for op, cs in by_op.items() for i in range(0, len(cs), chunk)]
    return sorted(batches, key=lambda b: min(c.created_at for c in b[1]))


def corpus_table(out: str, gpu_type: str) -> pd.DataFrame:
    """One row per LLM child: its op, parent, round, status, speedup, the parent's speedup and the ratio."""
    root = _root(out)
    cands = root.read_candidates()
    meas = root.read_measurements(gpu_type=gpu_type).drop_duplicates("candidate_id", keep="last")
    prov = root.read("provenance")
    kids = cands[cands["origin"] == "llm"].merge(prov[["candidate_id", "generation", "temperature", "model"]],
                                                 on="candidate_id", how="left")
    kids = kids.drop_duplicates("candidate_id")
    m = meas.set_index("candidate_id")
    kids["status"] = kids["candidate_id"].map(m["status"])
    kids["speedup"] = kids["candidate_id"].map(m["speedup"])
    kids["error"] = kids["candidate_id"].map(m["error"])
    kids["parent_speedup"] = kids["parent_id"].map(m["speedup"])
    kids["vs_parent"] = kids["speedup"] / kids["parent_speedup"]
    return kids


def cmd_summary(args) -> int:
    """Counts by status and op, the speedup against the parent, how many beat it, the fastest new kernels."""
    kids = corpus_table(args.out, args.gpu_type)
    measured = kids[kids["status"].notna()]
    lines = [f"# LLM corpus: {len(kids)} children, {len(measured)} measured on {args.gpu_type}", ""]
    statuses = ["ok", "compile_error", "runtime_error", "incorrect", "timeout", "crashed", "rejected"]
    table = measured.groupby("op")["status"].value_counts().unstack(fill_value=0).reindex(columns=statuses,
                                                                                          fill_value=0)
    table.loc["all"] = table.sum()
    lines += ["## Status by operation", "", "| op | " + " | ".join(statuses) + " | total |",
              "|---|" + "---|" * (len(statuses) + 1)]
    lines += [f"| {op} | " + " | ".join(str(int(v)) for v in row) + f" | {int(row.sum())} |"
              for op, row in table.iterrows()]
    ok = measured[(measured["status"] == "ok") & measured["vs_parent"].notna()]
    q = ok["vs_parent"].quantile([0.1, 0.25, 0.5, 0.75, 0.9]) if len(ok) else pd.Series(dtype=float)
    lines += ["", "## Speedup of valid children over their parent", "",
              f"{len(ok)} valid children with a measured parent. Quantiles of child/parent: "
              + ", ".join(f"p{int(100 * k)} {v:.3f}" for k, v in q.items()), ""]
    for label, lo in (("beat the parent (> 1.00x)", 1.0), ("by more than 5%", 1.05), ("by more than 20%", 1.2)):
        lines.append(f"- {label}: {int((ok['vs_parent'] > lo).sum())}")
    within = int(((ok["vs_parent"] - 1).abs() <= 0.02).sum())
    lines.append(f"- within 2% of the parent (copies in effect, or nearly): {within}")
    by_round = measured.groupby("generation")["status"].value_counts().unstack(fill_value=0)
    lines += ["", "## Status by round", "", by_round.to_markdown() if hasattr(by_round, "to_markdown")
              else by_round.to_string()]
    top = ok.sort_values("vs_parent", ascending=False).head(args.top)
    lines += ["", f"## The {len(top)} children that beat their parent by most", ""]
    for r in top.itertuples():
        lines += [f"### {r.op}: {r.speedup:.3f}x over eager ({r.vs_parent:.3f}x its parent {r.parent_id}), "
                  f"candidate {r.candidate_id}, round {r.generation}, temperature {r.temperature}", "",
                  "```python", r.source.strip(), "```", ""]
    text = "\n".join(lines) + "\n"
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("import-tasks")
    sp.add_argument("tasks", nargs="+", help="KernelBench problem files, GPU MODE task folders")
    sp.set_defaults(func=cmd_import)
    sp = sub.add_parser("generate")
    sp.add_argument("--url", required=True)
    sp.add_argument("--model", required=True)
    sp.add_argument("--model-sha256", default="")
    sp.add_argument("--round", type=int, default=1)
    sp.add_argument("--children", type=int, default=24, help="rewrites asked per parent")
    sp.add_argument("--best-children", type=int, default=2, help="round > 1: best children per op made parents")
    sp.add_argument("--temperatures", default="0.7,1.0")
    sp.add_argument("--job-size", type=int, default=8, help="requests of one (parent, temperature) per job")
    sp.add_argument("--jobs", type=int, default=40, help="jobs in flight (jobs x job size: the engine's batch)")
    sp.add_argument("--max-minutes", type=float, default=0.0, help="start no job after this (0: no limit)")
    sp.add_argument("--max-tokens", type=int, default=1024)
    sp.add_argument("--measure-anyway", default="undefined",
                    help="static checks whose children are measured rather than dropped (comma-separated; the "
                         "corpus measures them so that forecasters learn real failures; '' drops them as a search does)")
    sp.add_argument("--timeout", type=float, default=600.0)
    sp.add_argument("--pool", default=DEFAULT_POOL)
    sp.add_argument("--ops", default="", help="comma-separated template ops (default: all)")
    sp.set_defaults(func=cmd_generate)
    sp = sub.add_parser("measure")
    sp.add_argument("--max-minutes", type=float, default=8.0)
    sp.add_argument("--concurrency", type=int, default=0)
    sp.add_argument("--chunk", type=int, default=64)
    sp.add_argument("--shard", default="0/1", help="i/n: measure only the candidates whose id is i modulo n, so that "
                    "n runs beside each other share the work (each waits for its own slowest child, not the others')")
    sp.add_argument("--follow", action="store_true",
                    help="keep measuring what a generate run beside this one stores, until the deadline")
    sp.add_argument("--interpreter", action="store_true", help="check correctness on the CPU instead (no timings)")
    # A model-written kernel may spin forever; while it holds the GPU nothing else is measured.
    sp.add_argument("--gpu-timeout", type=float, default=30.0, help="seconds a candidate may hold the GPU")
    sp.add_argument("--timeout", type=float, default=180.0, help="seconds a candidate may take in all")
    sp.set_defaults(func=cmd_measure)
    sp = sub.add_parser("summary")
    sp.add_argument("--markdown", default="")
    sp.add_argument("--top", type=int, default=5)
    sp.set_defaults(func=cmd_summary)
    for sp in sub.choices.values():
        sp.add_argument("--out", required=True, help="the corpus's data root (a local folder)")
        sp.add_argument("--gpu-type", default="h100")
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
