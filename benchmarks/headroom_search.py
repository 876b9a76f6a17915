"""Searches where there is something to find: KernelBench level-2/3 problems whose fastest measured kernel ran
at 1.3x eager or more, searched live with execution variants from CUDA-L1's kernels, the surrogate against the
equal-budget baseline.

Each search is ``--generator variants`` rooted at the problem's kernels in the CUDA-L1 pool
(``generator_roots``: its best, median and poor imported kernel as measured there), so its children are those
kernels and the reference run another way (torch.compile in four modes, a CUDA graph, channels_last, cuDNN
autotuning) and their variants in turn; every child is compiled, checked and timed by the harness on this
machine's GPU (``--backend local``). The surrogates' prior is the pool itself without the searched problem
(``prior_scope other-ops``), on this GPU type.

Per problem, budget and seed: the baseline (``surrogate none``: the generator's children measured as they come,
each parent's variants in an order drawn from the seed) and each surrogate run at ``budget`` measurements; then
each surrogate again with a budget of GPU plus compile seconds equal to what the baseline spent
(``budget_kind gpu_compile_seconds``), the comparison the search's cost is really charged in. The runs of one
problem share a data root, so a child two runs chose is measured once and charged to both at its stored cost;
the order of baseline and surrogate alternates with the seed, since compile caches make the second compile of
related code cheaper. The reference's ``compile-default`` child is measured once per problem as well: the best
kernel found is reported against eager and against torch.compile.

    python -m benchmarks.headroom_search --budgets 8 16 32 --seeds 2 --shard 0/4 --data /tmp/hs0 --json hs0.json
    python -m benchmarks.headroom_search --summary-only --json hs0.json hs1.json --markdown docs/measured/headroom_search/X.md

``--problems`` names problems (``l2-017,...``); the default is the pool report's headroom list in the order
``--order-seed`` shuffles it into. ``--backend replay --replay-pool data/pools/headroom`` replays the live runs'
measured children (the variants they made, as recorded, with their measurements; a child no live run measured
comes back rejected) for more seeds, on a machine with no GPU:

    python -m benchmarks.headroom_search --problems l2-096,l2-098,l3-007,l3-017 --backend replay \
        --replay-pool data/pools/headroom --gpu-type h100 --seeds 10 --json replay.json

``--gpumode DIR,...`` adds GPU MODE task folders (imported here, searched from their reference alone, since the
pool holds no kernels of theirs): ``--problems none --gpumode .../helion/causal_conv1d_py,...`` searches only those.

``--live URL`` (with ``--live-model``, ``--model-sha256``, ``--temperature``, ``--max-tokens``, ``--concurrency``, as
``benchmarks.llm_search`` takes them) has a model behind that OpenAI-compatible endpoint (the project's engine:
``python -m kernelcast.infra.engine --model MODEL.gguf --port 8000 --gpu-lock LOCK``) rewrite the measured kernels as well:
generator ``freeform+variants``, the model's rewrites of the parents it picks first, then execution variants.

``--space`` measures each problem's variant space once instead (its roots, every variant of the reference and
of the roots, ``--space-depth 2`` their variants too), in one call of the pool so its children compile side by
side, into ``--data/<problem>``; every comparison is then a replay of it, at no GPU cost:

    python -m benchmarks.headroom_search --space --shard 0/4 --data /tmp/space0 --json space0.json
    python -m benchmarks.headroom_search --backend replay --replay-pool /tmp/space0 --gpu-type h100 --seeds 10

``--census DIR`` measures nothing: per space under DIR, the best of what both sides measure first (the reference and
the roots), the best kernel, what made it, and how far beyond the roots it lies.

``--space --live URL`` adds the model's rewrites to the space: ``--space-rewrites`` of each root (the reference where
the problem has none), asked once and measured beside the variants; a replay offers a root's rewrites with its
variants, so a surrogate is judged on choosing among them as well.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.llm_search import (BASELINE, add_live_arguments, beyond_roots, live_model_settings, run_one,
                                   to_reach)
from kernelcast.kernels.records import utc_now
from kernelcast.tasks.config import SearchConfig

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "data" / "pools" / "cudal1"
REPORT = ROOT / "docs" / "measured" / "cudal1_pool" / "cudal1_pool_h100_2026-11-26.json"
MODES = ("measurements", "gpu-compile-seconds")
TORCH_COMPILE = "variant:compile-default"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", default=str(POOL), help="the CUDA-L1 pool root (its kernelcast protocol's data root)")
    p.add_argument("--protocol", default="kernelcast")
    p.add_argument("--report", default=str(REPORT), help="the pool report whose headroom list is searched")
    p.add_argument("--problems", default="", help="l2-017,... (default: the report's headroom list; 'all': every "
                   "problem of the pool; 'none': only --gpumode tasks)")
    p.add_argument("--gpumode", default="", help="GPU MODE task folders to search as well (comma-separated, each "
                   "holding reference.py and task.yml): imported here, searched from their reference alone (the "
                   "pool has no kernels of theirs to start from); '--problems none' searches only these")
    p.add_argument("--order-seed", type=int, default=0, help="the headroom list is searched in this shuffled order")
    p.add_argument("--shard", default="", metavar="I/N", help="every N-th problem from the I-th")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--surrogates", nargs="+", default=["learned"])
    p.add_argument("--acquisition", default="thompson", help="the surrogate runs' acquisition (thompson, ei)")
    p.add_argument("--surrogate-folder", default="", metavar="DIR",
                   help="the folder a surrogate that reads one is given, {op} standing for the problem's name "
                        "(the oracle: the replayed root itself, --surrogate-folder data/pools/spaces/{op})")
    p.add_argument("--weigh-roots", action="store_true",
                   help="the surrogate weighs the roots (CUDA-L1's kernels) with the other children rather than "
                        "measuring them first (SearchConfig.weigh_roots); the baseline meets them first either way")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--gpu-type", default="auto")
    p.add_argument("--backend", default="local", help="local: this machine's GPU; replay: answers from "
                   "--replay-pool (a child it did not measure comes back rejected)")
    p.add_argument("--replay-pool", default="", help="--backend replay: a folder of per-problem data roots, as "
                   "live runs of this script leave under --data (data/pools/headroom); default: the pool's root")
    p.add_argument("--data", default="/tmp/kernelcast-headroom-search")
    p.add_argument("--max-minutes", type=float, default=math.inf, help="start no problem after this long")
    p.add_argument("--json", nargs="+", default=[], help="write every run here (--summary-only: read these)")
    p.add_argument("--markdown", default="")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--census", default="", metavar="DIR",
                   help="measure nothing: for each problem's space under DIR (as --space leaves them), how far its best "
                        "kernel lies beyond what both sides of a comparison measure first (the reference and the roots)")
    p.add_argument("--space", action="store_true", help="measure each problem's variant space once instead of "
                   "searching it: its roots and every variant of the reference and of the roots (--space-depth 2: "
                   "and of those variants), one pool call, into --data/<problem>; the comparisons are then replays "
                   "of it (--backend replay --replay-pool DATA)")
    p.add_argument("--space-depth", type=int, default=1, choices=(1, 2))
    p.add_argument("--space-variants", nargs="+", default=[], metavar="NAME",
                   help="--space: only these variants (compile-default compile-reduce-overhead ...; default: all)")
    p.add_argument("--space-anchors", type=int, default=2, metavar="K",
                   help="--space resuming a space an earlier call began: K of its measured children measured again "
                        "beside this call's reference, logged (space_calls.jsonl) to show how far the calls agree")
    p.add_argument("--space-reference-only", action="store_true",
                   help="--space: the reference's variants only, no roots (torch.compile of every reference, say)")
    p.add_argument("--prior-spaces", default="", help="a folder of measured variant spaces (as --space leaves them) "
                   "whose kernels join the pool in the surrogate's prior (built under --data/prior-with-spaces); the "
                   "searched problem's own rows are still left out (prior_scope other-ops)")
    add_live_arguments(p, "rewrites of each problem's measured kernels beside their execution variants (generator "
                          "freeform+variants: the model's children first, at least half of each generation variants; "
                          "with --space, --space-rewrites of each root join the space)")
    p.add_argument("--space-rewrites", type=int, default=8, metavar="K",
                   help="--space --live: the model's rewrites of each root (of the reference where the problem has "
                        "none) asked once, measured in the space beside the variants; a replay offers them as the "
                        "root's children")
    args = p.parse_args(argv)
    if args.live and args.backend == "replay":
        p.error("--live has a model write new code, measured here: not with --backend replay (a pool answers only "
                "for the children it holds)")
    if args.space_rewrites < 0:
        p.error(f"--space-rewrites must be 0 or more, got {args.space_rewrites}")
    from kernelcast.kernels.variants import VARIANTS

    unknown = [n for n in args.space_variants if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    args.prior = ""  # the merged prior's root, once main has built it
    return args


def prior_with_spaces(pool: str, spaces: str, folder: str) -> str:
    """A data root holding ``pool``'s candidates and measurements and those of every space under ``spaces``
    (built afresh in ``folder``): the prior of a surrogate that has seen other problems' variants."""
    import shutil

    from kernelcast.storage.dataset import DataRoot

    if not Path(spaces).is_dir():
        raise ValueError(f"--prior-spaces {spaces}: no such folder")
    roots = [Path(pool), *(d for d in sorted(Path(spaces).iterdir()) if d.is_dir())]
    shutil.rmtree(folder, ignore_errors=True)
    merged = DataRoot(folder)
    for table in ("candidates", "measurements"):
        for root in roots:
            rows = DataRoot(str(root)).read_table(table)
            if rows.num_rows:
                merged.write(table, rows)
    return folder


def problems(args) -> list[str]:
    """The ops to search, in order: those named, or the report's headroom list shuffled by ``--order-seed``."""
    from kernelcast.kernels.harness.sweep import shard
    from kernelcast.tasks.cudal1_pool import _PROBLEM

    if args.problems == "none":
        ops = []
    elif args.problems == "all":  # every problem of the pool, in order
        from kernelcast.storage.dataset import DataRoot

        ops = sorted(o for o in DataRoot(f"{args.pool}/{args.protocol}").read_candidates()["op"].unique()
                     if o.startswith("kb.cudal1-"))
    elif args.problems:
        ops = []
        for item in filter(None, (s.strip() for s in args.problems.split(","))):
            m = _PROBLEM.fullmatch(item)
            if not m:
                raise ValueError(f"unknown problem {item!r}: name one as l<level>-<task> (l2-017)")
            ops.append(f"kb.cudal1-l{m.group(1)}-{int(m.group(2)):03d}")
    else:
        ops = sorted(r["op"] for r in json.loads(Path(args.report).read_text())["headroom"])
        random.Random(args.order_seed).shuffle(ops)
    ops += import_gpumode(args.gpumode)
    return shard(ops, args.shard)


def import_gpumode(folders: str) -> list[str]:
    """The GPU MODE tasks in ``folders`` (comma-separated) imported and installed here, by op name."""
    from kernelcast.kernels.formats import import_task

    ops = []
    for folder in filter(None, (f.strip() for f in folders.split(","))):
        path = Path(folder)
        if not (path / "reference.py").is_file():
            raise ValueError(f"--gpumode {folder}: no reference.py there (a GPU MODE task folder holds reference.py "
                             "and task.yml)")
        op, _ = import_task("gpumode", str(path / "reference.py"), name=path.name.removesuffix("_py"))
        ops.append(op.name)
    return ops


def install_pool_tasks(pool) -> list[str]:
    """Every operation of the pool installed from its root (where this process looks for tasks); those that load."""
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.kernels.ops import get_operation

    loadable = []
    for op in sorted(pool.read_candidates()["op"].unique()):
        install_from_root(pool, op)
        try:
            get_operation(op)
            loadable.append(op)
        except Exception as exc:  # noqa: BLE001 - its reference needs what this machine lacks
            print(f"left out: {op} does not load here ({type(exc).__name__}: {str(exc)[-160:]})", flush=True)
    return loadable


def torch_compile_speedup(base: dict, op: str) -> float | None:
    """The speedup over eager of the reference under torch.compile (default mode), measured in the problem's root."""
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.variants import variant_children
    from kernelcast.tasks.generators import recorded_variants
    from kernelcast.tasks.search import measure_and_store
    from kernelcast.tasks.setup import open_search

    config = SearchConfig(**base, surrogate=BASELINE, budget=1, run_id=f"torch-compile-{op.replace('.', '-')}"[:64])
    search = open_search(config, track=False)  # the root, the pool and the reference's own measurement
    try:
        operation = get_operation(op)
        reference = operation.seed_candidates()[0]
        kids = recorded_variants(base["variants_recorded"], op).get(reference.candidate_id, []) \
            if base.get("variants_recorded") else variant_children(operation, reference)[0]
        kid = next((k for k in kids if k.origin == TORCH_COMPILE), None)
        if kid is None:  # a replay of live runs that never made it
            return None
        search.root.write_candidates([kid])
        found, _ = measure_and_store(search.root, search.pool, [kid], search.config.gpu_type)
    finally:
        search.pool.close()
    m = found.get(kid.candidate_id)
    return m.speedup if m is not None and m.status == "ok" else None


def problem_settings(args, op: str) -> dict:
    """The settings every run on ``op`` shares (its own data root under --data, the pool's roots and prior)."""
    base = dict(op=op, generations=args.generations, data=f"{args.data}/{op}", gpu_type=args.gpu_type,
                acquisition=args.acquisition, weigh_roots=args.weigh_roots,
                backend=args.backend, generator="freeform+variants" if args.live else "variants",
                prior_data=args.prior or f"{args.pool}/{args.protocol}",
                # a task of the pool starts from its kernels there; another (GPU MODE) from its reference
                generator_roots=f"{args.pool}/{args.protocol}" if op.startswith("kb.cudal1-") else "")
    if args.surrogate_folder:
        base["surrogate_folder"] = args.surrogate_folder.format(op=op)
    if args.live:
        base |= live_model_settings(args)
    if args.backend == "replay":
        base["replay_pool"] = f"{args.replay_pool}/{op}" if args.replay_pool else f"{args.pool}/{args.protocol}"
        if args.replay_pool:  # the children the live runs made, with their ids: the variants' text may have moved on
            base["variants_recorded"] = base["replay_pool"]
    return base


def variant_space(op: str, roots, depth: int = 1, only=()) -> list:
    """The roots, then every variant of the reference and of each root, then (``depth`` 2) every variant of
    those variants: each child once, in that order; ``only``: just the variants of these names."""
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.variants import variant_children

    operation = get_operation(op)
    found = {c.candidate_id: c for c in roots}
    layer = [operation.seed_candidates()[0], *roots]
    for _ in range(depth):
        made = [kid for parent in layer for kid in variant_children(operation, parent)[0]
                if kid.candidate_id not in found and (not only or kid.origin.removeprefix("variant:") in only)]
        found.update((k.candidate_id, k) for k in made)
        layer = made
    return list(found.values())


def measure_space(args, op: str) -> dict:
    """The problem's variant space measured in one call of the pool (reused where its root holds them already)."""
    from kernelcast.tasks.generators import template_roots
    from kernelcast.tasks.search import measure_and_store
    from kernelcast.tasks.setup import open_search

    base = problem_settings(args, op)
    # A space measured without a model keeps its run; the model's rewrites added to it are a run of their own.
    config = SearchConfig(**(base | dict(seed=0, surrogate=BASELINE, budget=1, generations=1)),
                          run_id=f"space-{'rewrites-' if args.live else ''}{op.replace('.', '-')}"[:64])
    search = open_search(config, track=False)  # the root, the pool and the reference's own measurement
    try:
        measured_roots = template_roots(base["generator_roots"], op, search.config.gpu_type) \
            if base["generator_roots"] and not args.space_reference_only else []
        roots = [c for c, _ in measured_roots]
        space = variant_space(op, roots, args.space_depth, tuple(args.space_variants))
        t0 = time.perf_counter()
        rewrites = model_rewrites(search, op, measured_roots, space, args.space_rewrites) if args.live else []
        ask_seconds = time.perf_counter() - t0
        space += rewrites
        t0, since = time.perf_counter(), utc_now()
        call = {"started": since.isoformat(), "children": len(space), "anchors": []}
        found: dict = {}
        try:
            call["anchors"] = measure_anchors(search, space, args.space_anchors)
            if anchors_agree(call["anchors"]) is False:
                ratios = ", ".join(f"{r:.3f}" for r in anchor_ratios(call["anchors"]))
                print(f"{op}: this call's anchors came out at {ratios} of their earlier speedups, beyond "
                      f"{ANCHOR_TOLERANCE:.0%}: its rows and the earlier ones are not one space", flush=True)
            found, reused = measure_and_store(search.root, search.pool, space, search.config.gpu_type)
        finally:
            # The space's children are written once measured: a call stopped part way (a deadline's kill) leaves
            # its measurements, which a second call reuses, and no child a replay would meet unmeasured.
            stored = search.root.read_measurements(op=op, gpu_type=search.config.gpu_type)
            measured = set(stored["candidate_id"]) if not stored.empty else set()
            search.root.write_candidates([c for c in space if c.candidate_id in measured])
            log_call(search.root, op, stored, call, since, time.perf_counter() - t0)
        wall = time.perf_counter() - t0
    finally:
        search.pool.close()
    ok = [m for m in found.values() if m.status == "ok" and m.speedup]
    row = {"op": op, "children": len(space), "measured": len(found), "reused": reused, "ok": len(ok),
           "anchors": call["anchors"], "anchors_agree": anchors_agree(call["anchors"]),
           "best": max((m.speedup for m in ok), default=None), "wall_seconds": wall,
           "gpu_seconds": sum(m.gpu_seconds for m in found.values()),
           "compile_seconds": sum(m.compile_seconds for m in found.values())}
    if args.live:
        row |= rewrite_summary(rewrites, found, ask_seconds, since)
    return row


CALLS = "space_calls.jsonl"  # a space's data root: one line a call that measured in it
# How far an anchor's speedup may come out from its earlier one for two calls' rows to count as one space: about
# the spread of one child measured on two machines where both runs of the reference agree (docs/search.md).
ANCHOR_TOLERANCE = 0.05


def measure_anchors(search, space, k: int) -> list[dict]:
    """Where an earlier call began this space: ``k`` of the children it measured ok (the fastest, then evenly down
    its speedups) measured again beside this call's own reference, each with its earlier and present speedup.

    A speedup is relative to the reference measured in the same call, on that call's machine; a space is merged
    across calls only as far as these agree. The anchors' new rows go to the call log, not to the measurements, so
    the space keeps one row a child; the reference measured with them is written as any call's reference is."""
    from kernelcast.kernels.ops import get_operation
    from kernelcast.storage.schema import measurements_from_frame

    seed = get_operation(search.config.op).seed_candidates()[0].candidate_id
    by_id = {c.candidate_id: c for c in space}
    stored = search.root.read_measurements(op=search.config.op, gpu_type=search.config.gpu_type)
    if k <= 0 or stored.empty:
        return []
    earlier = stored[(stored["status"] == "ok") & stored["candidate_id"].isin(set(by_id) - {seed})]
    earlier = earlier.drop_duplicates("candidate_id", keep="last").sort_values(
        ["speedup", "candidate_id"], ascending=[False, True], na_position="last").reset_index(drop=True)
    if earlier.empty:
        return []
    picks = sorted({round(i * (len(earlier) - 1) / max(1, k - 1)) for i in range(min(k, len(earlier)))})
    before = {m.candidate_id: m for m in measurements_from_frame(earlier.loc[picks])}
    anchors, reference = [], []
    for m in search.pool.measure([by_id[cid] for cid in before], search.config.gpu_type):
        if m.candidate_id == seed:
            reference.append(m)
            continue
        was = before[m.candidate_id].speedup
        anchors.append({"candidate_id": m.candidate_id, "origin": by_id[m.candidate_id].origin,
                        "status": m.status, "earlier": was, "now": m.speedup,
                        "earlier_reference_us": list(before[m.candidate_id].reference_us_median or ()),
                        "reference_us": list(m.reference_us_median or ()),
                        "ratio": m.speedup / was if m.speedup and was else None})
    search.root.write_measurements(reference)
    return anchors


def log_call(root, op: str, stored, call: dict, since, wall: float) -> None:
    """One line of the space's call log: when this call ran and on what, its reference's runtime, how many children
    it measured, and its anchors (``measure_anchors``); written even when the call is stopped part way."""
    from kernelcast.kernels.ops import get_operation

    seed = get_operation(op).seed_candidates()[0].candidate_id
    fresh = stored[stored["measured_at"] >= since] if not stored.empty else stored
    # the reference this call's speedups stand on, as its children's rows carry it (a pool need not hand back
    # the reference row it measured for them)
    timed = fresh[fresh["reference_us_median"].map(lambda r: r is not None and len(r) > 0)] \
        if not fresh.empty else fresh
    line = call | {"wall_seconds": round(wall, 1),
                   "measured": int((fresh["candidate_id"] != seed).sum()) if not fresh.empty else 0,
                   "device": str(fresh["device_name"].iloc[0]) if not fresh.empty else "",
                   "reference_us": [float(x) for x in timed["reference_us_median"].iloc[-1]] if not timed.empty
                   else []}
    earlier = root.get_object(CALLS) or b""
    root.put_object(CALLS, earlier + (json.dumps(line) + "\n").encode())


def space_calls(root) -> list[dict]:
    """The calls that measured in a space's data root, in order (none logged: an empty list)."""
    text = (root.get_object(CALLS) or b"").decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def model_rewrites(search, op: str, measured_roots, space, k: int) -> list:
    """``k`` rewrites by the search's model of each root (CUDA-L1's best, median and poor kernel, with the speedup the
    pool measured; the reference where the problem has no roots), asked at once as a free-form search's model
    generation asks them; those passing the static checks, each with its parent id and provenance (written)."""
    from kernelcast.kernels.ops import get_operation
    from kernelcast.tasks.generators import rewriter
    from kernelcast.tasks.llm_generator import Parent, fingerprints

    parents = [Parent(c, speedup, "ok") for c, speedup in measured_roots] or \
        [Parent(get_operation(op).seed_candidates()[0])]
    model = rewriter(search.config)
    model.probe()
    kids = model.propose(op, [p for p in parents for _ in range(k)], None, seed=search.config.seed,
                         seen=fingerprints(space), run_id=search.config.run_id)
    counts = model.last_counts_
    print(f"{op}: the model wrote {len(kids)} rewrites of {len(parents)} parents that pass the static checks "
          f"(asked {k * len(parents)}; {counts.failed} failed, {counts.invalid} invalid, {counts.duplicate} "
          "duplicates)", flush=True)
    search.root.write_records(list(model.provenance_.values()))
    return kids


def rewrite_summary(rewrites, found: dict, ask_seconds: float, since=None) -> dict:
    """What the model's rewrites came to: how many ran, and the best of them over eager and over its own parent.

    A rewrite is set against its parent only where both were measured in this call (after ``since``): a parent
    measured in an earlier call of the space had another reference measurement, and on a host-bound problem the
    two speedups are not comparable (a copy of its parent once came out 4.2x faster that way)."""
    speed = {cid: m.speedup for cid, m in found.items() if m.status == "ok" and m.speedup}
    ran = [k for k in rewrites if k.candidate_id in speed]
    now = {cid for cid, m in found.items() if since is None or m.measured_at >= since}
    over_parent = [speed[k.candidate_id] / speed[k.parent_id] for k in ran
                   if k.parent_id in speed and k.parent_id in now]
    statuses = collections.Counter(found[k.candidate_id].status if k.candidate_id in found else "unmeasured"
                                   for k in rewrites)
    return {"rewrites": len(rewrites), "rewrites_ok": len(ran), "rewrite_statuses": dict(statuses),
            "rewrite_best": max((speed[k.candidate_id] for k in ran), default=None),
            "rewrite_best_over_parent": max(over_parent, default=None),
            "rewrites_faster_than_parent": sum(r > 1.0 for r in over_parent),
            "rewrites_10pct_faster": sum(r >= 1.10 for r in over_parent),
            "rewrites_with_parent_measured_earlier": sum(k.parent_id in speed and k.parent_id not in now for k in ran),
            "ask_seconds": ask_seconds}


def search_problem(args, op: str, rows: list, save) -> None:
    base = problem_settings(args, op)
    compiled = torch_compile_speedup(base | dict(seed=0, generations=1), op)
    for budget, seed in itertools.product(args.budgets, range(args.seeds)):
        mine = base | dict(seed=seed)
        done: dict = {}
        order = [BASELINE, *args.surrogates] if seed % 2 == 0 else [*args.surrogates, BASELINE]
        for name in order:
            done[name] = run_one(SearchConfig(**mine, budget=budget, surrogate=name))
        ref = done[BASELINE]
        spent = ref["gpu_seconds"] + ref["compile_seconds"]
        for mode, name in itertools.product(args.modes, args.surrogates):
            if mode == "measurements":
                run, scale = done[name], budget
            else:
                run = run_one(SearchConfig(**mine, surrogate=name, budget=max(spent, 1e-6),
                                           budget_kind="gpu_compile_seconds"))
                scale = spent
            reached = to_reach(run, ref["best"], mode) if ref["best"] else None
            origin = origins_of(base["data"], op)
            row = {"op": op, "budget": budget, "seed": seed, "mode": mode, "surrogate": name,
                   "backend": args.backend, "generator": base["generator"], "model": base.get("generator_model", ""),
                   "surrogate_best": run["best"], "baseline_best": ref["best"], "torch_compile": compiled,
                   "ratio": run["best"] / ref["best"] if ref["best"] else None,
                   "to_baseline_best": reached, "share_of_baseline_budget": reached / scale if reached else None,
                   "baseline_to_its_best": to_reach(ref, ref["best"], mode) if ref["best"] else None,
                   # the same two, less the roots both sides measure first (at the same cost)
                   "beyond_roots_to_baseline_best": beyond_roots(run, ref["best"], mode) if ref["best"] else None,
                   "baseline_beyond_roots_to_its_best": beyond_roots(ref, ref["best"], mode) if ref["best"] else None,
                   "surrogate_best_origin": origin.get(run["best_candidate"], ""),
                   "baseline_best_origin": origin.get(ref["best_candidate"], ""),
                   **{f"surrogate_{k}": run[k] for k in ("run_id", "best_candidate", "measurements", "gpu_seconds",
                                                         "compile_seconds", "stop_reason", "trusted", "dropped",
                                                         "failed", "seconds")},
                   **{f"baseline_{k}": ref[k] for k in ("run_id", "best_candidate", "measurements", "gpu_seconds",
                                                        "compile_seconds", "stop_reason", "failed")}}
            rows.append(row)
            save()
            print(json.dumps(row), flush=True)


def origins_of(data: str, op: str) -> dict[str, str]:
    """Candidate id -> origin (a CUDA-L1 kernel: import; variant:NAME; a model's rewrite) of ``op``'s kernels
    under the data root ``data``."""
    from kernelcast.storage.dataset import DataRoot

    made = DataRoot(data).read_candidates(op)
    return dict(zip(made["candidate_id"], made["origin"])) if len(made) else {}


def geomean(values) -> float:
    values = [max(v, 1e-9) for v in values]
    return math.exp(statistics.mean(math.log(v) for v in values)) if values else float("nan")


def summary(rows: list[dict]) -> list[str]:
    """The goal's table per (mode, surrogate, budget), then per problem the best kernel found."""
    ops = sorted({r["op"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    generators = sorted({r.get("generator", "variants") for r in rows})
    models = sorted({r["model"] for r in rows if r.get("model")})
    backends = {r.get("backend") for r in rows}  # rows of older runs do not say
    kind = "Replayed searches" if backends == {"replay"} else \
        "Live searches" if None not in backends and "replay" not in backends else "Searches"
    kb = sum(o.startswith("kb.cudal1-") for o in ops)
    roots = "CUDA-L1's kernels" if kb == len(ops) else "the reference" if not kb else \
        "CUDA-L1's kernels (the reference for a task the pool lacks)"
    lines = [f"{kind}, generator {', '.join(generators)} from {roots}"
             + (f" (model {', '.join(models)})" if models else "") + f", on {len(ops)} problems x {len(seeds)} seeds.",
             "", "| budget kind | surrogate | budget | runs | geomean best(surrogate) / best(baseline) | wins / ties / "
             "losses | reached the baseline's best | median share of the baseline's cost to get there | "
             "median cost to the baseline's best, over the baseline's own | "
             "the same beyond the roots (runs whose baseline found its best beyond them) | "
             "measured (surrogate / baseline, mean) | GPU + compile s (surrogate / baseline, mean) |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["mode"], r["surrogate"], r["budget"]) for r in rows}, key=lambda k: (MODES.index(k[0]), k[1:]))
    for mode, name, budget in keys:
        mine = [r for r in rows if (r["mode"], r["surrogate"], r["budget"]) == (mode, name, budget) and r["ratio"]]
        if not mine:
            continue
        wins = sum(r["ratio"] > 1.0005 for r in mine)
        losses = sum(r["ratio"] < 0.9995 for r in mine)
        share = statistics.median(r["share_of_baseline_budget"] if r["share_of_baseline_budget"] is not None else 2.0
                                  for r in mine)
        # A run that never reached it counts as 2x; a row without the baseline's own (older files) is left out.
        relative = [(r["to_baseline_best"] or 2 * r["baseline_to_its_best"]) / r["baseline_to_its_best"]
                    for r in mine if r.get("baseline_to_its_best")]
        # Beyond the roots: only where the baseline spent something past them to reach its best (else there is no
        # search cost to compare); a surrogate that never reached it counts as 2x, as above.
        past = [(r["beyond_roots_to_baseline_best"] if r["beyond_roots_to_baseline_best"] is not None
                 else 2 * r["baseline_beyond_roots_to_its_best"]) / r["baseline_beyond_roots_to_its_best"]
                for r in mine if r.get("baseline_beyond_roots_to_its_best")]
        cost = [(r["surrogate_gpu_seconds"] + r["surrogate_compile_seconds"],
                 r["baseline_gpu_seconds"] + r["baseline_compile_seconds"]) for r in mine]
        lines.append(f"| {mode} | {name} | {budget} | {len(mine)} | **{geomean(r['ratio'] for r in mine):.3f}** | "
                     f"{wins} / {len(mine) - wins - losses} / {losses} | "
                     f"{sum(r['to_baseline_best'] is not None for r in mine)}/{len(mine)} | {share:.2f} | "
                     f"{f'{statistics.median(relative):.2f}' if relative else '-'} | "
                     f"{f'{statistics.median(past):.2f} ({len(past)})' if past else '-'} | "
                     f"{statistics.mean(r['surrogate_measurements'] for r in mine):.1f} / "
                     f"{statistics.mean(r['baseline_measurements'] for r in mine):.1f} | "
                     f"{statistics.mean(c[0] for c in cost):.0f} / {statistics.mean(c[1] for c in cost):.0f} |")
    lines += ["", "Per problem, the best kernel any of its runs measured (speedup over eager, and over the reference "
              "under torch.compile's default mode, measured in the same root):", "",
              "| problem | best over eager | torch.compile over eager | best over torch.compile | found by |",
              "|---|---:|---:|---:|---|"]
    for op in ops:
        mine = [r for r in rows if r["op"] == op]
        best = max(mine, key=lambda r: max(r["surrogate_best"], r["baseline_best"]))
        top = max(best["surrogate_best"], best["baseline_best"])
        side = "surrogate" if best["surrogate_best"] >= best["baseline_best"] else "baseline"
        who = best[f"{side}_best_candidate"] + (f" ({best[f'{side}_best_origin']})"
                                                if best.get(f"{side}_best_origin") else "")
        tc = best["torch_compile"]
        lines.append(f"| {op} | {top:.3f} | {f'{tc:.3f}' if tc else '-'} | {f'{top / tc:.3f}' if tc else '-'} | "
                     f"{who} |")
    return lines


def published_compile(corpus: Path = POOL / "cudal1.parquet") -> dict[str, float]:
    """Per KernelBench problem of the CUDA-L1 pool, torch.compile's (default mode) speedup over eager on CUDA-L1's
    own H100 as its published scores imply it (its kernel's score over eager divided by its score over
    torch.compile): their machine and software, not measured here."""
    import pandas as pd

    if not corpus.is_file():
        return {}
    scores = pd.read_parquet(corpus, columns=["op", "h100_score_default", "h100_score_torch_compile_default"])
    scores = scores.dropna().groupby("op").first()
    scores = scores[(scores["h100_score_default"] > 0) & (scores["h100_score_torch_compile_default"] > 0)]
    return (scores["h100_score_default"] / scores["h100_score_torch_compile_default"]).to_dict()


def space_census(folder: str, gpu_type: str = "auto") -> list[str]:
    """Per measured space under ``folder``: its children, how many ran, the best of what both sides of a comparison
    measure first (the reference and CUDA-L1's kernels, the roots), the best kernel and what made it, and how much
    beyond the roots it lies, and the best over torch.compile of the reference (default mode) where the space holds
    it, and over torch.compile as CUDA-L1's published H100 scores imply it (``published_compile``); then how many
    spaces hold a kernel 1.10x beyond their roots, the margin a surrogate needs to win by 1.10 (docs/search.md)."""
    from kernelcast.storage.dataset import DataRoot

    roots = [d for d in sorted(Path(folder).iterdir()) if d.is_dir() and (d / "measurements").is_dir()] \
        if Path(folder).is_dir() else []
    if not roots:
        raise ValueError(f"--census {folder}: no measured spaces there (folders holding measurements/)")
    published = published_compile()
    lines = ["| problem | children | ran | best root | best | made by | best / best root | within 10% of the best | "
             "torch.compile | best / torch.compile | torch.compile, published | best / published torch.compile |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    beyond, merged = [], []
    for root in roots:
        data = DataRoot(str(root))
        c = data.read_candidates()
        m = data.read_measurements(**({} if gpu_type in ("", "auto") else {"gpu_type": gpu_type}))
        if c.empty or m.empty:
            continue
        m = m.drop_duplicates("candidate_id", keep="last").merge(c[["candidate_id", "origin", "parent_id"]],
                                                                 on="candidate_id")
        kids = m[m["origin"] != "seed"]
        ok = m[(m["status"] == "ok") & m["speedup"].notna()]
        if ok.empty:
            continue
        first = ok[ok["origin"].isin(("seed", "import"))]
        best_root = max(1.0, first["speedup"].max()) if not first.empty else 1.0
        top = ok.loc[ok["speedup"].idxmax()]
        ratio = top["speedup"] / best_root
        near = int((ok["speedup"] >= 0.9 * top["speedup"]).sum())
        beyond.append(ratio)
        seeds = set(m.loc[m["origin"] == "seed", "candidate_id"])
        compiled = ok[(ok["origin"] == TORCH_COMPILE) & ok["parent_id"].isin(seeds)]
        over = f"{compiled['speedup'].iloc[0]:.3f} | {top['speedup'] / compiled['speedup'].iloc[0]:.3f}" \
            if not compiled.empty else "- | -"
        paper = published.get(root.name)
        over += f" | {paper:.3f} | {top['speedup'] / paper:.3f}" if paper else " | - | -"
        lines.append(f"| {root.name} | {len(kids)} | {int((kids['status'] == 'ok').sum())} | {best_root:.3f} | "
                     f"{top['speedup']:.3f} | {top['origin']} | {ratio:.3f} | {near} | {over} |")
        calls = space_calls(data)
        if len(calls) > 1:
            merged.append(calls_note(root.name, calls))
    lines += ["", f"{len(beyond)} spaces; a kernel at least 1.10x beyond the roots in {sum(r >= 1.10 for r in beyond)}, "
              f"at least 1.03x in {sum(r >= 1.03 for r in beyond)}; the best is a root in "
              f"{sum(r <= 1.0 + 1e-9 for r in beyond)}"]
    return lines + (["", "Spaces measured over several calls (each child's speedup is over the reference of its own "
                     "call; the anchors are children of earlier calls measured again):", "", *merged] if merged else [])


def anchor_ratios(anchors: list[dict]) -> list[float]:
    """Each anchor's present speedup over its earlier one, where both were measured."""
    return [a["ratio"] for a in anchors if a.get("ratio")]


def anchors_agree(anchors: list[dict]) -> bool | None:
    """Whether a call's anchors all came out within ``ANCHOR_TOLERANCE`` of their earlier speedups; None where none
    has two speedups to compare (no earlier call, or a machine that does not time)."""
    ratios = anchor_ratios(anchors)
    return all(abs(r - 1.0) <= ANCHOR_TOLERANCE for r in ratios) if ratios else None


def calls_agree(calls: list[dict]) -> bool:
    """Whether every anchor of every later call came out within ``ANCHOR_TOLERANCE`` of its earlier speedup (a later
    call with no anchor measured ok cannot be told to agree)."""
    return all(anchors_agree(call.get("anchors", [])) for call in calls[1:])


def calls_note(name: str, calls: list[dict]) -> str:
    """One line on a space measured over several calls: each call's children and reference, and how far its
    anchors' speedups came out from their earlier ones."""
    parts = []
    for i, call in enumerate(calls, 1):
        ref = statistics.median(call["reference_us"]) if call.get("reference_us") else None
        ratios = anchor_ratios(call.get("anchors", []))
        part = f"call {i} {call['started'][:16]}: {call['measured']} children" + \
            (f", reference {ref:.1f} us" if ref else "")
        if ratios:
            part += f", anchors at {min(ratios):.3f}-{max(ratios):.3f} of their earlier speedups"
        parts.append(part)
    verdict = f"the calls agree within {ANCHOR_TOLERANCE:.0%}" if calls_agree(calls) else \
        f"the calls do not agree within {ANCHOR_TOLERANCE:.0%}: not one space"
    return f"- {name}: " + "; ".join(parts) + f" ({verdict})"


def main(argv=None) -> int:
    args = parse(argv)
    if args.census:
        try:
            return write(space_census(args.census, args.gpu_type), args.markdown)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.summary_only:
        rows = [r for path in args.json for r in json.loads(Path(path).read_text())["runs"]]
        return write(summary(rows), args.markdown)
    if len(args.json) > 1:
        print("error: a search writes one --json file; several are read only with --summary-only", file=sys.stderr)
        return 2
    from kernelcast.storage.dataset import DataRoot

    try:
        ops = problems(args)
    except (ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    loadable = set(install_pool_tasks(DataRoot(f"{args.pool}/{args.protocol}"))) | \
        {op for op in ops if not op.startswith("kb.cudal1-")}
    try:
        args.prior = prior_with_spaces(f"{args.pool}/{args.protocol}", args.prior_spaces,
                                       f"{args.data}/prior-with-spaces") if args.prior_spaces else ""
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows: list[dict] = []

    def save() -> None:  # after every row: a run cut short keeps what it finished
        if args.json:
            Path(args.json[0]).write_text(json.dumps({"runs": rows}, indent=1))

    deadline = time.monotonic() + 60 * args.max_minutes
    for op in ops:
        if time.monotonic() > deadline:
            print(f"--max-minutes {args.max_minutes:g} passed: no more problems started", flush=True)
            break
        if op not in loadable:
            print(f"{op}: not in the pool or does not load here; skipped", flush=True)
            continue
        t0 = time.monotonic()
        try:
            if args.space:
                row = measure_space(args, op)
                rows.append(row)
                save()
                print(json.dumps(row), flush=True)
            else:
                search_problem(args, op, rows, save)
        except Exception as exc:  # noqa: BLE001 - one problem's failure is reported, the others still run
            print(f"{op}: search failed: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
        print(f"{op}: {time.monotonic() - t0:.0f} s", flush=True)
    save()
    return 0 if args.space else write(summary(rows), args.markdown)


def write(lines: list[str], markdown: str) -> int:
    print("\n".join(lines))
    if markdown:
        Path(markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
