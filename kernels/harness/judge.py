"""The judge: correctness decided in a process that never shares one with candidate code.

A child calls its candidate and writes what came back (``OutputLog``: raw bytes and a small JSON
header per call, in its scratch folder); it writes nothing else the verdict rests on. The judge, a
process started from the harness's fork server before any candidate ran and never given candidate
code, rebuilds each call's inputs from the seed the *worker* drew for it from the operating system,
computes the operation's reference in its own process (where no candidate can have replaced a torch
function, a tensor method or a task's checker), and compares. A child's own verdict is only a fast
way to fail: ``ok`` stands once the judge agrees on every recorded call, the timed calls' last outputs
among them.

The judge also refuses outputs that did no work (``trivial_passes``): where the operation's tolerance
would accept zeros, a constant or an input passed through, the candidate must be much closer to the
reference than that trivial output is, and its outputs must be laid out as the reference's.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import os
import random
import re
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from kernelcast.kernels.ops import Operation, get_operation, mismatch

RECORD_CAP_BYTES = 256 << 20  # one call's outputs written whole up to this; a bigger call is left to the child
TOTAL_CAP_BYTES = 4 << 30  # all of one child's records
SAMPLE_ELEMENTS = 1 << 20  # an output of more elements is judged on this many, at places drawn after the call
TRIVIAL_MARGIN = 0.5  # where a trivial output passes the tolerance, the candidate's error must be under this share of it
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64)}
_NAME = re.compile(r"^(\d{1,6})\.json$")
ROLES = ("check", "timed", "recheck")


class JudgeError(Exception):
    """A record the judge cannot read as the harness writes it: a verdict of ``incorrect``."""


# ---- the child's side: what it writes ---------------------------------------------------------------

class OutputLog:
    """Writes each judged call's outputs under ``folder``: ``N.json`` (case, seed, role, each tensor's dtype, shape and
    strides) and ``N.bin`` (the tensors' elements, in order, contiguous).

    ``deferred``: a call's outputs are copied to host memory at once (a later call may overwrite them) but written to
    files only at ``flush``, which the child calls where it does not hold the device alone: the files of one softmax
    candidate's records are about a gigabyte (measured on an H100: writing them inside the timing hold made a child
    hold the device 2.7 s against 0.6 s). ``sample``: an output of more than ``SAMPLE_ELEMENTS`` elements is recorded
    as that many of its elements, at places drawn from the operating system after the call (the judge draws the same
    places from the seed kept in the header). A sample of a million finds an output wrong in one element in 100,000
    or more with a probability over 0.9999; the child's own comparison of every element still fails what its
    candidate got wrong honestly, and a candidate that silenced it and is wrong in fewer places gains no time."""

    def __init__(self, folder: str, deferred: bool = False, sample: bool = False, device: str = "cpu"):
        self.folder, self.deferred, self.sample, self.device = folder, deferred, sample, device
        self.count = 0
        self.bytes = 0
        self.skipped: list[str] = []  # calls too big to write: left to the child's own comparison
        self._pending: list[tuple[dict, list[torch.Tensor]]] = []

    def write(self, case: str, seed: int, role: str, outputs) -> None:
        tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
        if len(tensors) != len(tuple(outputs)):
            return  # not tensors: the child's own check says so
        head = {"case": case, "seed": int(seed), "role": role, "tensors": []}
        kept = []
        for t in tensors:
            spec = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "stride": list(t.stride())}
            data = t.detach()
            if self.sample and data.numel() > SAMPLE_ELEMENTS:
                spec["sample"] = random.SystemRandom().randrange(1 << 62)
                where = sample_places(spec["sample"], data.numel(), self.device).to(data.device)
                data = data.reshape(-1)[where]
            kept.append(data)
            spec["bytes"] = data.numel() * data.element_size()
            head["tensors"].append(spec)
        size = sum(spec["bytes"] for spec in head["tensors"])
        if size > RECORD_CAP_BYTES or self.bytes + size > TOTAL_CAP_BYTES:
            self.skipped.append(f"{case}/{role}")
            return
        self.bytes += size
        self._pending.append((head, [d.contiguous().cpu() for d in kept]))
        if not self.deferred:
            self.flush()

    def flush(self) -> None:
        """Write every call kept in memory to its files."""
        if self._pending:
            os.makedirs(self.folder, exist_ok=True)
        for head, kept in self._pending:
            path = os.path.join(self.folder, f"{self.count}")
            with open(path + ".bin", "wb") as f:
                for data in kept:
                    if data.numel():
                        f.write(memoryview(data.reshape(-1).view(torch.uint8).numpy()))
            with open(path + ".json", "w") as f:
                json.dump(head, f)
            self.count += 1
        self._pending.clear()


def sample_places(seed: int, numel: int, device: str = "cpu") -> torch.Tensor:
    """The ``SAMPLE_ELEMENTS`` places of a flat output a sampled record keeps: drawn from ``seed`` on ``device`` (the
    run's: the GPU's generator in GPU mode), the same in the child that writes the record and in the judge that reads
    it. Drawn on the GPU, they cost a child under 1 ms inside its timing hold, against 6-17 ms a record on the CPU."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, numel, (SAMPLE_ELEMENTS,), generator=gen, device=device)


# ---- the judge's side: reading and judging ----------------------------------------------------------

@dataclass(frozen=True)
class Record:
    case: str
    seed: int
    role: str
    outputs: tuple[torch.Tensor, ...]  # a sampled output: its sampled elements, flat
    strides: tuple[tuple[int, ...], ...]
    shapes: tuple[tuple[int, ...], ...] = ()
    samples: tuple[int | None, ...] = ()  # per output: the seed of its sampled places, or None (recorded whole)


def read_records(folder: str, limit_bytes: int = TOTAL_CAP_BYTES) -> list[Record]:
    """Every record under ``folder``, each checked against the format (``JudgeError`` where one is not)."""
    if not os.path.isdir(folder):
        return []
    records, total = [], 0
    names = sorted((n for n in os.listdir(folder) if n.endswith(".json")), key=lambda n: (len(n), n))
    for name in names:
        if not _NAME.match(name):
            raise JudgeError(f"an output record named {name[:40]!r}, which the harness does not write")
        stem = os.path.join(folder, name[:-5])
        try:
            with open(stem + ".json") as f:
                head = json.loads(f.read(1 << 16))
            blob_size = os.path.getsize(stem + ".bin")
        except (OSError, ValueError) as exc:
            raise JudgeError(f"output record {name}: {exc}") from None
        if not isinstance(head, dict) or set(head) != {"case", "seed", "role", "tensors"} \
                or not isinstance(head["case"], str) or head["role"] not in ROLES \
                or not isinstance(head["seed"], int) or not isinstance(head["tensors"], list):
            raise JudgeError(f"output record {name} is not of the harness's format")
        specs, expected = [], 0
        for spec in head["tensors"]:
            if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPES \
                    or not all(isinstance(x, int) and x >= 0 for x in spec.get("shape", [None])) \
                    or not all(isinstance(x, int) for x in spec.get("stride", [None])) \
                    or len(spec["stride"]) != len(spec["shape"]):
                raise JudgeError(f"output record {name}: a tensor's description is not of the harness's format")
            if set(spec) - {"dtype", "shape", "stride", "bytes", "sample"}:
                raise JudgeError(f"output record {name}: a tensor's description is not of the harness's format")
            dtype = _DTYPES[spec["dtype"]]
            sample = spec.get("sample")
            if sample is not None and not (isinstance(sample, int) and math.prod(spec["shape"]) > SAMPLE_ELEMENTS):
                raise JudgeError(f"output record {name}: a sample where the harness writes none")
            count = SAMPLE_ELEMENTS if sample is not None else math.prod(spec["shape"])
            n = count * torch.empty((), dtype=dtype).element_size()
            if spec.get("bytes") != n:
                raise JudgeError(f"output record {name}: a tensor's size does not match its shape")
            specs.append((dtype, tuple(spec["shape"]), tuple(spec["stride"]), n, sample))
            expected += n
        if expected != blob_size:
            raise JudgeError(f"output record {name}: {blob_size} bytes of elements, its header says {expected}")
        total += blob_size
        if total > limit_bytes:
            raise JudgeError(f"output records over {limit_bytes} bytes")
        blob = bytearray(blob_size)  # read once, into memory the tensors then use as it is
        with open(stem + ".bin", "rb") as f:
            f.readinto(blob)
        outs, at = [], 0
        for dtype, shape, _, n, sample in specs:
            if not n:
                outs.append(torch.empty(shape, dtype=dtype))
                continue
            aligned = at % torch.empty((), dtype=dtype).element_size() == 0
            raw = (torch.frombuffer(blob, dtype=torch.uint8, count=n, offset=at) if aligned  # no copy
                   else torch.frombuffer(bytearray(blob[at:at + n]), dtype=torch.uint8)).view(dtype)
            outs.append(raw if sample is not None else raw.reshape(shape))
            at += n
        records.append(Record(head["case"], head["seed"], head["role"], tuple(outs),
                              tuple(s[2] for s in specs), tuple(s[1] for s in specs), tuple(s[4] for s in specs)))
    return records


def _rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The error of ``got`` against ``expected`` relative to ``expected``'s size (L2 norms, float64)."""
    g, e = got.double(), expected.double()
    scale = float(e.norm())
    err = float((g - e).nan_to_num(nan=math.inf).norm())
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def trivial_passes(op, case, inputs, expected) -> dict[str, float]:
    """The trivial outputs the operation's own check would accept on these inputs, each with its relative error:
    zeros, the outputs' means (a constant), and any input of the outputs' shape and dtype passed through."""
    expected = tuple(expected)
    if not expected or not all(isinstance(e, torch.Tensor) and e.dtype.is_floating_point for e in expected):
        return {}
    trivial = {"zeros": tuple(torch.zeros_like(e) for e in expected),
               "a constant": tuple(torch.full_like(e, float(e.double().mean())) for e in expected)}
    if len(expected) == 1:
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.shape == expected[0].shape and x.dtype == expected[0].dtype:
                trivial[f"input {i} passed through"] = (x.clone(),)
    passing = {}
    for name, outs in trivial.items():
        if mismatch(op, case, outs, expected) is None:
            passing[name] = max(_rel_error(t, e) for t, e in zip(outs, expected))
    return passing


def judge_record(op, case, record: Record, device: str, trivial: bool = True) -> tuple[str | None, dict[str, float]]:
    """(what is wrong with one recorded call, or None; the trivial outputs the plain check would have passed).
    ``trivial``: whether to ask which trivial outputs pass (the answer is a property of the case, asked once a case)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(record.seed)
    inputs = op.make_inputs(case, gen, device)
    got = tuple(o.to(device) for o in record.outputs)
    expected = op.reference(*inputs)
    expected = (expected,) if isinstance(expected, torch.Tensor) else tuple(expected)
    for i, (stride, e) in enumerate(zip(record.strides, expected)):
        if isinstance(e, torch.Tensor) and e.numel() > 1 and tuple(stride) != tuple(e.stride()):
            return (f"the judge, on the {record.role} call: output {i} has strides {tuple(stride)}, the reference's "
                    f"{tuple(e.stride())}: outputs are laid out as the reference's, dense, one element each"), {}
    own_check = type(op).check is not Operation.check
    if any(s is not None for s in record.samples):
        # judged where the record's places are: the reference's elements there, and the inputs' where one has the
        # outputs' shape (the trivial output "an input passed through")
        if own_check or len(record.shapes) != len(expected) \
                or any(tuple(sh) != tuple(e.shape) for sh, e in zip(record.shapes, expected)):
            return (f"the judge, on the {record.role} call: outputs sampled where the harness records them whole, "
                    f"or of shapes {list(record.shapes)} unlike the reference's"), {}
        places = [None if s is None else sample_places(s, e.numel(), device)
                  for s, e in zip(record.samples, expected)]
        expected = tuple(e if w is None else e.reshape(-1)[w] for e, w in zip(expected, places))
        if len(places) == 1 and places[0] is not None:
            inputs = tuple(x.reshape(-1)[places[0]] if isinstance(x, torch.Tensor) and x.shape == record.shapes[0]
                           else x for x in inputs)
    # The operation's own check where it has one (a GPU MODE task's); else the reference's comparison, on the
    # reference computed once here for it and for the checks below.
    problem = op.check(case, inputs, got) if own_check else mismatch(op, case, got, expected)
    if problem:
        return f"the judge, on the {record.role} call's outputs (seed {record.seed}): {problem}", {}
    passing = trivial_passes(op, case, inputs, expected) if trivial else {}
    if passing:
        err = max(_rel_error(g, e) for g, e in zip(got, expected))
        worst = min(passing.values())
        if not err <= TRIVIAL_MARGIN * worst:
            names = ", ".join(passing)
            return (f"the judge, on the {record.role} call: its error against the reference ({err:.3g}) is not well "
                    f"under that of a trivial output the tolerance also accepts ({names}: {worst:.3g}); an output "
                    f"must do the work"), passing
    return None, passing


def judge_folder(op_name: str, mode: str, folder: str, served: dict[int, str], model_build: str = "auto",
                 protocol: str = "kernelcast", lock_path: str | None = None, roles_needed=("check",)) -> dict:
    """Judge every record a child wrote in ``folder``: {"problem": text or "", "records": n, "trivial": {case: names}}.

    ``served``: the seeds the worker drew for this child (seed -> case); a record of any other seed was not made on
    inputs the harness chose. ``roles_needed``: the roles every case must have a record of."""
    op = get_operation(op_name)
    op.configure_models(model_build, protocol)
    device = "cuda" if mode == "gpu" else "cpu"
    cases = {c.name: c for c in (op.cases if mode == "gpu" else op.interpret_cases)}
    try:
        records = read_records(folder)
    except JudgeError as exc:
        return {"problem": f"the judge cannot read the child's outputs: {exc}", "records": 0, "trivial": {}}
    seen = {(r.case, r.role) for r in records}
    for case in cases:
        if not _recordable(op_name, mode, case):
            continue  # a call too big to write whole (or of a size nobody can tell) is left to the child's check
        for role in roles_needed:
            if (case, role) not in seen:
                return {"problem": f"no {role} call of case {case} was recorded for the judge: the checks did not run "
                                   f"as the harness runs them", "records": len(records), "trivial": {}}
    trivial: dict[str, list[str]] = {}
    asked: set[str] = set()
    lock = open(lock_path) if (lock_path and device == "cuda") else None
    try:
        if lock is not None:
            # shared, as children's checks hold it: never inside a timing window (an exclusive hold waited for every
            # shared one, and children's checks kept it waiting for tens of seconds on an H100)
            fcntl.flock(lock, fcntl.LOCK_SH)
        with torch.no_grad() if device == "cuda" else nullcontext():
            for r in records:
                if r.case not in cases:
                    return {"problem": f"a record of case {r.case[:40]!r}, which {op_name} does not have",
                            "records": len(records), "trivial": trivial}
                if served.get(r.seed) != r.case:
                    return {"problem": f"a {r.role} call of case {r.case} on seed {r.seed}, which the worker did not "
                                       f"draw for that case: its inputs were not the harness's",
                            "records": len(records), "trivial": trivial}
                # which trivial outputs the tolerance accepts depends on the case's values: asked on its first record,
                # and again on each where some did
                ask = r.case not in asked or bool(trivial.get(r.case))
                asked.add(r.case)
                problem, passing = judge_record(op, cases[r.case], r, device, trivial=ask)
                if passing:
                    trivial.setdefault(r.case, sorted(set(trivial.get(r.case, [])) | set(passing)))
                if problem:
                    return {"problem": f"case {r.case}: {problem}", "records": len(records), "trivial": trivial}
    finally:
        if lock is not None:
            lock.close()
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"problem": "", "records": len(records), "trivial": trivial}


@functools.lru_cache(maxsize=4096)
def _recordable(op_name: str, mode: str, case_name: str) -> bool:
    """Whether a call's outputs fit a record, as far as the case's outputs' size can be told without running it (once
    a case for the judge's life: it depends on the case alone)."""
    from kernelcast.kernels.harness import budget

    op = get_operation(op_name)
    case = next(c for c in (op.cases if mode == "gpu" else op.interpret_cases) if c.name == case_name)
    try:
        size = budget.footprint(op, case).output_bytes
    except Exception:  # noqa: BLE001 - inputs meta tensors cannot describe
        return False
    return bool(size) and size <= RECORD_CAP_BYTES


def judge_main(conn) -> None:
    """The judge's process: answers ``judge_folder`` requests from its worker until told to stop (None)."""
    fields = {"op_name", "mode", "folder", "served", "model_build", "protocol", "lock_path", "roles_needed"}
    while True:
        try:
            request = json.loads(conn.recv_bytes(1 << 24))  # JSON, never pickle: nothing reaching it runs here
        except (EOFError, OSError, ValueError):
            return
        if request is None:
            return
        try:
            if not isinstance(request, dict) or set(request) - fields:
                raise ValueError("a request the worker does not send")
            request["served"] = {int(seed): case for seed, case in request["served"].items()}
            answer = judge_folder(**request)
        except Exception as exc:  # noqa: BLE001 - the judge's own failure is a verdict it cannot give
            answer = {"problem": "", "records": 0, "trivial": {}, "error": f"{type(exc).__name__}: {exc}"}
        conn.send_bytes(json.dumps(answer).encode())
