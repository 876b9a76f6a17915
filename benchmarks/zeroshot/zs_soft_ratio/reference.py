import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise: a / (torch.abs(b) + 2)"""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a / (torch.abs(b) + 2)


M = 256
N = 1024


def get_inputs():
    return [torch.randn(M, N), torch.randn(M, N)]


def get_init_inputs():
    return []
