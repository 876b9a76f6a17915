"""Out-of-bounds accesses on any buffer, the candidate's own included: one call under compute-sanitizer.

Guard zones catch stray writes around the outputs the harness allocates; a KernelBench or
GPU MODE candidate allocates its outputs and intermediates itself, out of the caching
allocator's large segments, where a write past a tensor's end lands in memory nobody checks.
So a candidate that passed its checks makes one more call, on its smallest case, in a process
of its own started under compute-sanitizer's memcheck with the caching allocator off: every
tensor is then an allocation of its own size, and any read or write outside one is reported
with the kernel, the access and the allocation it missed. The process inherits the child's
sandbox; it runs while the child still holds the GPU lock, after the child freed its memory.

    python -m kernels.harness.memcheck REQUEST.json    (under compute-sanitizer; writes REQUEST.json.out)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from kernels.formats import TASKS_ENV

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


def run(source: str, op: str, origin: str, params: dict, case: str, scratch: str, timeout_s: float,
        tasks: str = "") -> str | None:
    """The sanitizer's finding on one call of the candidate on ``case`` as text, or None when clean.

    ``tasks`` is the imported tasks' folder (the sandbox points the default elsewhere).

    Raises ``RuntimeError`` when the check could not be made (no sanitizer, no answer in time)."""
    tool = sanitizer()
    if tool is None:
        raise RuntimeError("compute-sanitizer is not installed")
    folder = os.path.join(scratch, "memcheck")
    os.makedirs(folder, exist_ok=True)
    request = os.path.join(folder, "request.json")
    with open(request, "w") as f:
        json.dump({"source": source, "op": op, "origin": origin, "params": params, "case": case}, f)
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (project, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", TMPDIR=folder, TRITON_INTERPRET="0", PYTHONPATH=path)
    if tasks:
        env[TASKS_ENV] = tasks
    cmd = [tool, "--tool", "memcheck", "--print-limit", "8", "--leak-check", "no", "--report-api-errors", "no",
           sys.executable, "-m", "kernels.harness.memcheck", request]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=folder)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no answer within {timeout_s:.0f} s") from None
    report = done.stdout + done.stderr
    buffers = []
    try:
        with open(request + ".out") as f:
            buffers = json.load(f)
    except (OSError, ValueError):
        pass
    finding = describe(report, buffers)
    if finding is None and "ERROR SUMMARY: 0 errors" not in report:
        tail = report.strip().splitlines()[-3:]
        raise RuntimeError(f"the call did not finish under the sanitizer: {' | '.join(tail)[:300]}")
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
    """In the sanitized process: one call of the candidate on its case; the buffers it touched, named."""
    import torch

    from kernels.harness.correctness import call_candidate, load_launch, poisoned_outputs
    from kernels.ops import get_operation

    with open(request_path) as f:
        req = json.load(f)
    op = get_operation(req["op"])
    case = next(c for c in op.cases if c.name == req["case"])
    launch = load_launch(req["source"], os.path.dirname(request_path), module_name="memchecked")
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
