"""What every imported operation shares: cases from its manifest, inputs matched back to their case, wrapping.

The harness calls a candidate as ``launch(*inputs)`` and keeps what it returns (an imported
op asks for no harness-allocated outputs). A task's own calling convention (a ``Model``
built with init inputs, a ``data`` object) sometimes depends on the case, which ``launch``
is not told; so ``make_inputs`` remembers which case produced inputs of each shape
signature, and the wrapper looks the case up from the inputs it receives. The harness
always makes inputs in the process that then calls the candidate, so the lookup holds.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from torch.overrides import TorchFunctionMode

from kernelcast.kernels.formats.common import WRAPPER_MARK, backend_of, submission_of
from kernelcast.kernels.ops.base import DEFAULT_TOLERANCES, DTYPES, Case, Operation
from kernelcast.kernels.records import Candidate

# Set ("1") in the probe's process (kernelcast.kernels.probe): an imported task with a probe case runs it under the
# interpreter instead of its interpreter case.
PROBE_CASES_ENV = "KERNELCAST_PROBE_CASES"

Signature = tuple[tuple[tuple[int, ...], str], ...]


def signature(inputs) -> Signature:
    return tuple((tuple(t.shape), str(t.dtype)) for t in inputs)


def seed_from(gen: torch.Generator) -> int:
    """A seed for a task's own input generator, drawn from the harness's seeded generator."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=gen.device).item())


class _CudaRedirect(TorchFunctionMode):
    """Rewrites the CUDA device named in torch calls (``device="cuda"``, ``.cuda()``, ``.to("cuda")``) to another.

    With ``host_too`` the CPU named explicitly is rewritten as well: a task that picks
    ``"cuda" if torch.cuda.is_available() else "cpu"`` names the CPU on a machine without a
    GPU, and its shapes must still come from meta tensors, not from running it on the host
    (GPU MODE's linalg tasks build 32768 x 32768 matrices that way)."""

    def __init__(self, device: str, host_too: bool = False):
        super().__init__()
        self.device = torch.device(device)
        self.types = ("cuda", "cpu") if host_too else ("cuda",)

    def _map(self, value):
        if isinstance(value, torch.device) and value.type in self.types:
            return self.device
        if isinstance(value, str) and value.split(":")[0] in self.types:
            return self.device
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: self._map(v) for k, v in (kwargs or {}).items()}
        if func is torch.Tensor.cuda:
            return args[0].to(self.device)
        return func(*(self._map(a) for a in args), **kwargs)


def _generator_on(device: str):
    class RedirectedGenerator(torch._C.Generator):
        """``torch.Generator(device="cuda")`` in task code: a generator where the tensors are made instead."""

        def __new__(cls, device_=None, **kwargs):
            where = kwargs.get("device", device_)
            if where is not None and str(where).split(":")[0] in ("cuda", "meta"):
                where = "cpu" if device == "meta" else device  # meta tensors draw from a CPU generator
            return torch._C.Generator(device=where) if where is not None else torch._C.Generator()

    return RedirectedGenerator


@contextlib.contextmanager
def on_device(device) -> Iterator[None]:
    """Run a task's input code so that its tensors land on ``device``.

    Factories without a device make tensors there (the default device); on ``meta`` or
    ``cpu`` the CUDA device the task names is redirected too, so shapes can be found
    without a GPU (meta: no memory at all, so on ``meta`` a CPU the task names is
    redirected as well) and tasks written for CUDA run under the interpreter. On ``cuda``
    nothing is redirected: the task makes its inputs on the GPU, as it was written to.
    """
    device = str(device)
    with torch.device(device):
        if device.startswith("cuda"):
            yield
            return
        saved = torch.Generator, torch.distributions.Distribution._validate_args
        torch.Generator = _generator_on(device)
        if device == "meta":
            # A distribution checks its parameters' values when made (``Cauchy(0, 2)``), which meta
            # tensors do not have; sampling needs only shapes.
            torch.distributions.Distribution.set_default_validate_args(False)
        try:
            with _CudaRedirect(device, host_too=device == "meta"):
                yield
        finally:
            torch.Generator = saved[0]
            torch.distributions.Distribution.set_default_validate_args(saved[1])


def rng_fork(device):
    """``torch.random.fork_rng`` over the CPU and, for a CUDA device, that device's generator."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.random.fork_rng(devices=[device.index or 0], device_type="cuda")
    return torch.random.fork_rng(devices=[])


def tensor_bytes(values) -> int:
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


def is_literal(text: str, value) -> bool:
    """Whether ``text`` is a plain Python literal that reads back as ``value`` (so it can be written into a wrapper)."""
    import ast

    try:
        return ast.literal_eval(text) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def first_float_dtype(tensors, default: str = "float32") -> str:
    names = {v: k for k, v in DTYPES.items()}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dtype in names:
            return names[t.dtype]
    return default


class ImportedOperation(Operation):
    """An operation read from an imported task's folder and manifest (see ``kernelcast.kernels.formats``)."""

    bound = "memory"  # nothing in a task file says otherwise; the bytes model is inputs plus outputs
    format = ""
    entry = ""  # the name a submission must define: ModelNew, custom_kernel

    def __init__(self, folder: Path, manifest: Mapping[str, Any]):
        self.folder = Path(folder)
        self.manifest = dict(manifest)
        self.name = manifest["name"]
        self.summary = manifest["summary"]
        self._case_info: dict[Case, dict] = {}
        self.cases = self._cases(manifest["cases"])
        # the probe's smaller interpreter case where the task has one and the probe's process asks for it
        probing = os.environ.get(PROBE_CASES_ENV) == "1" and manifest.get("probe_cases")
        self.interpret_cases = self._cases(manifest["probe_cases" if probing else "interpret_cases"])
        self._last_case: dict[Signature, Case] = {}
        self.requires = manifest.get("requires")  # the compute capability its code needs (common.device_requirement)
        tol = manifest.get("tolerance")
        self.tolerance_overrides = {}
        self._tolerance = (float(tol["rtol"]), float(tol["atol"])) if tol else None
        self.reference_source = (self.folder / manifest["reference"]).read_text()
        self.eager_source = self.wrap(self.reference_source, self.reference_entry)

    reference_entry = ""  # the reference's own callable that the eager baseline wraps: Model, ref_kernel
    # What a submission must define, in words a code model is told when it rewrites one of the
    # format's kernels (its answer is dropped as ``no_launch`` when it defines no ``entry``).
    ENTRY_CONTRACT = ""

    def _cases(self, rows) -> tuple[Case, ...]:
        out = []
        for row in rows:
            c = Case(tuple((k, int(v)) for k, v in row["dims"].items()), row["dtype"])
            self._case_info[c] = row
            out.append(c)
        return tuple(out)

    def info(self, case: Case) -> dict:
        try:
            return self._case_info[case]
        except KeyError:
            raise ValueError(f"{self.name} has no case {case.name}; its cases: "
                             f"{', '.join(c.name for c in (*self.cases, *self.interpret_cases))}") from None

    # ---- the harness's contract --------------------------------------------------------------

    def output_specs(self, case):
        return ()  # the candidate returns its outputs, as both task formats expect

    def input_names(self):
        return ()

    def remember(self, case: Case, inputs) -> tuple[torch.Tensor, ...]:
        inputs = tuple(inputs)
        self._last_case[signature(inputs)] = case
        return inputs

    def case_of(self, inputs) -> Case:
        """The case that last produced inputs of this shape signature in this process."""
        sig = signature(inputs)
        try:
            return self._last_case[sig]
        except KeyError:
            raise ValueError(f"{self.name}: inputs of shapes {[s for s, _ in sig]} were not made by this "
                             "operation's make_inputs in this process, so their case is unknown") from None

    def bytes_moved(self, case):
        # Unknown (a task whose inputs cannot be made on this machine): one byte, so the roofline
        # features stay finite; the forecasters see the op as one they know nothing about.
        return max(1, int(self.info(case).get("bytes") or 0))

    def flops(self, case):
        return 0  # a task file carries no FLOP count

    def parameter_bytes(self, case):
        return int(self.info(case).get("parameter_bytes") or 0)

    def writable_inputs(self, case) -> tuple[int, ...]:
        return tuple(self.info(case).get("writable") or ())

    def tolerance(self, dtype):
        if self._tolerance is not None:
            return self._tolerance
        return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))

    # ---- candidates --------------------------------------------------------------------------

    def wrap(self, submission: str, entry: str | None = None) -> str:
        """Candidate source: the submission verbatim, then a ``launch`` around its entry point.

        The wrapper is self-contained (no import of this project: the harness refuses
        candidates that reach into it); what it needs per case is written into it as a
        table keyed by the inputs' shapes and dtypes.
        """
        return submission.rstrip() + "\n\n\n" + WRAPPER_MARK + "\n" + self.wrapper_body(entry or self.entry)

    WRAPPER = ""  # the format's launch, with {entry} and {table} to fill in

    def wrapper_body(self, entry: str) -> str:
        """The launch written after a submission whose entry point is ``entry``."""
        return self.WRAPPER.format(entry=entry, table=self.wrapper_table())

    def wrapper_table(self, field: str | None = None) -> str:
        """A Python literal: input signature -> what the wrapper needs for that case, the manifest's ``field``
        (default ``TABLE_FIELD``, a repr) of each case that has it."""
        field = field or self.TABLE_FIELD
        rows = {}
        for case in (*self.cases, *self.interpret_cases):
            info = self.info(case)
            if info.get("signature") is not None and info.get(field) is not None:
                key = tuple((tuple(shape), dtype) for shape, dtype in info["signature"])
                rows[key] = info[field]
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in rows.items()) + "}"

    TABLE_FIELD = ""  # the manifest field (a repr) the wrapper table holds per case

    def seed_candidates(self) -> list[Candidate]:
        """The task's reference itself, as the timed baseline (origin ``seed``)."""
        return [Candidate(op=self.name, backend="torch", source=self.eager_source,
                          template=f"{self.name}/reference", origin="seed")]

    def candidate(self, submission: str, origin: str = "import", parent_id: str | None = None) -> Candidate:
        return Candidate(op=self.name, backend=backend_of(submission), source=self.wrap(submission),
                         parent_id=parent_id, origin=origin)

    def imported_candidates(self) -> list[Candidate]:
        """The submissions imported with the task (origin ``import``)."""
        return [self.candidate((self.folder / rel).read_text()) for rel in self.manifest.get("candidates", ())]

    @staticmethod
    def submission_of(source: str) -> str:
        return submission_of(source)
