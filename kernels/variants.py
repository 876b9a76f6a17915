"""Execution variants of a PyTorch model: the same ``ModelNew`` run another way (torch.compile, CUDA graphs,
channels_last, cuDNN autotuning), written as a wrapper appended to the model's own submission. A GPU MODE
submission's ``custom_kernel`` gets the same (but channels_last) around the function.

A variant's source is the parent's submission verbatim, then a marked block that binds the class above
(``ModelNew``, or a reference's ``Model``) to a private name and defines a new ``ModelNew`` around it. The
wrapper builds the wrapped model first thing in its constructor, so it draws the same weights from the
seeded generator as the model itself would (KernelBench's eval makes both models after one seed). Variants
compose: a variant of a variant wraps the wrapper, each kind under a name of its own; a second variant of
the same kind is refused, as is one that cannot apply to the parent (``reason_not``).

Left out on purpose: TF32 on or off. It changes the arithmetic (a 10-bit mantissa in matmuls and
convolutions), so its speedup is bought with precision; a variant here runs the same arithmetic faster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernelcast.kernels.formats.common import TaskFormatError, submission_of, top_level_names

ORIGIN_PREFIX = "variant"  # a variant child's origin: "variant:<name>"
_MARK = "# ---- kernelcast variant: {name} ({what}) ----"
_MARKED = re.compile(r"^# ---- kernelcast variant: ([a-z0-9-]+) ", re.M)
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)\s*\(")

_HEAD = '''

{mark}
import torch as _kc_torch

_kc_{kind}_base = {base}


class ModelNew(_kc_torch.nn.Module):
    """{doc}"""

    def __init__(self, *args, **kwargs):
        super().__init__()
        # First, so that the wrapped model draws the weights it would alone; and while this module's name
        # {base} still means the wrapped class, as that class's own code (super({base}, self)) expects.
        names = globals()
        mine = names[{base!r}]
        names[{base!r}] = _kc_{kind}_base
        try:
            self.model = _kc_{kind}_base(*args, **kwargs)
        finally:
            names[{base!r}] = mine
'''

_BODIES = {
    "compile": '''        self.compiled = _kc_torch.compile(self.model, mode={mode!r})

    def forward(self, *inputs):
        return self.compiled(*inputs)
''',
    # Warm-up runs on the current stream: the harness refuses streams a candidate makes itself, while
    # torch.cuda.graph captures on a side stream of torch's own. Inputs are copied into the captured
    # (static) tensors before each replay; outputs are cloned, since the harness may hold the outputs
    # of one call while it makes the next, and a replay overwrites the static outputs.
    "cuda_graph": '''        self.graphs = {}

    def forward(self, *inputs):
        if _kc_torch.is_grad_enabled() or not all(isinstance(t, _kc_torch.Tensor) and t.is_cuda for t in inputs):
            return self.model(*inputs)  # a graph replays device work only: off the GPU, the model as it is
        key = tuple((tuple(t.shape), t.dtype, t.stride()) for t in inputs)
        captured = self.graphs.get(key)
        if captured is None:
            static = [t.clone() for t in inputs]
            for _ in range(3):  # lazy initialisation and library workspaces happen before the capture
                self.model(*static)
            _kc_torch.cuda.synchronize()
            graph = _kc_torch.cuda.CUDAGraph()
            with _kc_torch.cuda.graph(graph):
                out = self.model(*static)
            captured = self.graphs[key] = (graph, static, out)
        graph, static, out = captured
        for s, t in zip(static, inputs):
            s.copy_(t)
        graph.replay()
        if isinstance(out, (tuple, list)):
            return type(out)(o.clone() if isinstance(o, _kc_torch.Tensor) else o for o in out)
        return out.clone()
''',
    "channels_last": '''        self.model = self.model.to(memory_format=_kc_torch.channels_last)

    def forward(self, *inputs):
        return self.model(*(t.contiguous(memory_format=_kc_torch.channels_last)
                            if isinstance(t, _kc_torch.Tensor) and t.dim() == 4 else t for t in inputs))
''',
    # The flag is process-wide: it is set only around this model's call, so that a reference run in
    # the same process runs as it was written.
    "cudnn_benchmark": '''
    def forward(self, *inputs):
        saved = _kc_torch.backends.cudnn.benchmark
        _kc_torch.backends.cudnn.benchmark = True
        try:
            return self.model(*inputs)
        finally:
            _kc_torch.backends.cudnn.benchmark = saved
''',
}


# A GPU MODE submission is a function of the task's data: the same ways of running it, around the function.
_FN_HEAD = '''

{mark}
import torch as _kc_torch

_kc_{kind}_base = custom_kernel
'''
_FN_BODIES = {
    "compile": '''_kc_dynamo = _kc_torch._dynamo.config
for _kc_limit in ("recompile_limit", "cache_size_limit"):  # a graph per case's shapes: tasks have more cases than 8
    if hasattr(_kc_dynamo, _kc_limit):
        setattr(_kc_dynamo, _kc_limit, max(getattr(_kc_dynamo, _kc_limit), 64))
_kc_compiled = _kc_torch.compile(_kc_compile_base, mode={mode!r})


def custom_kernel(data):
    """{doc}"""
    return _kc_compiled(data)
''',
    # As the model's: captured per structure and shapes of the data, inputs copied into the captured tensors
    # before each replay, outputs cloned; a call that must not be captured (a tensor that needs gradients, data
    # off the GPU) runs as it is.
    "cuda_graph": '''from torch.utils import _pytree as _kc_pytree

_kc_graphs = {}


def custom_kernel(data):
    """{doc}"""
    leaves, spec = _kc_pytree.tree_flatten(data)
    tensors = [t for t in leaves if isinstance(t, _kc_torch.Tensor)]
    if not tensors or not all(t.is_cuda and not t.requires_grad for t in tensors):
        return _kc_cuda_graph_base(data)
    key = (str(spec), tuple((tuple(t.shape), t.dtype, t.stride()) if isinstance(t, _kc_torch.Tensor) else repr(t)
                            for t in leaves))
    captured = _kc_graphs.get(key)
    if captured is None:
        static = [t.clone() if isinstance(t, _kc_torch.Tensor) else t for t in leaves]
        static_data = _kc_pytree.tree_unflatten(static, spec)
        for _ in range(3):  # lazy initialisation and library workspaces happen before the capture
            _kc_cuda_graph_base(static_data)
        _kc_torch.cuda.synchronize()
        graph = _kc_torch.cuda.CUDAGraph()
        with _kc_torch.cuda.graph(graph):
            out = _kc_cuda_graph_base(static_data)
        captured = _kc_graphs[key] = (graph, static, out)
    graph, static, out = captured
    for s, t in zip(static, leaves):
        if isinstance(s, _kc_torch.Tensor):
            s.copy_(t)
    graph.replay()
    return _kc_pytree.tree_map(lambda o: o.clone() if isinstance(o, _kc_torch.Tensor) else o, out)
''',
    "cudnn_benchmark": '''

def custom_kernel(data):
    """{doc}"""
    saved = _kc_torch.backends.cudnn.benchmark
    _kc_torch.backends.cudnn.benchmark = True
    try:
        return _kc_cudnn_benchmark_base(data)
    finally:
        _kc_torch.backends.cudnn.benchmark = saved
''',
}


@dataclass(frozen=True)
class Variant:
    """One way of running a model: its name (the child's origin is ``variant:<name>``), its kind (two
    variants of one kind never stack), and what it does, in words."""

    name: str
    kind: str
    what: str
    mode: str | None = None  # torch.compile's mode (kind compile)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    *(Variant(f"compile-{m}", "compile", f"torch.compile, mode {m!r}", mode=m) for m in COMPILE_MODES),
    Variant("cuda-graph", "cuda_graph", "captured once per input shape in a CUDA graph, replayed"),
    Variant("channels-last", "channels_last", "weights and 4-D inputs in channels_last memory format"),
    Variant("cudnn-benchmark", "cudnn_benchmark", "torch.backends.cudnn.benchmark on: cuDNN autotunes"),
)}
# Modes whose compiled model already replays CUDA graphs: a cuda-graph variant of one captures nothing new.
_GRAPHED_MODES = ("reduce-overhead", "max-autotune")
# A submission that captures CUDA graphs itself (CUDA-L1's cuda_graph_code does): a capture cannot hold another
# capture, and torch.compile around one failed in its capture in 9 of 10 such children measured on an H100.
_CAPTURES = re.compile(r"\bcuda\.graph\(|\bCUDAGraph\(|\bmake_graphed_callables\b")
_CONV2D = re.compile(r"\b(Conv2d|ConvTranspose2d|conv2d|conv_transpose2d|LazyConv2d)\b")


def variant_named(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown execution variant {name!r}; known: {', '.join(VARIANTS)}") from None


def applied(source: str) -> list[Variant]:
    """The variants a source already runs under, innermost first (read from their marks)."""
    return [VARIANTS[n] for n in _MARKED.findall(submission_of(source)) if n in VARIANTS]


def model_class(submission: str) -> str:
    """What a variant wraps: ``ModelNew`` if the submission defines one, else a reference's ``Model``; for a
    GPU MODE submission, its function ``custom_kernel``."""
    names = top_level_names(submission, "the parent's source")
    for cls in ("ModelNew", "Model"):
        if names.get(cls) in ("class", "value"):
            return cls
    if names.get("custom_kernel") in ("function", "value"):
        return "custom_kernel"
    raise TaskFormatError("the parent's source defines no ModelNew or Model (KernelBench) and no custom_kernel "
                          "(GPU MODE) to run another way")


def reason_not(variant: Variant, submission: str, input_dims: tuple[int, ...] = ()) -> str:
    """Why ``variant`` cannot apply to ``submission`` (whose inputs have ``input_dims`` dimensions), or ''."""
    try:
        model_class(submission)
    except TaskFormatError as exc:
        return str(exc)
    done = applied(submission)
    same = [v.name for v in done if v.kind == variant.kind]
    if same:
        return f"the parent already runs as {same[0]}: a {variant.kind.replace('_', ' ')} variant of it adds nothing"
    if variant.kind in ("cuda_graph", "compile"):
        graphed = [v.name for v in done if v.kind == "cuda_graph"]
        if graphed or _CAPTURES.search(submission):
            how = f"runs as {graphed[0]}" if graphed else "captures CUDA graphs in its own code"
            what = "a capture cannot hold another" if variant.kind == "cuda_graph" else \
                "torch.compile around a capture fails in it (9 of 10 such children on an H100)"
            return f"the parent {how}: {what}"
    if variant.kind == "cuda_graph":
        graphed = [v.name for v in done if v.mode in _GRAPHED_MODES]
        if graphed:
            return f"the parent already runs as {graphed[0]}, which replays CUDA graphs of its own"
    if variant.kind == "channels_last":
        if model_class(submission) == "custom_kernel":
            return "a GPU MODE submission is a function of the task's data: no model whose layout to change"
        if 4 not in input_dims:
            return "no 4-D input: channels_last changes the layout of 4-D (N, C, H, W) tensors only"
        if not _CONV2D.search(submission):
            return "no 2-D convolution in the model: channels_last pays off in cuDNN's NHWC convolutions"
    return ""


def variant_source(submission: str, name: str) -> str:
    """``submission`` (a KernelBench model file) followed by the wrapper that runs it as variant ``name``."""
    v = variant_named(name)
    mark, base = _MARK.format(name=v.name, what=v.what), model_class(submission)
    if base == "custom_kernel":
        if v.kind not in _FN_BODIES:
            raise ValueError(f"variant {name!r} runs a model; a GPU MODE submission is a function")
        body = _FN_BODIES[v.kind].replace("{mode!r}", repr(v.mode)).replace(
            "{doc}", f"The submission above, run as {v.name}: {v.what}.")
        return submission.rstrip() + "\n" + _FN_HEAD.format(mark=mark, kind=v.kind) + body
    head = _HEAD.format(mark=mark, kind=v.kind, base=base, doc=f"The model above, run as {v.name}: {v.what}.")
    return _own_super(submission, base).rstrip() + "\n" + head + _BODIES[v.kind].replace("{mode!r}", repr(v.mode))


def _own_super(submission: str, base: str) -> str:
    """``submission`` with ``super(<base>, self)`` written ``super()`` in its methods other than ``__init__``.

    The wrapper takes the name ``base`` and gives it back only while the wrapped model is built, which is all a
    constructor's ``super(ModelNew, self).__init__()`` needs. A method called later sees the wrapper under that name:
    on an H100, a CUDA-L1 kernel of KernelBench level2/73 overrides ``train`` with ``super(ModelNew, self).train(mode)``,
    and each of its variants failed on the harness's ``.eval()`` ("super(type, obj): obj must be an instance or
    subtype of type"). The zero-argument form means the class the method was written in, whatever the name means
    then. Code without such a call is left as it is (its variants keep their ids)."""
    named = re.compile(rf"super\(\s*{re.escape(base)}\s*,\s*self\s*\)")
    lines = submission.split("\n")
    changed = False
    for i, line in enumerate(lines):
        if not named.search(line):
            continue
        indent = len(line) - len(line.lstrip())
        for above in reversed(lines[:i]):
            m = _DEF.match(above)
            if m and len(m.group(1)) < indent:
                if m.group(2) != "__init__":
                    lines[i] = named.sub("super()", line)
                    changed = True
                break
    return "\n".join(lines) if changed else submission


@dataclass(frozen=True)
class Skipped:
    """A variant not made for a parent, and why."""

    parent_id: str
    variant: str
    reason: str


def input_dims(op) -> tuple[int, ...]:
    """The numbers of dimensions of an imported KernelBench op's inputs, over all its cases (from its manifest)."""
    dims = set()
    for case in (*op.cases, *op.interpret_cases):
        dims.update(len(shape) for shape, _ in op.info(case).get("signature") or ())
    return tuple(sorted(dims))


def variant_children(op, parent, names=tuple(VARIANTS)) -> tuple[list, list[Skipped]]:
    """(children, skipped): each named variant of ``parent`` (a candidate of the imported KernelBench or GPU MODE
    op ``op``) as a child with origin ``variant:<name>``, or the reason it cannot be one."""
    fmt = getattr(op, "format", "")
    if fmt not in ("kernelbench", "gpumode"):
        raise ValueError(f"execution variants run a KernelBench ModelNew or a GPU MODE custom_kernel another way; "
                         f"{op.name} is neither")
    # a GPU MODE reference's code defines ref_kernel: as a submission, custom_kernel is bound to it
    submission = op.null_submission() if fmt == "gpumode" and parent.origin == "seed" else submission_of(parent.source)
    dims = input_dims(op) if fmt == "kernelbench" else ()
    children, skipped = [], []
    for name in names:
        why = reason_not(variant_named(name), submission, dims)
        if why:
            skipped.append(Skipped(parent.candidate_id, name, why))
        else:
            children.append(op.candidate(variant_source(submission, name), origin=f"{ORIGIN_PREFIX}:{name}",
                                         parent_id=parent.candidate_id))
    return children, skipped
