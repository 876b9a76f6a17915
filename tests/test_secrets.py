"""A sandbox that keeps secrets: what a candidate can read of the worker's secrets, and where it could leave them.

Each test plants a secret where a measuring machine keeps one (the environment the worker was started with,
a credentials file in its HOME), runs a candidate through the real worker in interpreter mode, and looks for
the secret in everything the candidate can output: its verdict's error text and files that outlive it.
The worker runs in a fresh process started with the secret, as credentials usually arrive, so that its own
``/proc/<pid>/environ`` and every ancestor's hold it too.
"""

import ctypes
import errno
import json
import os
import platform
import socket
import subprocess
import sys

import pytest

from kernelcast.kernels.harness import memcheck, sandbox
from kernelcast.kernels.records import Candidate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "planted-secret-5e1d27"

# Every process whose environment the candidate can read: its ancestors first (by the parent links in
# /proc/<pid>/stat), then every other process listed in /proc.
ENVIRON_PROBE = '''
import os


def _parent(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def launch(x, out):
    pids, pid = [], os.getpid()
    while pid > 1:
        pid = _parent(pid)
        pids.append(pid)
    pids += [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in pids]
    leaked, readable = [], 0
    for pid in pids:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                text = f.read()
            readable += 1
        except OSError:
            continue
        if b"{secret}" in text:
            leaked.append("%d: %s" % (pid, text.decode(errors="replace")))
    raise RuntimeError("PROBE " + ("leaked " + " | ".join(leaked) if leaked else "none of %d readable" % readable))
'''

FILE_PROBE = '''
import os
import pwd


def launch(x, out):
    found = []
    for path in ({credentials!r}, os.path.expanduser("~/.aws/credentials"),
                 os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".aws", "credentials")):
        try:
            with open(path) as f:
                found.append(path + " = " + f.read())
        except OSError as exc:
            found.append(path + " refused (" + type(exc).__name__ + ")")
    raise RuntimeError("PROBE " + "; ".join(found))
'''

# Writes the secret (had it read one) wherever a later process could find it: /dev/shm, the worker's
# Triton cache (the candidate knows the worker's layout: its scratch directory's sibling), the Triton
# cache its environment names, SysV shared memory.
PLANT_PROBE = '''
import ctypes
import os


def launch(x, out):
    outcomes = []
    shared = os.path.join(os.path.dirname(os.getcwd()), "triton-cache")
    for path in ("/dev/shm/kernelcast-planted", os.path.join(shared, "planted"),
                 os.path.join(os.environ.get("TRITON_CACHE_DIR", shared), "planted")):
        try:
            with open(path, "w") as f:
                f.write("{secret}")
            outcomes.append("wrote " + path)
        except OSError as exc:
            outcomes.append("refused " + path + " (" + type(exc).__name__ + ")")
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(0x6B63, 4096, 0o1666)  # IPC_CREAT | 0666: a segment that outlives this process
    outcomes.append("shmget " + ("refused" if shmid < 0 else "made %d" % shmid))
    raise RuntimeError("PROBE " + "; ".join(outcomes))
'''

# A later child of the same worker: what the planting child left for it.
FIND_PROBE = '''
import ctypes
import os


def launch(x, out):
    found = []
    shared = os.path.join(os.path.dirname(os.getcwd()), "triton-cache")
    for path in ("/dev/shm/kernelcast-planted", os.path.join(shared, "planted"),
                 os.path.join(os.environ.get("TRITON_CACHE_DIR", shared), "planted")):
        if os.path.exists(path):
            found.append(path)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmget(0x6B63, 0, 0) >= 0:
        found.append("shm segment 0x6b63")
    raise RuntimeError("PROBE " + ("found " + ", ".join(found) if found else "nothing"))
'''

WORKER_SCRIPT = '''
import json, sys
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.records import Candidate, HardwareSpec

sources, config = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cfg = WorkerConfig(**{"mode": "interpreter", "concurrency": 1, "timeout_s": 60, "seeds": 1, **config})
with MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter"), cfg) as worker:
    results = [m for m in worker.measure([Candidate(op="softmax", backend="triton", source=s, origin="llm")
                                          for s in sources])]
    order = {c: i for i, c in enumerate(Candidate(op="softmax", backend="triton", source=s, origin="llm").candidate_id
                                        for s in sources)}
    results.sort(key=lambda m: order[m.candidate_id])
    print(json.dumps({"errors": [m.status + ": " + (m.error or "") for m in results],
                      "sandboxes": sorted(worker.stats.sandboxes)}))
'''


def measure_with_secrets(tmp_path, sources: list[str], **config) -> tuple[list[str], list[str]]:
    """Run ``sources`` through a worker started with the secret in its environment and its HOME's credentials
    file; returns each candidate's verdict (status and error) and the sandboxes its children reported."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key = {SECRET}\n")
    env = {**os.environ, "HOME": str(home), "AWS_SECRET_ACCESS_KEY": SECRET, "KERNELCAST_SERVICE_TOKEN": SECRET,
           "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", WORKER_SCRIPT, json.dumps(sources), json.dumps(config)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["errors"], answer["sandboxes"]


def probe_text(verdict: str) -> str:
    assert verdict.startswith("runtime_error: ") and "PROBE " in verdict, verdict
    return verdict.split("PROBE ", 1)[1]


@pytest.mark.parametrize("network", ["namespace", "seccomp"])
def test_no_process_environment_holding_the_secret_is_readable_from_a_child(tmp_path, network):
    """The seccomp fallback is what a machine without user namespaces gets: there a root child once read its
    ancestors' environments (the worker's and its parents'), which a user namespace hides."""
    (verdict,), sandboxes = measure_with_secrets(tmp_path, [ENVIRON_PROBE.replace("{secret}", SECRET)],
                                                 network=network)
    assert SECRET not in verdict
    assert probe_text(verdict).startswith("none of"), verdict
    assert f"network={network}" in sandboxes[0] and "environments=hidden" in sandboxes[0], sandboxes


def test_a_credentials_file_in_the_workers_home_is_not_readable(tmp_path):
    (verdict,), sandboxes = measure_with_secrets(tmp_path, [FILE_PROBE.format(
        credentials=str(tmp_path / "home" / ".aws" / "credentials"))])
    assert SECRET not in verdict
    assert f"{tmp_path / 'home' / '.aws' / 'credentials'} refused (PermissionError)" in probe_text(verdict)
    assert "reads=" in sandboxes[0] and "home" in sandboxes[0], sandboxes


@pytest.mark.parametrize("network", ["namespace", "seccomp"])
def test_nothing_a_child_writes_outlives_it_or_reaches_the_next_child(tmp_path, network):
    """/dev/shm, the worker's shared Triton cache (a channel for a planted compiled kernel) and SysV shared
    memory would each outlive the child and be seen by the next one."""
    leftover = "/dev/shm/kernelcast-planted"
    if os.path.exists(leftover):
        os.unlink(leftover)
    try:
        (planted, found), sandboxes = measure_with_secrets(
            tmp_path, [PLANT_PROBE.replace("{secret}", SECRET), FIND_PROBE], network=network)
        plant = probe_text(planted)
        assert "refused /dev/shm/kernelcast-planted (PermissionError)" in plant, plant
        assert "triton-cache/planted (PermissionError)" in plant, plant
        assert probe_text(found) == "nothing", (plant, found)
        assert not os.path.exists(leftover)
        assert "writes=scratch+devices" in sandboxes[0] and "triton-cache=private" in sandboxes[0], sandboxes
        assert "ipc=namespace" in sandboxes[0] or "ipc=seccomp" in sandboxes[0], sandboxes
        assert "keyrings=refused" in sandboxes[0], sandboxes
    finally:
        if os.path.exists(leftover):
            os.unlink(leftover)
        subprocess.run(["ipcrm", "-M", str(0x6B63)], capture_output=True)


HOLDER = """
import ctypes, os, sys, time
header = (ctypes.c_uint32 * 2)(0x20080522, 0)
ctypes.CDLL(None).capset(header, (ctypes.c_uint32 * 6)())  # as a process of the worker's user holds none
print("ready", flush=True)
time.sleep(120)
"""


def test_a_child_that_could_read_an_environment_holding_a_secret_refuses_to_load_the_candidate(tmp_path):
    """Where neither a user namespace nor Landlock hides a process (one of the worker's user, holding no capability,
    as every process of an ordinary user does; dropped capabilities hide only those that hold some), the child says
    so and never loads the candidate."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env={**os.environ, "DEPLOY_TOKEN": SECRET},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        ran = tmp_path / "ran"
        source = f"open({str(ran)!r}, 'w').close()\n" + ENVIRON_PROBE.replace("{secret}", SECRET)
        (verdict,), _ = measure_with_secrets(tmp_path, [source], network="seccomp", filesystem="off")
    finally:
        holder.kill()
        holder.wait()
    assert SECRET not in verdict
    assert "refuses to load the candidate" in verdict and f"{holder.pid} (python" in verdict, verdict
    assert "DEPLOY_TOKEN" in verdict and not ran.exists()


def test_a_refused_read_names_the_hidden_place(monkeypatch):
    monkeypatch.setattr(sandbox, "_confined_to", ("/scratch/c1",))
    monkeypatch.setattr(sandbox, "_hidden", ("/root", "/run/secrets"))
    clause = sandbox.denied_write(PermissionError(13, "Permission denied", "/root/.aws/credentials"))
    assert "hides the files of homes" in clause and "/root/.aws/credentials is among them" in clause
    assert "write only beneath" in sandbox.denied_write(PermissionError(13, "Permission denied", "/tmp/x"))


def test_the_worker_is_not_dumpable_so_no_child_of_its_user_reads_its_proc_entries():
    script = ("import ctypes\n"
              "from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig\n"
              "from kernelcast.kernels.hardware import INTERPRETER\n"
              "from kernelcast.kernels.records import HardwareSpec\n"
              "MeasureWorker(HardwareSpec(gpu_type=INTERPRETER, device_name='cpu'), WorkerConfig(mode='interpreter'))"
              ".close()\n"
              "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))\n")  # PR_GET_DUMPABLE
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "0"


def test_the_sanitized_process_starts_without_credentials(tmp_path, monkeypatch):
    """memcheck's process is started by the worker, not forked from the scrubbed fork server: its own
    /proc/self/environ and the sanitizer's, its parent's, would hold whatever it was given."""
    tools = tmp_path / "bin"
    tools.mkdir()
    seen = tmp_path / "sanitizer-environment"
    (tools / "compute-sanitizer").write_text(f"#!/bin/sh\nenv > {seen}\n")
    (tools / "compute-sanitizer").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    policy = sandbox.SandboxPolicy(scratch_dir=str(scratch), triton_cache_dir=str(scratch), gpu=True)
    cand = Candidate(op="softmax", backend="triton", source="def launch(x, out):\n    pass\n", origin="llm")
    with pytest.raises(RuntimeError, match="did not finish under the sanitizer"):
        memcheck.run(cand, "small", policy, {}, str(tmp_path), timeout_s=30)
    assert seen.exists() and "PATH=" in seen.read_text() and SECRET not in seen.read_text()


def test_the_seccomp_fallback_refuses_sysv_ipc_and_the_kernel_keyrings():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter is for good: a process of its own
        try:
            sandbox._refuse_sockets(refuse_ipc=True)
            libc = ctypes.CDLL(None, use_errno=True)
            made = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE | IPC_CREAT
            err = ctypes.get_errno()
            try:
                socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                inet = "allowed"
            except OSError as exc:
                inet = str(exc.errno)
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
            libc.syscall.restype = ctypes.c_long
            key = libc.syscall(248 if platform.machine() == "x86_64" else 217, b"user", b"kernelcast-probe", b"x", 1,
                               ctypes.c_int(-4))  # add_key to the user keyring, which outlives the process
            key_err = ctypes.get_errno()
            os.write(write, f"{made} {err} {inet} {key} {key_err}".encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert answer == f"-1 {errno.EACCES} {errno.EACCES} -1 {errno.EACCES}", answer


# Both run at import, which children do at once (outside the GPU lock): the first leaves a note in its scratch
# directory and stays a while; the second looks for it in its siblings' scratch directories.
LEAVE_NOTE = '''
import os
import time

with open("note.txt", "w") as f:
    f.write("for my sibling")
time.sleep(6)


def launch(x, out):
    raise RuntimeError("PROBE left a note")
'''

READ_NOTES = '''
import os
import time

time.sleep(3)
_root = os.path.dirname(os.getcwd())
_read = []
for name in os.listdir(_root):
    try:
        with open(os.path.join(_root, name, "note.txt")) as f:
            _read.append(name + ": " + f.read())
    except OSError:
        pass


def launch(x, out):
    raise RuntimeError("PROBE " + ("read " + "; ".join(_read) if _read else "read nothing"))
'''


def test_a_child_cannot_read_a_running_siblings_scratch_directory(tmp_path):
    """Concurrent children of one worker: a scratch directory its sibling can read is a channel between them."""
    (_, found), sandboxes = measure_with_secrets(tmp_path, [LEAVE_NOTE, READ_NOTES], concurrency=2)
    assert probe_text(found) == "read nothing", found
    assert "other-children" in sandboxes[0], sandboxes
