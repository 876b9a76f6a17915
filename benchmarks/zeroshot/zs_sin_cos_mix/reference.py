import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise: torch.sin(x) * torch.cos(2 * x)"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sin(x) * torch.cos(2 * x)


M = 4096
N = 4096


def get_inputs():
    return [torch.randn(M, N)]


def get_init_inputs():
    return []
