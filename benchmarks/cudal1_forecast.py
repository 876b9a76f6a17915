"""Forecasters judged where ranking matters, on the measured CUDA-L1 pool: problems held out, pools ranked.

    PYTHONPATH=$PWD python benchmarks/cudal1_forecast.py [--pool data/pools/cudal1] [--protocol kernelcast]
        [--forecasters learned,source,roofline,random] [--folds 5] [--draws 1000] [--also-data data/pools ...]
        [--lmhead-folder DIR] [--corpus CUDA-L1 JSON Lines folder] [--out docs/measured/cudal1_forecast/cudal1_forecast]

Each problem of the pool (op ``kb.cudal1-lX-NNN``: its eager reference, the anchor, and its CUDA-L1
implementations) is forecast by each registered forecaster fit on other problems only, two ways:
grouped k-fold by problem, and leave one level out (``kernelcast.surrogate.ranking``). ``--also-data`` adds the
measured pairs of other pools (template pools, LLM corpora) to every fold's training data.
``lmhead`` is read from a trained folder and runs only when ``--lmhead-folder`` is given.

Also a small cross-GPU table (``kernelcast.surrogate.crossgpu``): CUDA-L1's published speedup of the same kernel on
A100, L40, H20 and RTX 3090, forecast from our measured H100 speedup, scored against the published
figures with grouped k-fold again. The published figures come from ``cudal1.parquet``, or where it has
none for a GPU, from CUDA-L1's files in ``--corpus`` (only kernels whose code in that GPU's file is the
very code measured here).

Prints the tables; with ``--out STEM`` writes STEM.txt (what was printed) and STEM.json.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARED = Path(__file__).resolve().parents[2] / "shared"
FORECASTERS = ("learned", "labels", "source", "physics", "roofline", "random")  # labels: the baseline every table carries
PROTOCOLS = ("kernelcast", "kernelbench")
TARGET_GPUS = ("a100", "l40", "h20", "rtx3090")
COLUMNS = ("spearman", "top1_within_10pct", "select_top10_within_20pct", "select_top20_within_20pct",
           "select_top30_within_20pct", "failure_auroc", "ece", "aurc")


def add_pool_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments that say which pool, protocol, GPU type, problems and variant spaces a script reads (this
    benchmark's, and the scripts that train or read on the same kernels)."""
    p.add_argument("--pool", default="data/pools/cudal1", help="the pool root: one data root per protocol, cudal1.parquet")
    p.add_argument("--protocol", default="kernelcast", choices=PROTOCOLS)
    p.add_argument("--gpu-type", default="h100", help="the GPU type the pool was measured on")
    p.add_argument("--problems", default="all", choices=("all", "dev", "sealed"),
                   help="all: every problem cross-validated; dev: the problems forecasters are developed on "
                        "(cross-validated among themselves); sealed: the other fifth (kernelcast.surrogate.ranking."
                        "sealed_problems), each forecaster fit on every dev problem and scored on them once")
    p.add_argument("--spaces", action="append", default=[],
                   help="a folder of per-problem data roots (kb.cudal1-lX-NNN/, as headroom_search --space leaves "
                        "them: data/pools/headroom) whose implementations join their problem's pool, each anchored "
                        "at the reference measured in its own root; a kernel the pool holds counts once, from the "
                        "pool (repeatable)")
    p.add_argument("--corpus", default=str(SHARED / "corpora" / "cuda-l1"),
                   help="CUDA-L1's JSON Lines files, for published figures the side table lacks")


def parse(argv=None) -> argparse.Namespace:
    from kernelcast.surrogate.calibration import CALIBRATORS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pool_arguments(p)
    p.add_argument("--forecasters", default=",".join(FORECASTERS))
    p.add_argument("--lmhead-folder", default=None, help="a folder lmhead was trained into: adds lmhead")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dealings", type=int, default=1,
                   help="deal the grouped folds this many ways (seeds SEED, SEED+1, ...): each dealing's rows, then "
                        "per forecaster their mean, with the range over the dealings in place of an interval (one "
                        "dealing moves failure AUROC and ECE by more than forecasters differ)")
    p.add_argument("--draws", type=int, default=1000, help="bootstrap draws per interval (over problems)")
    p.add_argument("--forecasts", action="append", default=[], metavar="NAME=DIR",
                   help="held-out forecasts made elsewhere, scored beside the others: DIR's forecasts-*.parquet, one "
                        "a fold (benchmarks/cudal1_lmhead.py writes them); repeatable")
    p.add_argument("--blend", action="append", default=[], metavar="A+B[:W]",
                   help="also score two forecasters' held-out forecasts of the first split mixed into one "
                        "(kernelcast.surrogate.ranking.blended; W on B's, default 0.5), each a forecaster of this run or a "
                        "--forecasts NAME dealt by the same folds; repeatable")
    p.add_argument("--also-data", action="append", default=[], help="another pool's root to train on (repeatable)")
    p.add_argument("--embeddings", default=None,
                   help="a table of the pool's pair vectors (benchmarks/cudal1_embed.py): adds learned+emb and "
                        "source+emb, each with a projection of them (fit on its training problems) among its "
                        "source features")
    p.add_argument("--embedding-dims", type=int, default=16, help="principal components of the vectors kept")
    p.add_argument("--calibrator", action="append", default=[], choices=sorted(CALIBRATORS),
                   help="also score each forecaster with its bin distributions recalibrated (NAME+CALIBRATOR): per "
                        "fold, a calibrator fit on the forecaster's own held-out forecasts of that fold's training "
                        "problems (kernelcast.surrogate.ranking.recalibrated; ranking and failure AUROC unchanged); repeatable")
    p.add_argument("--versus", default="learned",
                   help="pair every other forecaster against this one (the first split's held-out forecasts, and any "
                        "--forecasts): the difference of each figure with a bootstrap interval over the same problems; "
                        "several, comma-separated (labels,learned), give a table each")
    p.add_argument("--drop-verdicts", default=None, metavar="FILE",
                   help="a file of candidate ids (one a line, # comments) whose stored verdicts are known to be the "
                        "harness's faults, not the kernels': left out of training and scoring")
    p.add_argument("--retest", default=None, metavar="POOL",
                   help="another pool root holding the same kernels measured again under --protocol "
                        "(benchmarks/cudal1_pool.py --root POOL): a test-retest ranker beside the others")
    p.add_argument("--no-measured-rankers", dest="measured_rankers", action="store_false",
                   help="leave out the rankers that are other measurements of the same kernels (CUDA-L1's published "
                        "figure, the pool's other protocol, --retest), which show how well a second measurement ranks")
    p.add_argument("--score-on", default="all", choices=("all", "spaces"),
                   help="all: every problem's pool is scored; spaces: only the problems a --spaces folder holds, each "
                        "over its whole pool (its CUDA-L1 kernels and its measured variants: tens of kernels with a "
                        "wide spread, where the 10%% selection picks several); the forecasters still train on every "
                        "other problem, held out by problem as always")
    p.add_argument("--out", default=None, help="path stem of the .txt and .json results")
    p.add_argument("--save-forecasts", default=None, metavar="DIR",
                   help="write each forecaster's held-out forecasts of the first split into DIR/NAME/forecasts-0."
                        "parquet, as cudal1_lmhead.py writes its own (--forecasts NAME=DIR/NAME reads them back; "
                        "lmhead_reading.py --forecasts compares their spread)")
    p.add_argument("--census-only", action="store_true",
                   help="count the pool's measured implementations (every problem; no forecaster is fit or scored)")
    args = p.parse_args(argv)
    if args.dealings < 1:
        p.error(f"--dealings must be at least 1, got {args.dealings}")
    for value in args.blend:
        try:
            blend_of(value)
        except ValueError as exc:
            p.error(str(exc))
    for value in args.forecasts:
        if "=" not in value or not value.split("=", 1)[0] or not value.split("=", 1)[1]:
            p.error(f"--forecasts wants NAME=DIR, got {value!r}")
    return args


def blend_of(value: str) -> tuple[str, str, float]:
    """(A, B, weight on B) of a ``--blend A+B[:W]``."""
    names, _, weight = value.partition(":")
    first, plus, second = names.partition("+")
    if not (first and plus and second):
        raise ValueError(f"--blend wants A+B or A+B:W (two forecasters, W the second's weight), got {value!r}")
    try:
        w = float(weight) if weight else 0.5
    except ValueError:
        raise ValueError(f"--blend {value!r}: the weight {weight!r} is not a number") from None
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"--blend {value!r}: the weight lies in [0, 1], got {w}")
    return first, second, w


def main(argv=None) -> int:
    args = parse(argv)
    return with_pool_tasks(lambda: run(args))


def with_pool_tasks(work):
    """``work()`` with the pool's operations installed, from its root, into a folder of this run's own."""
    from kernelcast.kernels.formats import TASKS_ENV

    before = os.environ.get(TASKS_ENV)
    with tempfile.TemporaryDirectory(prefix="cudal1-forecast-tasks-") as tasks:
        os.environ[TASKS_ENV] = tasks
        try:
            return work()
        finally:
            if before is None:
                os.environ.pop(TASKS_ENV, None)
            else:
                os.environ[TASKS_ENV] = before


def _measured(args):
    """(kernels, per-case pairs) of the pool under its protocol, anchored at each problem's reference."""
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.kernels.ops import get_operation
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs, source_pairs

    root = DataRoot(str(Path(args.pool) / args.protocol))
    loadable = set()
    for op in sorted(root.read_candidates()["op"].unique()):
        install_from_root(root, op)
        try:
            get_operation(op)
            loadable.add(op)
        except Exception as exc:  # noqa: BLE001 - its reference needs what this machine lacks (a package, say)
            print(f"left out: {op} does not load here ({type(exc).__name__}: {str(exc)[-160:]})", flush=True)
    roots = [root, *(r for folder in args.spaces for r in space_roots(folder, loadable))]
    kernels = source_pairs(*roots, gpu_type=args.gpu_type, anchor="reference", ops=loadable).reset_index(drop=True)
    if kernels.empty:
        raise ValueError(f"no kernel with a measured reference under {root.uri} on {args.gpu_type}")
    dropped = dropped_verdicts(getattr(args, "drop_verdicts", None))
    if dropped:
        found = kernels["candidate_id"].isin(dropped)
        print(f"left out: {int(found.sum())} of the {len(dropped)} kernels whose verdicts {args.drop_verdicts} names "
              f"({', '.join(sorted(kernels.loc[found, 'status'].value_counts().index))})", flush=True)
        kernels = kernels[~found].reset_index(drop=True)
    cases = [c for c in (case_pairs(r, gpu_type=args.gpu_type) for r in roots) if not c.empty]
    cases = pd.concat(cases, ignore_index=True) if cases else pd.DataFrame()
    if not cases.empty:  # a kernel measured in the pool and again in a space counts once, from the pool (the first
        # root), as source_pairs has it
        cases = cases[cases["op"].isin(loadable) & cases["candidate_id"].isin(kernels["candidate_id"])]
        cases = cases.drop_duplicates(["op", "candidate_id", "case_name"]).reset_index(drop=True)
    return kernels, cases


def dropped_verdicts(path: str | None) -> set[str]:
    """The candidate ids ``path`` lists (one a line; blank lines and # comments ignored); a clear error where it
    cannot be read or names no id."""
    if not path:
        return set()
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--drop-verdicts {path}: cannot read it ({exc.strerror})") from None
    ids = {line.split("#", 1)[0].strip() for line in lines} - {""}
    if not ids:
        raise ValueError(f"--drop-verdicts {path}: names no candidate id (one a line)")
    return ids


def space_roots(folder: str | None, ops) -> list:
    """The data roots of ``folder``'s per-problem subfolders whose problem is one of ``ops`` (a space of another
    task, a GPU MODE one, has no problem of this pool to join)."""
    from kernelcast.storage.dataset import DataRoot

    if not folder:
        return []
    if not Path(folder).is_dir():
        raise ValueError(f"--spaces {folder}: no such folder")
    return [DataRoot(str(sub)) for sub in sorted(Path(folder).iterdir()) if sub.is_dir() and sub.name in ops]


def _also(args):
    """(kernels, per-case pairs) of the ``--also-data`` roots, or (None, None)."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs, source_pairs

    if not args.also_data:
        return None, None
    roots = [DataRoot(uri) for uri in args.also_data]
    kernels = source_pairs(*roots, gpu_type=args.gpu_type)
    cases = [c for c in (case_pairs(r, gpu_type=args.gpu_type) for r in roots) if not c.empty]
    return kernels, (pd.concat(cases, ignore_index=True) if cases else None)


def pool_variants(pool: str) -> dict[str, str]:
    """Candidate id -> the variant the pool's side table labels it (custom, cuda-graph, cudnn, null); empty without
    the table."""
    path = Path(pool) / "cudal1.parquet"
    if not path.exists():
        return {}
    side = pd.read_parquet(path, columns=["candidate_id", "variant"]).dropna()
    return dict(zip(side["candidate_id"], side["variant"]))


def census(kernels: pd.DataFrame) -> dict:
    """What the pool holds: problems with their reference measured, and besides each reference and its null twin
    (the reference's own code resubmitted) the implementations measured, by origin."""
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation

    nulls = {null_candidate(get_operation(op)).candidate_id for op in kernels["op"].unique()}
    rest = kernels[~kernels["candidate_id"].isin(nulls)]
    kinds = rest["origin"].where(rest["origin"] != "import", "cuda-l1").str.removeprefix("variant:")
    return {"problems": int(kernels["op"].nunique()), "references": int(kernels["op"].nunique()),
            "nulls": int(kernels["candidate_id"].isin(nulls).sum()), "implementations": int(len(rest)),
            "implementations_ok": int((rest["status"] == "ok").sum()),
            "problems_with_implementations": int(rest["op"].nunique()),
            "by_origin": {k: int(v) for k, v in kinds.value_counts().items()},
            "with_references": int(len(rest)) + int(kernels["op"].nunique())}


def run(args) -> int:
    from kernelcast.surrogate import ranking, registry

    if args.census_only:
        found = census(_measured(args)[0])
        print(json.dumps(found, indent=1))
        print(f"{found['with_references']} H100-measured implementations of {found['problems']} problems: "
              f"{found['references']} references and {found['implementations']} others "
              f"({found['implementations_ok']} ok), besides {found['nulls']} null twins")
        return 0

    t0 = time.perf_counter()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    kernels, cases = _measured(args)
    also_kernels, also_cases = _also(args)
    names = [n for n in args.forecasters.split(",") if n]
    if args.lmhead_folder:
        names.append("lmhead")
    options = {}  # a forecaster's name -> (its registered name, its factory's keyword arguments)
    if "labels" in names:  # the label baseline reads the pool's own variant labels (custom, cuda-graph, cudnn, null)
        options["labels"] = ("labels", {"variants": pool_variants(args.pool)})
    if args.embeddings:
        from kernelcast.surrogate.embeddings import PairEmbeddings
        from kernelcast.surrogate.learned import SOURCE_OPTIONS

        table = PairEmbeddings.read(args.embeddings, args.embedding_dims)
        options = {"learned+emb": ("learned", {"source_options": {**SOURCE_OPTIONS, "embeddings": table}}),
                   "source+emb": ("source", {"embeddings": table})}
        names += [n for n in options if n not in names]
    skipped = ([] if "lmhead" in names or any(f.startswith("lmhead") for f in args.forecasts)
               else ["lmhead (no trained folder given: --lmhead-folder, nor its forecasts: --forecasts lmhead=DIR)"])
    development, sealed = development_split(kernels)
    if args.problems == "dev":
        kernels = development
    problems = sorted(kernels["op"].unique())
    scored = spaced_problems(args.spaces, problems) if args.score_on == "spaces" else None
    say(f"CUDA-L1 pool {args.pool} ({args.protocol} protocol, {args.gpu_type}): {len(problems)} problems, "
        f"{len(kernels)} kernels ({int(kernels['failed'].sum())} failed)"
        + (f"; with the variant spaces of {', '.join(args.spaces)}" if args.spaces else "")
        + (f"; also trained on {len(also_kernels)} kernels of {', '.join(args.also_data)}" if args.also_data else ""))
    if scored is not None:
        say(f"scored on the {len(scored)} problems with a variant space, each over its whole pool "
            f"({int(kernels['op'].isin(scored).sum())} kernels): {', '.join(scored)}")
    if args.problems == "sealed":  # one fold: fit on the dev problems, scored on the sealed ones
        splits = {f"dev -> sealed ({len(sealed)} problems)": [("sealed", sealed)]}
    else:
        splits = {grouped(args, problems, seed): ranking.problem_folds(problems, args.folds, seed)
                  for seed in range(args.seed, args.seed + args.dealings)}
        splits["leave one level out"] = ranking.level_folds(problems)
    rows, first = [], {}  # first: each forecaster's held-out forecasts under the first split
    dealt = {name: args.seed for name in names}  # the seed that dealt each one's folds
    for split, folds in splits.items():
        for name in names:
            t = time.perf_counter()
            registered, kwargs = options.get(name, (name, None))
            forecasts = ranking.held_out_forecasts(kernels, cases, registered, folds, also_kernels, also_cases,
                                                   args.lmhead_folder if name == "lmhead" else None, options=kwargs)
            if split == next(iter(splits)):
                first[name] = forecasts
            rows.append({"split": split, "forecaster": name, **scoped_score(kernels, forecasts, scored, args),
                         "seconds": time.perf_counter() - t})
            print(f"  {split}, {name}: {rows[-1]['seconds']:.0f} s", flush=True)
            for calibrator in ([] if registry.reads_folder(registered) else args.calibrator):
                t = time.perf_counter()
                again = ranking.recalibrated(forecasts, kernels, cases, registered, folds, calibrator, also_kernels,
                                             also_cases, kwargs)
                rows.append({"split": split, "forecaster": f"{name}+{calibrator}", "seconds": time.perf_counter() - t,
                             **scoped_score(kernels, again, scored, args)})
                print(f"  {split}, {name}+{calibrator}: {rows[-1]['seconds']:.0f} s", flush=True)
    for label, folder in (f.split("=", 1) for f in args.forecasts):
        files = sorted(Path(folder).glob("forecasts-*.parquet"))
        if not files:
            raise ValueError(f"--forecasts {label}={folder}: no forecasts-*.parquet there")
        tables = [pd.read_parquet(f) for f in files]
        # the folds the forecasts were made under: dealt by the seed they record (this run's when they do not)
        seeds = {int(v) for t in tables for v in (t["fold_seed"] if "fold_seed" in t else [args.seed])}
        if len(seeds) != 1:
            raise ValueError(f"--forecasts {label}={folder}: its files were made under folds of seeds {sorted(seeds)}")
        seed = seeds.pop()
        split = next(iter(splits)) if args.problems == "sealed" else grouped(args, problems, seed)
        folds = splits[split] if args.problems == "sealed" else ranking.problem_folds(problems, args.folds, seed)
        forecasts = ranking.stored_forecasts(kernels, tables, folds)
        first[label], dealt[label] = forecasts, seed
        rows.append({"split": split, "forecaster": label, **scoped_score(kernels, forecasts, scored, args),
                     "seconds": 0.0})
    for value in args.blend:
        a, b, w = blend_of(value)
        missing = [n for n in (a, b) if n not in first]
        if missing:
            raise ValueError(f"--blend {value}: no held-out forecasts of {', '.join(missing)} in this run "
                             f"(its forecasters: {', '.join(first)})")
        if args.problems != "sealed" and dealt[a] != dealt[b]:
            raise ValueError(f"--blend {value}: {a}'s folds were dealt by seed {dealt[a]}, {b}'s by seed {dealt[b]}: "
                             "a kernel must be held out of the same training problems by both")
        label = f"{a}+{b}" + (f":{w:g}" if w != 0.5 else "")
        first[label], dealt[label] = ranking.blended(first[a], first[b], w), dealt[a]
        rows.append({"split": next(iter(splits)), "forecaster": label,
                     **scoped_score(kernels, first[label], scored, args), "seconds": 0.0})
    if args.save_forecasts:
        for name in names:
            save_forecasts(kernels, first[name], Path(args.save_forecasts) / name, args.seed)
    table = pd.DataFrame(rows)
    if args.dealings > 1 and args.problems != "sealed":
        table = pd.concat([table, over_dealings(table, [grouped(args, problems, seed) for seed in
                                                        range(args.seed, args.seed + args.dealings)])],
                          ignore_index=True)
    say()
    say("Per forecaster, on held-out problems (95% bootstrap intervals over problems"
        + ("; on the mean of the dealings, their range" if args.dealings > 1 else "") + "):")
    say(_table(table))
    if skipped:
        say(f"not run: {', '.join(skipped)}")
    paired = versus(args, kernels, first)
    for against, table_of in (paired.groupby("versus", sort=False) if not paired.empty else ()):
        say()
        say(f"Paired against {against} (each forecaster's figure less {against}'s on the kernels both forecast; "
            "95% bootstrap over problems, the same problems for both; * where the interval excludes a tie):")
        say(_versus_table(table_of))
    replays = replayed_searches(kernels, first, args)
    say()
    say("Searches replayed from the measurements (each problem's kernels its children, the reference's resubmission "
        f"among them, measured in the order of each forecaster's held-out ranking under {next(iter(splits))}; the "
        "baseline measures them as they come): the geometric mean over problems of the best found over the "
        "baseline's at each budget, the perfect forecaster's ceiling, and the measurements to a kernel within 10% "
        "of the problem's best (95% bootstrap over problems):")
    say(_replay_table(replays))
    measured = measured_rankers(args, kernels, first, next(iter(splits))) if args.measured_rankers else pd.DataFrame()
    if not measured.empty:
        say()
        say("Rankers that are measurements, not forecasts, on the problems where every kernel has one, beside "
            f"the forecasters of the first split ({next(iter(splits))}) on the same problems; each judged against "
            "the pool's measurement, then against that other measurement as the truth:")
        say(_ranker_table(measured))
    transfer = _cross_gpu(args, kernels, problems)
    say()
    say("Cross-GPU: CUDA-L1's published speedup on another GPU forecast from our measured H100 speedup "
        f"(grouped {min(args.folds, len(problems))}-fold by problem):")
    say(_transfer_table(transfer) if not transfer.empty else "no kernel with a published figure on another GPU")
    say(f"total {time.perf_counter() - t0:.0f} s")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        meta = {"command": "python benchmarks/cudal1_forecast.py " + " ".join(argv_of(args)),
                "pool": args.pool, "spaces": args.spaces, "embeddings": args.embeddings, "protocol": args.protocol, "problems_set": args.problems, "gpu_type": args.gpu_type, "problems": problems,
                "kernels": len(kernels), "failed": int(kernels["failed"].sum()), "draws": args.draws,
                "not_run": skipped}
        Path(args.out + ".json").write_text(json.dumps(
            {**meta, "rows": table.to_dict("records"), "versus": paired.to_dict("records"),
             "measured_rankers": measured.to_dict("records"), "replayed_searches": replays.to_dict("records"),
             "cross_gpu": transfer.to_dict("records")}, indent=1,
            default=float))
    return 0


def replayed_searches(kernels: pd.DataFrame, forecasts: dict, args) -> pd.DataFrame:
    """``ranking.replayed_search`` of each forecaster's held-out forecasts, on the kernels it forecast."""
    from kernelcast.surrogate import ranking

    rows = []
    for name, table in forecasts.items():
        done = table["fold"].notna().to_numpy() if "fold" in table else np.ones(len(table), bool)
        rows.append({"forecaster": name, **ranking.replayed_search(kernels[done], ranking.rank_of(table[done])[0],
                                                                   draws=args.draws, seed=args.seed)})
    return pd.DataFrame(rows)


def _replay_table(table: pd.DataFrame) -> str:
    from kernelcast.surrogate.ranking import REPLAY_BUDGETS

    def cell(r, key, form):
        return f"{r[key]:{form}} [{r[key + '_lo']:{form}}, {r[key + '_hi']:{form}}]"

    heads = ("forecaster", "problems", *(f"best at {b} / baseline's" for b in REPLAY_BUDGETS),
             *(f"ceiling at {b}" for b in REPLAY_BUDGETS), "measurements to the best", "baseline's")
    body = [[r["forecaster"], str(r["problems"]), *(cell(r, f"best_at_{b}", ".3f") for b in REPLAY_BUDGETS),
             *(f"{r[f'oracle_at_{b}']:.3f}" for b in REPLAY_BUDGETS), cell(r, "to_best", ".2f"),
             f"{r['baseline_to_best']:.2f}"] for r in table.to_dict("records")]
    return _aligned(heads, body)


def spaced_problems(folders, problems) -> list[str]:
    """The ``problems`` that one of the ``--spaces`` folders holds a measured variant space of."""
    if not folders:
        raise ValueError("--score-on spaces needs --spaces: the folders of the variant spaces to score on")
    held = {sub.name for folder in folders for sub in Path(folder).iterdir() if sub.is_dir()}
    found = sorted(set(problems) & held)
    if not found:
        raise ValueError(f"--score-on spaces: none of the problems has a space in {', '.join(folders)}")
    return found


def scoped_score(kernels: pd.DataFrame, forecasts: pd.DataFrame, only, args) -> dict:
    """``ranking.score`` of the held-out ``forecasts``, on the kernels of the problems ``only`` names (all: None)."""
    from kernelcast.surrogate import ranking

    if only is not None:
        keep = kernels["op"].isin(only).to_numpy()
        kernels, forecasts = kernels[keep], forecasts[keep]
    return ranking.score(kernels, forecasts, args.draws, args.seed)


def measured_rankers(args, kernels: pd.DataFrame, forecasts: dict, split: str) -> pd.DataFrame:
    """Another measurement of the same kernels, ranked as a forecaster's forecasts are: CUDA-L1's published
    speedup on this GPU type (the null twin, the reference's own code, at 1), the pool's measurement under its
    other protocol, and with ``--retest`` the same protocol's second one (a kernel that failed there at 0). Each
    is scored on the problems where every kernel has it, and so is each forecaster of ``forecasts`` (held out
    under ``split``), on the same problems: how close a forecaster comes to what a second measurement knows."""
    from kernelcast.kernels.formats.cudal1 import published_gpu
    from kernelcast.surrogate import ranking

    values = {}
    side = pd.read_parquet(Path(args.pool) / "cudal1.parquet").dropna(subset=["candidate_id"])
    column = f"published_speedup_{published_gpu(args.gpu_type)}"
    if column in side:
        by_id = side.drop_duplicates("candidate_id").set_index("candidate_id")
        figure = kernels["candidate_id"].map(by_id[column]).astype(float)
        values[f"CUDA-L1's published {args.gpu_type} speedup"] = figure.where(
            kernels["candidate_id"].map(by_id["variant"]) != "null", 1.0)
    other = next(p for p in PROTOCOLS if p != args.protocol)
    if (Path(args.pool) / other).is_dir():
        values[f"our measurement under the {other} protocol"] = _worth_of(kernels, args, protocol=other)
    if args.retest:  # the same kernels measured again, by the same protocol, into another pool root
        values[f"our second measurement under the {args.protocol} protocol"] = _worth_of(kernels, args,
                                                                                        pool=args.retest)
    held = np.logical_or.reduce([f["fold"].notna().to_numpy() for f in forecasts.values()]) if forecasts else True
    pool = "the pool's measurement"
    pool_worth = pd.Series(ranking.worth(kernels["speedup"], kernels["failed"]), index=kernels.index)
    rows = []
    for ranker, value in values.items():
        whole = value.notna().groupby(kernels["op"]).transform("all").to_numpy() & held
        if not whole.any():
            continue
        # judged against the pool, then the other way round: this measurement as the truth, the pool's own one
        # more ranker, and every figure of each forecaster (failure AUROC and ECE too) against it
        for truth, judged_against, rank, rank_name in ((kernels, pool, value, ranker),
                                                       (as_truth(kernels, value), ranker, pool_worth, pool)):
            rows.append({"ranker": ranker, "judged_against": judged_against, "kind": "measurement",
                         "ranked_by": rank_name, "split": split,
                         **ranking.ranking_figures(truth[whole], rank[whole].to_numpy(), draws=args.draws,
                                                   seed=args.seed)})
            rows += [{"ranker": ranker, "judged_against": judged_against, "kind": f"forecaster {name}",
                      "ranked_by": f"forecaster {name}", "split": split,
                      **ranking.score(truth[whole], theirs[whole], args.draws, args.seed)}
                     for name, theirs in forecasts.items()]
    return pd.DataFrame(rows)


def development_split(kernels: pd.DataFrame) -> tuple[pd.DataFrame, frozenset]:
    """The kernels of the development problems, and the sealed problems kept out of them
    (``kernelcast.surrogate.ranking.sealed_problems``: fixed by the problems' names)."""
    from kernelcast.surrogate import ranking

    sealed = ranking.sealed_problems(kernels["op"].unique())
    return kernels[~kernels["op"].isin(sealed)].reset_index(drop=True), sealed


def save_forecasts(kernels: pd.DataFrame, forecasts: pd.DataFrame, folder: Path, seed: int, part: str = "0") -> Path:
    """``forecasts`` (held out, aligned with ``kernels``) of the kernels they forecast, into
    ``folder/forecasts-<part>.parquet`` in the stored forecasts' columns (op, candidate_id, fold, fold_seed, p_fail,
    expected, probs): ``kernelcast.surrogate.ranking.stored_forecasts`` reads them back under the same folds."""
    done = forecasts["fold"].notna().to_numpy()
    table = pd.DataFrame({"op": kernels["op"][done], "candidate_id": kernels["candidate_id"][done],
                          "fold": forecasts["fold"][done], "fold_seed": seed,
                          "p_fail": forecasts["p_fail"][done].astype(float),
                          "expected": forecasts["expected"][done].astype(float),
                          "probs": [list(map(float, p)) for p in forecasts["probs"][done]]})
    folder.mkdir(parents=True, exist_ok=True)
    table.to_parquet(folder / f"forecasts-{part}.parquet", index=False)
    return folder


def as_truth(kernels: pd.DataFrame, worth: pd.Series) -> pd.DataFrame:
    """``kernels`` with another measurement's ``worth`` of each (its speedup, 0 where it failed there) as their
    measured speedup, failure and bin."""
    from kernelcast.surrogate.bins import speedup_bin

    return kernels.assign(speedup=worth.where(worth > 0), failed=worth == 0,
                          true_bin=[speedup_bin(w if w > 0 else None) for w in worth.fillna(0.0)])


def versus(args, kernels: pd.DataFrame, forecasts: dict) -> pd.DataFrame:
    """Each forecaster of ``forecasts`` (the first split's, and any stored ones) against each of ``--versus``'s
    (comma-separated), paired on the kernels both forecast (``kernelcast.surrogate.ranking.paired_difference``); a
    ``--versus`` forecaster that was not run gives no rows."""
    from kernelcast.surrogate import ranking

    rows = [{"forecaster": name, "versus": against,
             **ranking.paired_difference(kernels, theirs, forecasts[against], args.draws, args.seed)}
            for against in (a for a in args.versus.split(",") if a in forecasts)
            for name, theirs in forecasts.items() if name != against]
    return pd.DataFrame(rows)


def _versus_table(table: pd.DataFrame) -> str:
    def cell(r, key):
        value, lo, hi = r[key], r[key + "_lo"], r[key + "_hi"]
        if not np.isfinite(value):
            return "-"
        return f"{value:+.2f} [{lo:+.2f},{hi:+.2f}]" + ("*" if lo > 0 or hi < 0 else "")

    keys = ("spearman", "top1_within_10pct", "select_top10_within_20pct", "failure_auroc", "ece", "aurc")
    heads = ("forecaster", "problems", "Spearman", "top-1 within 10%", "top 10% within 20%", "failure AUROC", "ECE",
             "AURC")
    body = [[r["forecaster"], str(r["problems"]), *[cell(r, k) for k in keys]] for r in table.to_dict("records")]
    return _aligned(heads, body)


def _worth_of(kernels: pd.DataFrame, args, **where) -> pd.Series:
    """What each of ``kernels`` measured in the pool ``where`` names (another ``protocol`` or ``pool``; no spaces):
    its speedup, 0 where it failed there, NaN where it was not measured there."""
    from kernelcast.surrogate import ranking

    found = _measured(argparse.Namespace(**{**vars(args), "spaces": [], **where}))[0]
    found = pd.Series(ranking.worth(found["speedup"], found["failed"]), index=found["candidate_id"])
    return kernels["candidate_id"].map(found[~found.index.duplicated()]).astype(float)


def _ranker_table(table: pd.DataFrame) -> str:
    heads = ("problems of", "judged against", "ranked by", "problems", "Spearman (problems)", "top-1 within 10%",
             "top 10% within 20%", "top 20% within 20%", "top 30% within 20%", "failure AUROC", "ECE")
    body = [[r["ranker"], r["judged_against"], r["ranked_by"], str(r["problems"]),
             f"{_cell(r, 'spearman')} ({r['spearman_problems']})", *[_cell(r, k) for k in COLUMNS[1:5]],
             *[_cell(r, k) for k in ("failure_auroc", "ece")]]
            for r in table.to_dict("records")]
    return _aligned(heads, body)


def grouped(args, problems, seed: int) -> str:
    """The split's label for the grouped folds dealt by ``seed`` (named by the seed when there are several)."""
    label = f"grouped {min(args.folds, len(problems))}-fold by problem"
    return f"{label}, dealing {seed}" if args.dealings > 1 else label


def over_dealings(table: pd.DataFrame, splits: list[str]) -> pd.DataFrame:
    """Per forecaster scored under every one of ``splits`` (the dealings), a row of each figure's mean over them,
    its ``_lo``/``_hi`` the lowest and highest of them."""
    rows = []
    dealt = table[table["split"].isin(splits)]
    figures = [c for c in dealt.columns if c.endswith("_lo")]
    for name, group in dealt.groupby("forecaster", sort=False):
        if len(group) != len(splits):
            continue  # scored under one dealing only (forecasts stored from elsewhere): no mean to take
        row = {**group.iloc[0].to_dict(), "split": f"{splits[0].rsplit(', dealing', 1)[0]}, mean of {len(splits)} "
               f"dealings", "seconds": float(group["seconds"].sum())}
        for lo in figures:
            key = lo[:-3]
            row[key], row[lo], row[key + "_hi"] = group[key].mean(), group[key].min(), group[key].max()
        rows.append(row)
    return pd.DataFrame(rows)


def argv_of(args) -> list[str]:
    """The run's flags; a path given absolute is written relative to the checkout."""
    out, here = [], Path(__file__).resolve().parents[1]
    for key, value in vars(args).items():
        for v in value if isinstance(value, list) else [value]:
            if v is not None:
                v = os.path.relpath(v, here) if isinstance(v, str) and os.path.isabs(v) else v
                out += [f"--{key.replace('_', '-')}", str(v)]
    return out


def _cell(r: dict, key: str) -> str:
    value = r.get(key, float("nan"))
    if not np.isfinite(value):
        return "-"
    lo, hi = r.get(key + "_lo", float("nan")), r.get(key + "_hi", float("nan"))
    return f"{value:.2f} [{lo:.2f},{hi:.2f}]" if np.isfinite(lo) else f"{value:.2f}"


def _table(table: pd.DataFrame) -> str:
    heads = ("split", "forecaster", "problems", "Spearman (problems)", "top-1 within 10%", "top 10% within 20%",
             "top 20% within 20%", "top 30% within 20%", "failure AUROC", "ECE", "AURC")
    body = [[r["split"], r["forecaster"], str(r["problems"]),
             f"{_cell(r, 'spearman')} ({r['spearman_problems']})", *[_cell(r, k) for k in COLUMNS[1:]]]
            for r in table.to_dict("records")]
    return _aligned(heads, body)


def _aligned(heads, body) -> str:
    width = [max(len(str(x)) for x in col) for col in zip(heads, *body)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(row, width)) for row in [heads, *body])


def published_figures(pool: str, corpus: str, side_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """candidate_id, gpu_type, target_speedup: CUDA-L1's published speedup of each kernel on each target GPU,
    from the side table where it has the GPU's figures, else from the corpus files where that GPU's file
    holds the very code (nothing where neither has it)."""
    from kernelcast.kernels.formats.cudal1 import VARIANTS, published_gpu, read_corpus

    side = side_table if side_table is not None else pd.read_parquet(Path(pool) / "cudal1.parquet")
    rows, problems = [], None
    for gpu in TARGET_GPUS:
        column = f"published_speedup_{published_gpu(gpu)}"
        if column in side and side[column].notna().any():
            same = side.get(f"same_code_{published_gpu(gpu)}", pd.Series(True, index=side.index)).fillna(False)
            have = side[side[column].notna() & same.astype(bool)]
            rows += [{"candidate_id": c, "gpu_type": gpu, "target_speedup": float(s)}
                     for c, s in zip(have["candidate_id"], have[column])]
            continue
        if problems is None:
            problems = {p.op_name: p for p in read_corpus(corpus)} if Path(corpus).is_dir() else {}
        for r in side.dropna(subset=["candidate_id"]).to_dict("records"):
            p, v = problems.get(r["op"]), VARIANTS.get(r["variant"])
            if p is None or v is None or not v.published or v.field is None:
                continue
            figure = v.published_speedup(p, published_gpu(gpu))
            if figure and p.same_code[published_gpu(gpu)].get(v.field):
                rows.append({"candidate_id": r["candidate_id"], "gpu_type": gpu, "target_speedup": figure})
    return pd.DataFrame(rows, columns=["candidate_id", "gpu_type", "target_speedup"])


def _cross_gpu(args, kernels: pd.DataFrame, problems: list[str]) -> pd.DataFrame:
    """One row per (target GPU, model) and over all target GPUs: the cross-GPU scores."""
    from kernelcast.surrogate import crossgpu, ranking

    figures = published_figures(args.pool, args.corpus)
    ran = kernels[~kernels["failed"] & (kernels["speedup"] > 0)]
    rows = ran[["op", "candidate_id", "speedup"]].rename(columns={"speedup": "source_speedup"}).merge(
        figures, on="candidate_id")
    rows = rows[rows["target_speedup"] > 0].reset_index(drop=True)
    if rows.empty:
        return pd.DataFrame()
    folds = ranking.problem_folds(sorted(rows["op"].unique()), args.folds, args.seed)
    out = []
    for model in crossgpu.MODELS:
        forecast = crossgpu.held_out(rows, folds, model, args.gpu_type)
        for gpu in [*TARGET_GPUS, "all"]:
            mine = (rows["gpu_type"] == gpu).to_numpy() if gpu != "all" else np.ones(len(rows), bool)
            if mine.any():
                out.append({"gpu_type": gpu, "model": model, "problems": int(rows.loc[mine, "op"].nunique()),
                            **crossgpu.scores(forecast[mine], rows["target_speedup"].to_numpy()[mine])})
    return pd.DataFrame(out)


def _transfer_table(table: pd.DataFrame) -> str:
    heads = ("GPU", "model", "kernels (problems)", "Spearman", "median |log error|", "within 20%")
    body = [[r["gpu_type"], r["model"], f"{r['n']} ({r['problems']})", f"{r['spearman']:.2f}",
             f"{r['median_abs_log_error']:.3f}", f"{r['within_20pct']:.2f}"] for r in table.to_dict("records")]
    return _aligned(heads, body)


if __name__ == "__main__":
    raise SystemExit(main())
