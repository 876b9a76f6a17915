"""Compare measurements of the same CUDA-L1 pool candidates across runs: verdicts that changed, and how far the
speedups of candidates ok in both runs (and the references' own runtimes) moved.

    PYTHONPATH=$PWD python benchmarks/pool_runs_compare.py NAME=ROOT NAME=ROOT [...] [--protocol kernelcast]
        [--mark ops.txt] [--markdown OUT.md] [--runtimes]

Each ROOT is a pool root (``cudal1_pool.py --root``); its ``<protocol>/measurements`` are read. The first run is
the baseline of every pair of consecutive runs and of each later one. ``--mark`` names problems (comma-separated op
names) shown apart in the table (the ones a change was aimed at). ``--runtimes`` adds a table of what each speedup
stands on: the candidate's runtime, the reference's stored runtime it was divided into, and whether the candidate's
figure was anchored (timed beside the reference, its ratio carried to the stored runtime). ``--processes`` adds,
for references measured in several processes (``WorkerConfig.reference_processes``; their rows name each process's
figure), how far each rule's figure moves across the runs that measured so: the first process alone (what one process
stores), the median process and the fastest (what is stored), beside the stored runtime's range over the runs that
measured in one process. Reads Parquet only: no GPU.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcast.kernels.harness.sweep_report import anchored_in  # noqa: E402 - after the path is set
from kernelcast.kernels.harness.worker import anchored_slowed_in, reference_process_figures  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="NAME=ROOT", help="two or more pool roots, each with a name")
    p.add_argument("--protocol", default="kernelcast", help="the data root under each pool root (default: %(default)s)")
    p.add_argument("--mark", default="", help="a file of comma-separated op names shown apart")
    p.add_argument("--markdown", default=None, help="write the tables here as well")
    p.add_argument("--runtimes", action="store_true",
                   help="a table of each speedup's runtimes (candidate / stored reference, us) and its anchoring")
    p.add_argument("--processes", action="store_true",
                   help="for references measured in several processes: each rule's figure across the runs")
    return p.parse_args(argv)


def read_run(root: str, protocol: str) -> pd.DataFrame:
    path = Path(root) / protocol / "measurements"
    if not path.is_dir():
        raise SystemExit(f"error: no measurements at {path} (a pool root holds <protocol>/measurements)")
    table = pd.read_parquet(path).sort_values("measured_at").drop_duplicates("candidate_id", keep="last")
    candidates = Path(root) / protocol / "candidates"
    if not candidates.is_dir():
        raise SystemExit(f"error: no candidates at {candidates} (which of the measurements are references)")
    origin = pd.read_parquet(candidates, columns=["candidate_id", "origin"]).drop_duplicates("candidate_id")
    return table.merge(origin, on="candidate_id", how="left")


def geomean(values) -> float:
    """NaN for no values: an ok candidate whose op's reference was not measured ok has no reference figure."""
    values = [float(v) for v in values]
    if not values:
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _anchor_mark(anchored) -> str:
    """" a" for an anchored figure, " a s" for one anchored beside a slowed reference, "" for one timed alone."""
    return " a s" if anchored == "s" else " a" if anchored else ""


def is_reference(table: pd.DataFrame) -> pd.Series:
    """The op's reference rows: the candidates of origin ``seed`` (an imported task's reference)."""
    return table["origin"].eq("seed")


def spread(a: pd.Series, b: pd.Series) -> dict:
    ratio = (b / a).dropna()
    dev = (ratio - 1).abs()
    return {"n": len(ratio), "median_abs_dev": float(dev.median()) if len(dev) else None,
            "within_2pct": int((dev <= 0.02).sum()), "within_5pct": int((dev <= 0.05).sum()),
            "within_10pct": int((dev <= 0.10).sum()), "largest": float(ratio.max()) if len(ratio) else None,
            "smallest": float(ratio.min()) if len(ratio) else None}


def compare(runs: dict[str, pd.DataFrame], marked: set[str]) -> tuple[pd.DataFrame, list[dict]]:
    names = list(runs)
    rows = {}
    for name, table in runs.items():
        own = table[~is_reference(table)]
        for r in own.itertuples(index=False):
            row = rows.setdefault(r.candidate_id, {"candidate_id": r.candidate_id, "op": r.op,
                                                   "marked": r.op in marked})
            row[f"{name}_status"] = r.status
            row[f"{name}_speedup"] = r.speedup if r.status == "ok" else None
            if r.status == "ok":
                row[f"{name}_us"] = geomean(r.runtime_us_median)
                row[f"{name}_reference_us"] = geomean(r.reference_us_median)
                checks = getattr(r, "checks", "") or ""
                row[f"{name}_anchored"] = "s" if anchored_slowed_in(checks) else bool(anchored_in(checks))
    wide = pd.DataFrame(list(rows.values())).sort_values(["marked", "op"])
    pairs = []
    base = names[0]
    for a, b in [(base, n) for n in names[1:]] + [(x, y) for x, y in zip(names[1:], names[2:])]:
        refs = {n: runs[n][is_reference(runs[n])].set_index("op")["runtime_us_median"].map(geomean) for n in (a, b)}
        seen = wide[wide[f"{a}_status"].notna() & wide[f"{b}_status"].notna()]  # measured in both runs
        both = seen[seen[f"{a}_status"].eq("ok") & seen[f"{b}_status"].eq("ok")].set_index("candidate_id")
        pairs.append({"runs": f"{a} -> {b}", "in_both": len(seen),
                      "verdicts_changed": int((seen[f"{a}_status"] != seen[f"{b}_status"]).sum()),
                      "failed_then_ok": int((seen[f"{a}_status"].ne("ok") & seen[f"{b}_status"].eq("ok")).sum()),
                      "ok_then_failed": int((seen[f"{a}_status"].eq("ok") & seen[f"{b}_status"].ne("ok")).sum()),
                      "speedup": spread(both[f"{a}_speedup"].astype(float), both[f"{b}_speedup"].astype(float)),
                      "reference_runtime": spread(refs[a], refs[b])})
    return wide, pairs


def runtimes_table(wide: pd.DataFrame, names: list[str]) -> list[str]:
    """Each candidate's runtime over the stored reference's in each run (us), ``a`` where it was anchored (``a s``
    beside a slowed reference)."""
    lines = ["", "Runtimes (us): candidate / the reference's stored runtime; a: the candidate's figure was anchored; "
             "a s: anchored beside a reference that ran 1.25x its stored runtime or more",
             "", "| op | candidate | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r in wide.itertuples(index=False):
        cells = []
        for n in names:
            us = getattr(r, f"{n}_us", None)
            cells.append("-" if us is None or us != us else
                         f"{us:.1f} / {getattr(r, f'{n}_reference_us'):.1f}{_anchor_mark(getattr(r, f'{n}_anchored'))}")
        lines.append(f"| {r.op} | {r.candidate_id} | " + " | ".join(cells) + " |")
    return lines


PROCESS_RULES = {"first process": lambda f: f[0], "median process": lambda f: sorted(f)[(len(f) - 1) // 2],
                 "fastest process": min}


def reference_processes(runs: dict[str, pd.DataFrame]) -> dict:
    """Per (op, case) of a reference measured in several processes in some run: each rule's figure in each such run
    (``PROCESS_RULES``), and the stored runtime in each run that measured it in one process ("one process")."""
    found: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for name, table in runs.items():
        for r in table[is_reference(table) & table["status"].eq("ok")].itertuples(index=False):
            figures = reference_process_figures(getattr(r, "checks", "") or "")
            for i, case in enumerate(r.case_names):
                rules = found.setdefault((r.op, case), {rule: {} for rule in (*PROCESS_RULES, "one process")})
                if case in figures:
                    for rule, pick in PROCESS_RULES.items():
                        rules[rule][name] = pick(figures[case])
                elif not figures:
                    rules["one process"][name] = float(r.runtime_us_median[i])
    return {key: rules for key, rules in found.items() if rules["fastest process"]}


def processes_table(found: dict) -> list[str]:
    """Each rule's range over the runs (largest over smallest figure), per reference case and summed up."""
    rules = [*PROCESS_RULES, "one process"]
    ranges = {rule: [] for rule in rules}
    lines = ["", "References measured in several processes: each rule's figure (us) over the runs, and its range "
             "(largest / smallest); \"one process\": the stored runtime in the runs that measured in one", "",
             "| op | case | " + " | ".join(rules) + " |", "|---|---|" + "---|" * len(rules)]
    for (op, case), by_rule in sorted(found.items()):
        cells = []
        for rule in rules:
            values = list(by_rule[rule].values())
            if len(values) >= 2:
                ranges[rule].append(max(values) / min(values))
            cells.append(" / ".join(f"{v:.1f}" for v in values) + (f" ({max(values) / min(values):.2f}x)"
                                                                      if len(values) >= 2 else "") if values else "-")
        lines.append(f"| {op} | {case} | " + " | ".join(cells) + " |")
    lines += ["", "| rule | reference cases | median range | within 5% | within 10% | widest |",
              "|---|---|---|---|---|---|"]
    for rule in rules:
        v = sorted(ranges[rule])
        if v:
            lines.append(f"| {rule} | {len(v)} | {v[(len(v) - 1) // 2]:.3f}x | {sum(x <= 1.05 for x in v)} | "
                         f"{sum(x <= 1.10 for x in v)} | {v[-1]:.2f}x |")
    return lines


def alone_speedups(wide: pd.DataFrame, found: dict, names: list[str]) -> list[str]:
    """The speedups of kernels timed alone (not anchored) in every run, as stored in the runs whose reference took one
    process and over the fastest process in the runs whose reference took several: what the fastest rule does to a
    GPU-bound kernel's speedup over a host-bound reference."""
    cases = {}
    for (op, case), rules in found.items():
        cases.setdefault(op, []).append(rules)
    lines = ["", "Speedups of kernels timed alone, as stored (runs whose reference took one process) and over the "
             "fastest process (runs whose reference took several); range: largest / smallest", "",
             "| op | candidate | " + " | ".join(names) + " | range, one process | range, fastest process |",
             "|---|---|" + "---|" * (len(names) + 2)]
    ranges = {"one": [], "fastest": []}
    for r in wide.itertuples(index=False):
        if r.op not in cases:
            continue
        one, fastest, cells = [], [], []
        for n in names:
            us = getattr(r, f"{n}_us", None)
            if us is None or us != us or getattr(r, f"{n}_anchored"):
                cells.append("-")
                continue
            by_case = [rules["fastest process"].get(n) for rules in cases[r.op]]
            if all(v is not None for v in by_case):
                value = geomean(by_case) / us
                fastest.append(value)
            elif all(n in rules["one process"] for rules in cases[r.op]):
                value = float(getattr(r, f"{n}_speedup"))
                one.append(value)
            else:
                cells.append("-")
                continue
            cells.append(f"{value:.3f}")
        if not one and not fastest:
            continue
        spans = [f"{max(v) / min(v):.2f}x" if len(v) >= 2 else "-" for v in (one, fastest)]
        if len(one) >= 2 and len(fastest) >= 2:
            ranges["one"].append(max(one) / min(one))
            ranges["fastest"].append(max(fastest) / min(fastest))
        lines.append(f"| {r.op} | {r.candidate_id} | " + " | ".join(cells + spans) + " |")
    if ranges["one"]:
        mid = lambda v: sorted(v)[(len(v) - 1) // 2]  # noqa: E731
        lines += ["", f"Kernels timed alone in two or more runs of each kind: {len(ranges['one'])}; median range "
                      f"{mid(ranges['one']):.3f}x as stored in one process, {mid(ranges['fastest']):.3f}x over the "
                      "fastest process"]
    return lines


def markdown(wide: pd.DataFrame, pairs: list[dict], names: list[str], runtimes: bool = False,
             processes: dict | None = None) -> str:
    lines = ["| runs | candidates in both | verdicts changed | failed -> ok | ok -> failed | speedups both ok | median abs change | "
             "within 2% / 5% / 10% | ratio range | references | their median abs change | within 2% / 5% |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        s, r = p["speedup"], p["reference_runtime"]
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {p['runs']} | {p['in_both']} | {p['verdicts_changed']} | {p['failed_then_ok']} | {p['ok_then_failed']} | "
                     f"{s['n']} | {fmt(s['median_abs_dev'])} | {s['within_2pct']} / {s['within_5pct']} / "
                     f"{s['within_10pct']} | {fmt(s['smallest'])}-{fmt(s['largest'])} | {r['n']} | "
                     f"{fmt(r['median_abs_dev'])} | {r['within_2pct']} / {r['within_5pct']} |")
    lines += ["", "| op | candidate | marked | " + " | ".join(names) + " |",
              "|---|---|---|" + "---|" * len(names)]
    for r in wide.itertuples(index=False):
        cells = []
        for n in names:
            status, speed = getattr(r, f"{n}_status", None), getattr(r, f"{n}_speedup", None)
            cells.append("-" if not isinstance(status, str) else
                         f"{speed:.3f}" if status == "ok" and speed == speed else status)
        lines.append(f"| {r.op} | {r.candidate_id} | {'yes' if r.marked else ''} | " + " | ".join(cells) + " |")
    if runtimes:
        lines += runtimes_table(wide, names)
    if processes is not None:
        lines += processes_table(processes) + alone_speedups(wide, processes, names)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse(argv)
    runs = {}
    for item in args.runs:
        name, sep, root = item.partition("=")
        if not sep or not name or not root:
            print(f"error: give each run as NAME=ROOT, got {item!r}", file=sys.stderr)
            return 2
        runs[name] = read_run(root, args.protocol)
    if len(runs) < 2:
        print("error: give two or more runs", file=sys.stderr)
        return 2
    marked = set(filter(None, Path(args.mark).read_text().replace("\n", ",").split(","))) if args.mark else set()
    wide, pairs = compare(runs, marked)
    text = markdown(wide, pairs, list(runs), args.runtimes, reference_processes(runs) if args.processes else None)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
