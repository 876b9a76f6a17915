"""Which of the judge's rules each kernel of a measured CUDA-L1 pool breaks, read on meta tensors before any GPU
(``kernelcast.surrogate.physics.rule_facts``), against the verdict the pool holds for it.

    PYTHONPATH=$PWD python benchmarks/rule_facts_census.py [--pool data/pools/cudal1/h100-2026-11-27]
        [--problems dev|sealed|all] [--out FILE]

Per rule (``physics.RULE_FACTS``, each forecast to fail at ``physics.RULE_FAILURE``) and per leaning (cuDNN
autotuning switched on, half-precision arithmetic where the reference has none): the kernels it flags by the
pool's verdict, then each flagged kernel by name; and how many kernels' facts could be found at all. The sealed
problems are read only with ``--problems sealed`` or ``all``. Facts come from ``~/.cache/kernelcast/facts`` where a
forecaster has found them already.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import cudal1_forecast  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", default="data/pools/cudal1/h100-2026-11-27")
    p.add_argument("--protocol", default="kernelcast", choices=cudal1_forecast.PROTOCOLS)
    p.add_argument("--gpu-type", default="h100")
    p.add_argument("--problems", default="dev", choices=("dev", "sealed", "all"))
    p.add_argument("--out", default=None, help="also write what is printed to FILE")
    p.set_defaults(spaces=[], drop_verdicts=None)  # what cudal1_forecast's reading of the pool also asks
    return p.parse_args(argv)


def census(kernels) -> tuple[collections.Counter, list[tuple]]:
    """({(fact, verdict): kernels}, [(fact, verdict, candidate id, op)]) of ``kernels`` (a pool's measured rows)."""
    from kernelcast.kernels.facts import DEFAULT_CACHE_DIR
    from kernelcast.surrogate.dataset import source_requests
    from kernelcast.surrogate.physics import RULE_FACTS, find_facts, request_facts

    requests = source_requests(kernels)
    find_facts(requests, True, DEFAULT_CACHE_DIR)
    counts: collections.Counter = collections.Counter()
    flagged = []
    for row, request in zip(kernels.to_dict("records"), requests):
        facts = request_facts(request, True, DEFAULT_CACHE_DIR)
        counts[("kernels", row["status"])] += 1
        counts[("facts " + facts["status"], "")] += 1
        for name in (*RULE_FACTS, "cudnn_benchmark", "lower_precision"):
            if facts[name]:
                counts[(name, row["status"])] += 1
                flagged.append((name, row["status"], row["candidate_id"], row["op"]))
    return counts, flagged


def main(argv=None) -> int:
    args = parse(argv)
    lines: list[str] = []

    def work():
        kernels, _ = cudal1_forecast._measured(args)
        development, sealed = cudal1_forecast.development_split(kernels)
        chosen = {"dev": development, "sealed": kernels[kernels["op"].isin(sealed)], "all": kernels}[args.problems]
        counts, flagged = census(chosen.reset_index(drop=True))
        lines.append(f"{args.pool} ({args.protocol}, {args.gpu_type}), {args.problems} problems: "
                     f"{chosen['op'].nunique()} problems, {len(chosen)} kernels")
        for (fact, verdict), n in sorted(counts.items()):
            lines.append(f"{fact:22s} {verdict:14s} {n}")
        lines.append("")
        lines.extend(f"{fact:22s} {verdict:14s} {cid} {op}" for fact, verdict, cid, op in flagged)

    cudal1_forecast.with_pool_tasks(work)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
