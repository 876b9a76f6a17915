"""The ``kernelcast`` command line: the parser built from the command groups, and ``main``.

Each command group is a module of ``kernelcast.flows.commands`` (listed once, in ``GROUPS``); this file
only assembles them and turns a bad input into one clear line and exit status 2.
Configuration is read there, at the edge, validated once, and passed down as values.
"""

from __future__ import annotations

import argparse
import sys

from kernelcast.flows.commands import GROUPS
from kernelcast.flows.commands.common import DEFAULT_DATA, UsageError

__all__ = ["DEFAULT_DATA", "UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelcast", description="Find fast GPU kernels with few GPU measurements.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ValueError, OSError, RuntimeError) as exc:  # storage and tracking errors are OSErrors naming the URI
        print(f"kernelcast {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
