"""The task sweep as a script for a measuring machine with torch and triton alone (``kernelcast sweep`` needs the
whole project installed); the sweep itself is ``kernelcast.kernels.harness.sweep``.

    PYTHONPATH=$PWD python benchmarks/task_sweep.py --tasks ../shared/tasks --out DIR [--max-minutes 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcast.kernels.harness.sweep import add_arguments, run  # noqa: E402 - after the checkout is on the path

TASKS = Path(__file__).resolve().parents[2] / "shared" / "tasks"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Sweep a folder of public tasks through the harness.")
    p.add_argument("--tasks", default=str(TASKS),
                   help="folder swept for KernelBench problems and GPU MODE tasks (default: %(default)s)")
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args.tasks, args)


if __name__ == "__main__":
    sys.exit(main())
