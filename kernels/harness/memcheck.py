"""Out-of-bounds accesses on any buffer, the candidate's own included: one call under compute-sanitizer.

Guard zones catch stray writes around the outputs the harness allocates; a KernelBench or
GPU MODE candidate allocates its outputs and intermediates itself, out of the caching
allocator's large segments, where a write past a tensor's end lands in memory nobody checks.
So a candidate that passed its checks makes one more call, on its smallest case, in a process
of its own started under compute-sanitizer's memcheck with the caching allocator off: every
tensor is then an allocation of its own size, and any read or write outside one is reported
with the kernel, the access and the allocation it missed. The worker starts it once the child
has finished (the child's sandbox would keep a new process from starting CUDA); the process
takes the GPU lock, starts CUDA, enters the child's sandbox, and only then loads the candidate.

    python -m kernelcast.kernels.harness.memcheck REQUEST.json    (under compute-sanitizer; writes REQUEST.json.out)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys

from kernelcast.kernels.formats import TASKS_ENV
from kernelcast.kernels.harness import sandbox

MODES = ("auto", "all", "off")
_SANITIZERS = ("compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer")
_ERROR = re.compile(r"Invalid (__\w+__ )?(read|write|atomic)\w* of size (\d+) bytes")
_NEAREST = re.compile(r"(\d+) bytes (before|after) the nearest allocation at (0x[0-9a-f]+) of size (\d+) bytes")
_KERNEL = re.compile(r"=========\s+at (?:0x[0-9a-f]+ in )?([^\s(]+)")


def applies(mode: str, imported: bool, is_reference: bool) -> bool:
    """Whether a candidate is memchecked: ``auto`` checks imported tasks' candidates, which allocate
    their own outputs (a template op's outputs have guard zones), but not a task's reference or null."""
    if mode == "off" or is_reference:
        return False
    return mode == "all" or imported


def sanitizer() -> str | None:
    for name in _SANITIZERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def run(candidate, case: str, policy, environment: dict, tasks: str, timeout_s: float,
        lock_path: str = "") -> str | None:
    """The sanitizer's finding on one call of ``candidate`` on ``case`` as text, or None when clean.

    ``policy`` is the sandbox (``kernelcast.kernels.harness.sandbox.SandboxPolicy``) the sanitized process enters
    before it loads the candidate; ``environment`` the op's own variables; ``tasks`` the imported tasks'
    folder (a sandbox points the default elsewhere); ``lock_path`` the GPU lock it holds for its call.
    Raises ``RuntimeError`` when the check could not be made (no sanitizer, no answer in time)."""
    tool = sanitizer()
    if tool is None:
        raise RuntimeError("compute-sanitizer is not installed")
    folder = os.path.join(policy.scratch_dir, "memcheck")
    os.makedirs(folder, exist_ok=True)
    request = os.path.join(folder, "request.json")
    with open(request, "w") as f:
        json.dump({"source": candidate.source, "op": candidate.op, "params": dict(candidate.params), "case": case,
                   "policy": {**dataclasses.asdict(policy), "scratch_dir": folder}, "environment": environment,
                   "lock": lock_path}, f)
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (project, os.environ.get("PYTHONPATH", "")) if p)
    # No credentials: the sanitized process's /proc/self/environ, and its parent's (the sanitizer), are the candidate's
    # to read, whatever the sandbox deletes from os.environ later.
    clean = {name: value for name, value in os.environ.items() if not sandbox.is_secret_name(name)}
    env = dict(clean, PYTORCH_NO_CUDA_MEMORY_CACHING="1", TMPDIR=folder, TRITON_INTERPRET="0", PYTHONPATH=path,
               **{TASKS_ENV: tasks})
    cmd = [tool, "--tool", "memcheck", "--print-limit", "8", "--leak-check", "no", "--report-api-errors", "no",
           sys.executable, "-m", "kernelcast.kernels.harness.memcheck", request]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=folder,
                            start_new_session=True)
    try:
        report, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the sanitizer and the process it runs
        proc.communicate()
        raise RuntimeError(f"no answer within {timeout_s:.0f} s") from None
    buffers = []
    try:
        with open(request + ".out") as f:
            buffers = json.load(f)
    except (OSError, ValueError):
        pass
    with open(os.path.join(folder, "report.txt"), "w") as f:  # kept with the candidate's scratch files
        f.write(report)
    finding = describe(report, buffers)
    if finding is None and "ERROR SUMMARY: 0 errors" not in report:
        lines = report.strip().splitlines()
        errors = [ln.strip() for ln in lines if re.search(r"(Error|error:|Errno|denied|CUDA_ERROR)", ln)]
        raise RuntimeError(f"the call did not finish under the sanitizer (exit {proc.returncode}): "
                           f"{' | '.join((errors or lines)[:2] + lines[-2:])[:500]}")
    return finding


def describe(report: str, buffers: list[dict]) -> str | None:
    """The first out-of-bounds access in a memcheck report, naming the kernel, the access and the buffer."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        m = _ERROR.search(line)
        if not m:
            continue
        kind, size = m.group(2), int(m.group(3))
        window = "\n".join(lines[i:i + 8])
        kernel = _KERNEL.search("\n".join(lines[i + 1:i + 3]))
        text = f"out-of-bounds {kind} of {size} bytes"
        if kernel:
            text += f" by kernel {kernel.group(1)!r}"
        near = _NEAREST.search(window)
        if near:
            gap, side, base, nbytes = int(near.group(1)), near.group(2), int(near.group(3), 16), int(near.group(4))
            owner = next((b["name"] for b in buffers if b["ptr"] == base), f"a buffer of {nbytes} bytes it allocated")
            text += f", {gap} bytes {side} the end of {owner}" if side == "after" else f", {gap} bytes before {owner}"
        return text + " (compute-sanitizer memcheck, one call on the smallest case)"
    return None


def _main(request_path: str) -> int:
    """In the sanitized process: take the GPU lock, start CUDA, enter the sandbox, then one call of the
    candidate on its case; the buffers it touched, named."""
    with open(request_path) as f:
        req = json.load(f)
    os.environ.update(req["environment"])
    import fcntl

    import torch

    from kernelcast.kernels.harness import sandbox
    from kernelcast.kernels.harness.correctness import call_candidate, load_launch, poisoned_outputs
    from kernelcast.kernels.ops import get_operation

    lock = open(req["lock"], "r") if req["lock"] else None
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process ends
    torch.zeros(1, device="cuda")  # CUDA starts before the sandbox (it writes beneath /proc/<pid>)
    op = get_operation(req["op"])  # read before the sandbox too
    sandbox.enter(sandbox.SandboxPolicy(**req["policy"]))
    case = next(c for c in op.cases if c.name == req["case"])
    launch = load_launch(req["source"], req["policy"]["scratch_dir"], module_name="memchecked")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    inputs = op.make_inputs(case, gen, "cuda")
    outputs = poisoned_outputs(op, case, "cuda")
    got = call_candidate(launch, inputs, outputs, req["params"])
    torch.cuda.synchronize()
    names = list(op.input_names()) or []
    buffers = [{"name": f"input {names[i] if i < len(names) else i}", "ptr": t.untyped_storage().data_ptr()}
               for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    buffers += [{"name": f"output {j}", "ptr": t.untyped_storage().data_ptr()}
                for j, t in enumerate(got) if isinstance(t, torch.Tensor)]
    with open(request_path + ".out", "w") as f:
        json.dump(buffers, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
