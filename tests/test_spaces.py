"""Template spaces: size, distinct content-hashed variants, mutation and crossover, interpreter correctness."""

import os
import random

import pytest

from kernels.harness.correctness import check_once, load_launch
from kernels.ops import OPERATIONS, get_operation
from kernels.spaces import get_space

OPS = list(OPERATIONS)


@pytest.mark.parametrize("op", OPS)
def test_space_has_at_least_200_distinct_variants_over_several_algorithms(op):
    variants = get_space(op).variants()
    assert len(variants) >= 200
    assert len({c.candidate_id for c in variants}) == len(variants)
    assert len({c.template for c in variants}) >= 2
    assert all(c.op == op and c.backend == "triton" and "def launch" in c.source for c in variants)


@pytest.mark.parametrize("op", OPS)
def test_mutation_and_crossover_stay_inside_the_space(op):
    space = get_space(op)
    ids = {c.candidate_id for c in space.variants()}
    rng = random.Random(7)
    variants = space.variants()
    for _ in range(20):
        a, b = rng.choice(variants), rng.choice(variants)
        child = space.mutate(a, rng)
        assert child.candidate_id in ids and child.parent_id == a.candidate_id and child != a
        mixed = space.crossover(a, b, rng)
        assert mixed.candidate_id in ids


def test_neighbours_differ_in_one_axis_or_the_algorithm():
    space = get_space("softmax")
    start = space.variants()[40]
    for n in space.neighbours(start):
        if n.template == start.template:
            assert sum(n.params[k] != start.params[k] for k in start.params) == 1


@pytest.mark.parametrize("op", OPS)
def test_first_variant_of_each_algorithm_is_correct_under_the_interpreter(op):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a GPU is present: the GPU tests and the measured pool cover correctness there")
    operation, space = get_operation(op), get_space(op)
    firsts = {}
    for c in space.variants():
        firsts.setdefault(c.template, c)
    for cand in firsts.values():
        launch = load_launch(cand.source)
        problem = check_once(operation, operation.interpret_cases[0], launch, cand.params, seed=3, device="cpu")
        assert problem is None, f"{cand.template} {cand.params}: {problem}"
