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
