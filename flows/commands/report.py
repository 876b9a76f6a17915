"""``kernelcast report``: the runs of one operation and GPU type side by side, as a PNG, a table and a CSV.

The work is in ``kernelcast.tasks.report``; this reads the flags, writes the files to ``--out`` and
logs them to MLflow as a run of their own (tagged ``kernelcast.report``).
"""

from __future__ import annotations

from kernelcast.flows.commands.common import UsageError, add_data_args, data_root


def register(sub) -> None:
    """Add the ``report`` command to the CLI's subparsers."""
    sp = sub.add_parser("report", help="the runs of one operation and GPU type side by side: surrogate vs "
                                       "baseline, this run vs earlier ones (PNG, Markdown table, CSV, MLflow)")
    sp.add_argument("--op", required=True, help="operation whose runs to compare")
    sp.add_argument("--gpu-type", default=None, help="GPU type (default: the one the op was searched on)")
    picked = sp.add_mutually_exclusive_group()
    picked.add_argument("--runs", nargs="+", metavar="RUN_ID", default=None, help="exactly these runs")
    picked.add_argument("--last", type=int, default=None,
                        help="the latest N runs and the equal-budget baseline of each surrogate run among them "
                             "(default: 8)")
    sp.add_argument("--out", default="kernelcast-report", help="folder for report.png, report.md and report.csv "
                                                               "(default: %(default)s)")
    sp.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default: sqlite under a local data root, as a search logs)")
    sp.add_argument("--experiment", default="kernelcast", help="MLflow experiment (default: %(default)s)")
    add_data_args(sp)
    sp.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    if args.last is not None and args.last < 1:
        raise UsageError(f"--last must be a positive whole number of runs, got {args.last}")
    from kernelcast.storage.tracking import Tracker, default_tracking_uri
    from kernelcast.tasks.report import compare_runs, log_report, report_files, write_report

    root = data_root(args)
    comparison = compare_runs(root, args.op, args.gpu_type, run_ids=args.runs or (), last=args.last)
    files = report_files(comparison)
    paths = write_report(files, args.out)
    tracker = Tracker(args.tracking_uri or default_tracking_uri(args.data), args.experiment, data=root)
    mlflow_run = log_report(tracker, comparison, files)
    print(files["report.md"])
    print(f"written: {', '.join(paths)}")
    print(f"MLflow: run {mlflow_run} in experiment {args.experiment!r} at {tracker.uri}")
    return 0
