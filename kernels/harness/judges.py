"""The worker's judges: processes started from the fork server with the worker, before any child, that never load
candidate code (kernelcast.kernels.harness.judge), asked in JSON to judge a child's recorded outputs (``Judges``).
"""

from __future__ import annotations

import json
import queue
import threading

from kernelcast.kernels.harness import channel
from kernelcast.kernels.harness.judge import judge_main


class Judge:
    """The judge's process (``judge.judge_main``), started from the fork server with the worker, before any child: it
    never loads candidate code. One question at a time; started again if it died."""

    def __init__(self, ctx):
        self._ctx, self._proc, self._conn = ctx, None, None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the judge's process if it is not running (before any candidate: no child's doing can stop it
        from starting, as a fork server that a child broke would)."""
        if self._proc is None or not self._proc.is_alive():
            self._conn, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=judge_main, args=(child,), daemon=True, name="kernelcast-judge")
            self._proc.start()
            child.close()

    def ask(self, request: dict, timeout_s: float = 1800.0) -> dict:
        with self._lock:
            self.start()
            # JSON both ways, as with a child: whatever reaches this socket is never unpickled on either side.
            self._conn.send_bytes(json.dumps(request).encode())
            if not self._conn.poll(timeout_s):
                self._proc.kill()
                raise RuntimeError(f"no answer from the judge within {timeout_s:.0f} s")
            try:
                answer = json.loads(self._conn.recv_bytes(channel.MAX_MESSAGE_BYTES))
            except (EOFError, OSError, ValueError) as exc:
                self._proc.kill()
                raise RuntimeError(f"the judge's answer could not be read ({exc}; exit {self._proc.exitcode})") \
                    from None
        if not isinstance(answer, dict) or set(answer) - {"problem", "records", "trivial", "error"} \
                or not isinstance(answer.get("problem"), str):
            raise RuntimeError("the judge's answer is not of its schema")
        if answer.get("error"):
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.is_alive():
                try:
                    self._conn.send_bytes(b"null")
                except OSError:
                    pass
                self._proc.join(5)
                if self._proc.is_alive():
                    self._proc.kill()


class Judges:
    """A few judges, each a process of its own, answering children's requests as they come: one judge answered one
    candidate at a time, and judging (reading a child's records, recomputing the reference) took 2-6 s a candidate
    against a child's 0.6 s of the device alone (H100, template kernels): one judge held every child's verdict up."""

    def __init__(self, ctx, count: int):
        self._all = [Judge(ctx) for _ in range(max(1, count))]
        self._free: queue.Queue[Judge] = queue.Queue()
        for j in self._all:
            self._free.put(j)

    def start(self) -> None:
        for j in self._all:
            j.start()

    def ask(self, request: dict) -> dict:
        j = self._free.get()
        try:
            return j.ask(request)
        finally:
            self._free.put(j)

    def close(self) -> None:
        for j in self._all:
            j.close()
