"""What a child notes before any candidate code runs, to hold its process against later (``take``).

  TORCH    the identity of torch's public functions (``torch_fingerprint``): once the candidate has replaced one,
           the reference timed beside it would run the replacement, so nothing is anchored
           (kernelcast.kernels.harness.anchoring);
  STATE    torch's process-wide switches (kernelcast.kernels.harness.state): the reference is timed under these, the
           candidate under its own (kernelcast.kernels.harness.case_timing);
  HARNESS  the identities of what the timer calls (``verify.harness_fingerprint``; {} without verification): each
           timed case's integrity check (kernelcast.kernels.harness.window_checks).
"""

from __future__ import annotations

import torch

from kernelcast.kernels.harness import state, verify

TORCH: dict[str, int] = {}
STATE: dict[str, object] = {}
HARNESS: dict[str, tuple[int, int]] = {}
_REWRAPPED = {"torch.manual_seed"}  # torch._dynamo wraps it when first imported (torch.compile)


def take(verified: bool) -> None:
    """Note all three now: after the static scan, before any candidate code runs (``Job.verify``: ``verified``)."""
    global TORCH, STATE, HARNESS
    TORCH = torch_fingerprint()  # before any candidate code runs (see anchoring._anchored)
    STATE = state.snapshot()  # torch's process-wide switches, as the reference is timed under them
    HARNESS = verify.harness_fingerprint() if verified else {}


def torch_fingerprint() -> dict[str, int]:
    """The identity of every public function of torch, torch.nn.functional and torch.Tensor.

    Taken before a candidate's code runs and compared before the reference is timed in the
    same process: a candidate that replaced one of them could slow the reference it is
    measured against."""
    import torch.nn.functional as F

    found = {}
    for prefix, holder in (("torch.", torch), ("F.", F), ("Tensor.", torch.Tensor)):
        for name in dir(holder):
            if not name.startswith("_") and prefix + name not in _REWRAPPED:
                value = getattr(holder, name, None)
                if callable(value):
                    found[prefix + name] = id(value)
    return found
