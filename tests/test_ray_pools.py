"""The Ray layer on a real local cluster: two nodes, each emulating one GPU type with a custom resource.

Nothing is mocked: the nodes are real raylets (``ray.cluster_utils.Cluster``), the actors are
real processes, and their measurers replay a real measured pool.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from kernelcast.infra.measure import LocalMeasurePool, ReplayMeasurer  # noqa: E402
from kernelcast.infra.ray_pools import ForecasterPool, RayMeasurePool  # noqa: E402
from kernelcast.kernels.ops import get_operation  # noqa: E402
from kernelcast.storage.dataset import DataRoot  # noqa: E402
from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame  # noqa: E402
from kernelcast.surrogate.baselines import RooflineForecaster  # noqa: E402
from kernelcast.surrogate.forecast import ForecastRequest  # noqa: E402

COMMITTED_POOL = Path(__file__).resolve().parents[1] / "data" / "pools"
OP = "softmax"
N_CANDIDATES = 16
H200_DEVICE = "NVIDIA H200 (test copy of H100 rows)"


class SlowReplay(ReplayMeasurer):
    """Replay that takes ``delay_s`` per candidate, so a batch is still in flight when its actor is killed."""

    def __init__(self, pool, gpu_type: str, delay_s: float = 0.3):
        super().__init__(pool, gpu_type)
        self.delay_s = delay_s

    def measure(self, candidates):
        for m in super().measure(candidates):
            time.sleep(self.delay_s)
            yield m


class AdoptingReplay(SlowReplay):
    """SlowReplay that takes the references it is given and says in each answer which it holds."""

    def __init__(self, pool, gpu_type: str, delay_s: float = 0.3):
        super().__init__(pool, gpu_type, delay_s)
        self.adopted: tuple[str, ...] = ()

    def adopt_reference(self, m):
        self.adopted += (m.op,)
        return None

    def measure(self, candidates):
        for m in super().measure(candidates):
            yield dataclasses.replace(m, checks=f"adopted: {', '.join(self.adopted) or 'none'}")


# What the tests hand to actors (SlowReplay, factories) travels by value: the actors never import
# this module, whose imports (torch, scipy through the surrogates) would cost seconds per actor.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    """A head node holding one h100 and a second node holding one h200 (emulated: no real GPUs)."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"gpu_type:h100": 1}})
    c.add_node(num_cpus=1, resources={"gpu_type:h200": 1})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def pool_uri(tmp_path_factory) -> str:
    """A small replay pool with the same softmax rows on h100 and h200.

    The test does not lean on the committed pool's h200 measurements (still being added when it
    was written, and free to change): it copies committed h100 rows and rewrites their GPU type
    and device name, which is enough to tell which actor answered. A small pool also loads fast.
    """
    committed = DataRoot(str(COMMITTED_POOL))
    rows = measurements_from_frame(committed.read_measurements(op=OP, gpu_type="h100"))
    rows = sorted(rows, key=lambda m: m.candidate_id)[:N_CANDIDATES]
    h200 = [dataclasses.replace(m, gpu_type="h200", hardware=dataclasses.replace(
        m.hardware, gpu_type="h200", device_name=H200_DEVICE)) for m in rows]
    root = DataRoot(str(tmp_path_factory.mktemp("pool")))
    root.write_measurements(rows + h200)
    wanted = {m.candidate_id for m in rows}
    root.write_candidates([c for c in candidates_from_frame(committed.read_candidates(op=OP))
                           if c.candidate_id in wanted])
    return root.uri


@pytest.fixture()
def candidates(pool_uri):
    return sorted(candidates_from_frame(DataRoot(pool_uri).read_candidates(op=OP)), key=lambda c: c.candidate_id)


@pytest.fixture(scope="module")
def forecaster_pool(cluster):
    """Two actors each holding a fitted roofline forecaster (shared: each actor takes seconds to import it)."""
    p = ForecasterPool(_fitted_roofline, actors=2)
    yield p
    p.close()


@pytest.fixture()
def pool(cluster, pool_uri):
    p = RayMeasurePool.connect(cluster.address, replay_pool=pool_uri)
    yield p
    p.close()


def _node_resources(node_id: str) -> dict:
    return next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node_id)


def test_one_actor_per_gpu_sits_on_a_node_of_its_type(pool):
    assert pool.gpu_types == ["h100", "h200"]
    by_type = {a.gpu_type: a for a in pool.actors}
    assert len(pool.actors) == 2  # one unit of each type in the cluster, one actor each
    for gpu_type, actor in by_type.items():
        assert _node_resources(actor.node_id).get(f"gpu_type:{gpu_type}") == 1
        assert actor.mode == "replay"
    assert by_type["h100"].node_id != by_type["h200"].node_id


def test_measurements_come_from_the_actor_of_the_asked_gpu_type(pool, pool_uri, candidates):
    assert pool.prepare(OP, "h200").device_name == H200_DEVICE
    for gpu_type in ("h100", "h200"):
        got = {m.candidate_id: m for m in pool.measure(candidates, gpu_type)}
        assert set(got) == {c.candidate_id for c in candidates}
        assert {m.gpu_type for m in got.values()} == {gpu_type}
        assert all(m.status == "ok" and m.replayed and m.mode == "replay" for m in got.values())
        devices = {m.hardware.device_name for m in got.values()}
        assert (devices == {H200_DEVICE}) == (gpu_type == "h200")
        # The same answers as the single-machine pool replaying the same data.
        local = LocalMeasurePool([ReplayMeasurer(pool_uri, gpu_type)])
        assert {m.candidate_id: m for m in local.measure(candidates, gpu_type)} == got


def test_measurement_actors_import_no_orchestration(pool):
    assert all(a.orchestration_modules == () for a in pool.actors)


def test_an_unknown_gpu_type_errors_naming_the_types_there_are(pool, candidates):
    with pytest.raises(ValueError, match=r"'a100'.*h100, h200"):
        pool.measure(candidates, "a100")
    with pytest.raises(ValueError, match=r"'a100'.*h100, h200"):
        pool.prepare(OP, "a100")


def test_a_killed_actor_costs_only_its_in_flight_candidates_and_the_pool_goes_on(cluster, pool_uri, candidates):
    chunk, candidates = 4, candidates[:8]  # two chunks on the one h100 actor, measured one after the other
    p = RayMeasurePool.connect(cluster.address, measurer_factory=functools.partial(AdoptingReplay, pool_uri),
                               chunk_size=chunk)
    try:
        # every h100 actor takes the stored reference as its own, and a restarted one takes it again (below)
        (reference,) = ReplayMeasurer(pool_uri, "h100").measure([get_operation(OP).seed_candidates()[0]])
        assert p.adopt_reference(reference, "h100") is None
        victim = next(a for a in p.actors if a.gpu_type == "h100")
        handle = p._slots["h100"][0].handle  # the pool keeps handles to itself; the test reaches in to kill
        got = []
        for m in p.measure(candidates, "h100"):
            got.append(m)
            if len(got) == 1:  # the first chunk is still being measured: kill its actor now
                ray.kill(handle, no_restart=False)
        assert sorted(m.candidate_id for m in got) == sorted(c.candidate_id for c in candidates)
        crashed = [m for m in got if m.status == "crashed"]
        assert 1 <= len(crashed) <= chunk - 1  # only what was in flight, never the whole batch
        assert all("died" in m.error and m.gpu_type == "h100" for m in crashed)
        assert all(m.status == "ok" for m in got if m not in crashed)
        restarted = next(a for a in p.actors if a.gpu_type == "h100")
        assert restarted.pid != victim.pid and restarted.node_id == victim.node_id
        again = list(p.measure([c for c in candidates if c.candidate_id in {m.candidate_id for m in crashed}], "h100"))
        assert len(again) == len(crashed) and all(m.status == "ok" for m in again)
        assert all(m.checks == f"adopted: {OP}" for m in again + [m for m in got if m not in crashed])
    finally:
        p.close()


def _requests(candidates, op: str = OP) -> list[ForecastRequest]:
    hardware = ReplayMeasurer(str(COMMITTED_POOL), "h100").prepare(OP)
    anchor = get_operation(OP).seed_candidates()[0]
    cases = tuple(c.name for c in get_operation(OP).cases)
    return [ForecastRequest(anchor, c, op, hardware, case_names=cases) for c in candidates]


def _fitted_roofline():
    return RooflineForecaster().fit()


def test_forecaster_pool_returns_the_in_process_forecasts_in_request_order(forecaster_pool, candidates):
    requests = _requests(candidates[::-1])  # an order that is not the pool's own
    expected = _fitted_roofline().forecast(requests)
    got = forecaster_pool.forecast(requests)
    assert (forecaster_pool.name, forecaster_pool.version) == (expected[0].surrogate, expected[0].surrogate_version)
    strip = lambda f: dataclasses.replace(f, latency_s=0.0)  # noqa: E731 - the only field timing may change
    assert [strip(f) for f in got] == [strip(f) for f in expected]
    assert forecaster_pool.forecast([]) == []


def test_a_failing_forecaster_chunk_comes_back_unparsed_and_the_rest_is_kept(forecaster_pool, candidates):
    good = _requests(candidates[:3])
    bad = _requests(candidates[3:6], op="no_such_op")  # the roofline raises on an unknown operation
    got = forecaster_pool.forecast(good + bad)  # two actors, chunks of three: the second one fails
    assert [f.candidate_id for f in got] == [r.candidate.candidate_id for r in good + bad]
    assert [f.parsed for f in got] == [True] * 3 + [False] * 3
    assert all("forecaster actor 1 failed" in f.raw_response for f in got[3:])
    assert [f.probabilities for f in got[:3]] == [f.probabilities for f in _fitted_roofline().forecast(good)]
    assert [f.parsed for f in forecaster_pool.forecast(good + good)] == [True] * 6  # both actors still serve


def test_the_example_cluster_config_is_valid_and_labels_every_gpu_with_its_type():
    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((COMMITTED_POOL.parents[1] / "infra" / "cluster.yaml").read_text()))
    validate_config(config)  # Ray's own cluster-launcher schema
    types = {}
    for name, node in config["available_node_types"].items():
        labels = {k: v for k, v in node["resources"].items() if k.startswith("gpu_type:")}
        assert sum(labels.values()) == node["resources"].get("GPU", 0), name  # one unit per GPU, one actor each
        types.update(labels)
    assert set(types) == {"gpu_type:h100", "gpu_type:h200"}


def test_an_emulated_gpu_type_without_a_replay_pool_fails_at_connect_naming_the_fix(cluster):
    with pytest.raises(Exception, match="no replay pool was given") as failure:
        RayMeasurePool.connect(cluster.address)
    assert isinstance(failure.value, ray.exceptions.RayActorError)
    deadline = time.monotonic() + 10  # nothing is left holding the GPUs (Ray frees them asynchronously)
    while ray.available_resources().get("gpu_type:h100") != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("gpu_type:h100") == 1
