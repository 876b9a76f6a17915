import torch
import torch.nn as nn
import triton
import triton.language as tl


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.sign(x) * torch.log1p(torch.abs(x))
