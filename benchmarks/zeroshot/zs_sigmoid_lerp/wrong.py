import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _kernel(a_ptr, b_ptr, c_ptr, y_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, a + b * (c - a), mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        a, b, c, = a.contiguous(), b.contiguous(), c.contiguous(),
        y = torch.empty_like(a)
        numel = y.numel()
        _kernel[(triton.cdiv(numel, 1024),)](a, b, c, y, numel, BLOCK=1024, num_warps=4)
        return y
