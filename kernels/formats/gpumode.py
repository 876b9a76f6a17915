"""GPU MODE reference kernels as kernelcast operations.

A GPU MODE task is a reference module with ``generate_input(**spec)`` (one input ``data``
object per test spec: a tensor or a tuple/list/dict of tensors and constants),
``ref_kernel(data)`` and ``check_implementation(data, output)`` (the task's own judge),
helper modules it imports (``task.py``, ``utils.py``), and test specs (``task.yml``'s
``tests`` and ``benchmarks``). A submission defines ``custom_kernel(data)``.

The harness passes inputs as a flat tuple of tensors, so ``data`` is flattened into its
tensors plus a structure that rebuilds it (constants kept in the structure). A spec's
``seed`` is replaced by one drawn from the harness's seeded generator, so each
correctness seed sees fresh inputs. Benchmarks are the GPU cases, tests the interpreter's.
As GPU MODE's own evaluation does, the reference runs on an untouched ``data``: made
again from the same spec and seed (not kept as a copy, which would double a case's
device memory), so a submission that writes into its inputs cannot change what it is
compared with. Tensors of ``data`` that the reference writes into (output buffers the
task allocates) are declared writable; the harness checks the others are left alone.

Inputs are made where the task makes them (most on the GPU, with their own seeded
generator). At import nothing is allocated: ``generate_input`` and ``ref_kernel`` run on
the meta device (the CUDA device the task names redirected), which gives the shapes,
bytes, output structure and writable buffers.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.overrides import TorchFunctionMode

from kernelcast.kernels.formats.common import (MANIFEST, TaskFormatError, default_task_name, device_requirement, load_module,
                                    op_name, read_required)
from kernelcast.kernels.formats.operation import (ImportedOperation, first_float_dtype, is_literal, on_device, seed_from,
                                       signature, tensor_bytes)

REFERENCE_NEEDS = {"ref_kernel": "function", "generate_input": "function", "check_implementation": "function"}
CANDIDATE_NEEDS = {"custom_kernel": "function"}


def flatten(data, numbers: bool = False) -> tuple[list[torch.Tensor], Any]:
    """(the tensors in ``data``, in order; a structure that ``unflatten`` rebuilds ``data`` from).

    With ``numbers`` (a result, not inputs) Python numbers become 0-d tensors as well, so a
    candidate's own numbers reach ``check_implementation`` rather than the reference's."""
    tensors: list[torch.Tensor] = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return ("tensor", len(tensors) - 1)
        if numbers and isinstance(x, (bool, int, float)):
            tensors.append(torch.tensor(x))
            return ("number", [len(tensors) - 1, type(x).__name__])
        if isinstance(x, (tuple, list)):
            # a named tuple (torch.geqrf's (a, tau), torch.linalg.eigh's) comes back as a plain tuple:
            # what a task's check_implementation can ask of it (isinstance tuple, len, unpacking) holds
            return ("list" if isinstance(x, list) else "tuple", [walk(v) for v in x])
        if isinstance(x, dict):
            return ("dict", [(k, walk(v)) for k, v in x.items()])
        return ("const", x)

    return tensors, walk(data)


def _flat(n: int):
    """The structures of ``n`` tensors that a wrapper without a structure for them passes correctly (as a tuple)."""
    return [(kind, [("tensor", i) for i in range(n)]) for kind in ("tuple", "list")]


def unflatten(structure, tensors: Sequence[torch.Tensor]):
    kind, body = structure
    if kind == "tensor":
        return tensors[body]
    if kind == "tuple":
        return tuple(unflatten(s, tensors) for s in body)
    if kind == "list":
        return [unflatten(s, tensors) for s in body]
    if kind == "dict":
        return {k: unflatten(s, tensors) for k, s in body}
    if kind == "number":
        index, number_type = body
        return {"bool": bool, "int": int, "float": float}[number_type](tensors[index].item())
    return body


def verdict(result) -> str | None:
    """None when ``check_implementation``'s answer means correct, else its message.

    GPU MODE tasks answer ``(ok, message)``, or a message that is empty when correct, or
    a list of reasons that is empty when correct, or a bool.
    """
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        return None if result[0] else (str(result[1]) or "check_implementation rejected the output")
    if isinstance(result, bool):
        return None if result else "check_implementation returned False"
    if isinstance(result, str):
        return result or None
    if isinstance(result, (list, tuple)):
        return "; ".join(map(str, result)) or None
    if result is None:
        return None
    return f"check_implementation answered {result!r}, which is neither (ok, message) nor a message"


class GpuModeOperation(ImportedOperation):
    format = "gpumode"
    entry = "custom_kernel"
    reference_entry = "ref_kernel"
    ENTRY_CONTRACT = ("Define a function `custom_kernel(data)`: it takes what the reference's `generate_input` "
                      "returns and returns what `ref_kernel(data)` returns. Only `custom_kernel` is used: "
                      "`ref_kernel`, `generate_input` and `check_implementation` need not be repeated. Import "
                      "everything the module uses (torch, triton, triton.language as tl).")
    TABLE_FIELD = "structure"
    WRAPPER = """import torch as _kc_torch

_KC_DATA = {table}  # input shapes and dtypes -> how the task's data object is built from the tensors


def _kc_build(structure, tensors):
    kind, body = structure
    if kind == "tensor":
        return tensors[body]
    if kind == "tuple":
        return tuple(_kc_build(s, tensors) for s in body)
    if kind == "list":
        return [_kc_build(s, tensors) for s in body]
    if kind == "dict":
        return {{k: _kc_build(s, tensors) for k, s in body}}
    return body


def _kc_tensors(out):
    if isinstance(out, _kc_torch.Tensor):
        return [out]
    if isinstance(out, (bool, int, float)):  # a number the task returns: checked as the task's judge reads it
        return [_kc_torch.tensor(out)]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _kc_tensors(v)]
    return []


def launch(*inputs):
    structure = _KC_DATA.get(tuple((tuple(t.shape), str(t.dtype)) for t in inputs))
    if structure is None:  # a case whose inputs could not be made at import: GPU MODE's usual tuple
        data = inputs[0] if len(inputs) == 1 else inputs
    else:
        data = _kc_build(structure, inputs)
    return tuple(_kc_tensors({entry}(data)))
"""

    # GPU MODE's evaluator runs tasks with cuBLAS in its deterministic configuration: tasks that enable
    # deterministic algorithms (utils.DeterministicContext) need it set before CUDA starts.
    environment = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

    def __init__(self, folder: Path, manifest):
        super().__init__(folder, manifest)
        self.module = load_module(self.folder / manifest["reference"], f"kernelcast_task_{self.name.replace('.', '_')}")
        self._structure: dict = {}  # input signature -> structure of data
        self._made: dict = {}  # input signature -> (ids of the inputs made last, their spec and device)

    def _generate(self, spec: dict, device):
        with torch.random.fork_rng(devices=[]), on_device(device):
            torch.manual_seed(int(spec.get("seed", 0)))
            data = self.module.generate_input(**spec)
        tensors, structure = flatten(data)
        return tuple(t.to(device) for t in tensors), structure

    def make_inputs(self, case, gen, device):
        spec = dict(self.info(case)["spec"])
        seed = seed_from(gen)
        if "seed" in spec:
            spec["seed"] = seed
        tensors, structure = self._generate(spec, device)
        row = self.info(case)
        if row.get("structure") is None and structure not in (("tensor", 0), *_flat(len(tensors))):
            # the wrapper written at import knows no structure for these inputs and would pass a flat tuple
            raise TaskFormatError(
                f"{self.name}: case {case.name}: generate_input(**{row['spec']}) could not run on meta tensors at "
                f"import ({row.get('meta_error', 'no reason kept')}), so its data's structure is not written into "
                "candidates, and this data is not a tensor or a flat tuple of tensors")
        sig = signature(tensors)
        self._structure[sig] = structure
        self._made[sig] = (tuple(map(id, tensors)), spec, device)
        return self.remember(case, tensors)

    def clear_caches(self) -> None:
        self._made.clear()

    def null_submission(self) -> str:
        return self.reference_source.rstrip() + "\n\n\ncustom_kernel = ref_kernel\n"

    def data_of(self, tensors):
        """The task's ``data`` object around these input tensors (no copy)."""
        sig = signature(tensors)
        if sig not in self._structure:
            self.case_of(tensors)  # raises, naming the shapes
        return unflatten(self._structure[sig], tensors)

    def _untouched(self, tensors):
        """``data`` as the task made it for these inputs: made again from their spec, else copied now."""
        ids, spec, device = self._made.get(signature(tensors), ((), None, None))
        if ids == tuple(map(id, tensors)):
            fresh, _ = self._generate(spec, device)
            return self.data_of(fresh)
        return self.data_of(tuple(t.clone() for t in tensors))

    def reference(self, *inputs):
        return tuple(flatten(self.module.ref_kernel(self._untouched(inputs)), numbers=True)[0])

    def reference_float64(self, case, *inputs):
        """``ref_kernel`` on the task's data with its floating-point tensors in float64 (the task may cast back)."""
        tensors, structure = flatten(self._untouched(inputs))
        wide = [t.double() if t.dtype.is_floating_point else t for t in tensors]
        return tuple(flatten(self.module.ref_kernel(unflatten(structure, wide)), numbers=True)[0])

    def check(self, case, inputs, got) -> str | None:
        """The task's own judge: ``check_implementation(data, output)`` on untouched inputs."""
        data = self._untouched(inputs)
        structure = self.info(case).get("output_structure")
        if structure is None:
            _, structure = flatten(self.module.ref_kernel(self._untouched(inputs)), numbers=True)
        try:
            output = unflatten(structure, tuple(got))
        except (IndexError, TypeError):
            return f"returned {len(got)} tensors; the reference returns a different structure"
        problem = verdict(self.module.check_implementation(data, output))
        return f"case {case.name}: {problem}" if problem else None


def operation_from_manifest(folder: Path, manifest) -> GpuModeOperation:
    return GpuModeOperation(folder, manifest)


# ---- import -------------------------------------------------------------------------------------

def _imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _scalar(text: str):
    text = re.sub(r"\s+#.*$", "", text).strip()  # a trailing comment
    if not text:
        return None
    if text[0] in "{[":
        # a flow mapping or sequence; YAML allows bare keys, JSON does not
        quoted = re.sub(r'([{,]\s*)([A-Za-z_][\w-]*)\s*:', r'\1"\2":', text)
        return json.loads(quoted)
    try:
        return json.loads(text)
    except ValueError:
        return text.strip("'\"") if text[:1] in "'\"" else text


def read_task_yaml(text: str) -> dict:
    """The subset of YAML that GPU MODE's task.yml files use, read without PyYAML.

    Top-level ``key: value`` pairs, ``key: |`` blocks, lists (``- {"size": 127}`` flow
    mappings or plain scalars) and one level of nested ``key: value`` mappings.
    """
    doc: dict = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():
            raise ValueError(f"line {i}: unexpected indentation: {line.strip()[:60]!r}")
        key, colon, rest = line.partition(":")
        if not colon:
            raise ValueError(f"line {i}: expected 'key: value', got {line[:60]!r}")
        rest = rest.strip()
        block = []
        while i < len(lines) and (not lines[i].strip() or lines[i][0].isspace()):
            block.append(lines[i])
            i += 1
        if rest in ("|", "|-", ">"):
            body = [b for b in block]
            indent = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=0)
            doc[key] = "\n".join(b[indent:] for b in body).strip("\n") + "\n"
        elif rest and not rest.startswith("#"):
            doc[key] = _scalar(rest)
        else:
            items = [b.strip() for b in block if b.strip() and not b.strip().startswith("#")]
            if items and all(b.startswith("- ") or b == "-" for b in items):
                doc[key] = [_scalar(b[2:]) for b in items]
            else:
                doc[key] = {k.strip(): _scalar(v) for k, _, v in (b.partition(":") for b in items)}
    return doc


def _read_specs(path: Path) -> tuple[list[dict], list[dict], str, dict[str, Path]]:
    """(tests, benchmarks, description, shared helpers) from a task.yml (or a .json file of the same keys).

    Shared helpers are the files the task names from elsewhere in its repository (GPU MODE's
    ``{"name": "utils.py", "source": "../utils.py"}``): name in the task -> the file.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise TaskFormatError(f"cannot read the GPU MODE specs {path}: {exc.strerror}") from None
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise TaskFormatError(f"GPU MODE specs {path} is not JSON: {exc}") from None
    else:
        try:
            import yaml
        except ImportError:  # a measuring machine with torch and triton only: the subset task.yml files use
            try:
                doc = read_task_yaml(text)
            except ValueError as exc:
                raise TaskFormatError(f"GPU MODE specs {path}: {exc} (PyYAML is not installed; this reader "
                                      "knows top-level keys, '|' blocks and lists of flow mappings)") from None
        else:
            try:
                doc = yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                raise TaskFormatError(f"GPU MODE specs {path} is not YAML: {exc}") from None
    tests = doc.get("tests") if isinstance(doc, dict) else None
    if not tests or not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise TaskFormatError(f"GPU MODE specs {path} has no 'tests' list of spec mappings "
                              "(e.g. tests: [{size: 127, seed: 4242}])")
    benchmarks = doc.get("benchmarks") or []
    if not isinstance(benchmarks, list) or not all(isinstance(b, dict) for b in benchmarks):
        raise TaskFormatError(f"GPU MODE specs {path}: 'benchmarks' must be a list of spec mappings")
    shared = {}
    for entry in doc.get("files") or ():
        source = str(entry.get("source", "")) if isinstance(entry, dict) else ""
        if source.endswith(".py") and "/" in source and (path.parent / source).is_file():
            shared[str(entry.get("name") or Path(source).name)] = (path.parent / source).resolve()
    return tests, benchmarks, str(doc.get("description") or "").strip(), shared


def _distributed(module, spec: dict) -> str | None:
    """Why a task is a multi-process one kernelcast cannot measure, or None: its ``generate_input`` takes a
    ``rank`` (each process makes its own shard) or its spec names a ``world_size`` above one."""
    try:
        params = inspect.signature(module.generate_input).parameters
    except (TypeError, ValueError):
        params = {}
    world = spec.get("world_size")
    if "rank" in params or (isinstance(world, int) and world > 1):
        return (f"a distributed task (generate_input {'takes a rank' if 'rank' in params else 'is one process of many'}"
                f"{f', its cases run world_size={world} processes' if isinstance(world, int) else ''}, one a GPU, "
                "through torch.distributed): kernelcast measures a kernel in one process on one device")
    return None


def _profile(module, spec: dict, where: str) -> dict:
    """One manifest case from the meta device: the spec, its integer entries as dims, input dtype, the bytes
    of inputs plus outputs, the output structure and which inputs the reference writes into."""
    # Sizes name a case; the seed does not (each correctness run draws its own).
    dims = {k: v for k, v in spec.items() if isinstance(v, int) and not isinstance(v, bool) and k != "seed"}
    row = {"spec": spec, "dims": dims, "dtype": "float32", "bytes": None}
    why = _distributed(module, spec)
    if why:
        raise TaskFormatError(f"{where}: {why}")
    try:
        with torch.random.fork_rng(devices=[]), on_device("meta"), Uninitialised() as fresh:
            torch.manual_seed(0)
            data = module.generate_input(**spec)
    except TypeError as exc:
        if "generate_input()" in str(exc):
            raise TaskFormatError(f"{where}: generate_input(**{spec}) does not take this spec: {exc}") from None
        return row
    except Exception as exc:  # noqa: BLE001 - input code meta tensors cannot run: shapes found when measured
        return {**row, "meta_error": f"{type(exc).__name__}: {exc}"[:300]}
    tensors, structure = flatten(data)
    if not tensors:
        raise TaskFormatError(f"{where}: generate_input(**{spec}) returned no tensors")
    out_bytes = None
    versions = [t._version for t in tensors]
    rooms = fresh.untouched(tensors)
    try:
        with on_device("meta"):
            outputs, out_structure = flatten(module.ref_kernel(unflatten(structure, list(tensors))), numbers=True)
        # tensors of data returned as outputs are not extra bytes
        out_bytes = tensor_bytes(o for o in outputs if not any(o is t for t in tensors))
        writable = [i for i, t in enumerate(tensors)
                    if t._version != versions[i] or any(o is t for o in outputs) or i in rooms]
        row.update(output_structure=out_structure if is_literal(repr(out_structure), out_structure) else None,
                   writable=writable)
    except Exception:  # noqa: BLE001 - outputs assumed input-sized when meta tensors cannot run the reference
        pass
    in_bytes = tensor_bytes(tensors)
    structure_repr = repr(structure)
    if not is_literal(structure_repr, structure):
        odd = "; ".join(_not_plain(structure)) or "a value whose repr does not read back"
        raise TaskFormatError(f"{where}: generate_input(**{spec}) returned data that a candidate cannot be given: "
                              f"{odd}. kernelcast calls a candidate with the task's tensors in tuples, lists and "
                              "dicts of them, and plain constants (numbers, strings, None)")
    row.update(dtype=first_float_dtype(tensors), bytes=in_bytes + (out_bytes if out_bytes is not None else in_bytes),
               signature=[[list(t.shape), str(t.dtype)] for t in tensors], structure=structure_repr)
    return row


def _not_plain(structure, path: str = "data") -> list[str]:
    """Where ``structure`` holds a constant that is not a plain literal, and what it is (naming tensors it holds)."""
    kind, body = structure
    if kind in ("tuple", "list"):
        return [bad for i, s in enumerate(body) for bad in _not_plain(s, f"{path}[{i}]")]
    if kind == "dict":
        return [bad for k, s in body for bad in _not_plain(s, f"{path}[{k!r}]")]
    if kind != "const" or is_literal(repr(body), body):
        return []
    what = type(body)
    holds = [name for name, value in vars(body).items() if isinstance(value, torch.Tensor)] \
        if hasattr(body, "__dict__") else []
    if isinstance(body, torch.nn.Module):
        holds += [name for name, _ in body.named_buffers()] + [name for name, _ in body.named_parameters()]
    kind_name = ("a torch.nn.Module" if isinstance(body, torch.nn.Module)
                 else "a dataclass" if dataclasses.is_dataclass(body) else "an object")
    tensors = f" holding tensors ({', '.join(dict.fromkeys(holds))})" if holds else ""
    return [f"{path} is {what.__name__}, {kind_name}{tensors}"]


class Uninitialised(TorchFunctionMode):
    """Notes the tensors ``torch.empty`` and its kin make while a task makes its data.

    One still unwritten when ``generate_input`` returns holds no values, only room: an output
    buffer, whatever the reference does with it (a reference may return a new tensor and leave
    the buffer alone, as GPU MODE's prefixsum does). It is declared writable: its contents are
    garbage that cannot be made again, so checking it unchanged against inputs made again
    would refuse the reference itself."""

    _EMPTY = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)

    def __init__(self):
        super().__init__()
        self.made: list[tuple[torch.Tensor, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self._EMPTY and isinstance(out, torch.Tensor):
            self.made.append((out, out._version))
        return out

    def untouched(self, tensors) -> set[int]:
        """Indices of ``tensors`` made empty and not written since."""
        return {i for i, t in enumerate(tensors) if any(t is m and t._version == v for m, v in self.made)}


# Running a task's smallest test on the host at import is for small tests only: a task of half-precision
# matrix products (GPU MODE's amd/moe: 0.9 GB of float16 experts) would run for many minutes on a CPU.
FILL_MAX_BYTES = 256 << 20


def _fill_from_smallest_test(module, tests: list[dict], test_rows: list[dict], rows: list[dict]) -> None:
    """Which inputs the reference writes and what it returns, for cases meta tensors could not run (a task
    reading a value with ``.item()``, an output sized by the data): found by running the smallest test spec
    for real on the CPU, and assumed alike for every case (one task, one calling convention). Not when that
    test's bytes (from meta tensors) pass FILL_MAX_BYTES: then no input is declared writable."""
    if all("writable" in r for r in rows) or not tests:
        return
    sized = sorted((r["bytes"], i) for i, r in enumerate(test_rows) if r.get("bytes"))
    if sized:
        nbytes, index = sized[0]
        if nbytes > FILL_MAX_BYTES:
            return
        smallest = tests[index]
    else:
        smallest = min(tests, key=lambda spec: sum(v for v in spec.values() if isinstance(v, int)
                                                   and not isinstance(v, bool)))
    try:
        with torch.random.fork_rng(devices=[]), on_device("cpu"):
            torch.manual_seed(0)
            with Uninitialised() as fresh:
                tensors, structure = flatten(module.generate_input(**smallest))
            versions, rooms = [t._version for t in tensors], fresh.untouched(tensors)
            outputs, out_structure = flatten(module.ref_kernel(unflatten(structure, list(tensors))), numbers=True)
    except Exception:  # noqa: BLE001 - nothing more can be learnt without a GPU; measured as the task runs
        return
    writable = [i for i, t in enumerate(tensors)
                if t._version != versions[i] or any(o is t for o in outputs) or i in rooms]
    found = {"writable": writable,
             "output_structure": out_structure if is_literal(repr(out_structure), out_structure) else None}
    for r in rows:
        if "writable" not in r:
            r.update(found)


def _distinct(rows: list[dict]) -> list[dict]:
    """Cases named by their integer dims; where two would share a name, each is numbered as well."""
    keys = [(tuple(r["dims"].items()), r["dtype"]) for r in rows]
    if len(set(keys)) < len(keys) or any(not r["dims"] for r in rows):
        rows = [{**r, "dims": {**r["dims"], "spec": i}} for i, r in enumerate(rows)]
    return rows


def import_task(reference: str, candidates: Sequence[str] = (), name: str | None = None, specs: str | None = None,
                tolerance: dict | None = None) -> tuple[str, dict[str, bytes]]:
    """(op name, the task's files with its manifest) from a reference module, submissions and test specs.

    Helpers the task's specs name from elsewhere in its repository (``../utils.py``) are
    taken along, as GPU MODE's own runner does, so a task imports straight from a checkout.
    """
    ref_path = Path(reference).resolve()
    source = read_required(reference, "GPU MODE reference", REFERENCE_NEEDS)
    subs = [read_required(path, "GPU MODE submission", CANDIDATE_NEEDS) for path in candidates]
    spec_path = Path(specs) if specs else ref_path.parent / "task.yml"
    if not spec_path.is_file():
        raise TaskFormatError(f"GPU MODE task {reference} needs its test specs: no {spec_path}; pass --specs "
                              "task.yml (a 'tests' list, optionally 'benchmarks')")
    tests, benchmarks, description, shared = _read_specs(spec_path)
    name = op_name("gpumode", name or default_task_name(ref_path))
    shared = {n: f for n, f in shared.items() if not (ref_path.parent / n).exists()}
    if not shared:
        return _import(ref_path, source, subs, name, tests, benchmarks, description, tolerance)
    with tempfile.TemporaryDirectory(prefix="kernelcast-gpumode-") as staging:
        folder = Path(staging) / ref_path.parent.name
        folder.mkdir()
        for p in ref_path.parent.glob("*.py"):
            shutil.copy(p, folder / p.name)
        for n, f in shared.items():
            shutil.copy(f, folder / n)
        return _import(folder / ref_path.name, source, subs, name, tests, benchmarks, description, tolerance)


def _import(ref_path: Path, source: str, subs: list[str], name: str, tests, benchmarks, description,
            tolerance) -> tuple[str, dict[str, bytes]]:
    reference = str(ref_path)
    wanted = set().union(_imported_modules(source), *(_imported_modules(s) for s in subs))
    helpers = {p.name: p.read_bytes() for p in sorted(ref_path.parent.glob("*.py"))
               if p.stem in wanted and p != ref_path}
    module = load_module(ref_path, f"kernelcast_import_{name.replace('.', '_')}")
    interpret = _distinct([_profile(module, s, reference) for s in tests])
    cases = _distinct([_profile(module, s, reference) for s in benchmarks]) if benchmarks else interpret
    _fill_from_smallest_test(module, tests, interpret, interpret + cases)
    summary = f"GPU MODE task {name.split('.', 1)[1]}" + (f": {description.splitlines()[0]}" if description else "")
    files = {ref_path.name: source.encode(), **helpers}
    files.update({f"submission_{i}.py": text.encode() for i, text in enumerate(subs)})
    manifest = {"format": "gpumode", "name": name, "summary": summary, "reference": ref_path.name,
                "files": sorted(files), "candidates": [f"submission_{i}.py" for i in range(len(subs))],
                "cases": cases, "interpret_cases": interpret, "tolerance": tolerance}
    requires = device_requirement(source, *(text.decode(errors="replace") for text in helpers.values()))
    if requires:
        manifest["requires"] = requires
    files[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return name, files
