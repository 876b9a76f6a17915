import torch
import torch.nn as nn
import triton
import triton.language as tl


def _math(a, b):
    return torch.sqrt(a * a + b * b)


_compiled = torch.compile(_math)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return _compiled(a, b)
