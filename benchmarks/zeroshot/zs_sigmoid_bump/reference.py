import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise: torch.sigmoid(x) * (1 - torch.sigmoid(x))"""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sigmoid(x) * (1 - torch.sigmoid(x))


M = 256
N = 1024


def get_inputs():
    return [torch.randn(M, N)]


def get_init_inputs():
    return []
