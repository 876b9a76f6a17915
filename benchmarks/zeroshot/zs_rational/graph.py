import torch
import torch.nn as nn
import triton
import triton.language as tl


def _math(x):
    return x / (1 + x * x)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graphs = {}

    def forward(self, x):
        key = tuple(t.shape for t in (x,))
        if key not in self.graphs:
            static = [t.clone() for t in (x,)]
            _math(*static)  # warm-up on the current stream (the capture makes its own)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = _math(*static)
            self.graphs[key] = (graph, static, out)
        graph, static, out = self.graphs[key]
        for s, t in zip(static, (x,)):
            s.copy_(t)
        graph.replay()
        return out.clone()
