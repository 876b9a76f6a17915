"""KernelBench problems as kernelcast operations.

A KernelBench problem file defines ``class Model(nn.Module)`` whose ``forward`` is the
reference, a module-level ``get_inputs()`` (the forward's arguments, drawn from torch's
global generator) and ``get_init_inputs()`` (the constructor's arguments); its sizes are
module-level integers (``batch_size = 16``) that both functions read when called. A
candidate file defines ``class ModelNew`` with the same constructor and forward.

Here a case is one setting of those integers: the file's own values are the GPU case,
and smaller settings (``--interpret-case batch_size=2,dim=64``) can be given for Triton's
CPU interpreter; without them the interpreter case is the file's own sizes halved until
its inputs take a few MB (``scaled_interpret_sizes``, stated in the manifest). Models are built once per case and
device, each right after seeding torch with ``INIT_SEED``, so ``Model`` and ``ModelNew`` get the same weights
whenever they create the same parameters in the same order. They are built as KernelBench's own eval builds them:
on the CPU, then moved to the device. There a parameter made with the legacy ``torch.Tensor(out, in)``
constructor and initialised by hand draws from the same generator as the reference's ``nn.Linear``; built on the
GPU, the two draw from different generators (that constructor ignores the default device) and such a kernel was
judged incorrect where KernelBench accepts it (docs/measured/task_sweep/README.md, "Models built on the host"). Under kernelcast's
protocol a model whose parameters pass ``HOST_BUILD_BYTES`` is still built on the device (no host memory or time
for a gigabyte-sized model), and a plain tensor attribute made in ``__init__`` is moved along with the parameters;
under KernelBench's protocol every model is built on the CPU and only its parameters and buffers move, as there.
``configure_models`` sets this per measuring process, ``prepare`` builds a loaded candidate's models the same way
before its first call: the choice lives outside the candidate's source, whose wrapper text is part of its id.
Inputs are made on the device (``get_inputs`` with the device as torch's
default and its generator seeded): a gigabyte-sized case costs no host memory and no
host time. At import, shapes and bytes come from the meta device: nothing is allocated.
Correctness is KernelBench's: every output within rtol = atol = 1e-2.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import torch

from kernelcast.kernels.formats.common import (MANIFEST, WRAPPER_MARK, TaskFormatError, default_task_name, device_requirement,
                                    load_module, op_name, read_required)
from kernelcast.kernels.formats.operation import (ImportedOperation, first_float_dtype, is_literal, on_device, rng_fork, seed_from,
                                       tensor_bytes)
from kernelcast.kernels.ops.base import MODEL_BUILDS

INIT_SEED = 42
# Under kernelcast's protocol, models whose parameters and buffers take more bytes than this are built on the device
HOST_BUILD_BYTES = 2 << 30
_WRAPPED_ENTRY = re.compile(r"model = (\w+)\(\*_KC_INIT\[key\]\)")  # the class the format's launch builds
TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # KernelBench's eval compares with atol = rtol = 1e-2
REFERENCE_NEEDS = {"Model": "class", "get_inputs": "function", "get_init_inputs": "function"}
CANDIDATE_NEEDS = {"ModelNew": "class"}


def as_outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class KernelBenchOperation(ImportedOperation):
    format = "kernelbench"
    entry = "ModelNew"
    reference_entry = "Model"
    ENTRY_CONTRACT = ("Define a class `ModelNew(torch.nn.Module)`, the drop-in replacement of the reference's "
                      "`Model`: the same constructor arguments (from `get_init_inputs()`), a `forward` taking the "
                      "same inputs (from `get_inputs()`) and returning the same outputs. Only `ModelNew` is used: "
                      "a class named `Model` is ignored, and `get_inputs`/`get_init_inputs` need not be repeated. "
                      "Import everything the module uses (torch, triton, triton.language as tl, torch.nn as nn).")
    TABLE_FIELD = "init"
    WRAPPER = """import torch as _kc_torch

_KC_INIT = {table}  # input shapes and dtypes -> the case's init inputs
_KC_MODELS = {{}}


def launch(*inputs):
    key = tuple((tuple(t.shape), str(t.dtype)) for t in inputs)
    device = inputs[0].device
    model = _KC_MODELS.get((key, device))
    if model is None:  # built once per case on the inputs' device, after the seed the reference model is built after
        cuda = [device.index or 0] if device.type == "cuda" else []
        with _kc_torch.random.fork_rng(devices=cuda, device_type="cuda"), _kc_torch.device(device):
            _kc_torch.manual_seed({seed})
            model = {entry}(*_KC_INIT[key])
        model = _KC_MODELS[(key, device)] = model.to(device).eval()
    with _kc_torch.no_grad():
        out = model(*inputs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
""".replace("{seed}", str(INIT_SEED))

    # Where get_inputs() passes numbers beside its tensors, the launch puts them back at their positions. Only
    # such tasks get this longer wrapper: every other candidate's source (and so its id) stays as it was.
    WRAPPER_WITH_CONSTANTS = WRAPPER.replace(
        "_KC_MODELS = {{}}\n",
        "_KC_MODELS = {{}}\n_KC_CONSTANTS = {constants}  # input shapes and dtypes -> the numbers get_inputs() "
        "passes beside them, by position\n").replace(
        "        out = model(*inputs)\n",
        "        args = list(inputs)\n        for position, value in _KC_CONSTANTS.get(key, ()):\n"
        "            args.insert(position, value)\n        out = model(*args)\n")

    def wrapper_body(self, entry: str) -> str:
        constants = self.wrapper_table("constants")
        if constants == "{}":
            return super().wrapper_body(entry)
        return self.WRAPPER_WITH_CONSTANTS.format(entry=entry, table=self.wrapper_table(), constants=constants)

    def __init__(self, folder: Path, manifest):
        super().__init__(folder, manifest)
        self.module = load_module(self.folder / manifest["reference"], f"kernelcast_task_{self.name.replace('.', '_')}")
        self._models: dict = {}
        self.built_where: dict = {}  # (class, case) -> where ``build`` last built it: host, device, or why not the host
        self._build, self._protocol = "auto", "kernelcast"  # until configure_models says otherwise

    def sized(self, case):
        """The task module with its size integers set to ``case``'s values (restored after)."""
        return sized_module(self.module, case.dims)

    def make_inputs(self, case, gen, device):
        """``get_inputs()`` at the case's sizes, made on ``device`` from torch's generators seeded from ``gen``."""
        seed = seed_from(gen)
        with self.sized(case) as m, rng_fork(device), on_device(device):
            torch.manual_seed(seed)
            tensors, _ = split_inputs(list(m.get_inputs()), self.name)  # numbers: the case's constants, as imported
        return self.remember(case, (v.to(device) for v in tensors))

    def configure_models(self, build: str, protocol: str) -> None:
        if build not in MODEL_BUILDS:
            raise ValueError(f"unknown model build {build!r}; known: {', '.join(MODEL_BUILDS)}")
        self._build, self._protocol = build, protocol
        if any(self.builds_on_host(c) for c in self.cases):
            start_cpu_threads()

    def builds_on_host(self, case) -> bool:
        """Whether ``case``'s models are built on the CPU and then moved (``configure_models``; module docstring)."""
        if self._build != "auto":
            return self._build == "host"
        return self._protocol == "kernelbench" or self.parameter_bytes(case) <= HOST_BUILD_BYTES

    def build(self, cls, case, device) -> torch.nn.Module:
        """A fresh ``cls`` with the case's init inputs, built after seeding ``INIT_SEED`` where ``builds_on_host``
        says, on ``device`` in eval mode. Under kernelcast's protocol a class that cannot be built on the CPU (its
        ``__init__`` runs a GPU kernel on its parameters, say) is built on the device, as before; ``built_where``
        says which, and why."""
        host = self.builds_on_host(case)
        kernelbench = self._protocol == "kernelbench"
        try:
            built = self._construct(cls, case, device, "cpu" if host else device)
            where = "host" if host or torch.device(device).type == "cpu" else "device"
        except Exception as exc:
            if not host or kernelbench or torch.device(device).type == "cpu":
                raise  # KernelBench's eval fails it the same way; nowhere else to build it
            built = self._construct(cls, case, device, device)
            why = f"{type(exc).__name__}: {str(exc)[:120]}".replace(";", ",")  # a row's checks are ;-separated
            host, where = False, f"device (not on the host: {why})"
        self.built_where[(cls, case)] = where
        built = built.to(device)
        if host and not kernelbench:
            move_plain_tensors(built, device)
        return built.eval()

    def _construct(self, cls, case, device, where) -> torch.nn.Module:
        with self.sized(case) as m, rng_fork(device), torch.device(where):
            init = list(m.get_init_inputs())
            torch.manual_seed(INIT_SEED)
            return cls(*init)

    def model(self, cls, case, device) -> torch.nn.Module:
        """``cls`` as ``build`` makes it, cached per case and device."""
        key = (cls, case, str(device))
        if key not in self._models:
            self._models[key] = self.build(cls, case, device)
        return self._models[key]

    def prepare(self, launch, source: str, device) -> str:
        """Each case's model of a loaded candidate built as the reference's is (``build``) and put where the
        format's launch keeps it, so that its first call finds it; says where they were built."""
        namespace = getattr(launch, "__globals__", None)
        entry = _WRAPPED_ENTRY.findall(source.rsplit(WRAPPER_MARK, 1)[-1])
        if not isinstance(namespace, dict) or not isinstance(namespace.get("_KC_MODELS"), dict) or not entry:
            return ""  # not the format's launch: it builds its models as its own code says
        cls = namespace.get(entry[-1])
        if not callable(cls):
            return ""
        device = torch.empty(0, device=device).device  # the index the launch's inputs will carry
        places = set()
        for case in (self.cases if device.type == "cuda" else self.interpret_cases):
            signature = self.info(case).get("signature")
            if signature is None:
                continue
            key = tuple((tuple(shape), dtype) for shape, dtype in signature)
            namespace["_KC_MODELS"][(key, device)] = self.build(cls, case, device)
            places.add(self.built_where[(cls, case)])
        return " + ".join(sorted(places))

    def clear_caches(self) -> None:
        self._models.clear()

    def null_submission(self) -> str:
        return self.reference_source.rstrip() + "\n\n\nModelNew = Model\n"

    def constants(self, case) -> list:
        """The numbers ``get_inputs()`` passes beside the tensors of ``case``, with their positions (often none)."""
        return self.info(case).get("constants", [])

    def reference(self, *inputs):
        case = self.case_of(inputs)
        model = self.model(self.module.Model, case, inputs[0].device)
        with torch.no_grad():
            return as_outputs(model(*with_constants(inputs, self.constants(case))))

    def reference_float64(self, case, *inputs):
        """The same model (its weights made the same way) in float64, on float64 copies of the inputs."""
        model = copy.deepcopy(self.model(self.module.Model, case, inputs[0].device)).double()
        doubled = [t.double() if t.dtype.is_floating_point else t for t in inputs]
        with torch.no_grad():
            return as_outputs(model(*with_constants(doubled, self.constants(case))))


def start_cpu_threads() -> None:
    """Start torch's pool of CPU threads now. A model built on the host starts it at its first parallel
    initialisation, and a measuring child counts the threads it starts while its checks share the device (under_lock's
    ``DeviceLock``): built there, a reference would be refused for threads that are torch's own (measured on an H200,
    2026-11-29: KernelBench's 43_MinGPTCausalAttention, 15 threads, the reference and its twin rejected)."""
    torch.ones(1 << 20).mul_(2)  # past the grain of a parallel loop: the pool starts


def move_plain_tensors(model: torch.nn.Module, device) -> None:
    """Move the tensors ``model``'s modules hold as plain attributes (neither parameters nor buffers, which
    ``.to`` moves) to ``device``: made in ``__init__`` on the CPU, they would stay there."""
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.device != torch.device(device):
                setattr(module, name, value.to(device))


def split_inputs(values, where: str) -> tuple[list[torch.Tensor], list[list]]:
    """``get_inputs()``'s values as (tensors, constants): a number among them (KernelBench's level1/5 passes a
    float scalar) is a constant ``[position, value]``, held at the value the import saw; anything else refused."""
    tensors, constants = [], []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
        elif isinstance(v, (bool, int, float)):
            constants.append([i, v])
        else:
            raise TaskFormatError(f"{where}: get_inputs() returned a {type(v).__name__} at position {i}; kernelcast "
                                  "passes a model's inputs as tensors, and numbers as constants of the case")
    if not tensors:
        raise TaskFormatError(f"{where}: get_inputs() returned no tensor; kernelcast needs at least one")
    return tensors, constants


def with_constants(tensors, constants) -> list:
    """The model's arguments: ``tensors`` with each constant put back at its position."""
    args = list(tensors)
    for position, value in constants or ():
        args.insert(position, value)
    return args


def operation_from_manifest(folder: Path, manifest) -> KernelBenchOperation:
    return KernelBenchOperation(folder, manifest)


# ---- import -------------------------------------------------------------------------------------

def _size_names(module) -> dict[str, int]:
    """The module-level integers of a problem file: its sizes."""
    return {k: v for k, v in vars(module).items()
            if not k.startswith("_") and isinstance(v, int) and not isinstance(v, bool)}


def _parse_sizes(text: str, known: dict[str, int], where: str) -> dict[str, int]:
    sizes = dict(known)
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in known:
            raise TaskFormatError(f"{where}: bad size {item!r}; give NAME=INT for module integers of the "
                                  f"problem: {', '.join(known) or 'it has none'}")
        try:
            sizes[key.strip()] = int(value)
        except ValueError:
            raise TaskFormatError(f"{where}: size {key.strip()} must be an integer, got {value!r}") from None
    return sizes


@contextmanager
def sized_module(module, sizes):
    """``module`` with its size integers set to ``sizes`` (a mapping or (name, value) pairs), restored after.

    A problem with no size integers has its case named by its input count ({"inputs": N}, ``_profile``): a name the
    module does not have is no size of it and is left alone (sizes given at import are checked against the module's
    own integers there, ``_parse_sizes``)."""
    sizes = {k: v for k, v in dict(sizes).items() if hasattr(module, k)}
    saved = {k: getattr(module, k) for k in sizes}
    for k, v in sizes.items():
        setattr(module, k, v)
    try:
        yield module
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def _on_meta(module, sizes: dict[str, int], where: str) -> tuple[list, list, int | None, int | None, list]:
    """(tensor inputs, init inputs, output bytes, parameter bytes, constants) of the problem at ``sizes``, run on
    the meta device.

    Output and parameter bytes are None where the model cannot run on meta tensors."""
    out_bytes = param_bytes = None
    try:
        with sized_module(module, sizes), torch.random.fork_rng(devices=[]), on_device("meta"):
            torch.manual_seed(0)
            inputs, constants = split_inputs(list(module.get_inputs()), where)
            init = list(module.get_init_inputs())
            try:  # outputs and parameters on the meta device: no memory, no compute
                model = module.Model(*init)
                param_bytes = tensor_bytes([*model.parameters(), *model.buffers()])
                out_bytes = tensor_bytes(as_outputs(model(*with_constants(inputs, constants))))
            except Exception:  # noqa: BLE001 - an op meta tensors cannot run; outputs assumed input-sized
                pass
    except TaskFormatError:
        raise
    except Exception as exc:
        raise TaskFormatError(f"{where}: get_inputs()/get_init_inputs() failed on the meta device for sizes {sizes}: "
                              f"{type(exc).__name__}: {exc}") from exc
    return inputs, init, out_bytes, param_bytes, constants


def _profile(module, sizes: dict[str, int], where: str) -> dict:
    """One manifest case: sizes, the input dtype, the bytes of inputs, outputs and parameters, from meta tensors."""
    inputs, init, out_bytes, param_bytes, constants = _on_meta(module, sizes, where)
    in_bytes = tensor_bytes(inputs)
    init_repr = repr(init)
    if not is_literal(init_repr, init):
        raise TaskFormatError(f"{where}: get_init_inputs() returned {init!r}, which cannot be written into a "
                              "candidate as a literal (use numbers, strings, lists)") from None
    if not is_literal(repr(constants), constants):
        raise TaskFormatError(f"{where}: get_inputs() returned numbers {constants!r} that cannot be written as "
                              "literals") from None
    return {**({"constants": constants} if constants else {}), "dims": sizes or {"inputs": len(inputs)},
            "dtype": first_float_dtype(inputs),
            "bytes": in_bytes + (out_bytes if out_bytes is not None else in_bytes),
            "parameter_bytes": param_bytes or 0,
            "signature": [[list(t.shape), str(t.dtype)] for t in inputs], "init": init_repr}


_RANDOM_CALLS = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                 "normal_", "uniform_", "bernoulli", "bernoulli_", "multinomial", "exponential_", "random_"}


def may_depend_on_history(source: str) -> bool:
    """Whether ``Model``'s methods other than ``__init__`` could make a call's output depend on earlier calls:
    they assign to an attribute of ``self``, call an in-place method (``name_``) on one, or draw random numbers.
    A model doing none of these is judged stateless without running it (history_dependence is costly on a CPU)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return True
    for fn in model.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            if any(_on_self(t) for t in targets):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name in _RANDOM_CALLS or (name.endswith("_") and not name.startswith("_") and _on_self(node.func.value)):
                    return True
    return False


def _on_self(node) -> bool:
    """``self.x``, ``self.x[i]``, ``self.x.y``: an expression rooted at ``self``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def history_dependence(module, sizes: dict[str, int], where: str) -> str | None:
    """Why the problem's ``Model`` cannot be judged one call at a time, or None.

    Built after ``INIT_SEED`` at ``sizes`` on the CPU, the model is called twice on the same inputs. A
    model whose second output differs from its first keeps state across calls (a recurrent hidden state
    it overwrites, a counter) or draws random numbers: its output depends on how many times it was
    called, and kernelcast checks each call of a candidate against a reference that was not called the
    same number of times. Such a problem is refused here, before any GPU work; KernelBench's own harness
    can judge one only by calling the model and the candidate in lockstep. A model that cannot run on
    the CPU (a CUDA-only op) is not judged here: None."""
    try:
        with sized_module(module, sizes), torch.random.fork_rng(devices=[]), on_device("cpu"), torch.no_grad():
            torch.manual_seed(0)
            inputs, constants = split_inputs(list(module.get_inputs()), where)
            init = list(module.get_init_inputs())
            torch.manual_seed(INIT_SEED)
            model = module.Model(*init).eval()
            first = as_outputs(model(*with_constants([t.clone() for t in inputs], constants)))
            second = as_outputs(model(*with_constants([t.clone() for t in inputs], constants)))
    except Exception:  # noqa: BLE001 - not runnable on the CPU here: the GPU run judges it
        return None
    for i, (a, b) in enumerate(zip(first, second)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            continue
        if not torch.equal(a, b) and not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True):
            gap = float((a.double() - b.double()).abs().nan_to_num(0.0).max())
            return (f"{where}: Model's output {i} differs between two calls on the same inputs (max abs difference "
                    f"{gap:.3g}, at sizes {sizes}): it keeps state across calls or draws random numbers, so a "
                    "call cannot be judged on its own against the reference")
    return None


# The interpreter case made when none is given: the problem's own sizes, halved until its inputs fit here.
INTERPRET_INPUT_BYTES = 4 << 20  # a CPU checks a few MB of inputs under Triton's interpreter in seconds
# The probe's case (kernelcast.kernels.probe: whether a candidate computes the right thing, a forecast's fact): the
# interpreter's case halved again until its inputs take this. An interpreted kernel's time grows with its programs:
# a BLOCK-32 kernel took 7-15 s a call on the 4 MB case of an elementwise problem, for one fact of a forecast.
PROBE_INPUT_BYTES = 64 << 10
# Integers at or below the first floor are left alone (axes, kernel sizes, strides, groups, small channels);
# a problem still too big then (a 3-D volume, many heads) goes down to the second.
SCALE_FLOORS = (32, 8)


def scaled_interpret_sizes(module, sizes: dict[str, int], where: str,
                           limit: int = INTERPRET_INPUT_BYTES) -> tuple[dict[str, int], dict]:
    """The problem's sizes scaled down for the interpreter, and how (the manifest's ``interpret_scaling``).

    The largest integer above the floor (``SCALE_FLOORS``, in turn) is halved, again and again, until the
    inputs take at most ``limit`` bytes (``INTERPRET_INPUT_BYTES``; the probe's case: ``PROBE_INPUT_BYTES``); an
    integer whose halving the problem refuses (``get_inputs`` fails, or a model that ran on meta tensors no longer
    does) keeps its last good value.
    Shapes come from the meta device, so nothing is allocated. ``how`` is empty when the problem's own
    sizes already fit.
    """
    inputs, _, out_bytes, _, _ = _on_meta(module, sizes, where)
    full_bytes = tensor_bytes(inputs)
    scaled, now_bytes, refused = dict(sizes), full_bytes, set()
    for floor in SCALE_FLOORS:
        while now_bytes > limit:
            movable = [k for k, v in scaled.items() if v > floor and k not in refused]
            if not movable:
                break
            name = max(movable, key=lambda k: scaled[k])  # ties: the first in the file
            trial = {**scaled, name: scaled[name] // 2}
            try:
                t_inputs, _, t_out, _, _ = _on_meta(module, trial, where)
            except TaskFormatError:
                t_inputs = t_out = None
            if t_inputs is None or (out_bytes is not None and t_out is None):
                refused.add(name)
                continue
            scaled, now_bytes = trial, tensor_bytes(t_inputs)
    if scaled == sizes:
        return scaled, {}
    return scaled, {"sizes": {k: [sizes[k], scaled[k]] for k in sizes if scaled[k] != sizes[k]},
                    "input_bytes": [full_bytes, now_bytes], "limit_bytes": limit,
                    "rule": f"the largest size above {SCALE_FLOORS[0]} (then above {SCALE_FLOORS[1]}) halved until "
                            f"the inputs take at most {limit} bytes; --interpret-case to choose"}


def scaling_text(scaling: dict) -> str:
    """One line for ``interpret_scaling``: 'batch_size 4096 -> 1024, dim 393216 -> 768 (inputs 6.4 GB -> 3.1 MB)'."""
    sizes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in scaling["sizes"].items())
    before, after = scaling["input_bytes"]
    return f"{sizes} (inputs {_bytes_text(before)} -> {_bytes_text(after)})"


def _bytes_text(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def import_task(reference: str, candidates: Sequence[str] = (), name: str | None = None,
                interpret_sizes: Sequence[str] = (), tolerance: dict | None = None) -> tuple[str, dict[str, bytes]]:
    """(op name, the task's files with its manifest) from a problem file and candidate files."""
    source = read_required(reference, "KernelBench problem file", REFERENCE_NEEDS)
    subs = [read_required(path, "KernelBench candidate file", CANDIDATE_NEEDS) for path in candidates]
    name = op_name("kernelbench", name or default_task_name(reference))
    module = load_module(Path(reference).resolve(), f"kernelcast_import_{name.replace('.', '_')}")
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        raise TaskFormatError(f"KernelBench problem file {reference}: Model is not a torch.nn.Module subclass")
    sizes = _size_names(module)
    cases = [_profile(module, sizes, reference)]
    scaling: dict = {}
    probe: list = []  # given interpreter cases are the probe's too
    if interpret_sizes:
        small = _parse_sizes(interpret_sizes[0], sizes, reference)
        interpret = [_profile(module, _parse_sizes(s, sizes, reference), reference) for s in interpret_sizes]
    else:  # the problem's own sizes, scaled down until a CPU checks them in seconds
        small, scaling = scaled_interpret_sizes(module, sizes, reference)
        interpret = [_profile(module, small, reference)] if scaling else cases
        tiny, probe_scaling = scaled_interpret_sizes(module, small, reference, PROBE_INPUT_BYTES)
        if probe_scaling:  # the probe's own, smaller still (ImportedOperation reads it under PROBE_CASES_ENV)
            probe = [_profile(module, tiny, reference)]
    why = history_dependence(module, small, reference) if may_depend_on_history(source) else None
    if why:
        raise TaskFormatError(why)
    doc = (module.Model.__doc__ or "").strip().splitlines()
    summary = f"KernelBench problem {Path(reference).name}" + (f": {doc[0].strip()}" if doc and doc[0].strip() else "")
    files = {"reference.py": source.encode()}
    files.update({f"candidate_{i}.py": text.encode() for i, text in enumerate(subs)})
    manifest = {"format": "kernelbench", "name": name, "summary": summary, "reference": "reference.py",
                "files": sorted(files), "candidates": [f"candidate_{i}.py" for i in range(len(subs))],
                "cases": cases, "interpret_cases": interpret, "tolerance": tolerance or TOLERANCE,
                "source_file": Path(reference).name}
    requires = device_requirement(source)
    if requires:
        manifest["requires"] = requires
    if scaling:
        manifest["interpret_scaling"] = scaling
    if probe:
        manifest["probe_cases"] = probe
    files[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return name, files
