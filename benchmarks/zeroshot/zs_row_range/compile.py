import torch
import torch.nn as nn
import triton
import triton.language as tl


def _math(x):
    return x.amax(dim=1) - x.amin(dim=1)


_compiled = torch.compile(_math)


class ModelNew(nn.Module):
    def forward(self, x):
        return _compiled(x)
