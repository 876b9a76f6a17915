"""Check template variants under Triton's CPU interpreter: ``python -m kernelcast.kernels.spaces.check OP [N]``.

Runs a spread of N variants of OP (default: one per algorithm plus a few) on the
operation's tiny interpreter cases and prints any that fail. For developers of spaces.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

from kernelcast.kernels.harness.correctness import check_once, load_launch  # noqa: E402
from kernelcast.kernels.ops import get_operation  # noqa: E402
from kernelcast.kernels.spaces import get_space  # noqa: E402


def check(op_name: str, limit: int) -> int:
    op, space = get_operation(op_name), get_space(op_name)
    variants = space.variants()
    firsts = {}
    for c in variants:
        firsts.setdefault(c.template, c)
    picked = list(firsts.values()) + space.spread_subset(limit)
    failures = 0
    for cand in picked:
        launch = load_launch(cand.source)
        for case in op.interpret_cases:
            try:
                problem = check_once(op, case, launch, cand.params, seed=1, device="cpu")
            except Exception as exc:  # report every failure, keep checking the rest
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                failures += 1
                print(f"FAIL {cand.template} {cand.params} {case.name}: {problem}")
    print(f"{op_name}: {len(variants)} variants, {len(picked)} checked, {failures} failures")
    return failures


if __name__ == "__main__":
    sys.exit(1 if check(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6) else 0)
