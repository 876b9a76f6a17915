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

Probed in a Python of its own (``python -m kernelcast.kernels.probe``, a JSON line in and out a request), started at
the first probe and kept: the interpreter is chosen when Triton is imported, and the process that forecasts may be
the one measuring on a GPU. An imported task runs its probe case there (its interpreter case halved again until the
inputs take ``PROBE_INPUT_BYTES``), and torch.compile runs the code it compiles, eagerly. Verdicts are kept in
memory by source, parameters and operation.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kernelcast.kernels.facts import write_whole
from kernelcast.kernels.formats import TASKS_ENV

WRONG = ("incorrect", "rejected")  # verdicts that say the candidate fails on a GPU too
_CACHE: dict[tuple[str, str], tuple[str, str]] = {}
SECONDS_PER_CANDIDATE = 60  # the probe's time limit grows with the candidates it is given


def key(candidate) -> tuple[str, str]:
    digest = hashlib.sha256((candidate.source + repr(sorted(candidate.params.items()))).encode()).hexdigest()[:20]
    return candidate.op, digest


def probe_many(candidates, workers: int = 2, cache_dir: str | None = None) -> list[tuple[str, str]]:
    """(status, error) of each candidate run in the harness under Triton's interpreter on its operation's small
    cases; ("unknown", why) where the probe itself could not run. Kept in memory, and in ``cache_dir`` when given
    (by source, parameters and the operation's own text, in a folder named by the code that decides a verdict)."""
    todo = {key(c): c for c in candidates if key(c) not in _CACHE}
    folder = _cache_folder(cache_dir) if cache_dir and todo else None
    paths: dict[tuple[str, str], str | None] = {}
    if folder:
        texts: dict[str, bytes | None] = {}  # each operation's text read once a call
        for k, c in list(todo.items()):
            paths[k] = _kept_path(folder, c, texts)
            kept = _read_kept(paths[k])
            if kept:
                _CACHE[k] = kept
                del todo[k]
    found = dict(zip(todo, _server(workers).ask(list(todo.values())))) if todo else {}
    for k, verdict in found.items():
        if verdict[0] != "unknown":  # a probe that failed is tried again
            _CACHE[k] = verdict
            if paths.get(k):
                write_whole(paths[k], json.dumps(list(verdict)))
    return [_CACHE.get(key(c)) or found[key(c)] for c in candidates]


@functools.lru_cache(maxsize=None)
def _cache_folder(cache_dir: str) -> str:
    """``cache_dir``'s folder for verdicts of this code: named by the text of the probe, the harness and the task
    formats, and torch's and Triton's versions, so a change to what decides a verdict starts a fresh folder."""
    import torch
    import triton

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(torch.__version__.encode() + triton.__version__.encode())
    for path in sorted([here / "probe.py", *(here / "harness").glob("*.py"), *(here / "formats").glob("*.py")]):
        digest.update(path.read_bytes())
    folder = os.path.join(cache_dir, digest.hexdigest()[:16])
    os.makedirs(folder, exist_ok=True)
    return folder


def _operation_text(op_name: str) -> bytes:
    """What the operation is, as text: an imported task's files, or a built-in operation's module."""
    from kernelcast.kernels.formats import task_files
    from kernelcast.kernels.formats.common import is_imported_name
    from kernelcast.kernels.ops import get_operation

    if is_imported_name(op_name):
        return b"".join(name.encode() + data for name, data in task_files(op_name).items())
    return Path(inspect.getfile(type(get_operation(op_name)))).read_bytes()


def _kept_path(folder: str, candidate, texts: dict) -> str | None:
    """The file of ``candidate``'s verdict: by its key and its operation's text (``texts``: op -> text, filled as read);
    None where the operation cannot be read (not installed here): nothing is kept for it."""
    if candidate.op not in texts:
        try:
            texts[candidate.op] = _operation_text(candidate.op)
        except (OSError, ValueError):
            texts[candidate.op] = None
    if texts[candidate.op] is None:
        return None
    digest = hashlib.sha256(repr(key(candidate)).encode() + texts[candidate.op]).hexdigest()[:32]
    return os.path.join(folder, digest + ".json")


def _read_kept(path: str | None) -> tuple[str, str] | None:
    if path is None:
        return None
    try:
        with open(path) as f:
            status, error = json.load(f)
        return str(status), str(error)
    except (OSError, ValueError, TypeError):  # not there, or cut short: probed again
        return None


ANSWER = "kernelcast-probe-answer "  # the prefix of the server's answer lines: anything else it prints is not one


class _Server:
    """The probe's Python, started at the first probe and kept: its worker's fork server and judges stay warm, so a
    later request pays for its candidates alone (4-6 s of start-up on the 2 cores the probe was measured on). One
    request at a time; a request that fails or times out stops it, and the next starts another."""

    def __init__(self, workers: int):
        self.workers = workers
        self._proc: subprocess.Popen | None = None
        self._tasks = ""  # the tasks folder it was started with (KERNELCAST_TASKS)
        self._log = tempfile.TemporaryFile()  # its standard error, for the reason where it fails
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        from kernelcast.kernels.facts import importable_path

        self._log.seek(0)
        self._log.truncate()
        from kernelcast.kernels.formats.operation import PROBE_CASES_ENV

        # The probe's own small case of an imported task; torch.compile run as the eager code it compiles (the math
        # is the same, and Inductor's CPU code took 25-31 s a kernel here, for a fact of a forecast).
        env = {**os.environ, "PYTHONPATH": importable_path(os.environ.get("PYTHONPATH", "")),
               "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", PROBE_CASES_ENV: "1", "TORCHDYNAMO_DISABLE": "1"}
        return subprocess.Popen([sys.executable, "-m", "kernelcast.kernels.probe", str(self.workers)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                env=env)

    def ask(self, candidates) -> list[tuple[str, str]]:
        request = json.dumps([{"op": c.op, "backend": c.backend, "source": c.source, "params": dict(c.params),
                               "origin": c.origin, "template": c.template} for c in candidates])
        with self._lock:
            tasks = os.environ.get(TASKS_ENV, "")
            if self._proc is not None and (self._proc.poll() is not None or tasks != self._tasks):
                self.stop()  # ended, or started for another tasks folder than the caller's now
            if self._proc is None:
                self._proc, self._tasks = self._start(), tasks
            proc = self._proc
            timer = threading.Timer(120 + SECONDS_PER_CANDIDATE * len(candidates) / self.workers, proc.kill)
            timer.start()
            try:
                proc.stdin.write(request + "\n")
                proc.stdin.flush()
                for line in proc.stdout:
                    if line.startswith(ANSWER):
                        return [(str(a[0]), str(a[1])) for a in json.loads(line[len(ANSWER):])]
                why = f"the probe ended (exit {proc.wait()})" if timer.is_alive() else "the probe timed out"
                self._log.seek(max(0, self._log.seek(0, os.SEEK_END) - 300))
                tail = self._log.read().decode(errors="replace").strip()
                why += f": {tail}" if tail else ""
            except (OSError, ValueError) as exc:
                why = f"the probe failed: {exc}"
            finally:
                timer.cancel()
            self.stop()
        return [("unknown", why)] * len(candidates)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


_SERVERS: dict[int, _Server] = {}


def _server(workers: int) -> _Server:
    if workers not in _SERVERS:
        _SERVERS[workers] = _Server(workers)
        atexit.register(_SERVERS[workers].stop)
    return _SERVERS[workers]


def _child(workers: int) -> None:
    """Read requests (a JSON list of candidates a line) until stdin closes; measure each in the interpreter and
    answer one line: ``ANSWER`` and each candidate's [status, error]."""
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.hardware import INTERPRETER
    from kernelcast.kernels.records import Candidate, HardwareSpec

    hardware = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
    # one checked call a case, no recheck round: whether the outputs are right, not whether the kernel cheats
    config = WorkerConfig(mode="interpreter", concurrency=max(1, workers), seeds=1, recheck=False)
    with MeasureWorker(hardware, config) as worker:
        for line in sys.stdin:
            candidates = [Candidate(op=c["op"], backend=c["backend"], source=c["source"], params=c["params"],
                                    origin=c["origin"], template=c["template"]) for c in json.loads(line)]
            verdicts: dict[str, tuple[str, str]] = {}
            missing = ("unknown", "not measured")
            try:
                for m in worker.measure(candidates):
                    verdicts[m.candidate_id] = (m.status, (m.error or "")[:300])
            except Exception as exc:  # noqa: BLE001 - the request's fault (an operation not installed): the next one runs
                missing = ("unknown", f"the probe could not measure them: {type(exc).__name__}: {exc}"[:300])
            sys.stdout.write(ANSWER + json.dumps([verdicts.get(c.candidate_id, missing) for c in candidates]) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    _child(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
