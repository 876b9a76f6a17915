"""torch.compile of each KernelBench reference against CUDA-L1's kernels of the same problem, as measured.

    PYTHONPATH=$PWD python benchmarks/compile_vs_pool.py [--compiled data/pools/compiled] [--pool data/pools/cudal1]
        [--markdown OUT.md]

For every problem folder of ``--compiled`` (each a data root holding the reference and its torch.compile children,
as ``headroom_search --space --space-reference-only`` leaves it): the speedup over eager of the default mode and of
the best mode, against the best CUDA-L1 kernel of the problem in ``--pool`` (its kernel, CUDA-graph and cuDNN
variants, under kernelcast's protocol), and whether the pool report lists the problem as having headroom (a kernel
at 1.3x eager or more). Each speedup is over the reference measured in its own root, at its own hour: the two
columns carry that drift. Reads stored measurements only (no GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernelcast.storage.dataset import DataRoot  # noqa: E402

REPORT = ROOT / "docs" / "measured" / "cudal1_pool" / "cudal1_pool_h100_2026-11-26.json"
MODES = ("compile-default", "compile-reduce-overhead", "compile-max-autotune-no-cudagraphs", "compile-max-autotune")


def compiled_speedups(folder: Path, gpu_type: str) -> dict[str, float | None]:
    """Mode -> speedup over the folder's own reference (None where the child did not run)."""
    root = DataRoot(str(folder))
    op = folder.name
    measured = root.read_measurements(op=op, gpu_type=gpu_type)
    origins = root.read_candidates(op=op)[["candidate_id", "origin"]].drop_duplicates("candidate_id")
    rows = measured.merge(origins, on="candidate_id")
    found: dict[str, float | None] = {}
    for _, r in rows.iterrows():
        mode = str(r["origin"]).removeprefix("variant:")
        if mode in MODES:
            found[mode] = float(r["speedup"]) if r["status"] == "ok" and r["speedup"] == r["speedup"] else None
    return found


def pool_best(pool: Path, op: str, gpu_type: str, side: pd.DataFrame) -> tuple[float | None, str]:
    """(the best speedup of the problem's CUDA-L1 kernels in the pool, which variant), or (None, '')."""
    measured = DataRoot(str(pool / "kernelcast")).read_measurements(op=op, gpu_type=gpu_type)
    mine = side[side["op"] == op][["candidate_id", "variant"]]
    rows = measured.merge(mine, on="candidate_id")
    rows = rows[(rows["status"] == "ok") & (rows["variant"] != "null") & rows["speedup"].notna()]
    if rows.empty:
        return None, ""
    best = rows.loc[rows["speedup"].idxmax()]
    return float(best["speedup"]), str(best["variant"])


def table(compiled: Path, pool: Path, gpu_type: str, report: Path) -> list[dict]:
    side = pd.read_parquet(pool / "cudal1.parquet")
    headroom = {r["op"] for r in json.loads(report.read_text())["headroom"]} if report.is_file() else set()
    rows = []
    for folder in sorted(p for p in compiled.iterdir() if p.is_dir()):
        modes = compiled_speedups(folder, gpu_type)
        ran = {m: s for m, s in modes.items() if s is not None}
        best_mode = max(ran, key=ran.get) if ran else ""
        cudal1, variant = pool_best(pool, folder.name, gpu_type, side)
        rows.append({"op": folder.name, "headroom": folder.name in headroom, "default": modes.get("compile-default"),
                     "best_compile": ran.get(best_mode), "best_mode": best_mode, "cudal1": cudal1,
                     "cudal1_variant": variant, "failed_modes": sorted(m for m, s in modes.items() if s is None)})
    return rows


def _f(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def markdown(rows: list[dict]) -> str:
    lines = ["| problem | headroom list | compile default | best compile (mode) | best CUDA-L1 (variant) | "
             "best / compile default |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        best = max((x for x in (r["best_compile"], r["cudal1"]) if x is not None), default=None)
        over = best / r["default"] if best and r["default"] else None
        lines.append(f"| {r['op'].removeprefix('kb.cudal1-')} | {'yes' if r['headroom'] else ''} | {_f(r['default'])} | "
                     f"{_f(r['best_compile'])} ({r['best_mode'].removeprefix('compile-') or '-'}) | "
                     f"{_f(r['cudal1'])} ({r['cudal1_variant'] or '-'}) | {_f(over)} |")
    both = [r for r in rows if r["best_compile"] and r["cudal1"]]
    if both:
        ratio = math.exp(sum(math.log(r["best_compile"] / r["cudal1"]) for r in both) / len(both))
        wins = sum(r["best_compile"] > r["cudal1"] for r in both)
        lines.append("")
        lines.append(f"{len(both)} problems with both: the best compile mode beats the best CUDA-L1 kernel on {wins}; "
                     f"geomean best compile / best CUDA-L1 {ratio:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compiled", default=str(ROOT / "data" / "pools" / "compiled"))
    p.add_argument("--pool", default=str(ROOT / "data" / "pools" / "cudal1"))
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--report", default=str(REPORT))
    p.add_argument("--markdown", default="")
    args = p.parse_args(argv)
    compiled, pool = Path(args.compiled), Path(args.pool)
    for path, what in ((compiled, "--compiled"), (pool / "cudal1.parquet", "--pool")):
        if not path.exists():
            print(f"{what}: no {path}", file=sys.stderr)
            return 2
    text = markdown(table(compiled, pool, args.gpu_type, Path(args.report)))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
