"""The sandbox, checked through the real worker and child: each candidate probes what it can reach and reports it.

A probing candidate never computes its output; it raises an error whose text lists what it
could do, and the test reads that text from the measurement (status ``runtime_error``).
"""

import os
import socket
import subprocess
import sys
import threading

import pytest

from kernelcast.kernels.harness import sandbox
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.records import Candidate, HardwareSpec

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
SECRET = "planted-secret-7f3a9c"

SECRET_PROBE = '''
import os


def launch(x, out):
    found = [name for name, value in os.environ.items() if "{secret}" in value]
    for path in ("/proc/self/environ", "/proc/%d/environ" % os.getppid(), "/proc/{worker_pid}/environ"):
        try:
            with open(path, "rb") as f:
                if b"{secret}" in f.read():
                    found.append(path)
        except OSError:
            pass
    raise RuntimeError("PROBE " + ("leaked " + ", ".join(found) if found else "no secret visible"))
'''

CONNECT_PROBE = '''
import socket


def launch(x, out):
    try:
        with socket.create_connection(("127.0.0.1", {port}), timeout=3) as s:
            s.sendall(b"escaped")
        outcome = "connected"
    except OSError as exc:
        outcome = "refused: " + type(exc).__name__ + " " + str(exc)
    raise RuntimeError("PROBE " + outcome)
'''

WRITE_PROBE = '''
import os


def launch(x, out):
    results = []
    for path in ({outside!r}, {sibling!r}, os.path.join(os.getcwd(), "mine.txt")):
        try:
            with open(path, "w") as f:
                f.write("escaped")
            results.append("wrote " + path)
        except OSError as exc:
            results.append("refused " + path + " (" + type(exc).__name__ + ")")
    raise RuntimeError("PROBE " + "; ".join(results))
'''


def probe(source: str, **config) -> tuple[str, MeasureWorker]:
    cand = Candidate(op="softmax", backend="triton", source=source, origin="llm")
    cfg = WorkerConfig(**{"mode": "interpreter", "concurrency": 1, "timeout_s": 30, "seeds": 1, **config})
    with MeasureWorker(CPU, cfg) as worker:
        (m,) = worker.measure([cand])
        assert m.status == "runtime_error" and "PROBE" in m.error, m.error
        return m.error.split("PROBE ", 1)[1], worker


@pytest.fixture
def loopback_server():
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn.recv(64))
                conn.close()
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    server.close()


def test_the_test_server_accepts_connections_from_outside_the_sandbox(loopback_server):
    port, accepted = loopback_server
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(b"hello")
    for _ in range(50):
        if accepted:
            break
        threading.Event().wait(0.05)
    assert accepted == [b"hello"]


def test_candidate_cannot_read_a_planted_secret():
    """The worker runs in a fresh process with the secret in the environment it was started with,
    as credentials usually arrive: then /proc/<pid>/environ of the worker and of the fork server
    hold it too, not only os.environ."""
    script = (f"from tests.test_sandbox import probe, SECRET_PROBE, SECRET\n"
              f"if __name__ == '__main__':\n"
              f"    report, worker = probe(SECRET_PROBE.format(secret=SECRET, worker_pid=os.getpid()))\n"
              f"    print(report)\n"
              f"    print(*worker.stats.sandboxes)\n")
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": SECRET, "KERNELCAST_SERVICE_TOKEN": SECRET}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", "import os\n" + script], env=env, cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report, summary = done.stdout.strip().splitlines()[-2:]
    assert "network=namespace" in summary  # the user namespace is what hides the worker's /proc entry
    assert report == "no secret visible"


def test_candidate_cannot_open_a_tcp_connection_to_a_loopback_server(loopback_server):
    port, accepted = loopback_server
    report, worker = probe(CONNECT_PROBE.format(port=port))
    assert report.startswith("refused") and accepted == []
    (summary,) = worker.stats.sandboxes
    assert "network=namespace" in summary


@pytest.mark.parametrize("network,filesystem", [("namespace", "off"), ("seccomp", "off")])
def test_each_network_layer_alone_refuses_the_connection(loopback_server, network, filesystem):
    port, accepted = loopback_server
    report, worker = probe(CONNECT_PROBE.format(port=port), network=network, filesystem=filesystem)
    assert report.startswith("refused") and accepted == []
    (summary,) = worker.stats.sandboxes
    assert f"network={network} filesystem=off" in summary


def test_candidate_cannot_write_outside_its_scratch_directory(tmp_path):
    outside = tmp_path / "escaped.txt"
    sibling = os.path.join(os.path.dirname(os.path.abspath(__file__)), "escaped_from_sandbox.txt")
    report, worker = probe(WRITE_PROBE.format(outside=str(outside), sibling=sibling))
    assert f"refused {outside} (PermissionError)" in report
    assert f"refused {sibling} (PermissionError)" in report
    assert "wrote " in report and "mine.txt" in report  # its own scratch directory stays writable
    assert not outside.exists() and not os.path.exists(sibling)
    (summary,) = worker.stats.sandboxes
    assert "filesystem=landlock" in summary


FIXED_PATH_BUILD = '''
import os
os.makedirs({folder!r}, exist_ok=True)  # as a kernel that writes its CUDA sources to a fixed path before load()

def launch(x, out):
    raise RuntimeError("never reached")
'''

FIXED_PATH_AT_CALL = '''
def launch(x, out):
    with open({path!r}, "w") as f:
        f.write("escaped")
'''


def _measure_one(source: str):
    cand = Candidate(op="softmax", backend="triton", source=source, origin="llm")
    cfg = WorkerConfig(mode="interpreter", concurrency=1, timeout_s=30, seeds=1)
    with MeasureWorker(CPU, cfg) as worker:
        (m,) = worker.measure([cand])
        (summary,) = worker.stats.sandboxes
    return m, summary


def test_a_write_to_a_fixed_path_outside_the_scratch_directory_names_the_sandbox(tmp_path):
    folder = tmp_path / "cuda_extensions"
    m, summary = _measure_one(FIXED_PATH_BUILD.format(folder=str(folder)))
    assert "filesystem=landlock" in summary
    assert m.status == "compile_error", (m.status, m.error)
    assert "PermissionError" in m.error and f"{folder} is outside it" in m.error, m.error
    assert "write only beneath its scratch directory" in m.error
    assert not folder.exists()
    m, _ = _measure_one(FIXED_PATH_AT_CALL.format(path=str(tmp_path / "out.txt")))
    assert m.status == "runtime_error" and f"{tmp_path / 'out.txt'} is outside it" in m.error, m.error


def test_a_refused_write_is_named_only_while_landlock_confines_writes(monkeypatch):
    refused = PermissionError(13, "Permission denied", "/tmp/cuda_extensions")
    monkeypatch.setattr(sandbox, "_confined_to", ())
    assert sandbox.denied_write(refused) == ""  # the operating system's own refusal, not the sandbox's
    monkeypatch.setattr(sandbox, "_confined_to", ("/scratch/c1", "/dev"))
    assert "/tmp/cuda_extensions is outside it" in sandbox.denied_write(refused)
    assert sandbox.denied_write(PermissionError(13, "Permission denied", "/scratch/c1/build/x.cu")) == ""
    assert sandbox.denied_write(PermissionError(13, "Permission denied", "/scratch/c10/x")) != ""  # not a prefix
    try:
        try:
            raise refused
        except PermissionError as inner:
            raise RuntimeError("building the extension failed") from inner
    except RuntimeError as outer:
        assert "/tmp/cuda_extensions is outside it" in sandbox.denied_write(outer)
    assert sandbox.denied_write(ValueError("unrelated")) == ""
    assert sandbox.denied_write(PermissionError(1, "Operation not permitted")) == ""  # no path named


ORPHAN_PROBE = '''
import ctypes
import os
import subprocess
import sys
import time


def children():
    found = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % entry) as f:
                found += f.read().rsplit(")", 1)[1].split()[1] == str(os.getpid())
        except (OSError, IndexError):
            pass
    return found


def launch(x, out):
    # a daemon's double fork: the middle process exits at once, leaving a grandchild that sleeps
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    "'import time; time.sleep(5)'])"], check=True)
    time.sleep(0.5)
    flag = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    raise RuntimeError("PROBE subreaper=%d own=%d" % (flag.value, children()))
'''


def test_a_process_the_candidate_leaves_behind_stays_its_own():
    """The child is a subreaper: a grandchild whose parent exited becomes the candidate's, so the verification sees
    that the candidate has processes of its own (``verify.own_processes``, whose turns on the timing core excuse
    nothing)."""
    report, _ = probe(ORPHAN_PROBE)
    flag, own = (int(part.split("=")[1]) for part in report.split())
    assert flag == 1 and own >= 1, report  # one grandchild a call of launch (the harness may call it more than once)


def test_scratch_directories_are_removed_after_each_candidate():
    _, worker = probe(WRITE_PROBE.format(outside="/nonexistent/x", sibling="/nonexistent/y"))
    assert not os.path.exists(worker._root)


def test_scrubbing_removes_credentials_and_keeps_ordinary_variables(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "x")
    monkeypatch.setenv("HF_HOME", "/models")
    monkeypatch.setenv("MY_API_TOKEN", "x")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    removed = sandbox.scrub_environment()
    assert {"MLFLOW_TRACKING_PASSWORD", "HF_HOME", "MY_API_TOKEN"} <= set(removed)
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_unknown_protection_names_are_refused():
    with pytest.raises(ValueError, match="unknown network protection 'netns'; known: namespace, seccomp, off"):
        sandbox.SandboxPolicy(scratch_dir="/tmp", triton_cache_dir="/tmp", gpu=False, network="netns")


# ---- frameworks inside the sandbox ---------------------------------------------------------------------

COMPILE_PROBE = '''
import os

import torch


@torch.compile
def _scaled(x):
    return x.float() * 2 + 1


def launch(x, out):
    _scaled(x)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = cache_dir()
    files = sum(len(names) for _, _, names in os.walk(folder))
    try:
        with open({outside!r}, "w") as f:
            f.write("escaped")
        outside = "wrote outside"
    except OSError as exc:
        outside = "refused outside (" + type(exc).__name__ + ")"
    inside = os.path.realpath(folder).startswith(os.path.realpath(os.getcwd()) + os.sep)
    raise RuntimeError("PROBE compiled; cache in scratch: %s; %d files; %s" % (inside, files, outside))
'''

COMPILED_SOFTMAX = '''
import torch


@torch.compile
def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def launch(x, out):
    out.copy_(_softmax(x))
'''


def test_torch_compile_works_in_a_child_with_its_caches_in_the_scratch_directory(tmp_path):
    outside = tmp_path / "inductor-escaped.txt"
    report, worker = probe(COMPILE_PROBE.format(outside=str(outside)), timeout_s=300)
    assert report.startswith("compiled; cache in scratch: True;")
    assert int(report.split(";")[2].split()[0]) > 0  # Inductor wrote its generated code there
    assert "refused outside (PermissionError)" in report and not outside.exists()
    (summary,) = worker.stats.sandboxes
    assert "filesystem=landlock" in summary


def test_a_torch_compiled_candidate_is_measured_and_compiles_under_the_lock_with_its_allowance():
    cand = Candidate(op="softmax", backend="torch", source=COMPILED_SOFTMAX, origin="llm")
    cfg = WorkerConfig(mode="interpreter", concurrency=1, timeout_s=300, seeds=1)
    with MeasureWorker(CPU, cfg) as worker:
        (m,) = worker.measure([cand])
        (locked,) = [d for _, _, phase, _, d in worker.timeline if phase == "locked"]
    assert m.status == "ok", m.error
    assert locked["first_calls_to_compile"] == 3  # the real compile waits for real tensors, with its allowance


STREAM_SCRIPT = '''
import torch
from kernelcast.kernels.harness.anticheat import Rejected, install_stream_guard

install_stream_guard()
code = "with torch.cuda.stream(None):\\n    pass\\n"
outcomes = []
for where in ("/scratch/candidate.py", torch.__file__.rsplit("/", 1)[0] + "/cuda/graph_capture_like.py"):
    try:
        exec(compile(code, where, "exec"), {"torch": torch})
        outcomes.append("allowed")
    except Rejected:
        outcomes.append("refused")
print(",".join(outcomes))
'''


def test_streams_are_refused_to_the_candidate_and_allowed_to_torchs_own_graph_capture():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", STREAM_SCRIPT], cwd=root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "refused,allowed"
