"""CUDA-L1's published KernelBench kernels as kernelcast candidates, with the speedups its authors published.

CUDA-L1 (github.com/deepreinforce-ai/CUDA-L1, ``optimized_cuda_code/<gpu>.json``) gives, for
each of KernelBench's 250 problems, the problem as its authors measured it (``ref_code``),
their model's kernel (``custom_code``, a ``ModelNew``), the reference run with CUDA graphs
(``cuda_graph_code``) and with cuDNN backend flags (``cudnn_code``; both define ``Model``), and
speedups per GPU. Their README defines every score as a ratio of runtimes over
``custom_code``'s: ``score_default`` is reference / custom, ``score_cuda_graph`` is
cuda_graph_code / custom, and likewise for cuDNN and torch.compile of the reference (modes
default and reduce-overhead). So the speedup over the eager reference that they imply for a
baseline variant is ``score_default / score_<variant>``; that is the figure ours is compared with.

Each problem becomes a KernelBench operation named ``kb.cudal1-l<level>-<task>`` from its
``ref_code``, and its candidates are the variants below: CUDA-L1's three codes (the class a
variant defines mapped onto ``ModelNew``), torch.compile of the reference in three modes
(wrappers written here), and the null candidate (the reference itself, kernelcast.kernels.null). A
variant that cannot be built is skipped with the reason.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from kernelcast.kernels.formats.common import TaskFormatError, backend_of, top_level_names
from kernelcast.kernels.records import Candidate
from kernelcast.kernels.variants import variant_source

REPOSITORY = "github.com/deepreinforce-ai/CUDA-L1"
COMMIT = "51e8356bf844101cab2aeeca4bdff47ebb1953b8"
SOURCE_GPU = "h100"  # the file whose kernels are measured
GPUS = ("h100", "a100", "l40", "h20", "3090")  # the GPUs CUDA-L1 published speedups for, one file each
CODE_FIELDS = ("custom_code", "cuda_graph_code", "cudnn_code")
SCORES = ("score_default", "score_torch_compile_default", "score_torch_compile_reduce_overhead",
          "score_cuda_graph", "score_cudnn")
_GPU_FILE_NAMES = {"rtx3090": "3090"}  # kernelcast.kernels.hardware's routing name -> CUDA-L1's file name


def corpus_file(gpu: str = SOURCE_GPU) -> str:
    """The file of CUDA-L1's repository a GPU's kernels and speedups come from."""
    return f"optimized_cuda_code/{gpu}.json"


def published_gpu(gpu_type: str) -> str | None:
    """CUDA-L1's name for a kernelcast GPU type ('rtx3090' -> '3090'), or None where they published nothing."""
    name = _GPU_FILE_NAMES.get(gpu_type, gpu_type)
    return name if name in GPUS else None


@dataclass(frozen=True)
class Problem:
    """One KernelBench problem as CUDA-L1 published it: its reference, codes, and scores per GPU."""

    level: int
    task_id: int
    ref_code: str
    codes: Mapping[str, str | None]  # custom_code, cuda_graph_code, cudnn_code of the source GPU's file
    scores: Mapping[str, Mapping[str, float | None]]  # gpu -> score name -> value (None: none published)
    same_code: Mapping[str, Mapping[str, bool | None]]  # gpu -> field -> that GPU's file has this very code

    @property
    def key(self) -> str:
        return f"l{self.level}-{self.task_id:03d}"

    @property
    def task_name(self) -> str:
        return f"cudal1-{self.key}"

    @property
    def op_name(self) -> str:
        return f"kb.{self.task_name}"


def _code(value) -> str | None:
    return value if isinstance(value, str) and value.strip() and value.strip() != "None" else None


def _score(value) -> float | None:
    """A published score as a number; their files hold floats, nulls, and strings that may not be numbers."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _read_lines(path: Path) -> dict[tuple[int, int], dict]:
    rows = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[(int(row["level_id"]), int(row["task_id"]))] = row
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskFormatError(f"{path}:{n}: not a CUDA-L1 row (one JSON object with level_id and task_id "
                                  f"a line): {exc}") from None
    return rows


def read_corpus(folder: str | Path) -> list[Problem]:
    """The problems of ``folder``'s ``h100.jsonl``, with every other GPU's scores found beside it, by level and task."""
    folder = Path(folder)
    source = folder / f"{SOURCE_GPU}.jsonl"
    if not source.is_file():
        raise TaskFormatError(f"no CUDA-L1 corpus at {folder}: {source.name} is missing (one JSON row a line, "
                              f"from {REPOSITORY} {corpus_file()})")
    files = {gpu: _read_lines(folder / f"{gpu}.jsonl") for gpu in GPUS if (folder / f"{gpu}.jsonl").is_file()}
    problems = []
    for (level, task), row in sorted(files[SOURCE_GPU].items()):
        codes = {f: _code(row.get(f)) for f in CODE_FIELDS}
        scores, same = {}, {}
        for gpu in GPUS:
            other = files.get(gpu, {}).get((level, task))
            scores[gpu] = {s: _score(other.get(s)) if other else None for s in SCORES}
            same[gpu] = {f: (_code(other.get(f)) == codes[f]) if other else None for f in CODE_FIELDS}
        problems.append(Problem(level, task, row["ref_code"], codes, scores, same))
    return problems


# ---- the variants -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """One implementation of every problem, and how its published speedup over the eager reference is read."""

    name: str
    field: str | None = None  # the corpus field its code comes from; None: written here
    compile_mode: str | None = None  # torch.compile of the reference, in this mode
    over: str | None = None  # the score of custom_code over this variant; published speedup = default / it
    published: bool = True  # whether CUDA-L1 published a figure this variant's speedup can be compared with

    def published_speedup(self, problem: Problem, gpu: str) -> float | None:
        """The speedup over the eager reference on ``gpu`` that CUDA-L1's scores imply, or None."""
        scores = problem.scores.get(gpu) or {}
        default = scores.get("score_default")
        if not self.published or default is None:
            return None
        if self.over is None:
            return default
        over = scores.get(self.over)
        return default / over if over else None


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("custom", field="custom_code"),
    Variant("cuda-graph", field="cuda_graph_code", over="score_cuda_graph"),
    Variant("cudnn", field="cudnn_code", over="score_cudnn"),
    Variant("compile-default", compile_mode="default", over="score_torch_compile_default"),
    Variant("compile-reduce-overhead", compile_mode="reduce-overhead", over="score_torch_compile_reduce_overhead"),
    # its compile autotunes under the GPU lock for minutes: a name of its own, to be left out
    Variant("compile-max-autotune", compile_mode="max-autotune-no-cudagraphs", published=False),
    Variant("null", published=False),  # the reference itself: 1.00x is the harness's to meet, not a figure of theirs
)}


def variants_named(spec: str | Sequence[str]) -> list[str]:
    """Variant names from 'all' or a comma-separated list, checked."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if names == ["all"]:
        return list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise ValueError(f"unknown variant {', '.join(unknown) or '(none given)'}; known: {', '.join(VARIANTS)}, "
                         "or all")
    return list(dict.fromkeys(names))


_MAPPED = "\n\n# ---- kernelcast: the {cls} this variant defines is the candidate ----\nModelNew = {cls}\n"


def submission(problem: Problem, variant: str) -> tuple[str | None, str]:
    """(the variant's KernelBench submission, '') or (None, why it cannot be built). The null is built from its op."""
    v = VARIANTS[variant]
    if v.compile_mode is not None:
        return variant_source(problem.ref_code, f"compile-{v.compile_mode}"), ""
    if v.field is None:
        return None, "built from the imported operation (kernelcast.kernels.null)"
    code = problem.codes.get(v.field)
    if code is None:
        score = problem.scores.get(SOURCE_GPU, {}).get("score_default")
        also = f" (its {SOURCE_GPU} score_default, {score:g}, was published without the code)" if score else ""
        return None, f"CUDA-L1 published no {v.field} for this problem{also}"
    try:
        names = top_level_names(code, v.field)
    except TaskFormatError as exc:
        return None, f"{exc} (as published)"
    if names.get("ModelNew") == "class":
        return code, ""
    if names.get("Model") == "class":
        return code.rstrip() + _MAPPED.format(cls="Model"), ""
    classes = sorted(n for n, kind in names.items() if kind == "class")
    return None, f"{v.field} defines no class ModelNew or Model (classes: {', '.join(classes) or 'none'})"


@dataclass(frozen=True)
class Built:
    """One variant of one problem: its candidate, or why there is none."""

    problem: Problem
    variant: str
    candidate: Candidate | None
    skipped: str = ""


def build(op, problem: Problem, variants: Sequence[str]) -> list[Built]:
    """The candidates of ``problem`` (imported as ``op``) for each named variant, origin ``import``."""
    from kernelcast.kernels.null import null_candidate

    out = []
    for name in variants:
        if name == "null":
            out.append(Built(problem, name, null_candidate(op)))
            continue
        text, why = submission(problem, name)
        cand = Candidate(op=op.name, backend=backend_of(text), source=op.wrap(text), origin="import") if text else None
        out.append(Built(problem, name, cand, why))
    return out


# ---- today's KernelBench file of the same problem ------------------------------------------------------

@dataclass(frozen=True)
class KernelBenchMatch:
    """How CUDA-L1's ref_code compares with today's KernelBench file of the same level and number."""

    file: str  # relative to the KernelBench folder; "" when there is none
    status: str  # identical | differs | missing
    summary: str  # what differs, in a line


def kernelbench_file(folder: Path, level: int, task_id: int) -> Path | None:
    found = sorted(p for p in (Path(folder) / f"level{level}").glob(f"{task_id}_*.py")
                   if p.name.split("_", 1)[0] == str(task_id))
    return found[0] if found else None


def compare_with_kernelbench(problem: Problem, folder: str | Path) -> KernelBenchMatch:
    """Whether ``problem``'s ref_code is today's KernelBench file, byte for byte, and if not what differs."""
    path = kernelbench_file(Path(folder), problem.level, problem.task_id)
    if path is None:
        return KernelBenchMatch("", "missing", f"no level{problem.level}/{problem.task_id}_*.py under {folder}")
    today = path.read_text()
    rel = str(path.relative_to(folder))
    if today == problem.ref_code:
        return KernelBenchMatch(rel, "identical", "")
    return KernelBenchMatch(rel, "differs", diff_summary(problem.ref_code, today))


def _constants(tree: ast.Module) -> dict[str, tuple[str, set[int]]]:
    """Top-level ``NAME = <expression without calls>`` (a problem's sizes): name -> (expression, its lines)."""
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and not any(isinstance(n, (ast.Call, ast.Lambda)) for n in ast.walk(node.value))):
            found[node.targets[0].id] = (ast.unparse(node.value), set(range(node.lineno, node.end_lineno + 1)))
    return found


def _owner(tree: ast.Module, line: int) -> str:
    for node in tree.body:
        if node.lineno <= line <= node.end_lineno and isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            return node.name
    return "module"


def diff_summary(ours: str, theirs: str, limit: int = 300) -> str:
    """What changed from ``ours`` to ``theirs``, in a line: the sizes, then other lines by the definition holding them."""
    if ours.split() == theirs.split():
        return "whitespace only"
    try:
        a, b = ast.parse(ours), ast.parse(theirs)
    except SyntaxError:
        return "one of the two does not parse"
    ca, cb = _constants(a), _constants(b)
    sizes = [f"{k} {ca[k][0]}->{cb[k][0]}" for k in ca if k in cb and ca[k][0] != cb[k][0]]
    sizes += [f"-{k}" for k in ca if k not in cb] + [f"+{k}={cb[k][0]}" for k in cb if k not in ca]
    skip_a = set().union(*(lines for _, lines in ca.values()))
    skip_b = set().union(*(lines for _, lines in cb.values()))
    la = [(i, s.rstrip()) for i, s in enumerate(ours.splitlines(), 1) if i not in skip_a and s.strip()]
    lb = [(i, s.rstrip()) for i, s in enumerate(theirs.splitlines(), 1) if i not in skip_b and s.strip()]
    removed, added, where = 0, 0, {}
    matcher = difflib.SequenceMatcher(None, [s for _, s in la], [s for _, s in lb], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = removed + (i2 - i1), added + (j2 - j1)
        for i, _ in la[i1:i2]:
            where[_owner(a, i)] = None
        for j, _ in lb[j1:j2]:
            where[_owner(b, j)] = None
    parts = [f"sizes: {', '.join(sizes)}"] if sizes else []
    if removed or added:
        parts.append(f"other lines -{removed} +{added} in {', '.join(where)}")
    text = "; ".join(parts) or "blank lines only"
    return text if len(text) <= limit else text[:limit - 3] + "..."
