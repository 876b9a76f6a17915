"""What the command groups share: the usage error, the data root flags and their parsing.

Nothing here imports more than the standard library at module level: every command module
imports this one, and ``kernelcast`` must answer a bad argument before anything heavy loads.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    error every run. Its logging is Prefect's own but for SQLAlchemy's connection pool, quiet below
    CRITICAL (``quiet_logging_settings``). A setting given in the environment is kept.
    """
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if "PREFECT_LOGGING_SETTINGS_PATH" not in os.environ:
        quiet = quiet_logging_settings()
        if quiet:
            os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = quiet


# Stopped at the end of a run while a request of the flow's held a connection, the temporary server's pool logs
# the cancelled rollback as an ERROR with its traceback (seen at the end of `kernelcast search --op softmax`, the
# README's main job, on a busy machine): nothing was lost, the run had finished.
QUIET_LOGGERS = {"sqlalchemy.pool": "CRITICAL"}


def quiet_logging_settings() -> str:
    """A logging settings file: Prefect's own with ``QUIET_LOGGERS`` added, written once by content into the temporary
    folder; its path, or "" where Prefect's own cannot be read (Prefect's then stand)."""
    import hashlib
    import importlib.util
    import tempfile

    import yaml

    spec = importlib.util.find_spec("prefect")
    try:
        own = (Path(list(spec.submodule_search_locations)[0]) / "logging" / "logging.yml").read_text()
        settings = yaml.safe_load(own)
    except (AttributeError, IndexError, OSError, TypeError, yaml.YAMLError):
        return ""
    for name, level in QUIET_LOGGERS.items():
        settings.setdefault("loggers", {})[name] = {"level": level}
    text = yaml.safe_dump(settings, sort_keys=False)
    path = Path(tempfile.gettempdir()) / f"kernelcast-prefect-logging-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yml"
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".part", delete=False) as f:
            f.write(text)
        os.replace(f.name, path)
    return str(path)
