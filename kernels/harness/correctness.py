"""Loading a candidate's source, calling it by the one convention, judging its outputs, and naming a failure.

These are plain functions: the runner process calls them inside its sandbox, and the
template tests call them directly under Triton's interpreter.
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile
import traceback
from typing import Any, Callable, Mapping

import torch

from kernelcast.kernels.harness.budget import is_out_of_memory
from kernelcast.kernels.harness.sandbox import denied_write
from kernelcast.kernels.ops import Case, Operation


class CandidateLoadError(Exception):
    """The source does not parse, fails to import, or defines no ``launch``."""


def load_launch(source: str, directory: str | None = None, module_name: str = "candidate") -> Callable[..., Any]:
    """Execute candidate source as a fresh module and return its ``launch`` function.

    The source is written to a real file (in ``directory``, or a new temporary one)
    because Triton's JIT reads a kernel's text back from its file.
    """
    try:
        compile(source, f"<{module_name}>", "exec")
    except SyntaxError as exc:
        raise CandidateLoadError(f"syntax error at line {exc.lineno}: {exc.msg}") from exc
    directory = directory or tempfile.mkdtemp(prefix="kernelcast-candidate-")
    path = os.path.join(directory, f"{module_name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CandidateLoadError(f"module failed to import: {type(exc).__name__}: {exc}{denied_write(exc)}") from exc
    launch = getattr(module, "launch", None)
    if not callable(launch):
        raise CandidateLoadError("source defines no callable 'launch(*inputs, *outputs, **params)'")
    return launch


GUARD_ELEMENTS = 4096  # poisoned elements before and after every output, to catch stray writes


def _poison(t: torch.Tensor) -> None:
    t.fill_(float("nan") if t.dtype.is_floating_point else torch.iinfo(t.dtype).max)


def _still_poisoned(t: torch.Tensor) -> bool:
    if t.dtype.is_floating_point:
        return bool(torch.isnan(t.float()).all())
    return bool((t == torch.iinfo(t.dtype).max).all())


def poisoned_outputs(op: Operation, case: Case, device) -> tuple[torch.Tensor, ...]:
    """Output tensors filled with NaN (or an extreme integer) so unwritten elements show.

    Each output is a view into a larger poisoned buffer; the guard zones around it
    reveal a kernel that writes outside its output (see ``stray_writes``).
    """
    outs = []
    for shape, dtype in op.output_specs(case):
        numel = math.prod(shape)
        buf = torch.empty(numel + 2 * GUARD_ELEMENTS, dtype=dtype, device=device)
        _poison(buf)
        outs.append(buf[GUARD_ELEMENTS:GUARD_ELEMENTS + numel].view(shape))
    return tuple(outs)


def stray_writes(outputs) -> str | None:
    """None when the guard zones around every harness output are untouched, else which were hit."""
    for i, out in enumerate(outputs):
        base = out._base
        if base is None or base.numel() != out.numel() + 2 * GUARD_ELEMENTS:
            continue
        before, after = base[:GUARD_ELEMENTS], base[GUARD_ELEMENTS + out.numel():]
        for where, zone in (("before", before), ("after", after)):
            if not _still_poisoned(zone):
                return f"wrote outside output {i}: the guard zone {where} it was overwritten (out-of-bounds write)"
    return None


def call_candidate(launch: Callable[..., Any], inputs, outputs, params: Mapping[str, Any]):
    """Call ``launch`` and return the outputs it produced (written in place or returned)."""
    returned = launch(*inputs, *outputs, **params)
    if returned is None:
        return tuple(outputs)
    if isinstance(returned, torch.Tensor):
        returned = (returned,)
    return tuple(returned)


def check_once(op: Operation, case: Case, launch, params, seed: int, device) -> str | None:
    """Run the candidate once on fresh seeded inputs and compare with the reference."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    inputs = op.make_inputs(case, gen, device)
    outputs = poisoned_outputs(op, case, device)
    got = call_candidate(launch, inputs, outputs, params)
    if device != "cpu":
        torch.cuda.synchronize()
    stray = stray_writes(outputs)
    if stray:
        return f"case {case.name}: {stray}"
    return op.check(case, inputs, got)


def is_compile_failure(exc: BaseException) -> bool:
    """Triton raises compile failures from its compiler and backends; anything else ran and failed."""
    if type(exc).__name__ in ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure"):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return any("/triton/compiler/" in f.filename or "/triton/backends/" in f.filename for f in frames)


def describe(exc: BaseException) -> str:
    """A failure as a verdict names it: its type and message, a write the sandbox refused, at most 2,000 characters."""
    text = f"{type(exc).__name__}: {exc}".strip() + denied_write(exc)
    return text if len(text) <= 2000 else text[:2000] + " ..."


def is_oom(exc: BaseException) -> bool:
    """Whether a failure is the device (or the interpreter's host) running out of memory."""
    return isinstance(exc, torch.OutOfMemoryError) or is_out_of_memory(describe(exc))
