"""The null candidate: an op's reference code submitted as a candidate, to check the harness on any task.

Measured against the reference it must come out at 1.00x, within the timing noise: both
are the same code, so any other speedup is the harness's doing (a limit, a memory
budget, a child disturbed by another, inputs that differ). It passes every check a
candidate must pass, and it differs from the reference only in a comment (so it has an
id of its own and is measured as a candidate, not recognised as the reference).

Imported tasks submit the reference in the format's own terms (``ModelNew = Model``,
``custom_kernel = ref_kernel``); built-in ops submit their eager baseline, which is the
one candidate allowed to call the torch function it computes.
"""

from __future__ import annotations

from kernelcast.kernels.records import Candidate

NULL_MARK = "# kernelcast null candidate: the reference's own code, measured as a candidate (expect 1.00x)"


def null_candidate(op) -> Candidate:
    """The reference of ``op`` as a candidate (origin ``import``)."""
    submission = op.null_submission()
    if submission is not None:
        return op.candidate(submission.rstrip() + "\n\n" + NULL_MARK + "\n")
    return Candidate(op=op.name, backend="torch", source=_eager_null(op), template=f"{op.name}/null",
                     origin="import")


def _eager_null(op) -> str:
    return op.eager_source.rstrip() + "\n\n" + NULL_MARK + "\n"


def is_null(op, candidate: Candidate) -> bool:
    """Whether ``candidate`` is the null candidate of a built-in ``op`` (its eager baseline, exempt as that is)."""
    return candidate.source == _eager_null(op)
