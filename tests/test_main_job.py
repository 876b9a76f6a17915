"""The README's main job, run as a new user runs it: in an empty folder, with no Prefect server configured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_main_job_in_an_empty_folder_prints_no_traceback(tmp_path):
    # Nothing of this machine's Prefect or kernelcast settings: the temporary server runs as it does for a new user
    # (its telemetry heartbeat, left on, printed 'database is locked' tracebacks while the flow wrote).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KERNELCAST_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(REPO))
    folder = tmp_path / "empty"
    folder.mkdir()
    # `kernelcast search --op softmax` (README, "Set up and run") at its smallest budget
    done = subprocess.run([sys.executable, "-m", "kernelcast.flows.cli", "search", "--op", "softmax", "--budget", "2",
                           "--generations", "1", "--children", "8"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "best measured kernel:" in done.stdout
    assert "Traceback" not in output, output[output.index("Traceback") - 500:][:3000]


def test_the_temporary_server_s_cancelled_pool_rollback_at_shutdown_is_quiet_and_other_errors_are_not(tmp_path):
    from kernelcast.flows.commands.common import quiet_logging_settings

    # what the temporary server's pool logged at the end of the main job on a busy machine (seen in CI), and an error
    # of another logger, under Prefect's own logging settings and under the quiet ones prefect_defaults() sets
    script = ("import logging\nfrom prefect.logging.configuration import setup_logging\nsetup_logging()\n"
              "try:\n    raise RuntimeError('cancelled rollback')\n"
              "except RuntimeError:\n"
              "    logging.getLogger('sqlalchemy.pool.impl.AsyncAdaptedQueuePool').error('Exception during reset',"
              " exc_info=True)\n"
              "logging.getLogger('kernelcast.elsewhere').error('a real error')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"))
    own = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    quiet = subprocess.run([sys.executable, "-c", script], env={**env, "PREFECT_LOGGING_SETTINGS_PATH":
                                                               quiet_logging_settings()},
                           capture_output=True, text=True, timeout=300)
    assert "Traceback" in own.stderr and "a real error" in own.stderr  # Prefect's own settings print it
    assert "Traceback" not in quiet.stderr and "Exception during reset" not in quiet.stderr, quiet.stderr
    assert "a real error" in quiet.stderr
