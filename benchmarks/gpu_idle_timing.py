"""Does a GPU left idle time slower (clocks not yet up)? (needs a CUDA GPU)

A GPU-bound call (softmax over 4096 x 4096 fp32, about 64 us) and a host-bound one (60 tiny
launches) timed by ``kernelcast.kernels.harness.timing.time_call`` four times after the GPU sat idle 0, 1
and 3 s, with 0, 10, 50 and 200 ms of GPU work first. The spread (max/min of the four medians)
says whether idling or warming moves a timed median.

    python benchmarks/gpu_idle_timing.py
"""

from __future__ import annotations

import time

import torch

from kernelcast.kernels.harness.timing import l2_flush_buffer, time_call


def main() -> None:
    flush = l2_flush_buffer()
    x = torch.randn(4096, 4096, device="cuda")
    small = [torch.randn(64, 64, device="cuda") for _ in range(4)]

    def gpu_bound(i):
        torch.softmax(x, dim=1)

    def host_bound(i):
        a = small[i % 4]
        for _ in range(30):
            a = a * 1.0001 + 0.5

    def warm(seconds):
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            flush.zero_()
            torch.cuda.synchronize()

    for name, fn in (("gpu_bound", gpu_bound), ("host_bound", host_bound)):
        for idle in (0.0, 1.0, 3.0):
            for warmup in (0.0, 0.01, 0.05, 0.2):
                medians = []
                for _ in range(4):
                    time.sleep(idle)
                    if warmup:
                        warm(warmup)
                    medians.append(time_call(fn, flush).runtime_us_median)
                print(f"{name:10s} idle {idle:3.1f}s warm {warmup * 1e3:5.0f}ms: medians "
                      f"{[round(m, 1) for m in medians]} spread {max(medians) / min(medians):.3f}", flush=True)


if __name__ == "__main__":
    main()
