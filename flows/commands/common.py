"""What the command groups share: the usage error, the data root flags and their parsing.

Nothing here imports more than the standard library at module level: every command module
imports this one, and ``kernelcast`` must answer a bad argument before anything heavy loads.
"""

from __future__ import annotations

import os

DEFAULT_DATA = "kernelcast-data"


class UsageError(Exception):
    """Bad input from the command line; printed as one clear line, exit status 2."""


def add_data_args(sp) -> None:
    """``--data`` and ``--storage-option``, the same on every command that reads or writes a data root."""
    sp.add_argument("--data", default=os.environ.get("KERNELCAST_DATA", DEFAULT_DATA),
                    help="data root: a local folder or s3://bucket/prefix (default: %(default)s)")
    sp.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                    help="fsspec storage option, e.g. endpoint_url=http://127.0.0.1:9000")


def parse_storage_options(pairs: list[str] | None) -> dict:
    """fsspec storage options from ``--storage-option KEY=VALUE`` flags (``endpoint_url`` goes to the client)."""
    options: dict = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"--storage-option takes KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        if key == "endpoint_url":
            options.setdefault("client_kwargs", {})["endpoint_url"] = value
        else:
            options[key] = value
    return options


def data_root(args):
    """The ``DataRoot`` the flags name; a malformed option or an unknown protocol fails here, reaching nothing."""
    options = parse_storage_options(args.storage_option)
    from kernelcast.storage.dataset import DataRoot

    return DataRoot(args.data, storage_options=options)


def check_data_root(uri: str, storage_options: dict) -> None:
    """An unknown protocol or a malformed data root fails here, as ``DataRoot`` would fail on it, without
    loading the table layer (pandas, pyarrow) or reaching the store."""
    import fsspec

    fsspec.core.url_to_fs(uri, **storage_options)


def prefect_defaults() -> None:
    """Settings for the temporary local Prefect server that flows run against when none is configured.

    It can take longer to start than Prefect's default 20 s on a busy two-core machine. Its
    telemetry heartbeat is off: the heartbeat reads and then writes Prefect's SQLite database in
    one deferred transaction, and when the flow's own writes commit in between (they do, at the
    start of every run), SQLite refuses the upgrade at once (``database is locked``, a traceback on
    the console, whatever the busy timeout); on a machine without internet access it also logs an
    error every run. A setting given in the environment is kept.
    """
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
