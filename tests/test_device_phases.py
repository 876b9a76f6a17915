"""One child on the device at a time: compile ahead on the CPU, every device phase under the lock, memory budgeted.

Run through the real worker and sandboxed children under Triton's interpreter: the
worker's timeline records when each child took and released the GPU lock, when it
made its first inputs, and what the others did meanwhile. Compiling ahead for a real
GPU target is checked in a process without the interpreter (Triton compiles CUDA
kernels with no GPU present).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.records import Candidate, HardwareSpec
from kernelcast.kernels.spaces import get_space

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OUT_OF_MEMORY = '''
import torch


def launch(x, out):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
'''


def _measure(cands, **config):
    cfg = WorkerConfig(**{"mode": "interpreter", "concurrency": 3, "timeout_s": 60, "seeds": 1, **config})
    with MeasureWorker(CPU, cfg) as worker:
        results = {m.candidate_id: m for m in worker.measure(cands)}
        return results, worker


def _intervals(timeline, start: str, end: str) -> dict[tuple[str, int], tuple[float, float]]:
    """(candidate, attempt) -> (time of phase ``start``, time of phase ``end``)."""
    seen: dict[tuple[str, int], dict[str, float]] = {}
    for cid, attempt, phase, t, _ in timeline:
        seen.setdefault((cid, attempt), {})[phase] = t
    return {k: (v[start], v[end]) for k, v in seen.items() if start in v and end in v}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.fixture(scope="module")
def batch():
    cands = get_space("softmax").spread_subset(6)
    results, worker = _measure(cands)
    return cands, results, worker


def _holds(timeline) -> list[tuple[tuple[str, int], float, float, bool]]:
    """Each hold of the lock: (child, start, end, shared). A child that checked with the lock shared holds it three
    times: from "locked" to "exclusive_wait", alone from "exclusive" to "shared_again" (or "share_wait"), and shared
    again from "shared_again" for its recheck; "releasing" ends its last hold."""
    marks: dict[tuple[str, int], dict[str, tuple[float, object]]] = {}
    for cid, attempt, phase, t, detail in timeline:
        marks.setdefault((cid, attempt), {})[phase] = (t, detail)
    holds = []
    for key, m in marks.items():
        if "locked" not in m or "releasing" not in m:
            continue
        shared = bool((m["locked"][1] or {}).get("shared"))
        if shared and "exclusive" in m and "shared_again" in m:
            end_alone = m.get("share_wait", m["shared_again"])[0]
            holds += [(key, m["locked"][0], m["exclusive_wait"][0], True), (key, m["exclusive"][0], end_alone, False),
                      (key, m["shared_again"][0], m["releasing"][0], True)]
        elif shared and "exclusive" in m:  # failed while it held the device alone
            holds += [(key, m["locked"][0], m["exclusive_wait"][0], True), (key, m["exclusive"][0], m["releasing"][0], False)]
        else:  # alone throughout, or failed before its checks ended
            holds.append((key, m["locked"][0], m["releasing"][0], shared))
    return holds


def _clashes(holds) -> list:
    """Pairs of holds of two children that overlap where one of them held the lock alone."""
    return [(a, b) for i, a in enumerate(holds) for b in holds[i + 1:]
            if a[0] != b[0] and not (a[3] and b[3]) and _overlap(a[1:3], b[1:3])]


def test_no_child_holds_the_device_beside_one_holding_it_alone_while_others_compile(batch):
    cands, results, worker = batch
    assert all(results[c.candidate_id].status == "ok" for c in cands), [m.error for m in results.values()]
    holds = _holds(worker.timeline)
    assert {h[0] for h in holds} == set(_intervals(worker.timeline, "started", "released"))
    assert len({h[0] for h in holds}) == len(cands)
    assert not _clashes(holds)
    # every child timed (here: rechecked) alone, after its checks
    alone = {h[0] for h in holds if not h[3]}
    assert len(alone) == len(cands)
    # concurrency did happen: some child compiled ahead while another held the device
    ahead = _intervals(worker.timeline, "started", "ahead_done")
    assert any(_overlap(ahead[a[0]], a_hold[1:3]) for a in holds for a_hold in holds if a[0] != a_hold[0])


SLOW_SOFTMAX = '''
import time

import torch


def launch(x, out):
    time.sleep({seconds})  # a slow call: its checks last long enough for another child's to begin beside them
    e = (x.float() - x.float().amax(dim=-1, keepdim=True)).exp()
    out.copy_((e / e.sum(dim=-1, keepdim=True)).to(x.dtype))
'''


def _slow(seconds: float, n: int) -> list[Candidate]:
    return [Candidate(op="softmax", backend="torch", origin="llm", source=SLOW_SOFTMAX.format(seconds=seconds)
                      + f"# variant {i}\n") for i in range(n)]


def test_checks_run_beside_other_childrens_checks_and_timing_never_does():
    results, worker = _measure(_slow(0.3, 3), concurrency=3)
    assert all(m.status == "ok" for m in results.values()), [m.error for m in results.values()]
    holds = _holds(worker.timeline)
    assert not _clashes(holds)
    shared = [h for h in holds if h[3]]
    assert len(shared) == 6 and worker.stats.shared_checks == 3  # each child's checks, then its recheck
    assert any(_overlap(a[1:3], b[1:3]) for a in shared for b in shared if a[0] != b[0]), "no two checks overlapped"
    # the device's busy time counts overlapping checks once; the children are charged each their own holds
    span = max(h[2] for h in holds) - min(h[1] for h in holds)
    assert worker.held_gpu_seconds <= span + 0.01 < sum(h[2] - h[1] for h in holds)
    assert len(worker.holds) == len(holds)
    # each child's wait for the lock alone came between its checks and its hold alone
    order = {}
    for cid, attempt, phase, t, _ in worker.timeline:
        if phase in ("checked", "exclusive_wait", "exclusive", "recheck"):
            order.setdefault((cid, attempt), []).append(phase)
    assert all(p[:3] == ["checked", "exclusive_wait", "exclusive"] and "recheck" in p[3:] for p in order.values())
    # nothing timed after it: each child's recheck held the device shared again, beside other children's checks,
    # on the cores it compiled on
    again = {}
    for cid, attempt, phase, t, detail in worker.timeline:
        if phase in ("exclusive", "shared_again", "share_wait", "recheck"):
            again.setdefault((cid, attempt), []).append(phase)
    assert all([p for p in ph if p != "share_wait"][:3] == ["exclusive", "shared_again", "recheck"]
               for ph in again.values()), again
    assert len([h for h in holds if h[3]]) == 6
    # each child's threads at the lock and when it let the shared hold go (a thread started in the checks shows here)
    waits = [d for _, _, phase, _, d in worker.timeline if phase == "exclusive_wait"]
    assert len(waits) == 3 and all(d["threads_at_lock"] >= 1 and d["threads"] >= 1 for d in waits)


def test_without_shared_checks_no_two_children_ever_hold_the_device_at_once():
    results, worker = _measure(_slow(0.2, 3), concurrency=3, shared_checks=False)
    assert all(m.status == "ok" for m in results.values()), [m.error for m in results.values()]
    holds = _holds(worker.timeline)
    assert len(holds) == 3 and not [h for h in holds if h[3]] and worker.stats.shared_checks == 0
    assert not [(a, b) for i, a in enumerate(holds) for b in holds[i + 1:] if _overlap(a[1:3], b[1:3])]


def test_first_inputs_are_made_only_while_holding_the_lock(batch):
    _, _, worker = batch
    locked = _intervals(worker.timeline, "locked", "releasing")
    first = {(cid, n): t for cid, n, phase, t, _ in worker.timeline if phase == "first_inputs"}
    assert set(first) == set(locked)
    for key, t in first.items():
        assert locked[key][0] <= t <= locked[key][1]


def test_each_child_frees_its_device_memory_before_releasing_the_lock(batch):
    _, _, worker = batch
    releasing = [detail for _, _, phase, _, detail in worker.timeline if phase == "releasing"]
    assert releasing and all(d["device_bytes_left"] == 0 for d in releasing)
    order = [phase for _, _, phase, _, _ in worker.timeline if phase in ("releasing", "released")]
    assert order == ["releasing", "released"] * (len(order) // 2)


def test_children_take_the_lock_with_what_they_made_ahead_frozen_out_of_the_collector(batch):
    """A full collection of a child with torch and Triton loaded took 0.1 s under the lock (an H200's host)."""
    _, _, worker = batch
    frozen = [d["frozen_objects"] for _, _, phase, _, d in worker.timeline if phase == "locked"]
    assert frozen and min(frozen) > 100_000


def test_release_collects_a_cycle_made_since_the_freeze():
    """What the candidate made under the lock is still collected: a cycle holding a tensor dies at release."""
    import gc
    import weakref

    import torch

    from kernelcast.kernels.harness.under_lock import _release_device
    from kernelcast.kernels.ops import get_operation

    class Holder:
        pass

    gc.freeze()
    try:
        a, b = Holder(), Holder()
        a.other, b.other, a.tensor = b, a, torch.ones(4)
        alive = weakref.ref(a)
        del a, b
        assert alive() is not None  # only a collection frees a cycle
        assert _release_device(None, get_operation("softmax"), gpu=False) == 0
        assert alive() is None
    finally:
        gc.unfreeze()


def test_a_first_call_that_cannot_run_on_meta_tensors_is_made_under_the_lock():
    data_dependent = Candidate(op="softmax", backend="torch", origin="llm", source=textwrap.dedent('''
        import torch


        def launch(x, out):
            if float(x.abs().max()) < 0:  # reads a value: impossible on meta tensors
                raise ValueError("never")
            e = (x.float() - x.float().amax(dim=-1, keepdim=True)).exp()
            out.copy_((e / e.sum(dim=-1, keepdim=True)).to(x.dtype))
        '''))
    results, worker = _measure([data_dependent])
    (m,) = results.values()
    assert m.status == "ok", m.error
    (ahead,) = [d for _, _, phase, _, d in worker.timeline if phase == "ahead_done"]
    assert len(ahead["deferred"]) == 3  # every interpreter case: its first call moved under the lock
    (locked,) = [d for _, _, phase, _, d in worker.timeline if phase == "locked"]
    assert locked["first_calls_to_compile"] == 3


def test_compiling_ahead_builds_cuda_kernels_without_a_gpu_or_cuda(tmp_path):
    """Triton compiles a template's kernels for an H100 (sm_90) from meta inputs at the GPU cases' sizes."""
    script = textwrap.dedent(f'''
        import glob, json, os
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ["TRITON_CACHE_DIR"] = {str(tmp_path)!r}
        import torch
        from kernelcast.kernels.harness.runner import Job, compile_ahead
        from kernelcast.kernels.ops import get_operation
        from kernelcast.kernels.spaces import get_space

        (cand,) = get_space("softmax").spread_subset(1)
        op = get_operation("softmax")
        job = Job(candidate=cand, mode="gpu", scratch_dir={str(tmp_path)!r}, lock_path="/nonexistent",
                  triton_cache_dir={str(tmp_path)!r}, compile_target="cuda:90")
        deferred = compile_ahead(job, op, op.cases)
        cubins = glob.glob({str(tmp_path)!r} + "/**/*.cubin", recursive=True)
        print(json.dumps({{"deferred": deferred, "cuda": torch.cuda.is_initialized(), "cubins": len(cubins)}}))
        ''')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**env, "PYTHONPATH": REPO},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["deferred"] == {} and report["cuda"] is False
    assert report["cubins"] >= 1


def test_launchers_of_tma_kernels_are_not_built_ahead(tmp_path):
    """A TMA template compiles ahead for an H100, but its launcher waits for the first launch.

    Built before CUDA's utilities are loaded, the launcher would keep None for the descriptor
    type and refuse every descriptor ("object must be of type PyCUtensorMap"), as seen on H200s."""
    script = textwrap.dedent(f'''
        import json, os
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ["TRITON_CACHE_DIR"] = {str(tmp_path)!r}
        import torch
        from kernelcast.kernels.harness import ahead
        from kernelcast.kernels.harness.correctness import call_candidate, load_launch, poisoned_outputs
        from kernelcast.kernels.ops import get_operation
        from kernelcast.kernels.spaces import get_space

        found = {{}}
        for name, family in (("matmul", "matmul/tma"), ("softmax", "softmax/")):
            cand = next(c for c in get_space(name).spread_subset(60) if c.template.startswith(family))
            op = get_operation(name)
            launch = load_launch(cand.source, {str(tmp_path)!r}, module_name="c_" + name)
            with ahead.compile_only(ahead.parse_target("cuda:90")) as compiled:
                gen = torch.Generator()
                gen.manual_seed(0)
                case = op.cases[0]
                call_candidate(launch, op.make_inputs(case, gen, "meta"), poisoned_outputs(op, case, "meta"), cand.params)
            found[family] = [ahead.warmable(k) for k in compiled]
        print(json.dumps(found))
        ''')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**env, "PYTHONPATH": REPO},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["matmul/tma"] and not any(found["matmul/tma"])
    assert found["softmax/"] and all(found["softmax/"])


def test_device_guard_refuses_cuda_before_torch_reaches_cuda():
    import torch

    from kernelcast.kernels.harness.ahead import DeviceGuard, NeedsDevice

    with DeviceGuard("cuda"):
        assert torch.empty(3, device="meta").shape == (3,)
        with pytest.raises(NeedsDevice, match="empty uses the cuda device"):
            torch.empty(3, device="cuda")
        with pytest.raises(NeedsDevice):
            torch.zeros(2).to("cuda:0")


# ---- out of memory: retried once, alone -----------------------------------------------------------------


def test_a_candidate_out_of_device_memory_is_retried_alone_before_its_verdict():
    hog = Candidate(op="softmax", backend="torch", source=OUT_OF_MEMORY, origin="llm")
    good = get_space("softmax").spread_subset(4)
    results, worker = _measure([good[0], hog] + good[1:])
    m = results[hog.candidate_id]
    assert m.status == "runtime_error"
    assert m.error.startswith("out of device memory even when measured alone") and "80.00 GiB" in m.error
    assert worker.stats.retried_alone == 1
    assert all(results[c.candidate_id].status == "ok" for c in good)
    lives = _intervals(worker.timeline, "started", "ended")
    (retry,) = [k for k in lives if k[1] == 2]
    assert retry[0] == hog.candidate_id
    assert not [k for k in lives if k != retry and _overlap(lives[k], lives[retry])]


def test_a_good_candidate_is_never_retried(batch):
    _, _, worker = batch
    assert worker.stats.retried_alone == 0
    assert {attempt for _, attempt, _, _, _ in worker.timeline} == {1}


# ---- on a GPU (skipped without one) ---------------------------------------------------------------------


@pytest.mark.gpu
def test_on_a_gpu_templates_compile_ahead_and_no_child_holds_the_device_beside_one_holding_it_alone():
    from kernelcast.kernels.hardware import detect
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    cands = get_space("softmax").spread_subset(6) + [null_candidate(op)]
    with MeasureWorker(detect(), WorkerConfig(mode="gpu", concurrency=4)) as worker:
        results = {m.candidate_id: m for m in worker.measure(cands)}
        timeline = list(worker.timeline)
    assert all(m.status == "ok" for m in results.values()), [m.error for m in results.values()]
    aheads = [d for _, _, phase, _, d in timeline if phase == "ahead_done"]
    assert aheads and all(d["deferred"] == [] for d in aheads)  # every Triton kernel compiled before the lock
    holds = _holds(timeline)
    # every child (the candidates and the op's reference) held the device alone for its timing, beside no other
    assert not _clashes(holds) and {h[0] for h in holds if not h[3]} == {h[0] for h in holds}
    assert len({h[0] for h in holds}) >= len(cands)
    first = {(cid, n): t for cid, n, phase, t, _ in timeline if phase == "first_inputs"}
    assert all(any(h[0] == k and h[1] <= t <= h[2] for h in holds) for k, t in first.items())
    left = [d["device_bytes_left"] for _, _, phase, _, d in timeline if phase == "releasing"]
    assert all(0 <= b < 64 << 20 for b in left), left  # what is left is not case data
    null = results[null_candidate(op).candidate_id]
    assert abs(1 - null.speedup) < 0.05, null.speedup


def test_plan_keeps_the_last_core_and_its_hyperthreads_for_the_lock_holder():
    from kernelcast.kernels.harness import cores

    pairs = {0: {0, 4}, 4: {0, 4}, 1: {1, 5}, 5: {1, 5}, 2: {2, 6}, 6: {2, 6}, 3: {3, 7}, 7: {3, 7}}
    p = cores.plan(range(8), siblings_of=pairs.__getitem__)
    assert p == cores.CorePlan(timing=(3, 7), compile=(0, 1, 2, 4, 5, 6)) and p.reserved
    assert cores.plan([0, 1], siblings_of=lambda c: {c}).timing == (1,)
    # one core, or one core's hyperthreads: nothing to split; asked not to reserve: nothing either
    assert not cores.plan([0, 4], siblings_of=pairs.__getitem__).reserved
    assert cores.plan([5], siblings_of=pairs.__getitem__) == cores.CorePlan((5,), (5,))
    assert not cores.plan(range(8), reserve=False, siblings_of=pairs.__getitem__).reserved
    assert cores.parse_cpu_list("0-2,8,10-11\n") == {0, 1, 2, 8, 10, 11}
    with pytest.raises(ValueError, match="no CPUs"):
        cores.plan([])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to reserve one")
def test_the_lock_holder_runs_alone_on_the_reserved_core_and_compiling_children_never_do():
    cands = get_space("softmax").spread_subset(3)
    results, worker = _measure(cands, reserve_timing_core=True)
    assert all(m.status == "ok" for m in results.values()), [m.error for m in results.values()]
    plan = worker.cores
    assert plan.reserved
    cpus = {phase: [tuple(d["cpus"]) for _, _, p, _, d in worker.timeline if p == phase]
            for phase in ("ahead_done", "locked", "exclusive", "shared_again")}
    assert cpus["ahead_done"] == [plan.compile] * len(cands)
    # checking with the lock shared (beside others), a child keeps its compile cores; alone, it takes the timing core
    assert cpus["locked"] == [plan.compile] * len(cands)
    assert cpus["exclusive"] == [plan.timing] * len(cands)
    assert cpus["shared_again"] == [plan.compile] * len(cands)  # its recheck, shared again: back on its own cores
    _, alone = _measure(cands[:2], reserve_timing_core=True, shared_checks=False)
    assert [tuple(d["cpus"]) for _, _, p, _, d in alone.timeline if p == "locked"] == [alone.cores.timing] * 2
    # in interpreter mode nothing is timed, so by default nothing is reserved
    _, plain = _measure(cands[:1])
    assert not plain.cores.reserved


def test_a_shared_gpu_lock_held_by_another_process_keeps_every_child_off_the_device_until_released(tmp_path):
    """With ``gpu_lock`` (an inference engine's lock file), children wait for that lock like for their own:
    while another process holds it no child enters its device phase, and all finish once it is released."""
    import fcntl
    import threading
    import time

    lock = tmp_path / "gpu.lock"
    cands = get_space("softmax").spread_subset(2)
    holder = open(lock, "a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    found = {}

    def measure():
        cfg = WorkerConfig(mode="interpreter", concurrency=3, timeout_s=60, seeds=1, gpu_lock=str(lock))
        with MeasureWorker(CPU, cfg) as worker:
            found["worker"] = worker
            found["results"] = {m.candidate_id: m for m in worker.measure(cands)}
        found["timeline"] = list(worker.timeline)

    def queued() -> int:
        worker = found.get("worker")
        return 0 if worker is None else sum(phase == "waiting" for _, _, phase, _, _ in list(worker.timeline))

    thread = threading.Thread(target=measure)
    thread.start()
    deadline = time.monotonic() + 60.0
    while queued() < len(cands) and time.monotonic() < deadline:  # both compile ahead and queue for the lock
        time.sleep(0.2)
    time.sleep(1.0)  # and stay off the device a while longer
    released_at = time.monotonic()
    fcntl.flock(holder, fcntl.LOCK_UN)
    holder.close()
    thread.join(120)
    assert len(found["results"]) == 2 and all(m.status == "ok" for m in found["results"].values())
    locked = [t for _, _, phase, t, _ in found["timeline"] if phase == "locked"]
    waiting = [t for _, _, phase, t, _ in found["timeline"] if phase == "waiting"]
    assert min(waiting) < released_at, "no child was ready before the lock was released: the test shows nothing"
    assert len(locked) == 2 and min(locked) >= released_at, "a child took the device while the lock was held"


def test_the_shared_gpu_lock_comes_from_the_environment_by_default(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELCAST_GPU_LOCK", str(tmp_path / "shared.lock"))
    assert WorkerConfig().gpu_lock == str(tmp_path / "shared.lock")
    monkeypatch.delenv("KERNELCAST_GPU_LOCK")
    assert WorkerConfig().gpu_lock is None


def test_share_gives_each_gpu_worker_whole_cores_of_its_own():
    from kernelcast.kernels.harness import cores

    # hyperthreads numbered as Linux does on many machines: cpu i and i + 4 share a core
    pairs = {c: {c % 4, c % 4 + 4} for c in range(8)}
    a, b = (cores.share(i, 2, range(8), siblings_of=pairs.__getitem__) for i in range(2))
    assert a == (0, 1, 4, 5) and b == (2, 3, 6, 7)  # not 0-3 / 4-7, which would put both on every core
    shares = [cores.share(i, 3, range(16), siblings_of=lambda c: {c}) for i in range(3)]
    assert sorted(c for s in shares for c in s) == list(range(16)) and [len(s) for s in shares] == [5, 5, 6]
    # each share still keeps a core for its own lock holder
    assert cores.plan(a, siblings_of=pairs.__getitem__).timing == (1, 5)
    with pytest.raises(ValueError, match="index"):
        cores.share(2, 2, range(8))
    with pytest.raises(ValueError, match="4 cores cannot be shared among 5"):
        cores.share(0, 5, range(8), siblings_of=pairs.__getitem__)


def _machine_of_gpus(root, *uuids):
    """A driver's list of a machine's GPUs, as /proc/driver/nvidia/gpus holds it: a folder a GPU, by PCI address."""
    for i, uuid in enumerate(uuids):
        bus = root / f"0000:00:0{6 + i}.0"
        bus.mkdir(parents=True)
        (bus / "information").write_text(f"Model: \t\t NVIDIA H200\nGPU UUID: \t {uuid}\nBus Location: \t {bus.name}\n")
    return str(root)


def test_a_process_told_one_of_the_machines_gpus_takes_that_gpus_share_of_the_cores(tmp_path):
    """Two sweeps, one per GPU of a two-GPU host, each started with CUDA_VISIBLE_DEVICES alone: each takes its GPU's
    share, so their lock holders never share a core (on two H200s, both kept core 31 and five honest calls were
    rejected as work left on the device)."""
    from kernelcast.kernels.harness import cores

    gpus = _machine_of_gpus(tmp_path / "gpus", "GPU-0b2bfbfe", "GPU-fa6fd60d")
    assert cores.gpu_of_machine("1", gpus) == (1, 2) and cores.gpu_of_machine("GPU-0b2bfbfe", gpus) == (0, 2)
    first, second = (cores.this_gpus_share(v, gpus, cpus=range(32), machine_cpus=32) for v in ("0", "GPU-fa6fd60d"))
    assert first and second and not set(first) & set(second) and set(first) | set(second) == set(range(32))
    assert cores.plan(first).timing != cores.plan(second).timing
    # a process that sees all of them, or several, or a GPU the driver does not list, keeps every core
    for visible in (None, "", "0,1", "2", "GPU-unknown", "MIG-0b2bfbfe"):
        assert cores.this_gpus_share(visible or "", gpus, cpus=range(32), machine_cpus=32) is None, visible
    # a machine of one GPU, no driver here, or fewer cores than GPUs: nothing to share
    assert cores.this_gpus_share("0", _machine_of_gpus(tmp_path / "one", "GPU-a"), range(32), 32) is None
    assert cores.this_gpus_share("0", str(tmp_path / "no-driver"), cpus=range(32), machine_cpus=32) is None
    assert cores.this_gpus_share("1", gpus, cpus=[0], machine_cpus=1) is None
    # a process already given its share (taskset -c 16-31 for GPU 1) keeps it whole, not a half of it
    assert cores.this_gpus_share("1", gpus, cpus=range(16, 32), machine_cpus=32) is None


def test_a_worker_given_cores_runs_its_children_on_them_only():
    mine = tuple(sorted(os.sched_getaffinity(0)))[-1:]
    hw = HardwareSpec(gpu_type=INTERPRETER, device_name="cpu")
    with MeasureWorker(hw, WorkerConfig(mode="interpreter", concurrency=1, cpus=mine)) as worker:
        from kernelcast.kernels.ops import get_operation

        seed = get_operation("softmax").seed_candidates()[0]
        [m] = list(worker.measure([seed]))
        where = [detail["cpus"] for _, _, phase, _, detail in worker.timeline if phase == "ahead_done"]
    assert m.status == "ok", m.error
    assert where == [list(mine)]


# ---- host-bound cases anchored to the reference ---------------------------------------------------------


def _anchor_job(tmp_path, cand, reference_us):
    from kernelcast.kernels.harness.runner import Job

    return Job(candidate=cand, mode="gpu", scratch_dir=str(tmp_path), lock_path="/nonexistent",
               triton_cache_dir=str(tmp_path), reference_us=reference_us)


def test_a_host_bound_case_is_reported_as_the_reference_runtime_times_the_paired_ratio(tmp_path):
    """Timed in one window beside the reference: 1.5x the reference's time there is 1.5x its runtime elsewhere."""
    from kernelcast.kernels.harness import anchoring, at_start
    from kernelcast.kernels.harness.timing import Timing
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    cand = get_space("softmax").spread_subset(1)[0]
    at_start.TORCH = at_start.torch_fingerprint()
    seen, phases = [], []

    def pair(case, anchor):  # the GPU's paired window: the candidate 1.5x the reference beside it
        ref_launch, params = anchor
        assert callable(ref_launch) and params == op.seed_candidates()[0].params
        seen.append(case.name)
        return Timing(300.0, 6.0, 40, 500.0), Timing(200.0, 4.0, 40, 480.0)

    job = _anchor_job(tmp_path, cand, tuple(100.0 * (i + 1) for i in range(len(op.cases))))
    result = {}
    got = anchoring._anchored(job, op, op.cases[1:2], pair, result, lambda *p: phases.append(p))
    assert seen == [op.cases[1].name] and list(got) == [op.cases[1].name]
    assert got[op.cases[1].name].runtime_us_median == pytest.approx(200.0 * 1.5)
    assert result["anchored_cases"] == [op.cases[1].name]
    assert phases[-1][0] == "anchored" and phases[-1][1]["ratio"] == pytest.approx(1.5)
    # the reference itself (no reference runtimes given) is never anchored
    assert anchoring._anchored(_anchor_job(tmp_path, cand, ()), op, op.cases, pair, {}, lambda *p: None) == {}
    # and the stored row says which cases were paired, so a speedup can be read without the timeline
    from kernelcast.kernels.harness.worker import MeasureWorker

    checks = MeasureWorker._from_result({"status": "ok", "window_check": "profiled", **result})["checks"]
    assert checks == f"window_check: profiled; anchored: {op.cases[1].name}"
    # a timed candidate none of whose cases was paired (``_time_cases`` records the empty list)
    assert MeasureWorker._from_result({"status": "ok", "anchored_cases": []})["checks"] == "anchored: none"
    assert MeasureWorker._from_result({"status": "compile_error"})["checks"] == ""  # never timed


def test_no_anchoring_once_the_candidate_has_replaced_a_torch_function(tmp_path, monkeypatch):
    """A candidate that swapped a torch function could slow the reference it is measured against."""
    import torch

    from kernelcast.kernels.harness import anchoring, at_start
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    cand = get_space("softmax").spread_subset(1)[0]
    at_start.TORCH = at_start.torch_fingerprint()
    slow = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda *a, **k: slow(*a, **k))
    phases = []
    got = anchoring._anchored(_anchor_job(tmp_path, cand, (100.0,) * len(op.cases)), op, op.cases,
                           lambda case, anchor: pytest.fail("the reference was timed"), {},
                           lambda *p: phases.append(p))
    assert got == {}
    assert phases == [("not_anchored", {"replaced": ["F.softmax"]})]


def test_cases_paired_ahead_are_timed_beside_the_reference_from_their_first_window(tmp_path, monkeypatch):
    """The reference's host-bound cases (every case under a format's protocol) get no window of their own first:
    they are timed and verified in their pair. A pair that fails leaves the case timed alone; the candidate's
    own verdicts stand; once torch's functions are replaced, no later case is paired."""
    import dataclasses

    import torch

    from kernelcast.kernels.harness import anchoring, at_start
    from kernelcast.kernels.harness.anticheat import Rejected
    from kernelcast.kernels.harness.timing import Timing
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    cand = get_space("softmax").spread_subset(1)[0]
    at_start.TORCH = at_start.torch_fingerprint()
    cases = op.cases[:3]
    reference = {c.name: 100.0 * (i + 1) for i, c in enumerate(cases)}
    job = dataclasses.replace(_anchor_job(tmp_path, cand, tuple(reference.values())),
                              reference_host_bound=(cases[0].name, cases[2].name))
    ahead = {c.name for c in anchoring.cases_to_pair(job, cases, ())} & set(reference)
    assert ahead == {cases[0].name, cases[2].name}
    calls, phases = [], []
    anchor = anchoring._anchor_launch(job, op, lambda *p: phases.append(p))
    assert anchor is not None and callable(anchor[0])

    def time_case(case, anchor=None):
        calls.append((case.name, anchor is not None))
        if anchor is not None:  # the candidate 1.2x the reference beside it
            return (Timing(240.0, 1.0, 20, 300.0), Timing(200.0, 1.0, 20, 300.0)), 3
        return Timing(50.0, 1.0, 20, 10.0), 2

    slowed = {}
    windows, rotation, anchored = anchoring._first_windows(cases, ahead, anchor, time_case, reference,
                                                        lambda *p: phases.append(p), slowed=slowed)
    assert calls == [(cases[0].name, True), (cases[1].name, False), (cases[2].name, True)]  # one window each
    # the reference ran at 200 us beside it: twice the 100 us stored for the first case, under the 300 of the third
    assert slowed == {cases[0].name: (200.0, 100.0)}
    assert sorted(anchored) == sorted(ahead) and rotation == {cases[0].name: 3, cases[1].name: 2, cases[2].name: 3}
    assert anchored[cases[2].name].runtime_us_median == pytest.approx(300.0 * 1.2)
    assert [w[0].runtime_us_median for w in windows.values()] == [240.0, 50.0, 240.0]  # the pair is the window

    def reference_fails(case, anchor=None):  # the reference cannot run beside this candidate: alone instead
        calls.append((case.name, anchor is not None))
        if anchor is not None:
            raise RuntimeError("the reference's module failed")
        return Timing(50.0, 1.0, 20, 10.0), 2

    calls.clear()
    _, _, anchored = anchoring._first_windows(cases[:1], ahead, anchor, reference_fails, reference,
                                           lambda *p: phases.append(p))
    assert anchored == {} and calls == [(cases[0].name, True), (cases[0].name, False)]
    assert phases[-1][0] == "not_anchored" and "module failed" in phases[-1][1]["error"]

    def cheat(case, anchor=None):
        raise Rejected("case x: launched work outside the timed window")

    with pytest.raises(Rejected):
        anchoring._first_windows(cases[:1], ahead, anchor, cheat, reference, lambda *p: None)

    def replaces_softmax(case, anchor=None):  # swaps a torch function during its first paired window
        slow = torch.nn.functional.softmax
        monkeypatch.setattr(torch.nn.functional, "softmax", lambda *a, **k: slow(*a, **k))
        return time_case(case, anchor)

    calls.clear()
    _, _, anchored = anchoring._first_windows(cases, ahead, anchor, replaces_softmax, reference,
                                           lambda *p: phases.append(p))
    assert anchored == {} and [a for _, a in calls] == [True, False, False]
    assert ("not_anchored", {"replaced": ["F.softmax"]}) in phases
    # the later pairs take the reference loaded for the first windows, and refuse it too once torch is replaced
    assert anchoring._anchored(job, op, cases[1:2], lambda case, a: pytest.fail("paired after a replacement"), {},
                            lambda *p: None, anchor=anchor) == {}
    monkeypatch.undo()
    used = []
    got = anchoring._anchored(job, op, cases[1:2], lambda case, a: used.append(a) or time_case(case, a)[0], {},
                           lambda *p: None, anchor=anchor)
    assert used == [anchor] and list(got) == [cases[1].name]


def test_the_worker_anchors_candidates_but_never_the_reference():
    from kernelcast.kernels.ops import get_operation

    cfg = WorkerConfig(mode="gpu", concurrency=1)
    worker = MeasureWorker.__new__(MeasureWorker)  # no children: only the job's anchor is asked
    worker.config, worker.reference_us = cfg, {"softmax": (10.0, 20.0, 30.0)}
    reference = get_operation("softmax").seed_candidates()[0]
    cand = get_space("softmax").spread_subset(1)[0]
    assert worker._anchor(cand) == (10.0, 20.0, 30.0)
    assert worker._anchor(reference) == ()
    worker.reference_host_bound = {"softmax": ("4096x1024-fp32",)}
    assert worker._reference_host_bound(cand) == ("4096x1024-fp32",) and worker._reference_host_bound(reference) == ()
    worker.config = WorkerConfig(mode="gpu", concurrency=1, anchor="off")
    assert worker._anchor(cand) == () and worker._reference_host_bound(cand) == ()


def test_anchor_all_pairs_every_case_with_the_reference_and_host_bound_only_those_cases(tmp_path):
    """kernelcast's protocol pairs the host-bound cases by default, every case with anchor "all"; a format's
    protocol pairs every case whatever the setting."""
    from kernelcast.kernels.harness import anchoring
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    cand = get_space("softmax").spread_subset(1)[0]
    host_bound = op.cases[1:2]
    job = _anchor_job(tmp_path, cand, (100.0,) * len(op.cases))
    assert anchoring.cases_to_pair(job, op.cases, host_bound) == list(host_bound)
    every = dataclasses.replace(job, anchor_all=True)
    assert anchoring.cases_to_pair(every, op.cases, host_bound) == list(op.cases)
    kernelbench = dataclasses.replace(job, protocol="kernelbench")
    assert anchoring.cases_to_pair(kernelbench, op.cases, []) == list(op.cases)
    # a case where the reference's own timing was host-bound is paired too, whatever the candidate's was
    ref_bound = dataclasses.replace(job, reference_host_bound=(op.cases[0].name,))
    assert anchoring.cases_to_pair(ref_bound, op.cases, host_bound) == [op.cases[0], op.cases[1]]
    assert anchoring.cases_to_pair(ref_bound, op.cases, []) == [op.cases[0]]


def test_the_worker_refuses_an_unknown_anchor_setting_by_name():
    from kernelcast.kernels.hardware import detect

    with pytest.raises(ValueError, match="unknown anchor setting 'sometimes'.*host-bound, all, off"):
        MeasureWorker(detect(), WorkerConfig(mode="interpreter", anchor="sometimes"))


def test_a_kernel_that_autotunes_on_the_device_gets_minutes_for_each_first_call():
    from kernelcast.kernels.harness import budget
    from kernelcast.kernels.ops import get_operation

    worker = MeasureWorker.__new__(MeasureWorker)  # no children: only the limits are asked
    worker.config, worker.reference_us, worker._reference_call_us, worker._case_bytes = (
        WorkerConfig(mode="gpu", concurrency=1), {}, {}, {})
    reference = get_operation("softmax").seed_candidates()[0]
    plain = worker.candidate_limits(reference)
    compiled = reference.source + "\n# torch.compile(mode='max-autotune')\n"
    tuned = worker.candidate_limits(dataclasses.replace(reference, source=compiled))
    assert all(c < 900.0 for c in plain.call_s) and plain == worker.limits("softmax")
    assert tuned.call_s == tuple(max(c, 900.0) for c in plain.call_s)
    assert tuned.first_calls_s == 900.0 * len(plain.call_s) and tuned.device_s == plain.device_s
    assert budget.autotunes('torch.compile(m, mode="max-autotune-no-cudagraphs")')
    assert not budget.autotunes("torch.compile(m)")


def test_a_case_whose_calls_take_seconds_is_checked_on_fewer_seeds():
    def softmax(wait: str) -> Candidate:
        return Candidate(op="softmax", backend="torch", origin="llm", source=textwrap.dedent(f'''
            import time

            import torch


            def launch(x, out):
                {wait}
                e = (x.float() - x.float().amax(dim=-1, keepdim=True)).exp()
                out.copy_((e / e.sum(dim=-1, keepdim=True)).to(x.dtype))
            '''))

    slow, quick = softmax("time.sleep(1.05)"), softmax("pass")
    results, worker = _measure([slow, quick], seeds=3, timeout_s=120)
    assert {m.status for m in results.values()} == {"ok"}, [m.error for m in results.values()]
    seeds: dict[tuple[str, str], int] = {}
    for cid, _, phase, _, detail in worker.timeline:
        if phase == "check":
            seeds[(cid, detail["case"])] = seeds.get((cid, detail["case"]), 0) + 1
    quick_seeds = [n for (cid, _), n in seeds.items() if cid == quick.candidate_id]
    slow_seeds = [n for (cid, _), n in seeds.items() if cid == slow.candidate_id]
    assert quick_seeds and set(quick_seeds) == {3}
    # the call that told it took seconds was not the case's first (which may have compiled): one or two seeds
    assert len(slow_seeds) == len(quick_seeds) and max(slow_seeds) <= 2


WRONG_SOFTMAX = '''
import torch


def launch(x, out):
    out.copy_(x)  # not a softmax: its checks fail while the lock is held shared
'''

DIES_IN_CHECKS = '''
import os


def launch(x, out):
    if x.device.type != "meta":  # compiled ahead on meta tensors, it dies in its first real call
        os._exit(3)  # the child dies holding the lock shared: the kernel releases its flock
'''


def test_a_child_that_fails_or_dies_in_shared_checks_leaves_the_others_their_verdicts():
    cands = _slow(0.3, 2) + [Candidate(op="softmax", backend="torch", origin="llm", source=WRONG_SOFTMAX),
                             Candidate(op="softmax", backend="torch", origin="llm", source=DIES_IN_CHECKS)]
    results, worker = _measure(cands, concurrency=4)
    status = {c.source: results[c.candidate_id].status for c in cands}
    assert [status[c.source] for c in cands] == ["ok", "ok", "incorrect", "crashed"], \
        [results[c.candidate_id].error for c in cands]
    holds = _holds(worker.timeline)
    assert not _clashes(holds)
    # the wrong one and the dying one took the lock shared before their ends
    for c in cands[2:]:
        locked = [d for cid, _, phase, _, d in worker.timeline if cid == c.candidate_id and phase == "locked"]
        assert locked and locked[0]["shared"], c.source
    # the two good children still got the device alone after the others failed or died in their shared holds
    good = {(c.candidate_id, 1) for c in cands[:2]}
    assert good <= {h[0] for h in holds if not h[3]}


THREAD_IN_CHECKS = '''
import threading
import time

import torch

_started = []


def launch(x, out):
    if x.device.type != "meta" and not _started:  # a thread started in its checks, still alive when they end
        _started.append(threading.Thread(target=time.sleep, args=(30,), daemon=True))
        _started[0].start()
    e = (x.float() - x.float().amax(dim=-1, keepdim=True)).exp()
    out.copy_((e / e.sum(dim=-1, keepdim=True)).to(x.dtype))
'''


def test_a_candidate_that_starts_a_thread_in_its_shared_checks_is_refused_before_it_lets_the_hold_go():
    cand = Candidate(op="softmax", backend="torch", origin="llm", source=THREAD_IN_CHECKS)
    honest = _slow(0.05, 1)
    results, worker = _measure([cand] + honest)
    got = results[cand.candidate_id]
    assert got.status == "rejected" and "started 1 thread(s) in its correctness checks" in got.error, got.error
    (wait,) = [d for cid, _, phase, _, d in worker.timeline if cid == cand.candidate_id and phase == "exclusive_wait"]
    assert wait["threads"] == wait["threads_at_lock"] + 1
    # it never held the device alone; the honest one beside it, which started none, did and is ok
    phases = [phase for cid, _, phase, _, _ in worker.timeline if cid == cand.candidate_id]
    assert "exclusive" not in phases and "releasing" in phases
    assert results[honest[0].candidate_id].status == "ok", results[honest[0].candidate_id].error
    (same,) = [d for cid, _, phase, _, d in worker.timeline if cid == honest[0].candidate_id
               and phase == "exclusive_wait"]
    assert same["threads"] == same["threads_at_lock"]


def test_sharing_again_waits_out_a_child_that_took_the_lock_alone_in_between_and_counts_the_wait_as_no_hold(tmp_path):
    import fcntl
    import threading
    import time

    from kernelcast.kernels.harness.runner import DeviceLock

    path = tmp_path / "gpu.lock"
    path.write_text("")
    marks = []
    lock = DeviceLock(str(path), shared=True, phase=lambda name, detail=None: marks.append(name), gpu=False)
    with lock:
        lock.exclusive()
        assert marks == ["exclusive_wait", "exclusive"] and not lock.shared
        # as if a child waiting for the lock alone got it the moment this one let its exclusive hold go
        fcntl.flock(lock._file, fcntl.LOCK_UN)
        rival = open(path)
        fcntl.flock(rival, fcntl.LOCK_EX)
        threading.Timer(0.3, lambda: (fcntl.flock(rival, fcntl.LOCK_UN), rival.close())).start()
        waited = lock.waited_s
        lock.share_again()
        assert marks[2:] == ["share_wait", "shared_again"] and lock.shared
        assert lock.waited_s - waited >= 0.25  # the rival's hold: waited, not held
        lock.share_again()  # already shared: nothing more
        assert len(marks) == 4
    # a child that held the lock alone from the start (not admitted to share) keeps it alone to the end
    alone = DeviceLock(str(path), shared=False, phase=lambda name, detail=None: marks.append(name), gpu=False)
    with alone:
        t = time.perf_counter()
        alone.share_again()
        assert not alone.shared and len(marks) == 4 and time.perf_counter() - t < 0.1


def test_a_reference_measured_before_is_adopted_so_runs_share_its_runtime_and_paired_cases():
    from kernelcast.kernels.harness.worker import host_sensitive_in
    from kernelcast.kernels.null import null_candidate
    from kernelcast.kernels.ops import get_operation
    from kernelcast.kernels.records import Measurement

    # a timed row says which of its cases were host-sensitive; rows from before it did say nothing
    fields = MeasureWorker._from_result({"status": "ok", "anchored_cases": [], "host_sensitive_cases": ["a", "b"]})
    assert fields["checks"] == "anchored: none; host-sensitive: a, b"
    assert host_sensitive_in(fields["checks"]) == ("a", "b")
    assert host_sensitive_in("anchored: none; host-sensitive: none") == ()
    assert host_sensitive_in("anchored: none") is None

    op = get_operation("softmax")
    names = tuple(c.name for c in op.cases)
    ref = Measurement(candidate_id=op.seed_candidates()[0].candidate_id, op="softmax", gpu_type=CPU.gpu_type,
                      status="ok", mode="gpu", case_names=names, runtime_us_median=tuple(10.0 + i for i in range(len(names))),
                      hardware=CPU, checks=f"window_check: profiled; anchored: none; host-sensitive: {names[0]}")
    cfg = WorkerConfig(mode="interpreter", concurrency=2, timeout_s=60, seeds=1)
    with MeasureWorker(CPU, cfg) as worker:
        refusals = {
            "is not the reference": dataclasses.replace(ref, candidate_id="other"),
            "its status is incorrect": dataclasses.replace(ref, status="incorrect"),
            "measured on h100": dataclasses.replace(ref, gpu_type="h100"),
            "it ran on": dataclasses.replace(ref, hardware=dataclasses.replace(CPU, torch_version="0.1")),
            "does not say which cases": dataclasses.replace(ref, checks="anchored: none"),
            "are not the op's": dataclasses.replace(ref, case_names=names[:1]),
            "has no timings": dataclasses.replace(ref, runtime_us_median=()),
        }
        for said, m in refusals.items():
            why = worker.adopt_reference(m)
            assert why is not None and said in why, (said, why)
        assert "softmax" not in worker.reference_us and "softmax" not in worker.reference_host_bound
        before = worker.limits("softmax")
        assert worker.adopt_reference(ref) is None
        assert worker.reference_us["softmax"] == ref.runtime_us_median
        assert worker.reference_host_bound["softmax"] == (names[0],)
        # its runtimes set the op's limits as a reference this worker measured would
        assert worker.limits("softmax").device_s > before.device_s
        # the op's candidates start at once, measured against it
        cand = null_candidate(op)
        (m,) = list(worker.measure([cand]))
        assert m.status == "ok", m.error
        assert {cid for cid, *_ in worker.timeline} == {cand.candidate_id}


def test_a_gpu_bound_candidate_timed_beside_a_host_bound_reference_keeps_its_own_series(tmp_path):
    """The anchored figure (the reference's runtime times the pair's ratio) follows the reference's host: a
    candidate whose own host time in the pair stays well under the flush reports its own series there instead,
    in the first windows and in a later pair; one near the flush (the reference's twin) and every case under a
    format's protocol stay anchored."""
    import dataclasses

    from kernelcast.kernels.harness import anchoring, at_start
    from kernelcast.kernels.harness.timing import Timing
    from kernelcast.kernels.ops import get_operation

    op = get_operation("softmax")
    cand = get_space("softmax").spread_subset(1)[0]
    at_start.TORCH = at_start.torch_fingerprint()
    cases = op.cases[:2]
    reference = {c.name: 100.0 for c in cases}
    job = dataclasses.replace(_anchor_job(tmp_path, cand, tuple(reference.values())),
                              reference_host_bound=tuple(reference))
    flush = 60.0
    gpu_bound, host_bound = Timing(40.0, 1.0, 20, 12.0), Timing(90.0, 1.0, 20, 55.0)  # host 0.2 and 0.92 of the flush
    beside = Timing(80.0, 1.0, 20, 50.0)  # the reference in the pair, slowed by its host: 80 us where it stored 100
    assert not anchoring.keeps_anchor(job, gpu_bound, flush) and anchoring.keeps_anchor(job, host_bound, flush)
    assert anchoring.keeps_anchor(dataclasses.replace(job, protocol="kernelbench"), gpu_bound, flush)
    assert anchoring.keeps_anchor(dataclasses.replace(job, anchor_all=True), gpu_bound, flush)
    anchor = anchoring._anchor_launch(job, op, lambda *p: None)
    phases = []
    timings = {cases[0].name: gpu_bound, cases[1].name: host_bound}

    def time_case(case, anchor=None):
        return (timings[case.name], beside), 3

    windows, _, anchored = anchoring._first_windows(cases, set(reference), anchor, time_case, reference,
                                                 lambda *p: phases.append(p),
                                                 lambda t: anchoring.keeps_anchor(job, t, flush))
    assert list(anchored) == [cases[1].name]  # the host-bound one: 100 us x (90 / 80)
    assert anchored[cases[1].name].runtime_us_median == pytest.approx(100.0 * 90.0 / 80.0)
    assert windows[cases[0].name][0].runtime_us_median == 40.0  # its own series, not 100 x 40 / 80 = 50
    assert [p[0] for p in phases] == ["own_figure", "anchored"] and phases[0][1]["host_us"] == 12.0
    # a later pair: the same rule, the own series joining the case's windows
    later = {cases[0].name: [Timing(41.0, 1.0, 20, 12.0)]}
    got = anchoring._anchored(job, op, cases[:1], lambda case, a: (gpu_bound, beside), {}, lambda *p: None, anchor,
                           lambda t: anchoring.keeps_anchor(job, t, flush), later)
    assert got == {} and [w.runtime_us_median for w in later[cases[0].name]] == [41.0, 40.0]


# ---- a host-bound reference measured in several processes ------------------------------------------------------


def _take(runtimes, host_sensitive, status="ok", seconds=1.0, host_share=1.1):
    from kernelcast.kernels.records import Measurement

    names = ("small", "large")
    res = {"status": status, "anchored_cases": [], "host_sensitive_cases": list(host_sensitive),
           "host_us": [r * host_share for r in runtimes] if status == "ok" else []}
    m = Measurement(candidate_id="ref", op="softmax", gpu_type="h200", status=status, mode="gpu",
                    case_names=names if status == "ok" else (), hardware=CPU,
                    runtime_us_median=tuple(runtimes) if status == "ok" else (),
                    runtime_us_iqr=tuple(r / 100 for r in runtimes) if status == "ok" else (),
                    repetitions=(100, 20) if status == "ok" else (), gpu_seconds=seconds, wall_seconds=2 * seconds,
                    compile_seconds=0.5 * seconds)
    return res, m


def test_a_reference_measured_in_several_processes_keeps_each_cases_fastest_process():
    from kernelcast.kernels.harness.sweep_report import cases_in
    from kernelcast.kernels.harness.rows import (REFERENCE_PROCESSES_MARK, combine_reference_takes, host_sensitive_in,
                                                 reference_process_figures)

    takes = [_take((180.0, 900.0), ["small"]), _take((310.0, 905.0), ["small", "large"]),
             _take((150.0, 890.0), []), _take((), [], status="timeout", seconds=3.0)]
    takes[2] = (takes[2][0], dataclasses.replace(takes[2][1], repetitions=(300, 40)))
    m, res = combine_reference_takes(takes)
    # each case's figures are those of its fastest ok process (150 us for the small case, 890 for the large: the
    # third process for both here), its IQR and repetitions with it
    assert m.runtime_us_median == (150.0, 890.0)
    assert m.runtime_us_iqr == (1.5, 8.9) and m.repetitions == (300, 40)
    # per case: the small case's fastest in the first process, the large case's in the second
    mixed, _ = combine_reference_takes([_take((150.0, 905.0), ["small"]), _take((310.0, 880.0), ["small"])])
    assert mixed.runtime_us_median == (150.0, 880.0)
    assert m.status == "ok" and m.candidate_id == "ref"
    # host-sensitive where more than half of the ok processes found it so: the small case (2 of 3), not the large (1)
    assert res["host_sensitive_cases"] == ["small"] and host_sensitive_in(m.checks) == ("small",)
    assert cases_in(m.checks, "anchored: ") == ()
    # charged every process, the failed one too, and the row says what each process measured
    assert m.gpu_seconds == pytest.approx(6.0) and m.wall_seconds == pytest.approx(12.0)
    assert m.compile_seconds == pytest.approx(3.0)
    (said,) = [p for p in m.checks.split("; ") if p.startswith(REFERENCE_PROCESSES_MARK)]
    assert said == (f"{REFERENCE_PROCESSES_MARK}3 of 4 ok (timeout) | small 180.0/310.0/150.0 us "
                    "(host 198.0/341.0/165.0 us) | large 900.0/905.0/890.0 us (host 990.0/995.5/979.0 us)")
    assert reference_process_figures(m.checks) == {"small": [180.0, 310.0, 150.0], "large": [900.0, 905.0, 890.0]}
    assert reference_process_figures("anchored: none; host-sensitive: small") == {}


def test_the_worker_measures_a_host_bound_reference_again_in_more_processes_before_its_candidates():
    """``MeasureWorker._reference_take``: a reference whose first process found a case host-sensitive is measured in
    ``reference_processes`` processes in all, the others queued first in line; its row comes once all are in. One
    that found none, failed, or a worker asked for one process: its first row as it is."""
    from collections import deque
    from types import SimpleNamespace

    from kernelcast.kernels.harness.worker import attempt_of

    op = get_space("softmax")
    ref = dataclasses.replace(op.spread_subset(1)[0], origin="seed")

    def child(res):
        return SimpleNamespace(result=res, candidate=ref, take=1)

    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", reference_processes=3)) as worker:
        takes = deque()
        res, m = _take((150.0, 900.0), ["small"])
        assert worker._reference_take(child(res), m, takes) is None
        assert list(takes) == [(ref, 2), (ref, 3)]
        res, m = _take((310.0, 905.0), ["small"])
        assert worker._reference_take(child(res), m, takes) is None
        res, m = _take((180.0, 890.0), [])
        got, res = worker._reference_take(child(res), m, takes)
        assert got.runtime_us_median == (150.0, 890.0) and res["host_sensitive_cases"] == ["small"]
        assert "reference processes: 3 of 3 ok" in got.checks
        # the next op's reference starts afresh; one with nothing host-sensitive is its first row
        takes.clear()
        res, m = _take((150.0, 900.0), [])
        assert worker._reference_take(child(res), m, takes) == (m, res) and not takes
        res, m = _take((), ["small"], status="incorrect")
        assert worker._reference_take(child(res), m, takes) == (m, res) and not takes
        # host-sensitive (against the flush) but not host-paced: the device sets its pace, one process is enough
        res, m = _take((150.0, 900.0), ["small"], host_share=0.9)
        assert worker._reference_take(child(res), m, takes) == (m, res) and not takes
        # host-paced in a case that is not host-sensitive counts for nothing either
        res, m = _take((150.0, 900.0), ["large"], host_share=0.9)
        res["host_us"] = [165.0, 810.0]
        assert worker._reference_take(child(res), m, takes) == (m, res) and not takes
        res["host_us"] = [165.0, 990.0]  # the host-sensitive case host-paced: three processes
        assert worker._reference_take(child(res), m, takes) is None and len(takes) == 2
        takes.clear()
        worker._takes.clear()
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", reference_processes=1)) as worker:
        res, m = _take((150.0, 900.0), ["small"])
        assert worker._reference_take(child(res), m, takes) == (m, res) and not takes
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="reference_processes"):
            MeasureWorker(CPU, WorkerConfig(mode="interpreter", reference_processes=bad))
    # the timeline's attempt numbers: 1 first, 2 a retry alone, 3 and on the further processes of a reference
    assert [attempt_of(False, 1), attempt_of(True, 1), attempt_of(False, 2), attempt_of(False, 3)] == [1, 2, 3, 4]


def test_tritons_utilities_built_once_are_copied_into_each_childs_own_cache(tmp_path):
    from kernelcast.kernels.harness.before_lock import seed_triton_cache

    built = tmp_path / "built" / "abc123"
    built.mkdir(parents=True)
    (built / "cuda_utils.so").write_bytes(b"\x7fELF")
    (built / "lock").write_text("")
    child = tmp_path / "cand-1"
    child.mkdir()
    seed_triton_cache(str(tmp_path / "built"), str(child))
    copy = child / "triton-cache" / "abc123" / "cuda_utils.so"
    assert copy.read_bytes() == b"\x7fELF" and not (child / "triton-cache" / "abc123" / "lock").exists()
    assert copy.stat().st_ino != (built / "cuda_utils.so").stat().st_ino  # a copy: the child's, not the worker's
