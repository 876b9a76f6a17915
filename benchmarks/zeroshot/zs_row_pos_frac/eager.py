import torch
import torch.nn as nn
import triton
import triton.language as tl


class ModelNew(nn.Module):
    def forward(self, x):
        return (x > 0).float().mean(dim=1)
