"""The sandbox that keeps secrets (issue 64), checked on a GPU machine: what a child can read and write there.

    python tests/sandbox_gpu_check.py --out DIR        (from the repository's root; kernelcast need not be installed)

Plants a secret in the worker's environment (``AWS_SECRET_ACCESS_KEY``, a ``*_TOKEN``) and in a credentials file
under a fake HOME, then measures through the real worker, in GPU mode: probes that look for the secret in every
process's environment and in the file, that write to /dev/shm, the worker's shared Triton cache and SysV shared
memory, and a later child that looks for what they left; honest kernels (Triton, torch.compile, a CUDA graph)
under the sandbox and again with Landlock off, so that a protection breaking an honest kernel shows; the device
files CUDA opened in a child; and what a Triton cache of its own costs a child (a cold cache against a warm one).
Writes DIR/sandbox_gpu_check.json and prints one line per finding; exits 1 if the secret reached any output.
``--mode interpreter`` runs the same on a CPU (no device files, no CUDA graph).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "planted-secret-gpu-4b19e0"

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
        if b"SECRET_VALUE" in text:
            leaked.append(str(pid))
    raise RuntimeError("PROBE " + ("leaked from " + ", ".join(leaked) if leaked else "none of %d readable" % readable))
'''

FILE_PROBE = '''
def launch(x, out):
    try:
        with open(CREDENTIALS) as f:
            outcome = "read " + f.read()
    except OSError as exc:
        outcome = "refused (" + type(exc).__name__ + ")"
    raise RuntimeError("PROBE " + outcome)
'''

PLANT_PROBE = '''
import ctypes
import os


def launch(x, out):
    outcomes = []
    shared = os.path.join(os.path.dirname(os.getcwd()), "triton-cache")
    for path in ("/dev/shm/kernelcast-gpu-planted", os.path.join(shared, "planted")):
        try:
            with open(path, "w") as f:
                f.write("SECRET_VALUE")
            outcomes.append("wrote " + path)
        except OSError as exc:
            outcomes.append("refused " + path + " (" + type(exc).__name__ + ")")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    shmid = libc.shmget(0x6B64, 4096, 0o1666)
    outcomes.append("shmget " + ("refused" if shmid < 0 else "made"))
    key = libc.syscall(248, b"user", b"kernelcast-gpu-planted", b"x", 1, ctypes.c_int(-4))  # x86_64 add_key, @u
    outcomes.append("add_key " + ("refused" if key < 0 else "made"))
    raise RuntimeError("PROBE " + "; ".join(outcomes))
'''

FIND_PROBE = '''
import ctypes
import os


def launch(x, out):
    found = [p for p in ("/dev/shm/kernelcast-gpu-planted",
                         os.path.join(os.path.dirname(os.getcwd()), "triton-cache", "planted")) if os.path.exists(p)]
    libc = ctypes.CDLL(None)
    libc.syscall.restype = ctypes.c_long
    if libc.shmget(0x6B64, 0, 0) >= 0:
        found.append("shm segment")
    if libc.syscall(250, 10, ctypes.c_int(-4), b"user", b"kernelcast-gpu-planted", 0) >= 0:  # KEYCTL_SEARCH
        found.append("user key")
    raise RuntimeError("PROBE " + ("found " + ", ".join(found) if found else "nothing"))
'''

TRITON_SOFTMAX = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def launch(x, out):
    x = x.contiguous()
    n = x.shape[-1]
    _softmax[(x.numel() // n,)](x, out, n, BLOCK=triton.next_power_of_2(n))
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

GRAPHED_SOFTMAX = '''
import torch

_graphs = {}


def _softmax(x):  # by hand: the built-in softmax is a route the operation's guard refuses
    e = (x.float() - x.float().amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def launch(x, out):
    key = (tuple(x.shape), x.dtype)
    if key not in _graphs:
        sx, so = x.clone(), torch.empty_like(out)
        so.copy_(_softmax(sx))  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            so.copy_(_softmax(sx))
        _graphs[key] = (graph, sx, so)
    graph, sx, so = _graphs[key]
    sx.copy_(x)
    graph.replay()
    out.copy_(so)
'''

DEVICE_PROBE = '''
import os

import torch


def launch(x, out):
    torch.cuda.synchronize()
    opened = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith("/dev/"):
            opened.add(target)
    mapped = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith("/dev/"):
                mapped.add(parts[5])
    raise RuntimeError("PROBE opened " + ",".join(sorted(opened)) + " mapped " + ",".join(sorted(mapped)))
'''

TRITON_TIMING = '''
import os, sys, time
import torch
import triton
import triton.language as tl

@triton.jit
def _scale_KERNEL(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

x = torch.ones(1000, device=sys.argv[1])
start = time.perf_counter()
_scale_KERNEL[(4,)](x, 1000, BLOCK=256)
if x.is_cuda:
    torch.cuda.synchronize()
print(time.perf_counter() - start)
'''


def _facts() -> dict:
    from kernelcast.kernels.harness import sandbox

    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # can a process of this user make a user + network namespace?
        ok = sandbox._libc.unshare(sandbox._CLONE_NEWUSER | sandbox._CLONE_NEWNET) == 0
        os.write(write, b"yes" if ok else b"no")
        os._exit(0)
    os.close(write)
    userns = os.read(read, 10).decode()
    os.waitpid(pid, 0)
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            yama = f.read().strip()
    except OSError:
        yama = "absent"
    devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    return {"kernel": platform.release(), "uid": os.getuid(), "capabilities": caps,
            "landlock_abi": sandbox.landlock_abi(), "user_namespace": userns, "yama_ptrace_scope": yama,
            "nvidia_devices": devices, "python": sys.version.split()[0]}


def _triton_cache_cost(device: str) -> dict:
    """Seconds to a Triton kernel's first finished call in a fresh process: with an empty cache (a child's own),
    with the cache another process filled (shared), and with a cache holding only Triton's utilities."""
    timings = {}
    folder = tempfile.mkdtemp(prefix="kc-triton-cost-")
    env = {**os.environ, "TRITON_CACHE_DIR": folder}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    for label, source in (("empty_cache", TRITON_TIMING), ("warm_cache", TRITON_TIMING),
                          ("warm_utilities_new_kernel", TRITON_TIMING.replace("_KERNEL", "_other"))):
        script = os.path.join(folder, f"{label}.py")  # a file: Triton reads a jit function's source from one
        with open(script, "w") as f:
            f.write(source)
        done = subprocess.run([sys.executable, script, device], env=env, capture_output=True, text=True,
                              timeout=600)
        timings[label] = float(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else done.stderr[-300:]
    return timings


def _measure(worker, named: dict[str, str]) -> dict:
    """{name: verdict} for each named source measured as a softmax candidate; rows the worker yields for candidates
    it was not given (in GPU mode, the op's reference, measured first in each worker) under ``reference <id>``."""
    from kernelcast.kernels.records import Candidate

    cands = {name: Candidate(op="softmax", backend="triton", source=src, origin="llm") for name, src in named.items()}
    by_id = {c.candidate_id: name for name, c in cands.items()}
    found = {}
    for m in worker.measure(list(cands.values())):
        name = by_id.get(m.candidate_id, f"reference {m.candidate_id}")
        found[name] = {"status": m.status, "error": (m.error or "")[:1500], "speedup": m.speedup}
    missing = sorted(set(named) - set(found))
    if missing:
        raise RuntimeError(f"the worker gave no verdict for {', '.join(missing)}")
    return found


def inner(args) -> int:
    sys.path.insert(0, ROOT)
    from kernelcast.kernels.hardware import INTERPRETER, detect
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.records import HardwareSpec

    gpu = args.mode == "gpu"
    hardware = detect() if gpu else HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
    result: dict = {"facts": _facts(), "device": hardware.device_name, "mode": args.mode}
    credentials = os.path.join(os.environ["HOME"], ".aws", "credentials")
    probes = {"environments": ENVIRON_PROBE.replace("SECRET_VALUE", SECRET),
              "credentials_file": f"CREDENTIALS = {credentials!r}\n" + FILE_PROBE,
              "plant": PLANT_PROBE.replace("SECRET_VALUE", SECRET)}
    honest = {"triton_softmax": TRITON_SOFTMAX, "torch_compile_softmax": COMPILED_SOFTMAX}
    if gpu:
        honest["cuda_graph_softmax"] = GRAPHED_SOFTMAX
        probes["device_files"] = DEVICE_PROBE
    config = dict(mode=args.mode, concurrency=1, timeout_s=600, seeds=1)
    # the default ladder (namespace first); the seccomp fallback alone (no user namespace, as on hosts that refuse
    # one); Landlock off, so that an honest kernel failing only with it on shows
    for label, extra in (("sandbox", {}), ("seccomp", {"network": "seccomp"}), ("landlock_off", {"filesystem": "off"})):
        with MeasureWorker(hardware, WorkerConfig(**config, **extra)) as worker:
            if gpu:
                result[f"{label}_probe_log"] = (worker.probe_sandbox(), list(getattr(worker, "probe_log", [])))
            started = time.monotonic()
            if label == "sandbox":
                measured = _measure(worker, probes)
                measured.update(_measure(worker, {"find": FIND_PROBE}))  # a later child: what the others left
                measured.update(_measure(worker, honest))
            elif label == "seccomp":
                measured = _measure(worker, {k: probes[k] for k in ("environments", "credentials_file")}
                                    | {"triton_softmax": TRITON_SOFTMAX})
            else:
                measured = _measure(worker, honest)
            result[label] = {"measured": measured, "sandboxes": sorted(worker.stats.sandboxes),
                             "wall_s": round(time.monotonic() - started, 1)}
    result["triton_cache_cost_s"] = _triton_cache_cost("cuda" if gpu else "cpu")
    result["left_in_dev_shm"] = os.path.exists("/dev/shm/kernelcast-gpu-planted")
    text = json.dumps(result, indent=1, default=str)
    result["secret_reached_output"] = SECRET in text
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sandbox_gpu_check.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    for label in ("sandbox", "seccomp", "landlock_off"):
        for name, m in result[label]["measured"].items():
            print(f"{label:13s} {name:22s} {m['status']:14s} {m['error'][:300]}")
        print(f"{label:13s} sandboxes: {result[label]['sandboxes']}")
    print("facts:", json.dumps(result["facts"]))
    print("triton cache cost (s):", result["triton_cache_cost_s"])
    print("secret reached an output:", result["secret_reached_output"], "| left in /dev/shm:", result["left_in_dev_shm"])
    return 1 if result["secret_reached_output"] or result["left_in_dev_shm"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=("gpu", "interpreter"), default="gpu")
    args = parser.parse_args()
    if os.environ.get("KERNELCAST_SANDBOX_CHECK_INNER"):
        return inner(args)
    # The worker runs in a process started with the secret, as credentials usually arrive.
    home = tempfile.mkdtemp(prefix="kc-check-home-")
    os.makedirs(os.path.join(home, ".aws"))
    with open(os.path.join(home, ".aws", "credentials"), "w") as f:
        f.write(f"[default]\naws_secret_access_key = {SECRET}\n")
    env = {**os.environ, "HOME": home, "AWS_SECRET_ACCESS_KEY": SECRET, "KERNELCAST_CHECK_TOKEN": SECRET,
           "KERNELCAST_SANDBOX_CHECK_INNER": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}
    if args.mode == "interpreter":
        env["TRITON_INTERPRET"] = "1"
    try:
        return subprocess.call([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env, cwd=ROOT)
    finally:
        if os.path.exists("/dev/shm/kernelcast-gpu-planted"):
            os.unlink("/dev/shm/kernelcast-gpu-planted")
        subprocess.run(["ipcrm", "-M", str(0x6B64)], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
