import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)
    value = tl.row_magic(x / (tl.sum(tl.abs(x), axis=0) / n + 1))
    tl.store(out_ptr + row * n + offs, value, mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=8)
        return out
