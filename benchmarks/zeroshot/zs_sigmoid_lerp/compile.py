import torch
import torch.nn as nn
import triton
import triton.language as tl


def _math(a, b, c):
    return a + torch.sigmoid(b) * (c - a)


_compiled = torch.compile(_math)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return _compiled(a, b, c)
