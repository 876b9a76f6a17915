import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)
        s += tl.abs(x)
    stat = tl.sum(s, axis=0) / n
    tl.store(out_ptr + row, stat)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        _kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=32, num_warps=1)
        return out
