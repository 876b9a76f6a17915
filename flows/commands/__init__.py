"""The ``kernelcast`` command groups, one module each; ``GROUPS`` is the one registry the CLI is built from.

A group module has ``register(subparsers)``, which adds its commands, each with ``func`` set
to the function that runs it. Adding a group is one module here and one entry in ``GROUPS``;
its place in the tuple is its place in ``kernelcast --help``.

A command checks its arguments before it imports anything heavy (torch, Prefect, MLflow,
pandas, Ray), and a group module imports nothing but the standard library and
``kernelcast.flows.commands.common`` at module level: building the parser loads every group, and a bad
argument must fail in well under two seconds (tests/test_cli_fast_errors.py).
"""

from __future__ import annotations

from kernelcast.flows.commands import data, model, report, search, surrogate

GROUPS = (
    data,        # ops, measure, sweep, show, pairs, import, compact, dedup
    surrogate,   # evaluate, train, forecast
    search,      # search, backfill, serve
    model,       # model pull | list | path | split
    report,      # report
)
