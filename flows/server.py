"""The Prefect server that scheduled runs need: the one configured, or a real local one started for it.

Prefect's temporary server (what a flow starts by itself when ``PREFECT_API_URL`` is unset) runs
no services: deployments served against it keep their schedules in its database, but no
scheduler ever turns a schedule into a run, so a nightly search served there never fires.
``prefect server start`` runs the scheduler (and the late-runs service and the UI); this module
starts one as a child process when no server is configured, or checks the configured one answers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

DEFAULT_PORT = 4200  # Prefect's own default, where `prefect server start` puts the UI


class ServerError(RuntimeError):
    """No Prefect server with a scheduler can be reached or started; the message says what to start."""


@dataclass
class PrefectServer:
    api_url: str  # http://HOST:PORT/api
    process: subprocess.Popen | None = None  # the local server this process started; None: someone else's
    log_path: str = ""

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def answers(api_url: str, timeout: float = 5.0) -> bool:
    """Whether a Prefect API answers its health check at ``api_url``."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def configured_api_url() -> str:
    """``PREFECT_API_URL`` as Prefect reads it (environment or profile); "" when none is set."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or ""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a port just left is free
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def start_local_server(host: str = "127.0.0.1", port: int = DEFAULT_PORT, timeout_s: float = 180.0) -> PrefectServer:
    """A real Prefect server on ``host:port`` with its scheduler and UI: one already answering there, or one
    started now as a child process (its log under ``PREFECT_HOME``); a ``ServerError`` saying what to start when
    the port is taken by something else or the server does not come up within ``timeout_s``."""
    api_url = f"http://{host}:{port}/api"
    if answers(api_url):
        return PrefectServer(api_url)
    if not _port_free(host, port):
        raise ServerError(f"port {port} is taken and no Prefect server answers there; start one with "
                          f"`prefect server start --port N` and set PREFECT_API_URL=http://{host}:N/api, "
                          "or pass --port with a free port")
    from prefect.settings import PREFECT_HOME

    home = str(PREFECT_HOME.value())
    os.makedirs(home, exist_ok=True)
    log_path = os.path.join(home, f"server-{port}.log")
    # The UI asks its API at the address it is told (Prefect's default: port 4200, whatever port it serves on).
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_API_URL": api_url}
    env.pop("PREFECT_API_URL", None)  # the server itself is no client of another server
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host,
                                    "--port", str(port), "--scheduler", "--late-runs", "--ui"],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   # Ctrl+C reaches the serving process alone, which stops its runner while the
                                   # server still answers, then the server (PrefectServer.stop).
                                   start_new_session=True)
    server = PrefectServer(api_url, process, log_path)
    deadline = time.monotonic() + timeout_s
    while not answers(api_url, timeout=2.0):
        if process.poll() is not None:
            raise ServerError(f"the local Prefect server exited with status {process.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            server.stop()
            raise ServerError(f"the local Prefect server did not answer within {timeout_s:.0f} s; see {log_path}")
        time.sleep(0.5)
    return server


def scheduling_server(host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> PrefectServer:
    """The server deployments are served against: ``PREFECT_API_URL``'s when set (refused in one line if it
    does not answer), else a local one with its scheduler (``start_local_server``)."""
    configured = configured_api_url()
    if configured:
        if not answers(configured):
            raise ServerError(f"PREFECT_API_URL={configured} does not answer; start that server "
                              "(`prefect server start`) or unset PREFECT_API_URL to have a local one started")
        return PrefectServer(configured)
    return start_local_server(host, port)
