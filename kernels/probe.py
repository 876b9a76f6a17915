"""Whether a candidate computes the right thing, found on the CPU before any GPU: the harness, interpreted.

What a kernel makes the device do cannot tell a kernel from its twin with the arithmetic changed: on the zero-shot
set's development problems, the physics forecaster gave each problem's wrong-math kernel (its BLOCK 1024 kernel with
one operation changed) the same top forecast as the right one in 12 of 21 problems (docs/surrogates.md). The harness
in Triton's interpreter (``kernelcast measure --mode interpreter``) answers that question on the CPU: each candidate
runs sandboxed on its operation's small cases, judged against the reference as on a GPU. A kernel whose outputs are
wrong there computes the wrong thing. Its verdict is a fact a forecaster may read:

- ``incorrect``: wrong outputs on the small cases (or refused as a cheat: ``rejected``): it fails on a GPU too;
- ``ok``: right on the small cases;
- anything else says nothing of the GPU: the interpreter cannot run a CUDA graph, a CUDA extension or a library the
  CPU build lacks (``runtime_error``), or a call took too long interpreted (``timeout``).

Probed in a Python of its own (``python -m kernelcast.kernels.probe``, JSON in and out): the interpreter is chosen
when Triton is imported, and the process that forecasts may be the one measuring on a GPU. Verdicts are kept in
memory by source, parameters and operation.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

WRONG = ("incorrect", "rejected")  # verdicts that say the candidate fails on a GPU too
_CACHE: dict[tuple[str, str], tuple[str, str]] = {}
SECONDS_PER_CANDIDATE = 60  # the probe's time limit grows with the candidates it is given


def key(candidate) -> tuple[str, str]:
    digest = hashlib.sha256((candidate.source + repr(sorted(candidate.params.items()))).encode()).hexdigest()[:20]
    return candidate.op, digest


def probe_many(candidates, workers: int = 2) -> list[tuple[str, str]]:
    """(status, error) of each candidate run in the harness under Triton's interpreter on its operation's small
    cases; ("unknown", why) where the probe itself could not run."""
    todo = {key(c): c for c in candidates if key(c) not in _CACHE}
    if todo:
        found = _probe_in_child(list(todo.values()), workers)
        _CACHE.update(zip(todo, found))
    return [_CACHE[key(c)] for c in candidates]


def _probe_in_child(candidates, workers: int) -> list[tuple[str, str]]:
    from kernelcast.kernels.facts import importable_path

    request = json.dumps({"workers": workers, "candidates": [
        {"op": c.op, "backend": c.backend, "source": c.source, "params": dict(c.params), "origin": c.origin,
         "template": c.template} for c in candidates]})
    env = {**os.environ, "PYTHONPATH": importable_path(os.environ.get("PYTHONPATH", "")), "TRITON_INTERPRET": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run([sys.executable, "-m", "kernelcast.kernels.probe"], input=request, capture_output=True,
                              text=True, env=env, timeout=120 + SECONDS_PER_CANDIDATE * len(candidates) / workers)
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            answers = json.loads(lines[-1])
            return [(str(a[0]), str(a[1])) for a in answers]
        why = f"the probe failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        why = "the probe timed out"
    return [("unknown", why)] * len(candidates)


def _child() -> None:
    """Read candidates (JSON on stdin), measure them in the interpreter, print each one's [status, error]."""
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.hardware import INTERPRETER
    from kernelcast.kernels.records import Candidate, HardwareSpec

    request = json.loads(sys.stdin.read())
    candidates = [Candidate(op=c["op"], backend=c["backend"], source=c["source"], params=c["params"],
                            origin=c["origin"], template=c["template"]) for c in request["candidates"]]
    hardware = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
    verdicts: dict[str, tuple[str, str]] = {}
    # one checked call a case, no recheck round: whether the outputs are right, not whether the kernel cheats
    config = WorkerConfig(mode="interpreter", concurrency=max(1, int(request["workers"])), seeds=1, recheck=False)
    with MeasureWorker(hardware, config) as worker:
        for m in worker.measure(candidates):
            verdicts[m.candidate_id] = (m.status, (m.error or "")[:300])
    sys.stdout.write("\n" + json.dumps([verdicts.get(c.candidate_id, ("unknown", "not measured"))
                                        for c in candidates]) + "\n")


if __name__ == "__main__":
    _child()
