"""The GPU lock's gate: a child waiting to hold the device alone goes before children arriving to share it.

The GPU lock (an flock; kernelcast.kernels.harness.under_lock.DeviceLock) admits a shared hold whenever nobody holds
it alone, and Linux's flock favours nobody: children finishing their compile one after another each took a shared
hold for their checks while a checked child waited to be timed, and the device stayed shared for as long as
arrivals kept coming. Measured on an H100 (2026-12-06, 128 template candidates, 12 children at once): the lock was
held shared for 58 s of 126 s and alone for 59 s, and a child waited a median 0.39 s between its checks and its
timing.

Every hold passes a second flock on the way in, the gate (``gate_of``): held shared by a hold that shares, alone by one
that wants the device alone, and let go as soon as the lock is taken. While a child waits for the device alone it holds
the gate, so no new shared hold begins; the shared holds already in finish their checks, the child is timed, and the
children that arrived meanwhile then pass the gate together, their checks beside each other's. Nobody waits at the
gate while holding the lock (``DeviceLock.exclusive`` lets its shared hold go first), so the two never deadlock; a
process that dies lets both go with it.
"""

from __future__ import annotations

import fcntl


def gate_of(lock_path: str) -> str:
    """The gate beside the GPU lock at ``lock_path`` (created by the worker with the lock)."""
    return lock_path + ".gate"


def create(lock_path: str, with_gate: bool = True) -> None:
    """Create the lock and its gate if missing (the worker's part: children may not create files there); without
    ``with_gate``, no gate: every hold takes the lock directly."""
    for path in (lock_path, gate_of(lock_path)) if with_gate else (lock_path,):
        open(path, "a").close()


def take(lock_file, exclusive: bool, lock_path: str) -> None:
    """Take the GPU lock on the open ``lock_file`` (of ``lock_path``) through its gate; blocks until held. Without a gate
    file (a lock made by an older worker) the lock is taken directly."""
    try:
        gate = open(gate_of(lock_path), "r")
    except OSError:
        gate = None
    try:
        if gate is not None:
            fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(lock_file, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    finally:
        if gate is not None:
            gate.close()  # lets the gate go


def holds(lock_path: str, exclusive: bool = False):
    """A context: the GPU lock at ``lock_path`` held (shared unless ``exclusive``) through its gate, let go after."""
    return _Held(lock_path, exclusive)


class _Held:
    def __init__(self, lock_path: str, exclusive: bool):
        self.lock_path, self.exclusive, self.file = lock_path, exclusive, None

    def __enter__(self):
        self.file = open(self.lock_path, "r")
        take(self.file, self.exclusive, self.lock_path)
        return self.file

    def __exit__(self, *exc) -> None:
        self.file.close()
