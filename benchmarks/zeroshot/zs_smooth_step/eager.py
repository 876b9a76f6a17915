import torch
import torch.nn as nn
import triton
import triton.language as tl


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp((x + 1) / 2, 0, 1) ** 2 * (3 - 2 * torch.clamp((x + 1) / 2, 0, 1))
