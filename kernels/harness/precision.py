"""Precision as a fact of the verdict: a candidate's error against a float64 reference, and its class.

A format's tolerance (KernelBench's 1e-2) lets a float32 task be answered in TF32, float16 or
bfloat16 arithmetic, which is cheaper, not faster. Every correct candidate's outputs on its
first checked inputs are compared with the operation's reference computed in float64 (TF32
off), as ``||out - ref64|| / ||ref64||`` over its floating-point outputs, and so is the
reference's own float32 result. The error's size says which arithmetic produced it (the
classes below, after the unit roundoff of each format and what long reductions add to it);
a candidate is flagged ``lower`` when its class is below the reference's and its error more
than ``RATIO`` times the reference's, so an ill-conditioned task that loses digits in float32
too is not flagged for it. ``--precision strict`` makes the flag a failed check.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# Upper bounds of the normwise relative error of each arithmetic class, best first.
CLASSES = (("float64", 1e-12), ("float32", 3e-5), ("tf32/fp16", 1e-3), ("bf16", 2e-2))
LOWEST = "lower than bf16"
RATIO = 8.0
MODES = ("tolerance", "strict")


def class_of(error: float) -> str:
    for name, bound in CLASSES:
        if error <= bound:
            return name
    return LOWEST


def _rank(name: str) -> int:
    names = [c for c, _ in CLASSES] + [LOWEST]
    return names.index(name)


def relative_error(got, expected) -> float | None:
    """``||got - expected|| / ||expected||`` over the floating-point tensors of both, in float64; None if none."""
    num = den = 0.0
    seen = False
    for g, e in zip(got, expected):
        if not (isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor)) or not e.dtype.is_floating_point:
            continue
        if g.shape != e.shape:
            return None
        diff = g.detach().double() - e.detach().double()
        num += float(torch.sum(diff * diff))
        den += float(torch.sum(e.detach().double() ** 2))
        seen = True
    if not seen:
        return None
    return (num ** 0.5) / (den ** 0.5) if den > 0 else num ** 0.5


@contextmanager
def full_float32():
    """TF32 off for matrix products and convolutions while the high-precision reference runs."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def errors(op, case, inputs, got) -> dict:
    """The candidate's and the reference's errors against the float64 reference, and the verdict on them."""
    try:
        with torch.no_grad(), full_float32():
            exact = op.reference_float64(case, *inputs)
        own = op.reference(*inputs)
    except Exception as exc:  # noqa: BLE001 - a reference that cannot run in float64: not measured, said why
        return {"precision": f"not measured: the reference fails in float64 ({type(exc).__name__})"}
    error, reference_error = relative_error(got, exact), relative_error(own, exact)
    if error is None or reference_error is None:
        return {"precision": "not measured: no floating-point outputs"}
    mine, theirs = class_of(error), class_of(reference_error)
    lower = _rank(mine) > _rank(theirs) and error > RATIO * max(reference_error, 1e-7)
    return {"error_rel": error, "reference_error_rel": reference_error,
            "precision": (f"lower: {mine} ({error:.1e}) where the reference is {theirs} ({reference_error:.1e})"
                          if lower else mine)}


def fits(inputs, free_bytes: int) -> bool:
    """Whether float64 copies of the inputs and the outputs fit beside what is there (about 4x the inputs)."""
    size = sum(t.numel() * 8 for t in inputs if isinstance(t, torch.Tensor))
    return 4 * size < free_bytes
