"""Template spaces: for each operation, Triton source templates and a grid of launch parameters.

A space is a set of *algorithms* (one Triton source module each, e.g. one-pass online vs
two-pass softmax) and, per algorithm, ordered parameter *axes* (block sizes, num_warps,
num_stages, rows per program, ...). A variant is one algorithm plus one value per axis,
kept when the space's ``valid`` rule accepts it. Variants become ``Candidate``s whose
source is the algorithm's module text and whose params are the axis values.

Mutation moves one axis to a neighbouring value (or switches algorithm, keeping the
shared axes); crossover takes each axis from one of two parents. Both repair to the
nearest valid variant so a search never leaves the space.

The algorithms and valid rule of each space are declared by its operation (each module under
``kernels/ops/``); this module is the machinery over them, and ``get_space`` finds an
operation's space through the one registry, ``kernelcast.kernels.ops.OPERATIONS``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from kernelcast.kernels.ops import OPERATIONS, get_operation
from kernelcast.kernels.ops.base import Algorithm
from kernelcast.kernels.records import Candidate

__all__ = ["Algorithm", "TemplateSpace", "get_space"]


@dataclass
class TemplateSpace:
    op: str
    algorithms: Sequence[Algorithm]
    valid: Callable[[str, Mapping[str, Any]], bool] = lambda algorithm, params: True
    _variants: list[Candidate] | None = field(default=None, repr=False)
    _neighbours: dict = field(default_factory=dict, repr=False)  # candidate id -> its neighbours

    def algorithm(self, name: str) -> Algorithm:
        for algo in self.algorithms:
            if algo.name == name:
                return algo
        known = ", ".join(a.name for a in self.algorithms)
        raise ValueError(f"{self.op} has no algorithm {name!r}; known: {known}")

    def candidate(self, algorithm: str, params: Mapping[str, Any], parent_id: str | None = None) -> Candidate:
        algo = self.algorithm(algorithm)
        missing = set(algo.axes) - set(params)
        extra = set(params) - set(algo.axes)
        if missing or extra:
            raise ValueError(f"{self.op}/{algorithm}: params missing {sorted(missing)}, unexpected {sorted(extra)}")
        return Candidate(op=self.op, backend="triton", source=algo.source, params=dict(params),
                         template=f"{self.op}/{algorithm}", parent_id=parent_id, origin="template")

    def variants(self) -> list[Candidate]:
        """Every valid variant, in a fixed order (algorithm, then axes in declaration order)."""
        if self._variants is None:
            out = []
            for algo in self.algorithms:
                for params in _grid(algo.axes):
                    if self.valid(algo.name, params):
                        out.append(self.candidate(algo.name, params))
            self._variants = out
        return list(self._variants)

    def spread_subset(self, limit: int | None) -> list[Candidate]:
        """``limit`` variants spread evenly over the whole space (all of them when None)."""
        allv = self.variants()
        if limit is None or limit >= len(allv):
            return allv
        if limit <= 0:
            return []
        step = len(allv) / limit
        return [allv[int(i * step)] for i in range(limit)]

    def algorithm_of(self, candidate: Candidate) -> str:
        if candidate.template is None or not candidate.template.startswith(self.op + "/"):
            raise ValueError(f"candidate {candidate.candidate_id} is not from the {self.op} template space")
        return candidate.template.split("/", 1)[1]

    def neighbours(self, candidate: Candidate) -> list[Candidate]:
        """Valid variants one step away along one axis, or the same params under another algorithm."""
        known = self._neighbours.get(candidate.candidate_id)
        if known is not None:
            return list(known)
        algo_name = self.algorithm_of(candidate)
        algo = self.algorithm(algo_name)
        out = []
        for axis, values in algo.axes.items():
            values = list(values)
            i = values.index(candidate.params[axis])
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    params = {**candidate.params, axis: values[j]}
                    if self.valid(algo_name, params):
                        out.append(self.candidate(algo_name, params, candidate.candidate_id))
        for other in self.algorithms:
            if other.name != algo_name:
                params = self._repair(other, candidate.params)
                if params is not None:
                    out.append(self.candidate(other.name, params, candidate.candidate_id))
        self._neighbours[candidate.candidate_id] = tuple(out)
        return out

    def mutate(self, candidate: Candidate, rng: random.Random) -> Candidate:
        """A random neighbour; the candidate itself when it has none."""
        options = self.neighbours(candidate)
        return rng.choice(options) if options else candidate

    def crossover(self, a: Candidate, b: Candidate, rng: random.Random) -> Candidate:
        """Each axis from one parent at random, under either parent's algorithm; repaired if invalid."""
        algo = self.algorithm(rng.choice([self.algorithm_of(a), self.algorithm_of(b)]))
        mixed = {}
        for axis in algo.axes:
            choices = [p.params[axis] for p in (a, b) if axis in p.params]
            mixed[axis] = rng.choice(choices) if choices else algo.axes[axis][0]
        params = self._repair(algo, mixed)
        if params is None:
            return a
        return self.candidate(algo.name, params, a.candidate_id)

    def _repair(self, algo: Algorithm, params: Mapping[str, Any]) -> dict | None:
        """The valid variant of ``algo`` that shares the most axis values with ``params``."""
        wanted = {axis: params.get(axis) for axis in algo.axes}
        if all(v in algo.axes[k] for k, v in wanted.items()) and self.valid(algo.name, wanted):
            return wanted
        best, best_score = None, -1
        for cand in (c for c in self.variants() if c.template == f"{self.op}/{algo.name}"):
            score = sum(cand.params[k] == v for k, v in wanted.items())
            if score > best_score:
                best, best_score = dict(cand.params), score
        return best


def _grid(axes: Mapping[str, Sequence[Any]]):
    names = list(axes)

    def rec(i, acc):
        if i == len(names):
            yield dict(acc)
            return
        for value in axes[names[i]]:
            acc[names[i]] = value
            yield from rec(i + 1, acc)

    yield from rec(0, {})


_SPACES: dict[str, TemplateSpace] = {}  # one per operation, so its variants and neighbours are built once


def get_space(op: str) -> TemplateSpace:
    """The template space of operation ``op``, from the algorithms and valid rule its module declares."""
    space = _SPACES.get(op)
    if space is None:
        operation = get_operation(op)  # an unknown name fails here, naming the known ones
        if not operation.algorithms:
            with_space = ", ".join(name for name, o in OPERATIONS.items() if o.algorithms)
            raise ValueError(f"operation {op!r} has no template space; operations with one: {with_space}")
        space = _SPACES[op] = TemplateSpace(op=op, algorithms=operation.algorithms, valid=operation.valid_variant)
    return space
