"""The search in the LLM regime: surrogate-filtered against the equal-budget random baseline, on a replayed corpus.

Every search here uses ``--generator replay``: the children are the ones a model wrote for
each parent when the corpus (``data/pools/llm`` by default) was made, and their measurements
(failures included) are the corpus's own, so this runs on a CPU and walks the tree a live
search would have met. For each operation with at least one parent in the corpus, seed and
budget, three kinds of run:

- the baseline (``surrogate none``): every child it asks for is measured, in the order the
  model answered, until the budget is spent; that is random selection among the children;
- one run per surrogate (``--surrogates``): 16 children asked per generation, forecast, and
  only what the policy selects measured;

under two budgets: ``measurements`` (``--budgets`` measurements each) and ``gpu-seconds`` (both
capped at the GPU-seconds the baseline spent at that budget, measurements no longer binding).
Per surrogate and budget it prints the geometric mean over (op, seed) of best(surrogate) /
best(baseline) (goal >= 1.10) and the median share of the baseline's budget the surrogate run
needed to reach the baseline's final best (goal <= 1/3; a run that never did counts as 2), and
per operation what the corpus's tree allows: children per parent, how many beat their parent,
and the headroom (best kernel in the tree over the best of its roots).

    python -m benchmarks.llm_search --seeds 3 --budgets 16 32 64 --surrogates learned source roofline \\
        --json docs/measured/llm_search/llm_search_replay.json --markdown docs/measured/llm_search/llm_search_replay.md

``--live URL`` runs the same comparison live: the children come from a model behind that
OpenAI-compatible endpoint (``--generator freeform``: whole rewritten sources, each search asking
its own), and they are compiled, checked and timed by the harness on this machine's GPU
(``--backend local``). Each search starts from the operation's eager reference, as a freeform
search does, so its first generation is the model's rewrites of it; with ``--roots POOL`` it starts
as the replayed tree does, from the op's best, median and poor template variants of that pool,
measured first, which the model then rewrites. Live runs are sampled twice over
(the model's answers and the GPU's timings), so single ratios are noisy. Several processes may
share one GPU (one ``--ops`` each, ``KERNELCAST_GPU_LOCK`` naming one lock file for them and the
engine); ``--summary-only --json A B ...`` makes one table of their runs.

    python -m benchmarks.llm_search --live http://127.0.0.1:8000/v1 --live-model qwen2.5-coder-1.5b \
        --ops softmax --seeds 1 --budgets 16 --surrogates learned --json live-softmax.json

``--failure-costs`` reads back the data roots such runs wrote (``--data``, one or more) and prints,
per budget kind, search and budget, what each run measured and what it charged to children that
failed: how much of the budget a forecast of failure kept for kernels that run.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import statistics
import sys
import time

from kernelcast.tasks.config import PACKAGED_CORPUS, SearchConfig
from kernelcast.tasks.setup import open_search

BASELINE = "none"
MODES = ("measurements", "gpu-seconds")


def corpus_ops(corpus: str) -> list[str]:
    """The corpus's operations whose tree has at least one parent with recorded children."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.replay import read_tree

    frame = DataRoot(corpus).read_candidates()
    ops = []
    for op in sorted(frame["op"].unique()) if not frame.empty else []:
        tree = read_tree(corpus, op)
        if any(tree.children.get(r.candidate_id) for r in tree.roots):
            ops.append(op)
    return ops


def tree_stats(corpus: str, op: str, gpu_type: str) -> dict:
    """What the recorded tree of ``op`` holds: parents, children per parent (before and after today's static
    checks), how many run, how many beat their parent, and the headroom over the best root."""
    from kernelcast.kernels.formats import submission_of
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.screen import screen
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.replay import read_tree

    tree = read_tree(corpus, op)
    m = DataRoot(corpus).read_measurements(op=op, gpu_type=gpu_type).set_index("candidate_id")
    speed = {cid: float(r.speedup) if r.status == "ok" and r.speedup else 0.0 for cid, r in m.iterrows()}
    parents = [p for p in tree.nodes() if tree.children.get(p.candidate_id)]
    kids = [k for p in parents for k in tree.children[p.candidate_id]]
    passing = [k for k in kids if screen(get_operation(op), k, submission_of(k.source), set())[0] is None]
    runs = [k for k in passing if speed.get(k.candidate_id, 0) > 0]
    beat = [k for k in runs if speed[k.candidate_id] > speed.get(k.parent_id, 0)]
    best_root = max(speed.get(r.candidate_id, 0) for r in tree.roots)
    best_all = max([best_root] + [speed.get(k.candidate_id, 0) for k in kids])
    return {"op": op, "roots": len(tree.roots), "parents": len(parents), "children": len(kids),
            "children_per_parent": len(kids) / len(parents), "pass_static_checks": len(passing), "run_ok": len(runs),
            "beat_parent": len(beat),
            "beat_parent_by_2pct": sum(speed[k.candidate_id] > 1.02 * speed.get(k.parent_id, 0) for k in runs),
            "best_root": best_root, "best_in_tree": best_all, "headroom": best_all / best_root if best_root else None}


def search_base(args, op: str, seed: int) -> dict:
    """The settings every search of one (op, seed) shares: replayed from the corpus, or live."""
    base = dict(op=op, generations=args.generations, seed=seed, data=args.data)
    if not args.live:
        return base | dict(gpu_type=args.gpu_type, backend="replay", generator="replay", replay_corpus=args.corpus)
    return base | dict(gpu_type=args.gpu_type, backend=args.backend, generator="freeform", generator_roots=args.roots,
                       **live_model_settings(args))


def add_live_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """The flags of a model behind an OpenAI-compatible endpoint writing a live search's children (``what``)."""
    p.add_argument("--live", default="", metavar="URL",
                   help=f"a model at this OpenAI-compatible endpoint writes {what}, the harness measures them here "
                        "(--backend)")
    p.add_argument("--live-model", default="qwen2.5-coder-1.5b", help="the model the --live endpoint serves")
    p.add_argument("--model-sha256", default="", help="its weights' SHA-256, recorded with every child")
    p.add_argument("--temperature", type=float, default=0.8, help="--live: the model's sampling temperature")
    p.add_argument("--max-tokens", type=int, default=1024, help="--live: most tokens of one rewritten source")
    p.add_argument("--concurrency", type=int, default=16,
                   help="--live: requests in flight per search (a batching server answers a generation at once)")


def live_model_settings(args) -> dict:
    """The search settings of the model ``add_live_arguments`` named: its endpoint, weights and sampling."""
    return dict(generator_url=args.live, generator_model=args.live_model, generator_model_sha256=args.model_sha256,
                generator_schema_style="json_object", generator_temperature=args.temperature,
                generator_max_tokens=args.max_tokens, generator_concurrency=args.concurrency)


def run_one(config: SearchConfig) -> dict:
    search = open_search(config, track=False)
    t0 = time.perf_counter()
    result = search.run()
    search.pool.close()
    return {"run_id": result.run_id, "best": result.best_speedup or 0.0, "best_candidate": result.best_candidate_id,
            "measurements": result.budget_used, "gpu_seconds": result.gpu_seconds,
            "compile_seconds": sum(search.compile_charges), "stop_reason": result.stop_reason,
            "trajectory": search.trajectory, "charges": search.charges,
            "costs": [g + c for g, c in zip(search.charges, search.compile_charges)],
            "roots_first": roots_first(search),
            "trusted": sum(s.trusted for s in result.generations), "dropped": sum(s.dropped for s in result.generations),
            "failed": sum(s.failed for s in result.generations), "seconds": time.perf_counter() - t0}


def roots_first(search) -> int:
    """How many of a search's first measurements were its roots (a measured pool's kernels it starts from)."""
    roots = {c.candidate_id for c in getattr(search.generator, "roots", ())}
    return next((i for i, cid in enumerate(search.charged_ids) if cid not in roots), len(search.charged_ids))


def _charged(run: dict, mode: str) -> list[float]:
    """What each of the run's measurements cost in ``mode``'s unit: 1 (measurements), its GPU-seconds
    (gpu-seconds) or its GPU plus compile seconds (gpu-compile-seconds)."""
    per = {"gpu-seconds": "charges", "gpu-compile-seconds": "costs"}.get(mode)
    return run[per] if per else [1] * len(run["trajectory"])


def beyond_roots(run: dict, target: float, mode: str) -> float | None:
    """``to_reach`` less what the run's first measurements, its roots, charged (both sides measure them first, at
    the same cost): 0 where a root reached ``target``; None when the run never did."""
    reached = to_reach(run, target, mode)
    if reached is None:
        return None
    return max(0.0, reached - sum(_charged(run, mode)[: run.get("roots_first", 0)]))


def to_reach(run: dict, target: float, mode: str) -> float | None:
    """Measurements (mode measurements), GPU-seconds (gpu-seconds) or GPU plus compile seconds
    (gpu-compile-seconds) the run charged until its best reached ``target``; None when it never did."""
    for best, used in zip(itertools.accumulate(run["trajectory"], max), itertools.accumulate(_charged(run, mode))):
        if best >= target:
            return used
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=PACKAGED_CORPUS)
    p.add_argument("--ops", default="corpus", help="comma-separated, or 'corpus': every op with a parent in it")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--surrogates", nargs="+", default=["learned", "roofline"],
                   help="surrogates to compare with the baseline (any name the search takes)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--gpu-type", default=None, help="replayed: the corpus's GPU type (h100); live: auto")
    p.add_argument("--data", default="/tmp/kernelcast-llm-search")
    add_live_arguments(p, "the children (search live)")
    p.add_argument("--max-minutes", type=float, default=math.inf,
                   help="start no (op, budget, seed) after this long; the rows finished are kept")
    p.add_argument("--backend", default="local", help="--live: where children are measured (local: this GPU)")
    p.add_argument("--roots", default="", metavar="POOL",
                   help="--live: start from the op's best, median and poor template variants of this measured pool "
                        "(the corpus's roots; default: the model first rewrites the eager reference)")
    p.add_argument("--json", nargs="+", default=[], help="write every run's numbers here (--summary-only: read "
                                                          "the runs of one or more such files)")
    p.add_argument("--markdown", default="", help="write the tables here")
    p.add_argument("--summary-only", action="store_true", help="only redo the tables from the runs in --json")
    p.add_argument("--failure-costs", nargs="+", default=[], metavar="DATA",
                   help="only print what the runs stored under these data roots charged to failures")
    args = p.parse_args(argv)
    args.gpu_type = args.gpu_type or ("auto" if args.live else "h100")
    if args.failure_costs:
        return write_summary(failure_costs(args.failure_costs), args.markdown)
    if args.summary_only:
        runs, trees = [], []
        for path in args.json:
            with open(path) as f:
                stored = json.load(f)
            runs += stored["runs"]
            trees += [t for t in stored["trees"] if t["op"] not in {seen["op"] for seen in trees}]
        return write_summary(summary(runs, trees, args), args.markdown)
    if len(args.json) > 1:
        p.error("a search writes one --json file; several are read only with --summary-only")
    if args.live and args.ops == "corpus":
        p.error("--live needs --ops: the operations to search")
    ops = corpus_ops(args.corpus) if args.ops == "corpus" else args.ops.split(",")
    # What the recorded tree allows, per op: of the corpus (replayed), or of the live runs' own data.
    trees = [] if args.live else [tree_stats(args.corpus, op, args.gpu_type) for op in ops]
    rows = []

    def save() -> None:  # after every row: a run cut short keeps what it finished
        if args.json:
            with open(args.json[0], "w") as f:
                json.dump({"trees": trees, "runs": rows}, f, indent=1)

    deadline = time.monotonic() + 60 * args.max_minutes
    for op, budget, seed in itertools.product(ops, args.budgets, range(args.seeds)):
        if time.monotonic() > deadline:
            print(f"--max-minutes {args.max_minutes:g} passed: no more searches started", flush=True)
            break
        base = search_base(args, op, seed)
        baseline = run_one(SearchConfig(**base, budget=budget, surrogate=BASELINE))
        for mode in args.modes:
            # At equal GPU-seconds: both capped at what the baseline spent, the measurement budget out of the way.
            limits = dict(budget=budget) if mode == "measurements" else \
                dict(budget=4 * budget, gpu_seconds_budget=max(baseline["gpu_seconds"], 1e-9))
            ref = baseline if mode == "measurements" else run_one(SearchConfig(**base, surrogate=BASELINE, **limits))
            scale = budget if mode == "measurements" else limits["gpu_seconds_budget"]
            for name in args.surrogates:
                run = run_one(SearchConfig(**base, surrogate=name, **limits))
                reached = to_reach(run, ref["best"], mode) if ref["best"] else None
                row = {"op": op, "budget": budget, "seed": seed, "mode": mode, "surrogate": name,
                       "generator": base["generator"], "backend": base["backend"],
                       "surrogate_best": run["best"], "baseline_best": ref["best"],
                       "ratio": run["best"] / ref["best"] if ref["best"] else None,
                       "to_baseline_best": reached, "share_of_baseline_budget": (reached / scale) if reached else None,
                       **{f"surrogate_{k}": run[k] for k in ("measurements", "gpu_seconds", "stop_reason", "trusted",
                                                             "dropped", "failed", "seconds")},
                       **{f"baseline_{k}": ref[k] for k in ("measurements", "gpu_seconds", "stop_reason", "failed")}}
                rows.append(row)
                save()
                print(json.dumps(row), flush=True)
    save()
    return write_summary(summary(rows, trees, args), args.markdown)


def write_summary(lines: list[str], markdown: str) -> int:
    print("\n".join(lines))
    if markdown:
        with open(markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def failure_costs(data: list[str]) -> list[str]:
    """Per (budget kind, search, budget): the mean over finished runs (the latest of each op and seed)
    of children measured, of those that failed, of GPU-seconds charged, and of those charged to failures."""
    from kernelcast.storage.dataset import DataRoot

    costs = collections.defaultdict(list)
    for uri in data:
        root = DataRoot(uri)
        finished = set(root.read("generations")["run_id"])
        measured = root.read("decisions").query("decision == 'measure'")
        kernels = root.read_measurements().drop_duplicates("candidate_id").set_index("candidate_id")
        latest = {}
        for r in root.read("runs").sort_values("created_at").itertuples():
            c = json.loads(r.config)
            mode = "gpu-seconds" if c.get("gpu_seconds_budget") else "measurements"
            budget = c["budget"] // 4 if mode == "gpu-seconds" else c["budget"]  # main's limits at equal GPU time
            if r.run_id in finished:
                latest[(mode, c["surrogate"], budget, r.op, c["seed"])] = r.run_id
        for (mode, name, budget, _, _), run_id in latest.items():
            mine = kernels.loc[measured.loc[measured["run_id"] == run_id, "candidate_id"]]
            failed = mine[mine["status"] != "ok"]
            costs[(mode, name, budget)].append((len(mine), len(failed), mine["gpu_seconds"].sum(),
                                                failed["gpu_seconds"].sum()))
    lines = ["| budget kind | search | budget | runs | measured | failed | GPU-seconds charged | ... to failures |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (mode, name, budget), runs in sorted(costs.items(), key=lambda kv: (MODES.index(kv[0][0]), kv[0][1:])):
        means = [statistics.mean(column) for column in zip(*runs)]
        lines.append(f"| {mode} | {name} | {budget} | {len(runs)} | {means[0]:.1f} | {means[1]:.1f} | "
                     f"{means[2]:.2f} | {means[3]:.2f} |")
    return lines


def summary(rows: list[dict], trees: list[dict], args) -> list[str]:
    """Markdown tables: per (mode, surrogate, budget) the two goals, then what each op's tree allows."""
    ops = sorted({r["op"] for r in rows})
    seeds = len({r["seed"] for r in rows})
    live = any(r.get("generator", "replay") != "replay" for r in rows)
    kind = ("Live search (generator freeform, the children measured by the harness on the GPU)" if live else
            "Replayed search on the corpus's recorded tree (generator replay, backend replay)")
    lines = [f"{kind}: {len(ops)} ops ({', '.join(ops)}) x {seeds} seeds; made by `python -m benchmarks.llm_search "
             f"{'--live URL ' if live else ''}--seeds {seeds} --budgets {' '.join(map(str, args.budgets))} "
             f"--surrogates {' '.join(args.surrogates)}`.", "",
             "| budget kind | surrogate | budget | runs | geomean best(surrogate) / best(baseline) | wins / ties / "
             "losses | reached the baseline's best | median share of the baseline's budget to get there | "
             "... of what the baseline spent | measurements (surrogate / baseline, mean) | failed measured "
             "(surrogate / baseline, mean) |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for mode, name, budget in itertools.product(args.modes, args.surrogates, args.budgets):
        mine = [r for r in rows if (r["mode"], r["surrogate"], r["budget"]) == (mode, name, budget) and r["ratio"]]
        if not mine:
            continue
        ratio = math.exp(statistics.mean(math.log(r["ratio"]) if r["ratio"] > 0 else math.log(1e-9) for r in mine))
        wins = sum(r["ratio"] > 1.0005 for r in mine)
        losses = sum(r["ratio"] < 0.9995 for r in mine)
        reached = sum(r["to_baseline_best"] is not None for r in mine)
        share = statistics.median(r["share_of_baseline_budget"] if r["share_of_baseline_budget"] is not None else 2.0
                                  for r in mine)
        # The baseline rarely spends its whole budget on these small trees: the same, against what it spent.
        unit = "baseline_measurements" if mode == "measurements" else "baseline_gpu_seconds"
        spent = statistics.median(r["to_baseline_best"] / r[unit] if r["to_baseline_best"] and r[unit] else 2.0
                                  for r in mine)
        lines.append(f"| {mode} | {name} | {budget} | {len(mine)} | **{ratio:.3f}** | {wins} / "
                     f"{len(mine) - wins - losses} / {losses} | {reached}/{len(mine)} | {share:.2f} | {spent:.2f} | "
                     f"{statistics.mean(r['surrogate_measurements'] for r in mine):.1f} / "
                     f"{statistics.mean(r['baseline_measurements'] for r in mine):.1f} | "
                     f"{statistics.mean(r['surrogate_failed'] for r in mine):.1f} / "
                     f"{statistics.mean(r['baseline_failed'] for r in mine):.1f} |")
    if not trees:
        return lines
    lines += ["", "| op | roots | parents | children | per parent | pass today's static checks | run ok | "
              "beat their parent (by > 2%) | best root | best in tree | headroom |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in trees:
        lines.append(f"| {t['op']} | {t['roots']} | {t['parents']} | {t['children']} | {t['children_per_parent']:.1f} "
                     f"| {t['pass_static_checks']} | {t['run_ok']} | {t['beat_parent']} ({t['beat_parent_by_2pct']}) | "
                     f"{t['best_root']:.3f} | {t['best_in_tree']:.3f} | {t['headroom']:.3f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
