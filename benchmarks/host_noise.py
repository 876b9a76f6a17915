"""Host-side noise on a GPU machine (needs a CUDA GPU): is a host-bound call's timed median the host's speed?

Eight samples per setting, 0.5 s apart, each: a pure-Python loop (20,000 additions, on the
host alone), the host time of a host-bound call (60 tiny torch launches, the GPU synced
before and after; median of 20), and the harness's timed median of that call
(``kernelcast.kernels.harness.timing.time_call``). Settings: unpinned, pinned to the last core, pinned
with 100 ms of spinning first (a core kept busy), pinned to another core. If the pure-Python
figure moves with the timed one, the host's speed (a shared or virtual machine) moves the
timing of host-bound calls, and no GPU-side care removes it.

    python benchmarks/host_noise.py
"""

from __future__ import annotations

import os
import time

import torch

from kernelcast.kernels.harness.timing import l2_flush_buffer, time_call


def main() -> None:
    flush = l2_flush_buffer()
    small = [torch.randn(64, 64, device="cuda") for _ in range(4)]

    def host_bound(i):
        a = small[i % 4]
        for _ in range(30):
            a = a * 1.0001 + 0.5

    def python_us():
        t, s = time.perf_counter(), 0
        for k in range(20000):
            s += k
        return (time.perf_counter() - t) * 1e6

    def issue_us():
        torch.cuda.synchronize()
        t = time.perf_counter()
        host_bound(0)
        spent = time.perf_counter() - t
        torch.cuda.synchronize()
        return spent * 1e6

    def spin(seconds):
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            pass

    last = max(os.sched_getaffinity(0))
    everywhere = os.sched_getaffinity(0)
    print("per sample: (pure Python us, host time of the call us, timed median us)")
    for label, cpus, pre in (("unpinned", None, 0.0), (f"pinned {last}", {last}, 0.0),
                             (f"pinned {last} + 100 ms spin", {last}, 0.1), ("pinned 3", {3}, 0.0)):
        if cpus:
            os.sched_setaffinity(0, cpus)
        rows = []
        for _ in range(8):
            time.sleep(0.5)
            if pre:
                spin(pre)
            rows.append((round(python_us()), round(sorted(issue_us() for _ in range(20))[10]),
                         round(time_call(host_bound, flush).runtime_us_median)))
        spread = max(r[2] for r in rows) / min(r[2] for r in rows)
        print(f"{label}: {rows}; timed max/min {spread:.2f}", flush=True)
        os.sched_setaffinity(0, everywhere)
    print("load average", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
