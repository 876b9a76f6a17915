"""The zero-shot set: KernelBench-format problems whose operation no training pool holds, each with kernels of
known character, written out as files.

    python benchmarks/zeroshot_tasks.py [--out benchmarks/zeroshot]

Each problem is an expression no pool's reference computes (an elementwise map of one, two or three tensors,
or a row-wise reduction or rescaling), at one of a few sizes. Its kernels, each named for its character:

- ``triton_b1024``: a flat Triton kernel, BLOCK 1024, 4 warps (row problems: one program per row, the whole
  row in one block);
- ``triton_b32``: the same kernel with BLOCK 32 and one warp (row problems: one row per program, a loop of
  32-wide chunks on one warp);
- ``triton_rowloop``: one program per row sweeping it in chunks of 64 on one warp (elementwise problems only);
- ``eager``: the reference's own math, resubmitted;
- ``compile``: the reference's math under ``torch.compile`` (every second problem);
- ``graph``: the reference's math captured once in a CUDA graph and replayed (every third problem);
- ``wrong``: the fast Triton kernel with wrong math (runs, fails the correctness check);
- ``missing``: the fast Triton kernel calling a Triton function that does not exist (does not compile).

The sealing rule, fixed before anything was measured: the third of the problems (rounded up) whose names have the
smallest SHA-256 (as hexadecimal text) are *sealed*: kept out of all development, scored once, last.
``manifest.json`` lists every problem with its sizes, kernels, characters and sealed flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

# name, inputs, torch expression, Triton expression, wrong Triton expression (x, a, b, c: tensors or loaded blocks)
ELEMENTWISE = (
    ("gauss_bump", "x", "torch.exp(-x * x)", "tl.exp(-x * x)", "tl.exp(-x)"),
    ("sin_cos_mix", "x", "torch.sin(x) * torch.cos(2 * x)", "tl.sin(x) * tl.cos(2 * x)", "tl.sin(x) * tl.cos(x)"),
    ("signed_log", "x", "torch.sign(x) * torch.log1p(torch.abs(x))",
     "tl.where(x >= 0, 1.0, -1.0) * tl.log(1 + tl.abs(x))", "tl.log(1 + tl.abs(x))"),
    ("rational", "x", "x / (1 + x * x)", "x / (1 + x * x)", "x / (1 + tl.abs(x))"),
    ("cubic_clamp", "x", "torch.clamp(x, -1, 1) ** 3",
     "tl.minimum(tl.maximum(x, -1.0), 1.0) * tl.minimum(tl.maximum(x, -1.0), 1.0) * tl.minimum(tl.maximum(x, -1.0), 1.0)",
     "tl.minimum(tl.maximum(x, -1.0), 1.0)"),
    ("soft_sqrt", "x", "torch.sqrt(torch.abs(x) + 1) - 1", "tl.sqrt(tl.abs(x) + 1) - 1", "tl.sqrt(tl.abs(x))"),
    ("mish_shift", "x", "x * torch.tanh(torch.log1p(torch.exp(x))) + 0.5 * x",
     "x * (2 * tl.sigmoid(2 * tl.log(1 + tl.exp(x))) - 1) + 0.5 * x",
     "x * (2 * tl.sigmoid(2 * tl.log(1 + tl.exp(x))) - 1)"),
    ("sigmoid_bump", "x", "torch.sigmoid(x) * (1 - torch.sigmoid(x))", "tl.sigmoid(x) * (1 - tl.sigmoid(x))",
     "tl.sigmoid(x) * tl.sigmoid(x)"),
    ("abs_cos_plus", "x", "torch.abs(torch.cos(3 * x)) + x", "tl.abs(tl.cos(3 * x)) + x", "tl.abs(tl.cos(3 * x))"),
    ("exp_decay", "x", "x * torch.exp(-torch.abs(x))", "x * tl.exp(-tl.abs(x))", "x * tl.exp(-x * x)"),
    ("square_plus", "x", "(x + torch.sqrt(x * x + 4)) / 2", "(x + tl.sqrt(x * x + 4)) / 2", "x + tl.sqrt(x * x + 4)"),
    ("hinge_sq", "x", "torch.relu(1 - x) ** 2", "tl.maximum(1 - x, 0.0) * tl.maximum(1 - x, 0.0)",
     "tl.maximum(1 - x, 0.0)"),
    ("log_cosh", "x", "torch.log(torch.cosh(x))", "tl.log((tl.exp(x) + tl.exp(-x)) * 0.5)",
     "tl.log(tl.exp(x) + tl.exp(-x))"),
    ("smooth_step", "x", "torch.clamp((x + 1) / 2, 0, 1) ** 2 * (3 - 2 * torch.clamp((x + 1) / 2, 0, 1))",
     "tl.minimum(tl.maximum((x + 1) / 2, 0.0), 1.0) * tl.minimum(tl.maximum((x + 1) / 2, 0.0), 1.0) "
     "* (3 - 2 * tl.minimum(tl.maximum((x + 1) / 2, 0.0), 1.0))",
     "tl.minimum(tl.maximum((x + 1) / 2, 0.0), 1.0)"),
    ("fma3", "a,b,c", "a * b + c", "a * b + c", "a * b"),
    ("sq_diff", "a,b", "(a - b) ** 2", "(a - b) * (a - b)", "a - b"),
    ("gated_tanh", "a,b", "torch.tanh(a) * torch.sigmoid(b)", "(2 * tl.sigmoid(2 * a) - 1) * tl.sigmoid(b)",
     "(2 * tl.sigmoid(2 * a) - 1) * b"),
    ("max_min_mix", "a,b", "torch.maximum(a, b) - 0.5 * torch.minimum(a, b)",
     "tl.maximum(a, b) - 0.5 * tl.minimum(a, b)", "tl.maximum(a, b) - tl.minimum(a, b)"),
    ("sigmoid_lerp", "a,b,c", "a + torch.sigmoid(b) * (c - a)", "a + tl.sigmoid(b) * (c - a)", "a + b * (c - a)"),
    ("soft_ratio", "a,b", "a / (torch.abs(b) + 2)", "a / (tl.abs(b) + 2)", "a / (b + 2)"),
    ("hypot2", "a,b", "torch.sqrt(a * a + b * b)", "tl.sqrt(a * a + b * b)", "a * a + b * b"),
    ("quad_blend", "a,b", "a * a - 0.25 * a * b + b", "a * a - 0.25 * a * b + b", "a * a - 0.25 * a * b"),
)
# name, output ("row": one value per row, "full": the input's shape), torch forward body, Triton row body (x the
# row block, masked with ``other``; writes ``out`` per row or ``y`` per element), its wrong twin, other
ROWWISE = (
    ("row_range", "row", "x.amax(dim=1) - x.amin(dim=1)",
     "tl.max(tl.where(m, x, -float('inf')), axis=0) - tl.min(tl.where(m, x, float('inf')), axis=0)",
     "tl.max(tl.where(m, x, -float('inf')), axis=0)"),
    ("row_absmean", "row", "torch.abs(x).mean(dim=1)", "tl.sum(tl.abs(x), axis=0) / n",
     "tl.sum(x, axis=0) / n"),
    ("row_pos_frac", "row", "(x > 0).float().mean(dim=1)", "tl.sum(tl.where(m & (x > 0), 1.0, 0.0), axis=0) / n",
     "tl.sum(tl.where(m & (x >= 0), 1.0, 0.0), axis=0)"),
    ("row_cubesum", "row", "(x * x * x).sum(dim=1)", "tl.sum(x * x * x, axis=0)", "tl.sum(x * x, axis=0)"),
    ("row_softplus_sum", "row", "torch.log1p(torch.exp(x)).sum(dim=1)",
     "tl.sum(tl.where(m, tl.log(1 + tl.exp(x)), 0.0), axis=0)", "tl.sum(tl.where(m, tl.exp(x), 0.0), axis=0)"),
    ("row_sin_sum", "row", "torch.sin(x).sum(dim=1)", "tl.sum(tl.sin(x), axis=0)", "tl.sum(tl.cos(x), axis=0)"),
    ("row_center", "full", "x - x.mean(dim=1, keepdim=True)", "x - tl.sum(x, axis=0) / n", "x - tl.sum(x, axis=0)"),
    ("row_peak_gap", "full", "x.amax(dim=1, keepdim=True) - x",
     "tl.max(tl.where(m, x, -float('inf')), axis=0) - x", "tl.max(tl.where(m, x, -float('inf')), axis=0) + x"),
    ("row_abs_scale", "full", "x / (torch.abs(x).mean(dim=1, keepdim=True) + 1)",
     "x / (tl.sum(tl.abs(x), axis=0) / n + 1)", "x / (tl.sum(tl.abs(x), axis=0) + 1)"),
    ("row_exp_shift", "full", "torch.exp(x - x.amax(dim=1, keepdim=True))",
     "tl.exp(x - tl.max(tl.where(m, x, -float('inf')), axis=0))", "tl.exp(x)"),
)
ELEMENTWISE_SIZES = ((8192, 4096), (4096, 4096), (1024, 1024), (256, 1024))
ROW_SIZES = ((4096, 4096), (16384, 1024), (2048, 8192), (65536, 256))


def sealed_names(names) -> set[str]:
    """The fixed rule: the ceil(n / 3) names with the smallest SHA-256 hexadecimal digest."""
    names = sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    return set(names[:-(-len(names) // 3)])


def _reference(doc: str, inputs: list[str], body: str, params: str, sizes: tuple[int, int]) -> str:
    m, n = sizes
    makes = ", ".join(f"torch.randn(M, N)" for _ in inputs)
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """{doc}"""

    def __init__(self):
        super().__init__()

    def forward(self, {", ".join(inputs)}):
        return {body}


M = {m}
N = {n}


def get_inputs():
    return [{makes}]


def get_init_inputs():
    return []
'''


_HEAD = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"


def _eager(inputs, body, wrap: str = "") -> str:
    args = ", ".join(inputs)
    if wrap == "compile":
        return (_HEAD + f"def _math({args}):\n    return {body}\n\n\n_compiled = torch.compile(_math)\n\n\n"
                f"class ModelNew(nn.Module):\n    def forward(self, {args}):\n        return _compiled({args})\n")
    if wrap == "graph":
        copies = "\n".join(f"            self.static[{i}].copy_({v})" for i, v in enumerate(inputs))
        return (_HEAD + f"def _math({args}):\n    return {body}\n\n\n"
                "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.graphs = {}\n\n"
                f"    def forward(self, {args}):\n        key = tuple(t.shape for t in ({args},))\n"
                "        if key not in self.graphs:\n"
                f"            static = [t.clone() for t in ({args},)]\n"
                "            _math(*static)  # warm-up on the current stream (the capture makes its own)\n"
                "            graph = torch.cuda.CUDAGraph()\n            with torch.cuda.graph(graph):\n"
                "                out = _math(*static)\n            self.graphs[key] = (graph, static, out)\n"
                "        graph, static, out = self.graphs[key]\n"
                f"        for s, t in zip(static, ({args},)):\n            s.copy_(t)\n"
                "        graph.replay()\n        return out.clone()\n")
    return _HEAD + f"class ModelNew(nn.Module):\n    def forward(self, {args}):\n        return {body}\n"


def _flat_triton(inputs, expr, block: int, warps: int) -> str:
    ptrs = ", ".join(f"{v}_ptr" for v in inputs)
    loads = "\n".join(f"    {v} = tl.load({v}_ptr + offs, mask=mask)" for v in inputs)
    args = ", ".join(inputs)
    conts = ", ".join(f"{v}.contiguous()" for v in inputs)
    return (_HEAD + f"@triton.jit\ndef _kernel({ptrs}, y_ptr, numel, BLOCK: tl.constexpr):\n"
            "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask = offs < numel\n"
            f"{loads}\n    tl.store(y_ptr + offs, {expr}, mask=mask)\n\n\n"
            f"class ModelNew(nn.Module):\n    def forward(self, {args}):\n        {args}, = {conts},\n"
            f"        y = torch.empty_like({inputs[0]})\n        numel = y.numel()\n"
            f"        _kernel[(triton.cdiv(numel, {block}),)]({args}, y, numel, BLOCK={block}, num_warps={warps})\n"
            "        return y\n")


def _rowloop_triton(inputs, expr) -> str:
    ptrs = ", ".join(f"{v}_ptr" for v in inputs)
    loads = "\n".join(f"        {v} = tl.load({v}_ptr + base + offs, mask=mask)" for v in inputs)
    args = ", ".join(inputs)
    conts = ", ".join(f"{v}.contiguous()" for v in inputs)
    return (_HEAD + f"@triton.jit\ndef _kernel({ptrs}, y_ptr, n, BLOCK: tl.constexpr):\n"
            "    base = tl.program_id(0).to(tl.int64) * n\n    for start in range(0, n, BLOCK):\n"
            "        offs = start + tl.arange(0, BLOCK)\n        mask = offs < n\n"
            f"{loads}\n        tl.store(y_ptr + base + offs, {expr}, mask=mask)\n\n\n"
            f"class ModelNew(nn.Module):\n    def forward(self, {args}):\n        {args}, = {conts},\n"
            f"        y = torch.empty_like({inputs[0]})\n"
            f"        _kernel[({inputs[0]}.shape[0],)]({args}, y, {inputs[0]}.shape[1], BLOCK=64, num_warps=1)\n"
            "        return y\n")


def _row_triton(out: str, expr: str, warps: int) -> str:
    """One program per row, the whole row in one block (the next power of two of its length) on ``warps`` warps."""
    store = ("    tl.store(out_ptr + row, value)\n" if out == "row"
             else "    tl.store(out_ptr + row * n + offs, value, mask=m)\n")
    return (_HEAD + "@triton.jit\ndef _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
            "    row = tl.program_id(0).to(tl.int64)\n    offs = tl.arange(0, BLOCK)\n    m = offs < n\n"
            "    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)\n"
            f"    value = {expr}\n{store}\n\n"
            "class ModelNew(nn.Module):\n    def forward(self, x):\n        x = x.contiguous()\n"
            + ("        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)\n" if out == "row"
               else "        out = torch.empty_like(x)\n")
            + f"        _kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), "
              f"num_warps={warps})\n        return out\n")


def _row_chunked(name: str, out: str) -> str:
    """A one-warp row kernel that sweeps the row in chunks of 32 (two sweeps where the output is the row's shape):
    the naive loop. Its math is spelled per problem (chunked reductions need their own accumulators)."""
    acc = {
        "row_range": ("hi = tl.full([BLOCK], -float('inf'), tl.float32)\n    lo = tl.full([BLOCK], float('inf'), tl.float32)",
                      "hi = tl.maximum(hi, tl.where(m, x, -float('inf')))\n        lo = tl.minimum(lo, tl.where(m, x, float('inf')))",
                      "tl.max(hi, axis=0) - tl.min(lo, axis=0)"),
        "row_absmean": ("s = tl.zeros([BLOCK], tl.float32)", "s += tl.abs(x)", "tl.sum(s, axis=0) / n"),
        "row_pos_frac": ("s = tl.zeros([BLOCK], tl.float32)", "s += tl.where(m & (x > 0), 1.0, 0.0)",
                         "tl.sum(s, axis=0) / n"),
        "row_cubesum": ("s = tl.zeros([BLOCK], tl.float32)", "s += x * x * x", "tl.sum(s, axis=0)"),
        "row_softplus_sum": ("s = tl.zeros([BLOCK], tl.float32)", "s += tl.where(m, tl.log(1 + tl.exp(x)), 0.0)",
                             "tl.sum(s, axis=0)"),
        "row_sin_sum": ("s = tl.zeros([BLOCK], tl.float32)", "s += tl.sin(x)", "tl.sum(s, axis=0)"),
        "row_center": ("s = tl.zeros([BLOCK], tl.float32)", "s += x", "tl.sum(s, axis=0) / n"),
        "row_peak_gap": ("hi = tl.full([BLOCK], -float('inf'), tl.float32)", "hi = tl.maximum(hi, tl.where(m, x, -float('inf')))",
                         "tl.max(hi, axis=0)"),
        "row_abs_scale": ("s = tl.zeros([BLOCK], tl.float32)", "s += tl.abs(x)", "tl.sum(s, axis=0) / n + 1"),
        "row_exp_shift": ("hi = tl.full([BLOCK], -float('inf'), tl.float32)", "hi = tl.maximum(hi, tl.where(m, x, -float('inf')))",
                          "tl.max(hi, axis=0)"),
    }[name]
    second = {"row_center": "x - stat", "row_peak_gap": "stat - x", "row_abs_scale": "x / stat",
              "row_exp_shift": "tl.exp(x - stat)"}.get(name)
    body = (_HEAD + "@triton.jit\ndef _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
            "    row = tl.program_id(0).to(tl.int64)\n"
            f"    {acc[0]}\n    for start in range(0, n, BLOCK):\n        offs = start + tl.arange(0, BLOCK)\n"
            "        m = offs < n\n        x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)\n"
            f"        {acc[1]}\n    stat = {acc[2]}\n")
    if second is None:
        body += "    tl.store(out_ptr + row, stat)\n"
    else:
        body += ("    for start in range(0, n, BLOCK):\n        offs = start + tl.arange(0, BLOCK)\n"
                 "        m = offs < n\n        x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)\n"
                 f"        tl.store(out_ptr + row * n + offs, {second}, mask=m)\n")
    return (body + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        x = x.contiguous()\n"
            + ("        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)\n" if out == "row"
               else "        out = torch.empty_like(x)\n")
            + "        _kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=32, num_warps=1)\n        return out\n")


def problems() -> list[dict]:
    """Every problem: its name, reference source, and kernels (file name -> (source, character))."""
    out = []
    for i, (name, inputs, body, expr, wrong) in enumerate(ELEMENTWISE):
        inputs = inputs.split(",")
        sizes = ELEMENTWISE_SIZES[i % len(ELEMENTWISE_SIZES)]
        kernels = {
            "triton_b1024": (_flat_triton(inputs, expr, 1024, 4), "launch: BLOCK 1024, 4 warps"),
            "triton_b32": (_flat_triton(inputs, expr, 32, 1), "launch: BLOCK 32, 1 warp"),
            "triton_rowloop": (_rowloop_triton(inputs, expr), "naive loop: a program per row, 64-wide chunks"),
            "eager": (_eager(inputs, body), "eager twin"),
            "wrong": (_flat_triton(inputs, wrong, 1024, 4), "wrong math"),
            "missing": (_flat_triton(inputs, f"tl.fast_blend({expr})", 1024, 4), "compile error: no such function"),
        }
        if i % 2 == 0:
            kernels["compile"] = (_eager(inputs, body, "compile"), "torch.compile")
        if i % 3 == 0:
            kernels["graph"] = (_eager(inputs, body, "graph"), "CUDA graph")
        doc = f"Elementwise: {body}"
        out.append({"name": f"zs_{name}", "reference": _reference(doc, inputs, body, "", sizes), "sizes": sizes,
                    "kernels": kernels})
    for i, (name, kind, body, expr, wrong) in enumerate(ROWWISE):
        sizes = ROW_SIZES[i % len(ROW_SIZES)]
        kernels = {
            "triton_b1024": (_row_triton(kind, expr, 8), "launch: a program per row, the whole row, 8 warps"),
            "triton_b32": (_row_chunked(name, kind), "naive loop: a program per row, 32-wide chunks, 1 warp"),
            "triton_w2": (_row_triton(kind, expr, 2), "launch: a program per row, the whole row, 2 warps"),
            "eager": (_eager(["x"], body), "eager twin"),
            "wrong": (_row_triton(kind, wrong, 8), "wrong math"),
            "missing": (_row_triton(kind, f"tl.row_magic({expr})", 8), "compile error: no such function"),
        }
        if i % 2 == 0:
            kernels["compile"] = (_eager(["x"], body, "compile"), "torch.compile")
        if i % 3 == 0:
            kernels["graph"] = (_eager(["x"], body, "graph"), "CUDA graph")
        out.append({"name": f"zs_{name}", "reference": _reference(f"Row-wise: {body}", ["x"], body, "", sizes),
                    "sizes": sizes, "kernels": kernels})
    return out


def write(folder: Path) -> dict:
    """Write every problem under ``folder`` (NAME/reference.py, NAME/KERNEL.py) and the manifest; returns it."""
    manifest = {"rule": "sealed: the ceil(n/3) problems whose names have the smallest sha256 hexdigest",
                "problems": []}
    found = problems()
    sealed = sealed_names(p["name"] for p in found)
    for p in found:
        where = folder / p["name"]
        where.mkdir(parents=True, exist_ok=True)
        (where / "reference.py").write_text(p["reference"])
        for kernel, (source, character) in p["kernels"].items():
            (where / f"{kernel}.py").write_text(source)
        manifest["problems"].append({"name": p["name"], "sealed": p["name"] in sealed, "sizes": list(p["sizes"]),
                                     "kernels": {k: c for k, (_, c) in p["kernels"].items()}})
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "zeroshot"))
    args = p.parse_args(argv)
    manifest = write(Path(args.out))
    n = len(manifest["problems"])
    k = sum(len(q["kernels"]) for q in manifest["problems"])
    s = sum(q["sealed"] for q in manifest["problems"])
    print(f"wrote {n} problems ({s} sealed) with {k} kernels under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
