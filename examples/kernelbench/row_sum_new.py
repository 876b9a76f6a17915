import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    # One program per row: a BLOCK-wide fp32 accumulator swept along the row, reduced once at the end.
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row.to(tl.int64) * n + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + row, tl.sum(acc, axis=0) * scale)


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        row_sum_kernel[(x.shape[0],)](x, y, x.shape[1], self.scale, BLOCK=2048, num_warps=8)
        return y
