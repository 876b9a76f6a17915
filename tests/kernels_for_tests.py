"""Hand-written candidate sources for the harness tests: good ones and every kind of bad one."""

from kernelcast.kernels.harness.faults import get_fault
from kernelcast.kernels.records import Candidate

SOURCES = {
    "malformed": "def launch(x, out:\n    pass\n",
    "no_launch": "import torch\n\ndef run(x, out):\n    pass\n",
    "raises": "def launch(x, out):\n    raise RuntimeError('kernel exploded on purpose')\n",
    "segfault": "import ctypes\n\ndef launch(x, out):\n    ctypes.string_at(0)\n",
    "hangs": "def launch(x, out):\n    while True:\n        pass\n",
    "wrong_values": "def launch(x, out):\n    out.copy_(x * 2)\n",
    "nans": "def launch(x, out):\n    out.fill_(float('nan'))\n",
    "out_of_bounds": '''
import torch
import triton
import triton.language as tl


@triton.jit
def _spill(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + n + offs, tl.load(x_ptr + offs, mask=offs < n, other=0.0))


def launch(x, out):
    e = (x.float() - x.float().amax(dim=-1, keepdim=True)).exp()  # right values, then a stray write
    out.copy_((e / e.sum(dim=-1, keepdim=True)).to(x.dtype))
    _spill[(1,)](x, out, out.numel(), BLOCK=64)
''',
}


SOURCES["illegal_address"] = get_fault("illegal_address").source  # the fault catalogue's, one copy
SOURCES["gpu_hang"] = get_fault("gpu_infinite_loop").source


def candidate(kind: str, op: str = "softmax") -> Candidate:
    return Candidate(op=op, backend="triton", source=SOURCES[kind], origin="llm")
