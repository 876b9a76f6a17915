import contextlib
import os
import socket
import sys
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Gradient boosting's OpenMP pool spins for every core; beside the servers and worker processes
# the tests start, that made fits many times slower. One thread each is faster here.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Without a GPU, kernels run under Triton's CPU interpreter; Triton reads the switch when it
# is first imported, so it is set here, before any test module imports it.
if not _has_gpu():
    os.environ["TRITON_INTERPRET"] = "1"


# ---- two workers (pytest-xdist, the README's `-n auto --dist loadgroup`); plain `pytest`: one process ----

@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it (`-p no:xdist`) one process, as before
def pytest_xdist_auto_num_workers(config):
    """Two workers without a GPU: much of the suite keeps one core busy, or waits on subprocesses, servers and
    sleeps. None (one process) with a GPU, where a second worker beside the GPU tests would disturb what they time."""
    return 0 if _has_gpu() or (os.cpu_count() or 1) < 2 else 2


# The session-scoped servers: the modules that use one run on one worker, so that it starts once there (and the
# Prefect server's early stop, below, comes after the last test that needs it).
_SERVER_GROUPS = {"prefect_server": "prefect-server", "server": "llama-server", "tiny_model": "llama-server",
                  "misbehaving": "llama-server"}


def _group_by_module(items) -> None:
    """Each module's tests on one worker (loadgroup's group), as its module-scoped fixtures expect, beside the
    other modules that share its session server."""
    groups: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        server = next((g for name, g in _SERVER_GROUPS.items() if name in item.fixturenames), None)
        groups[module] = server or groups.get(module, module)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid.split("::")[0]]))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    _group_by_module(items)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---- a real S3-compatible server (moto in server mode) on loopback -------------------------

@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_root(aws_credentials: None):
    """A DataRoot at s3://kernelcast/runs/test on a moto server listening on 127.0.0.1."""
    port = free_port()
    import boto3
    from moto.server import ThreadedMotoServer

    from kernelcast.storage.dataset import DataRoot

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        # moto keeps its state per process, not per server: start every test from an empty store
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="kernelcast")
        root = DataRoot("s3://kernelcast/runs/test", storage_options={"client_kwargs": {"endpoint_url": endpoint}})
        root.endpoint = endpoint
        yield root
    finally:
        server.stop()




# ---- a Prefect API server (temporary database), shared by the tests that run flows -------------

_PREFECT = contextlib.ExitStack()
_LAST_PREFECT_TEST: list = []


@pytest.fixture(scope="session")
def prefect_server():
    """A Prefect API server of its own (temporary database), as the Prefect UI would show.

    Starting one takes 15-20 s on two cores, so the tests that run flows share it; it stops after
    the last of them rather than idling (and polling its database) through the rest of the suite."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from prefect.testing.utilities import prefect_test_harness

    _PREFECT.enter_context(prefect_test_harness(server_startup_timeout=180))
    yield
    _PREFECT.close()


def pytest_collection_finish(session):
    _LAST_PREFECT_TEST[:] = [item for item in session.items if "prefect_server" in item.fixturenames][-1:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if _LAST_PREFECT_TEST and item is _LAST_PREFECT_TEST[0]:
        _PREFECT.close()
