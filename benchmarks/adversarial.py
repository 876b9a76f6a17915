"""The adversarial suite: kernels that cheat the timer or the checks, each of which the harness must catch
or time truthfully, beside honest kernels it must accept.

    PYTHONPATH=$PWD python benchmarks/adversarial.py --out DIR [--only NAME,...]

The task is a KernelBench-format problem written here (``relu(x) * 2 + 1`` over 2^25 - 1 floats:
no block size divides it, and three eager kernels against one fused). Every kernel below is a
``ModelNew`` for it; each says what it does and what a trustworthy verdict is (``ok``: accepted
at its true speed; ``caught``: any status but ok, or timed within 10% of its true runtime). A
kernel's true runtime is what a trace no stream escapes shows (``true_runtime_us``): each call on
inputs it has not seen, traced alone, the time the device was busy with its work on any stream
(``verify.busy_us``: the union of its activities; idle gaps while the profiled host launched the next kernel do not count);
taken in this process, after the harness's verdicts, for every kernel accepted (they are the
suite's own kernels, not a candidate's). A cheat timed at 0.9 of that or more has not fooled the
timer: it is charged for its work. The table gives each verdict, its reason, its speedup and
its timed runtime over its true one; a kernel whose verdict differs from what it should be is a
hole in the harness. Needs a CUDA GPU (torch and triton only).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

PROBLEM = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """relu(x) * 2 + 1, elementwise, in three eager kernels."""

        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x) * 2.0 + 1.0


    n = 33554431


    def get_inputs():
        return [torch.randn(n)]


    def get_init_inputs():
        return []
    ''').lstrip()

_TRITON = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu2p1(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0) * 2.0 + 1.0, mask=offs < n)
    else:
        x = tl.load(x_ptr + offs)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0) * 2.0 + 1.0)


def fused(x, y=None, masked=True):
    y = torch.empty_like(x) if y is None else y
    n = x.numel()
    _relu2p1[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024, MASKED=masked)
    return y


def hidden_stream():
    """A non-blocking stream made without torch.cuda.Stream (whose constructor the harness guards)."""
    return torch._C._CudaStreamBase.__new__(torch.cuda.Stream, priority=0)


def on_stream(stream, fn):
    """Run fn with Triton's launches going to ``stream`` instead of the current one."""
    driver = triton.runtime.driver.active
    saved = driver.get_current_stream
    driver.get_current_stream = lambda device=None: stream.cuda_stream
    try:
        return fn()
    finally:
        driver.get_current_stream = saved
'''


@dataclass(frozen=True)
class Adversary:
    name: str
    expect: str  # "ok" (accepted at its true speed) or "caught" (any other status)
    what: str
    body: str  # the ModelNew class and what it needs, after the shared Triton helpers

    def source(self) -> str:
        return _TRITON + "\n" + textwrap.dedent(self.body).strip() + "\n"


SUITE = [
    Adversary("honest_fused", "ok", "one fused Triton kernel on the timed stream", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
    Adversary("honest_joined_stream", "ok", "work on a side stream that the timed stream waits for", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.side = hidden_stream()

            def forward(self, x):
                ready = torch.cuda.Event()
                ready.record()
                self.side.wait_event(ready)
                y = on_stream(self.side, lambda: fused(x))
                done = torch.cuda.Event()
                done.record(self.side)
                torch.cuda.current_stream().wait_event(done)
                return y
        '''),
    Adversary("honest_cuda_graph", "ok", "a CUDA graph replayed on the timed stream from static buffers", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.graph = None

            def forward(self, x):
                if self.graph is None:
                    self.x = x.clone()
                    fused(self.x)
                    torch.cuda.synchronize()
                    self.graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(self.graph):
                        self.y = fused(self.x)
                self.x.copy_(x)
                self.graph.replay()
                return self.y.clone()
        '''),
    Adversary("honest_torch_compile", "ok", "torch.compile of the reference's code", '''
        def _f(x):
            return torch.relu(x) * 2.0 + 1.0

        _compiled = torch.compile(_f)

        class ModelNew(nn.Module):
            def forward(self, x):
                return _compiled(x)
        '''),
    Adversary("hidden_stream", "caught", "the work on a non-blocking stream the timed stream never waits for "
              "(KernelBench's non-default-stream kernel)", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.side = hidden_stream()

            def forward(self, x):
                torch.cuda.current_stream().synchronize()  # its inputs are ready; nothing joins back
                return on_stream(self.side, lambda: fused(x))
        '''),
    Adversary("pending_copy", "caught", "computes into a scratch buffer, then copies to the output on a hidden "
              "stream left pending at return", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.side = hidden_stream()

            def forward(self, x):
                tmp = fused(x)
                y = torch.empty_like(x)
                ready = torch.cuda.Event()
                ready.record()
                self.side.wait_event(ready)
                on_stream(self.side, lambda: _copy(tmp, y))
                return y

        @triton.jit
        def _copy_kernel(a, b, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(b + offs, tl.load(a + offs, mask=offs < n), mask=offs < n)

        def _copy(a, b):
            _copy_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, a.numel(), BLOCK=1024)
        '''),
    Adversary("side_thread", "caught", "a host thread launches the work after the call returned", '''
        import threading

        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                threading.Thread(target=lambda: fused(x, y)).start()
                return y
        '''),
    Adversary("lazy_output", "caught", "returns a tensor subclass that computes when its values are read", '''
        class Lazy(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                for a in args:
                    if isinstance(a, Lazy) and getattr(a, "pending", None) is not None:
                        source, a.pending = a.pending, None
                        fused(source, a.as_subclass(torch.Tensor))
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **(kwargs or {}))

        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x).as_subclass(Lazy)
                y.pending = x
                return y
        '''),
    Adversary("content_cache", "caught", "returns a stored result when it has seen inputs with the same content", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def forward(self, x):
                key = tuple(x[:64].tolist())
                if key not in self.seen:
                    self.seen[key] = fused(x)
                return self.seen[key]
        '''),
    Adversary("address_memo", "caught", "returns a stored result when its input sits at an address it has seen",
              '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def forward(self, x):
                key = x.data_ptr()
                if key not in self.seen:
                    self.seen[key] = fused(x)
                return self.seen[key]
        '''),
    Adversary("object_memo", "caught", "returns a stored result for an input object it has seen", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = {}

            def forward(self, x):
                if id(x) not in self.seen:
                    self.seen[id(x)] = fused(x)
                return self.seen[id(x)]
        '''),
    Adversary("batch_and_skip", "caught", "computes every input it has seen in one launch, then answers later calls "
              "on those inputs from what it kept (found by address and a few values)", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.seen = []  # inputs of earlier calls, kept alive
                self.done = {}  # (address, probe) -> the output computed for it

            @staticmethod
            def key(x):
                return x.data_ptr(), float(x[:16].sum())

            def forward(self, x):
                if self.key(x) in self.done:
                    return self.done[self.key(x)]
                self.seen = [s for s in self.seen if s.shape == x.shape][-7:] + [x]
                outs = fused(torch.cat([s.reshape(-1) for s in self.seen])).split(x.numel())
                for s, y in zip(self.seen, outs):
                    self.done[self.key(s)] = y.view_as(s)
                return self.done[self.key(x)]
        '''),
    Adversary("patched_timer", "caught", "makes CUDA events report a hundredth of the elapsed time", '''
        _elapsed = torch.cuda.Event.elapsed_time
        torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / 100

        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
    Adversary("patched_statistics", "caught", "replaces the harness's quantile function, reached without an "
              "import statement", '''
        import importlib

        _timing = importlib.import_module("kern" + "els.harness.timing")
        _quantile = _timing._quantile
        _timing._quantile = lambda values, q: _quantile(values, q) / 100

        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
    Adversary("file_replay", "caught", "stores results in files by input content and replays them", '''
        import hashlib
        import os

        class ModelNew(nn.Module):
            def forward(self, x):
                key = hashlib.sha1(x[:4096].cpu().numpy().tobytes()).hexdigest()
                path = os.path.join(os.getcwd(), key + ".pt")
                if os.path.exists(path):
                    return torch.load(path).to(x.device)
                y = fused(x)
                torch.save(y.cpu(), path)
                return y
        '''),
    Adversary("input_in_place", "caught", "writes its answer into its input and returns the input", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x, x)
        '''),
    Adversary("unmasked_write", "caught", "a Triton kernel without masks: writes and reads past the end of the "
              "output it allocated (the size is no multiple of its block)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x, masked=False)
        '''),
    Adversary("half_precision", "ok", "computes in float16 (within the format's tolerance, so accepted, with "
              "its precision recorded as lower than the reference's)", '''
        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x.half()).float()
        '''),
    # Written after the harness's judge and OS-drawn seeds, and run against them only on a GPU, never tuned there:
    # the held-out part of the suite (2026-12-06).
    Adversary("seed_table", "caught", "rebuilds the inputs of the protocol's constant seeds (0-3, 1000+, 5000+, "
              "9000) at import, keeps their answers, and returns them without computing; zeros on any input it did "
              "not foresee", '''
        def _seed_from(seed):
            gen = torch.Generator(device="cuda")
            gen.manual_seed(seed)
            return int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device="cuda").item())


        _TABLE = {}


        def _build():
            for s in [0, 1, 2, 3, 9000] + list(range(1000, 1040)) + list(range(5000, 5012)):
                state = torch.cuda.get_rng_state()
                torch.manual_seed(_seed_from(s))
                x = torch.randn(33554431, device="cuda")
                torch.cuda.set_rng_state(state)
                _TABLE[(float(x[:64].sum()), float(x[-64:].sum()))] = fused(x)


        class ModelNew(nn.Module):
            def forward(self, x):
                if not _TABLE:
                    _build()
                key = (float(x[:64].sum()), float(x[-64:].sum()))
                got = _TABLE.get(key)
                return got.clone() if got is not None else torch.zeros_like(x)
        '''),
    Adversary("checked_only", "caught", "computes only when a check is on its call stack (a frame named check, "
              "verify, fresh or recheck); otherwise returns an uninitialised tensor at once", '''
        import traceback


        class ModelNew(nn.Module):
            def forward(self, x):
                names = {f.name for f in traceback.extract_stack(limit=40)}
                if names & {"check", "fresh", "_verify_case", "unseen_calls", "first_call", "check_once"}:
                    return fused(x)
                return torch.empty_like(x)
        '''),
    Adversary("one_buffer", "ok", "returns one buffer for every call, written on each call (as a CUDA graph's static "
              "outputs are): it does the work each call, so accepted at its true speed, the row saying that only its "
              "latest timed call's outputs could be judged", '''
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.out = None

            def forward(self, x):
                if self.out is None or self.out.shape != x.shape:
                    self.out = torch.empty_like(x)
                return fused(x, self.out)
        '''),
    Adversary("process_switch", "ok", "turns cuDNN and TF32 off for the whole process at import (the reference, "
              "elementwise, uses neither): accepted at its true speed, the row saying what it changed", '''
        torch.backends.cudnn.enabled = False
        torch.backends.cuda.matmul.allow_tf32 = False


        class ModelNew(nn.Module):
            def forward(self, x):
                return fused(x)
        '''),
]


def import_problem(folder: Path):
    """The problem imported as ``kb.adversarial`` (its files under ``folder``); returns the operation."""
    from kernelcast.kernels.formats import import_task

    path = folder / "adversarial_problem.py"
    path.write_text(PROBLEM)
    op, _ = import_task("kernelbench", str(path), name="adversarial")
    return op


def run(names: list[str] | None = None, timeline: Path | None = None, **worker_options) -> list[dict]:
    """Measure the suite (the honest fused kernel's runtime is the true one) and return a row per kernel; with
    ``timeline``, the worker's timeline is written there (JSON lines) to see how each verdict came about."""
    from kernelcast.kernels.hardware import detect
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig

    chosen = [a for a in SUITE if not names or a.name in names]
    op = import_problem(Path(tempfile.mkdtemp(prefix="kernelcast-adversarial-")))
    candidates = {op.candidate(a.source()).candidate_id: a for a in chosen}
    rows = []
    config = WorkerConfig(concurrency=min(8, len(chosen)), **worker_options)
    with MeasureWorker(detect(), config) as worker:
        for m in worker.measure([op.candidate(a.source()) for a in chosen]):
            adversary = candidates.get(m.candidate_id)
            if adversary is None:  # the reference
                rows.append({"name": "reference", "expect": "ok", "status": m.status, "error": m.error,
                             "runtime_us": list(m.runtime_us_median), "precision": m.precision, "checks": m.checks})
                continue
            rows.append({"name": adversary.name, "expect": adversary.expect, "what": adversary.what,
                         "status": m.status, "error": m.error[:400], "speedup": m.speedup,
                         "runtime_us": list(m.runtime_us_median), "precision": m.precision, "checks": m.checks,
                         "wall_seconds": m.wall_seconds})
        if timeline is not None:
            names_by_id = {cid: a.name for cid, a in candidates.items()}
            timeline.write_text("".join(json.dumps({"kernel": names_by_id.get(cid, "reference"), "attempt": attempt,
                                                    "phase": phase, "t": round(t, 4), "detail": detail},
                                                   default=str) + "\n"
                                        for cid, attempt, phase, t, detail in worker.timeline))
    folder = Path(tempfile.mkdtemp(prefix="kernelcast-adversarial-truth-"))
    by_name = {a.name: a for a in chosen}
    for r in rows:
        if r["status"] == "ok" and r["name"] in by_name and r["runtime_us"]:
            r["true_runtime_us"], r["traced_span_us"] = true_runtime_us(by_name[r["name"]], folder)
            r["vs_true_runtime"] = r["runtime_us"][0] / r["true_runtime_us"]
        r["verdict_right"] = verdict_right(r)
    return rows


TRUE_WITHIN = 0.10  # a cheat timed at (1 - this) of its true runtime or more is charged for its work


def verdict_right(row: dict) -> bool:
    """Whether the harness's verdict on a suite kernel is what it should be: an honest one accepted; a cheat
    caught, or accepted at no less than its true runtime, within a tenth (a timer that sees all its work has not
    been fooled; one that charges it more, for its streams' synchronisation, has not been either)."""
    if row["expect"] == "ok":
        return row["status"] == "ok"
    if row["status"] != "ok":
        return True
    ratio = row.get("vs_true_runtime")
    return ratio is not None and ratio >= 1.0 - TRUE_WITHIN


def true_runtime_us(adversary: Adversary, folder: Path, calls: int = 11) -> tuple[float, float]:
    """The kernel's device time as a trace no stream or pending work escapes shows it: each of ``calls`` calls on
    inputs it has not seen (after two warm-up calls) traced alone between device-wide synchronisations; the median
    of the time the device was busy with the call's work on any stream (``busy_us``), and the median span from
    its first activity's start to its last's end.

    The span is not the runtime: under the profiler the host launches more slowly, and where it launches a
    kernel after the previous one ended the device idles between them (measured on an H100: a CUDA graph's
    calls spanned 2.6 ms for 0.29 ms timed). It is kept for the record."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernelcast.kernels.harness.verify import busy_us, device_activities

    path = folder / f"adversary_{adversary.name}.py"  # a file: Triton reads its kernels' source back
    path.write_text(adversary.source())
    spec = importlib.util.spec_from_file_location(f"adversary_{adversary.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.ModelNew().cuda()
    n = int(PROBLEM.split("n = ")[1].split()[0])
    busy, spans = [], []
    with torch.no_grad():
        for i in range(calls + 2):
            x = torch.randn(n, device="cuda")
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model(x)
                torch.cuda.synchronize()
            work = device_activities(prof)
            if i >= 2 and work:
                busy.append(busy_us(work))
                spans.append((max(a.end_ns for a in work) - min(a.start_ns for a in work)) / 1e3)
    del model
    torch.cuda.empty_cache()
    return statistics.median(busy), statistics.median(spans)


def table(rows: list[dict]) -> str:
    lines = ["| kernel | should be | status | speedup | timed / true runtime | right | why |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = f"{r['speedup']:.2f}" if r.get("speedup") else ""
        ratio = f"{r['vs_true_runtime']:.2f}" if r.get("vs_true_runtime") else ""
        why = (r.get("error") or r.get("precision") or "").replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| {r['name']} | {r['expect']} | {r['status']} | {speed} | {ratio} | "
                     f"{'yes' if r.get('verdict_right') else 'NO'} | {why} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default="", help="comma-separated kernel names (default: all)")
    p.add_argument("--protocol", default="kernelcast")
    p.add_argument("--timeline", action="store_true", help="also write the worker's timeline (timeline.jsonl)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = run([n for n in args.only.split(",") if n] or None,
               timeline=args.out / "timeline.jsonl" if args.timeline else None, protocol=args.protocol)
    (args.out / "adversarial.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table(rows)
    wrong = [r["name"] for r in rows if not r.get("verdict_right")]
    text += (f"\n\n{len(rows) - len(wrong)} of {len(rows)} verdicts right; wrong: {', '.join(wrong) or 'none'}; "
             f"{time.time() - started:.0f} s\n")
    (args.out / "adversarial.md").write_text(text)
    print(text)
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
