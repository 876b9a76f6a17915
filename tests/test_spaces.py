"""Template spaces: size, distinct content-hashed variants, mutation and crossover, interpreter correctness."""

import os
import random
from pathlib import Path

import pandas as pd
import pytest

from kernelcast.kernels.harness.correctness import check_once, load_launch
from kernelcast.kernels.ops import OPERATIONS, get_operation
from kernelcast.kernels.spaces import get_space

OPS = list(OPERATIONS)
# The committed measured pool: every template variant and eager baseline, as they were generated.
POOL_CANDIDATES = Path(__file__).resolve().parents[1] / "data" / "pools" / "candidates"


@pytest.fixture(scope="module")
def pool():
    frame = pd.read_parquet(POOL_CANDIDATES, columns=["candidate_id", "op", "origin", "template"])
    return frame.assign(op=frame["op"].astype(str))


# The operations the committed pool measured (an operation added since is not in it until measured).
POOLED = ("softmax", "layernorm", "rmsnorm", "cross_entropy", "fp8_quant", "bias_gelu", "row_sum", "transpose",
          "matmul", "attention")


def test_the_pool_holds_the_pooled_operations_and_each_is_registered(pool):
    assert set(pool["op"]) == set(POOLED) and set(POOLED) <= set(OPS)


def test_every_template_variant_is_the_one_the_committed_pool_measured(pool):
    """A candidate id hashes op, backend, source text and params: one changed byte of a template shows here."""
    generated = {(op, c.candidate_id) for op in POOLED for c in get_space(op).variants()}
    committed = pool[pool["origin"] == "template"]
    assert generated == set(zip(committed["op"], committed["candidate_id"]))


def test_every_eager_baseline_is_the_one_the_committed_pool_measured(pool):
    generated = {(op, c.candidate_id) for op in POOLED for c in get_operation(op).seed_candidates()}
    committed = pool[pool["origin"] == "seed"]
    assert generated == set(zip(committed["op"], committed["candidate_id"]))


def test_space_sizes_are_those_of_the_committed_pool(pool):
    committed = pool[pool["origin"] == "template"].groupby("op").size().to_dict()
    assert {op: len(get_space(op).variants()) for op in POOLED} == committed
    assert sum(committed.values()) == 2325
    by_algorithm = pool[pool["origin"] == "template"].groupby("template").size().to_dict()
    assert {t: n for op in POOLED for t, n in _algorithm_sizes(op).items()} == by_algorithm


def _algorithm_sizes(op):
    sizes = {}
    for c in get_space(op).variants():
        sizes[c.template] = sizes.get(c.template, 0) + 1
    return sizes


def test_the_registry_is_the_one_place_operations_and_spaces_come_from():
    for op in OPS:
        space, operation = get_space(op), get_operation(op)
        assert space is get_space(op)  # built once: its variants and neighbours are cached
        assert tuple(space.algorithms) == operation.algorithms and space.op == operation.name == op


def test_a_space_of_an_unknown_operation_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown operation 'sofmax'; known: softmax, layernorm"):
        get_space("sofmax")


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
