"""The verdict comes from where no candidate can reach: nothing a child writes is unpickled, a result a child
forges gets no verdict, the reference and the comparison run in the judge's own process, and inputs come from
seeds the worker draws when they are used.

Each adversary runs through the real worker and child, in the Triton interpreter (no GPU): the harness's
process boundaries are the same there.
"""

from __future__ import annotations

import json

import pytest
import torch

from kernelcast.kernels.harness import channel, judge
from kernelcast.kernels.harness.anticheat import Checker
from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
from kernelcast.kernels.hardware import INTERPRETER
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.ops.rows import case as row_case
from kernelcast.kernels.records import Candidate, HardwareSpec

CPU = HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter")

# Writes ``data`` framed as multiprocessing frames a message into every socket and pipe of its process (its result
# channel among them), then leaves before the harness reports anything.
WRITE_EVERYWHERE = '''
import os
import struct


def write_everywhere(data):
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith(("socket:", "pipe:")):
                os.write(int(fd), struct.pack("!i", len(data)) + data)
        except OSError:
            pass
    os._exit(0)
'''

# A pickle whose loading runs a command, written everywhere.
PICKLE_PAYLOAD = WRITE_EVERYWHERE + '''
import pickle


class Payload:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))


def launch(x, out):
    data = pickle.dumps(("result", Payload()))
    write_everywhere(data)
'''

# Writes a well-formed result of its own making ("ok", fast) on the channel and leaves: no check ever ran.
FORGED_RESULT = WRITE_EVERYWHERE + '''
import json


def launch(x, out):
    data = json.dumps(["result", {"status": "ok", "error": "", "case_names": [], "compile_seconds": 0.0,
                                  "gpu_seconds": 0.0, "runtime_us_median": [], "runtime_us_iqr": [],
                                  "repetitions": [], "out_of_memory": False}]).encode()
    write_everywhere(data)
'''

# Replaces, at import, the torch function the reference calls, so that the reference computed in its own process
# agrees with the zeros it writes.
PATCHED_REFERENCE = '''
import torch

setattr(torch, "softmax", lambda x, dim=-1, **kw: torch.zeros_like(x))


def launch(x, out):
    out.zero_()
'''

# Rebuilds the inputs of the protocol's constant seeds at import, answers from that table, and returns zeros on any
# input it did not foresee.
FORESEEN_INPUTS = '''
import torch

SHAPES = ((5, 37, torch.float32), (3, 256, torch.bfloat16), (4, 300, torch.float16))
TABLE = {}
for m, n, dtype in SHAPES:
    for seed in (0, 1, 2, 3, 1000, 5000, 5001, 9000):
        gen = torch.Generator()
        gen.manual_seed(seed)
        x = torch.randn((m, n), generator=gen, dtype=torch.float32).to(dtype)
        e = (x.float() - x.float().max(-1, keepdim=True).values).exp()
        TABLE[(dtype, x.float().sum().item(), x.float().abs().sum().item())] = (e / e.sum(-1, keepdim=True)).to(dtype)


def launch(x, out):
    key = (x.dtype, x.float().sum().item(), x.float().abs().sum().item())
    if key in TABLE:
        out.copy_(TABLE[key])
    else:
        out.zero_()
'''


def _measure(source: str, op: str = "softmax", origin: str = "llm"):
    cand = Candidate(op=op, backend="torch", source=source, origin=origin)
    with MeasureWorker(CPU, WorkerConfig(mode="interpreter", concurrency=1, seeds=2)) as worker:
        [got] = [m for m in worker.measure([cand]) if m.candidate_id == cand.candidate_id]  # the reference comes too
        return got


def test_nothing_a_child_writes_is_unpickled(tmp_path):
    marker = tmp_path / "ran-in-the-worker"
    got = _measure(PICKLE_PAYLOAD.format(marker=marker))
    assert not marker.exists(), "a pickle a candidate wrote ran a command in the worker's process"
    assert got.status != "ok"
    assert "does not send" in got.error or "before reporting a result" in got.error, got.error


def test_a_result_the_child_forges_gets_no_verdict():
    got = _measure(FORGED_RESULT)
    # written on every pipe it has: the seeds' pipe refuses it as it comes; where it came on the phases' pipe alone,
    # the judge finds no check recorded
    assert got.status in ("incorrect", "crashed"), (got.status, got.error)
    assert "recorded for the judge" in got.error or "gets no verdict of its own" in got.error, got.error


def test_a_reference_patched_in_the_childs_process_does_not_judge_it():
    got = _measure(PATCHED_REFERENCE)
    assert got.status in ("incorrect", "rejected"), (got.status, got.error)
    assert got.status == "rejected" or "the judge" in got.error, got.error


def test_inputs_come_from_seeds_drawn_when_used():
    got = _measure(FORESEEN_INPUTS)
    assert got.status == "incorrect", (got.status, got.error)


def test_the_reference_itself_is_judged_correct_with_the_seeds_it_was_given():
    op = get_operation("softmax")
    got = _measure(op.seed_candidates()[0].source, origin="seed")
    assert got.status == "ok", got.error
    assert "judged: " in got.checks and "seeds: " in got.checks, got.checks
    seeds = int(got.checks.split("seeds: ")[1].split(";")[0])
    assert seeds >= len(op.interpret_cases) * 3  # first call, checks, recheck: each set drawn


# ---- the channel's schema ----------------------------------------------------------------------------

@pytest.mark.parametrize("data, why", [
    (b"\x80\x04\x95", "not a JSON message"),
    (b'["result", {"status": "ok", "owned": 1}]', "result fields the harness does not send"),
    (b'["result", {"status": "great"}]', "is not one of"),
    (b'["result", {"status": "ok", "runtime_us_median": [-1.0]}]', "negative or not finite"),
    (b'["phase", "anything", null, 1.0]', "a phase is"),
    (b'["exec", "import os"]', "unknown message kind"),
    (b'["seed", {"case": "c", "key": "x"}]', "a seed request is"),
    (b'["seed", {"case": "c", "keys": []}]', "a seed request is"),
    (b'["seed", {"case": "c", "keys": [1, "x"]}]', "a seed request is"),
    (b'["seed", {"case": "c", "keys": [' + b", ".join(b"1" for _ in range(257)) + b']}]', "a seed request is"),
])
def test_the_channel_refuses_what_the_harness_does_not_send(data, why):
    with pytest.raises(channel.ChannelError, match=why):
        channel.decode(data)


def test_the_channel_carries_the_harnesss_own_messages():
    result = {"status": "ok", "error": "", "case_names": ["a"], "runtime_us_median": [1.5], "repetitions": [10],
              "compile_seconds": 0.1, "gpu_seconds": 0.2, "out_of_memory": False, "anchored_slowed": {"a": [1, 2]}}
    assert channel.decode(channel.encode("result", result)) == ("result", result)
    assert channel.decode(channel.encode("phase", "timed", {"case": "a", "us": 3.0}, 12.5)) == \
        ("phase", "timed", {"case": "a", "us": 3.0}, 12.5)
    assert channel.decode(channel.encode("seed", {"case": "a", "keys": [1000, 1001]})) == ("seed", "a", [1000, 1001])


def test_input_sets_made_together_draw_their_seeds_in_one_request():
    asked = []

    def draw(case, keys):
        asked.append(list(keys))
        return [7 + k for k in keys]

    op = get_operation("softmax")
    case = op.interpret_cases[0]
    checker = Checker(op, op.seed_candidates()[0], lambda *a: None, "cpu", draw=draw)
    checker.draw(case, [1001, 1002, 1003])
    sets = [checker.inputs(case, 1000 + k) for k in range(4)]  # the first drawn alone, the other three at once
    assert asked == [[1001, 1002, 1003], [1000]]
    assert checker.drawn_seed(case, 1002) == 1009 and len(asked) == 2  # drawn once, remembered
    assert not torch.equal(sets[1][0], sets[2][0])


# ---- the judge's comparison ------------------------------------------------------------------------------

def _record(tmp_path, op, case, seed: int, outputs, role: str = "check"):
    log = judge.OutputLog(str(tmp_path / "judged"))
    log.write(case.name, seed, role, outputs)
    return judge.read_records(str(tmp_path / "judged"))[-1]


def test_zeros_that_the_tolerance_accepts_are_refused_and_the_reference_is_not(tmp_path):
    op = get_operation("softmax")
    wide = row_case("bfloat16", M=4, N=4096)  # outputs near 1/16384, under bfloat16's absolute tolerance
    gen = torch.Generator().manual_seed(7)
    (x,) = op.make_inputs(wide, gen, "cpu")
    (expected,) = op.reference(x)
    assert op.check(wide, (x,), (torch.zeros_like(expected),)) is None  # the plain check alone passes zeros
    problem, passing = judge.judge_record(op, wide, _record(tmp_path, op, wide, 7, (torch.zeros_like(expected),)),
                                          "cpu")
    assert problem and "trivial output" in problem and "zeros" in passing
    problem, _ = judge.judge_record(op, wide, _record(tmp_path, op, wide, 7, (expected,)), "cpu")
    assert problem is None


def test_an_output_laid_out_unlike_the_references_is_refused(tmp_path):
    op = get_operation("softmax")
    case = op.interpret_cases[0]
    gen = torch.Generator().manual_seed(3)
    (x,) = op.make_inputs(case, gen, "cpu")
    (expected,) = op.reference(x)
    column_major = expected.t().contiguous().t()
    problem, _ = judge.judge_record(op, case, _record(tmp_path, op, case, 3, (column_major,)), "cpu")
    assert problem and "strides" in problem


def test_a_record_of_a_seed_the_worker_did_not_draw_is_refused(tmp_path):
    op = get_operation("softmax")
    for case in op.interpret_cases:
        gen = torch.Generator().manual_seed(11)
        (x,) = op.make_inputs(case, gen, "cpu")
        judge.OutputLog(str(tmp_path / "judged")).write  # the folder's writer, as a child has it
        log = judge.OutputLog(str(tmp_path / f"judged-{case.name}"))
        log.write(case.name, 11, "check", op.reference(x))
    folder = str(tmp_path / f"judged-{op.interpret_cases[0].name}")
    answer = judge.judge_folder("softmax", "interpreter", folder, served={12: op.interpret_cases[0].name},
                                roles_needed=())
    assert "which the worker did not draw" in answer["problem"]
    answer = judge.judge_folder("softmax", "interpreter", folder, served={11: op.interpret_cases[0].name},
                                roles_needed=())
    assert answer["problem"] == "" and answer["records"] == 1


def test_a_malformed_record_is_refused(tmp_path):
    folder = tmp_path / "judged"
    folder.mkdir()
    (folder / "0.json").write_text('{"case": "x", "seed": 1, "role": "check", "tensors": '
                                   '[{"dtype": "float32", "shape": [4], "stride": [1], "bytes": 16}]}')
    (folder / "0.bin").write_bytes(b"\0" * 8)
    with pytest.raises(judge.JudgeError, match="its header says 16"):
        judge.read_records(str(folder))
    (folder / "0.json").write_text('{"case": "x", "seed": 1, "role": "check", "tensors": '
                                   '[{"dtype": "object", "shape": [1], "stride": [1], "bytes": 8}]}')
    with pytest.raises(judge.JudgeError, match="not of the harness's format"):
        judge.read_records(str(folder))


# ---- the guard of built-in operations, past torch.ops and disabled dispatch ------------------------------

@pytest.mark.parametrize("body, why", [
    ("out.copy_(torch.ops.aten._softmax.default(x, -1, False))", "torch's own operator for the softmax"),
    ("out.copy_(getattr(torch.ops.aten, '_softmax')(x, -1, False))", "a route to the softmax"),
    ("with torch._C.DisableTorchFunction():\n        out.copy_(getattr(torch, 'soft' + 'max')(x, -1))",
     "turns off torch's function dispatch"),
    ("torch._C._disabled_torch_function_impl\n    out.zero_()", "turns off torch's function dispatch"),
])
def test_the_forbidden_call_guard_covers_torch_ops_and_disabled_dispatch(body, why):
    from kernelcast.kernels.harness.anticheat import scan_source

    op = get_operation("softmax")
    source = f"import torch\n\n\ndef launch(x, out):\n    {body}\n"
    refused = scan_source(Candidate(op="softmax", backend="torch", source=source, origin="llm"), op)
    if "getattr(torch.ops.aten" in body:  # a name built at run time: the runtime guard's to refuse
        got = _measure(source)
        assert got.status in ("rejected", "incorrect"), (got.status, got.error)
        return
    assert refused and why in refused, refused


def test_a_switch_set_at_import_is_put_back_for_the_reference_and_said():
    from kernelcast.kernels.harness import state

    harness = state.snapshot()
    try:
        torch.backends.cudnn.enabled = not harness["torch.backends.cudnn.enabled"]
        torch.backends.cudnn.benchmark = not harness["torch.backends.cudnn.benchmark"]
        mine = state.snapshot()
        assert set(state.differing(harness, mine)) == {"torch.backends.cudnn.enabled",
                                                       "torch.backends.cudnn.benchmark"}
        to_harness, to_candidate = state.swap(harness, mine)
        to_harness()
        assert state.snapshot() == harness
        to_candidate()
        assert state.snapshot() == mine
    finally:
        assert state.restore(harness)
    assert state.snapshot() == harness


class _Recorder:
    def __init__(self):
        self.records = []

    def record(self, case, seed, role, got):
        self.records.append((seed, role, [t.clone() for t in got]))


def test_the_verifications_first_call_on_unseen_inputs_is_the_recheck_the_judge_reads():
    op = get_operation("softmax")
    case = op.interpret_cases[0]
    kept = _Recorder()
    checker = Checker(op, op.seed_candidates()[0], lambda x, out: out.copy_(torch.softmax(x.float(), -1)), "cpu",
                      record=kept.record)
    for seed in (5000, 5001):
        unseen = checker.prepare(case, seed)
        assert checker.fresh(unseen, lambda call: call()) is None
    assert [(seed, role) for seed, role, _ in kept.records] == [(checker.drawn_seed(case, 5000), "recheck")]
    wrong = Checker(op, op.seed_candidates()[0], lambda x, out: out.zero_(), "cpu", record=kept.record)
    assert wrong.fresh(wrong.prepare(case, 5000), lambda call: call()) and len(kept.records) == 1


def test_the_timed_calls_latest_outputs_are_always_judged_and_a_reused_buffer_is_said():
    from kernelcast.kernels.harness import case_timing

    case = get_operation("softmax").interpret_cases[0]
    outs = [(torch.full((2,), float(k)),) for k in range(6)]
    fresh, result = _Recorder(), {}
    case_timing._record_timed(fresh, case, outs, [None] * 6, 4, result)
    seeds = [seed - case_timing._TIMING_SEED for seed, _, _ in fresh.records]
    assert seeds[0] == 4 and len(seeds) == case_timing.TIMED_RECORDS and len(set(seeds)) == len(seeds)
    assert all(float(got[0][0]) == seed - case_timing._TIMING_SEED for seed, _, got in fresh.records)
    assert "timed_outputs" not in result
    shared = torch.zeros(2)  # one buffer returned by every call, as a CUDA graph's static output is
    reused, result = _Recorder(), {}
    case_timing._record_timed(reused, case, outs, [shared] * 6, 2, result)
    assert [seed - case_timing._TIMING_SEED for seed, _, _ in reused.records] == [2]
    assert "one buffer returned for every call" in result["timed_outputs"][0]


def test_a_zero_dimensional_output_is_recorded_and_read_back(tmp_path):
    log = judge.OutputLog(str(tmp_path / "judged"))
    log.write("c", 5, "check", (torch.tensor(7, dtype=torch.int64), torch.tensor(2.5)))
    [record] = judge.read_records(str(tmp_path / "judged"))
    assert [t.shape for t in record.outputs] == [torch.Size([]), torch.Size([])]
    assert int(record.outputs[0]) == 7 and float(record.outputs[1]) == 2.5


# ---- records: big outputs sampled after the call, written where the device is not held alone ----------------

def _wide_softmax():
    op = get_operation("softmax")
    case = row_case("bfloat16", M=128, N=16384)  # 2M elements, over SAMPLE_ELEMENTS: a timed record is sampled;
    # outputs near 1/16384, under bfloat16's absolute tolerance: zeros pass the plain check
    (x,) = op.make_inputs(case, torch.Generator().manual_seed(21), "cpu")
    return op, case, x, op.reference(x)[0]


def test_a_big_output_is_recorded_as_a_sample_the_judge_checks_where_it_was_drawn(tmp_path):
    op, case, x, expected = _wide_softmax()
    log = judge.OutputLog(str(tmp_path / "judged"), deferred=True, sample=True)
    wrong = expected.clone()
    wrong.view(-1)[::20] += 1.0  # 5% of the elements wrong: a sample of a million finds them
    for got in (expected, wrong, torch.zeros_like(expected)):
        log.write(case.name, 21, "timed", (got,))
    small = expected[:32]  # 512k elements: recorded whole
    log.write(case.name, 21, "check", (small,))
    assert not (tmp_path / "judged").exists()  # nothing written before the flush
    log.flush()
    good, bad, zeros, whole = judge.read_records(str(tmp_path / "judged"))
    assert good.outputs[0].numel() == judge.SAMPLE_ELEMENTS and good.samples[0] is not None
    assert whole.outputs[0].shape == small.shape and whole.samples == (None,)
    assert good.samples[0] != bad.samples[0]  # places drawn from the operating system, a record each
    assert judge.judge_record(op, case, good, "cpu")[0] is None
    assert "differs from the reference" in judge.judge_record(op, case, bad, "cpu")[0]
    assert "trivial output" in judge.judge_record(op, case, zeros, "cpu")[0]


def test_a_sample_where_the_harness_records_whole_is_refused(tmp_path):
    op, case, x, expected = _wide_softmax()
    judge.OutputLog(str(tmp_path / "judged"), sample=True).write(case.name, 21, "check", (expected,))
    head_path = tmp_path / "judged" / "0.json"
    head = json.loads(head_path.read_text())
    assert head["tensors"][0]["sample"] is not None  # a checked call's output of over a million elements: sampled
    head["tensors"][0]["shape"] = [1024, 1024]  # one of a million or fewer is recorded whole: a sample is a forgery
    head_path.write_text(json.dumps(head))
    with pytest.raises(judge.JudgeError, match="a sample where the harness writes none"):
        judge.read_records(str(tmp_path / "judged"))


def test_a_workers_judges_answer_side_by_side():
    import multiprocessing as mp
    import threading
    import time as _time
    from kernelcast.kernels.harness.worker import Judges

    judges = Judges(mp.get_context("spawn"), 2)
    judges.start()
    try:
        bodies = [dict(op_name="softmax", mode="interpreter", folder="/nonexistent", served={}, roles_needed=())] * 2
        started, answers = _time.monotonic(), []
        threads = [threading.Thread(target=lambda b=b: answers.append(judges.ask(b))) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [a["problem"] for a in answers] == ["", ""] and len({id(j._proc) for j in judges._all}) == 2
        assert all(j._proc.is_alive() for j in judges._all)
    finally:
        judges.close()


# ---- a child's figures against what the worker itself saw -----------------------------------------------------

def _running(op_name: str = "softmax"):
    from kernelcast.kernels.harness.worker import _Running
    return _Running(candidate=get_operation(op_name).seed_candidates()[0], process=None, conn=None, scratch="",
                    started=0.0, limits=None)


def test_calls_claimed_beyond_the_window_the_worker_saw_are_refused():
    from kernelcast.kernels.harness.worker import _observe_window

    honest, inflated, unopened = _running(), _running(), _running()
    for r, reference_us in ((honest, 50.0), (inflated, 5000.0)):
        _observe_window(r, "timing", "4096x4096", 100.0)
        # 400 calls of 20 us and 400 of the reference beside them, in a window of 0.25 s by the worker's clock
        _observe_window(r, "timed", {"case": "4096x4096", "us": 20.0, "reps": 400, "reference_us": reference_us,
                                     "reference_reps": 400}, 100.25)
    assert honest.claim_problem == "" and honest.windows == {
        "4096x4096": [(0.25, 400 * 70.0 / 2e6, None, 400 * 70.0 / 1e6, pytest.approx(2 * 403 * 470e-6 + 0.03))]}
    assert "the worker saw the window take 0.250 s at most" in inflated.claim_problem  # a reference said to take 2 s
    _observe_window(unopened, "timed", {"case": "4096x4096", "us": 1.0, "reps": 10}, 5.0)
    assert "never saw open" in unopened.claim_problem


def test_a_window_read_late_is_bounded_by_the_last_empty_look_not_by_when_it_was_read():
    from kernelcast.kernels.harness.worker import _observe_window

    # A busy worker last found the pipe empty at 99.7 and read the opening and the closing in one pass at 100.0: the
    # honest 0.18 s of calls (as the reference refused on an H100 before the bound) fit the window's bound of 0.3 s.
    late, made_up = _running(), _running()
    for r, us in ((late, 450.0), (made_up, 4500.0)):
        _observe_window(r, "timing", "16x16x32", 100.0, sent_after=99.7)
        _observe_window(r, "timed", {"case": "16x16x32", "us": us, "reps": 400}, 100.0)
    assert late.claim_problem == "" and late.windows == {
        "16x16x32": [(pytest.approx(0.3), 400 * 450.0 / 2e6, None, 400 * 450.0 / 1e6, pytest.approx(2 * 403 * 650e-6 + 0.03))]}
    assert "0.300 s at most" in made_up.claim_problem  # 0.9 s of calls cannot fit in a window of at most 0.3 s
    # the bound never runs past the reading: a look reported after the read does not shrink the window below zero
    clamped = _running()
    _observe_window(clamped, "timing", "16x16x32", 100.0, sent_after=100.5)
    assert clamped.window_open == ("16x16x32", 100.0, 100.0)


def test_a_window_the_worker_looked_into_is_bounded_from_below_too_and_shown_in_the_row():
    from kernelcast.kernels.harness.children import window_text
    from kernelcast.kernels.harness.worker import _observe_window

    r = _running()
    _observe_window(r, "timing", "4096x4096", 100.0, sent_after=99.9)
    # an empty look at 100.4, after the opening was read: the closing was sent after it
    _observe_window(r, "timed", {"case": "4096x4096", "us": 500.0, "reps": 600}, 100.5, sent_after=100.4)
    ((high, least, low, calls, _),) = r.windows["4096x4096"]
    assert (high, low) == (pytest.approx(0.6), pytest.approx(0.4)) and calls == pytest.approx(0.3) and least < calls
    assert window_text(r.windows) == "4096x4096 0.400-0.600 s, calls 0.300 s (explains 0.874 s)"


def test_a_window_its_calls_figures_leave_unexplained_is_refused_as_understated():
    from kernelcast.kernels.harness.children import explained_s
    from kernelcast.kernels.harness.worker import _observe_window

    # 600 calls of 5 ms seen to take at least 3.1 s: told as 5 ms they explain it; told as 0.5 ms (the timer of the
    # child's process hooked to a tenth, as pygpubench's GOT-patch and detour exploits do) they do not
    honest, hooked = _running(), _running()
    for r, us in ((honest, 5000.0), (hooked, 500.0)):
        _observe_window(r, "timing", "4096x4096", 100.0, sent_after=99.9)
        _observe_window(r, "timed", {"case": "4096x4096", "us": us, "reps": 600}, 103.2, sent_after=103.1)
    assert honest.claim_problem == "" and not honest.understated
    assert hooked.understated and "understate what its calls took" in hooked.claim_problem, hooked.claim_problem
    assert "600 at 500 us" in hooked.claim_problem
    # where the worker never looked into the window it cannot tell, and refutes nothing
    unseen = _running()
    _observe_window(unseen, "timing", "4096x4096", 100.0, sent_after=99.9)
    _observe_window(unseen, "timed", {"case": "4096x4096", "us": 500.0, "reps": 600}, 103.2)
    assert unseen.claim_problem == "" and not unseen.understated
    # GPU MODE's timer warms up for up to a tenth of a second of calls before the ones it counts
    assert explained_s([(3, 10.0)], "gpumode") > explained_s([(3, 10.0)]) + 0.25
    assert explained_s([(100, 50.0), (100, 50.0)]) == pytest.approx(2 * 2 * 103 * 250e-6 + 0.03)


def test_a_figure_under_the_floor_or_of_no_window_is_refused_by_the_worker():
    from types import SimpleNamespace
    from kernelcast.kernels.harness.worker import MeasureWorker

    h100 = HardwareSpec(gpu_type="h100", device_name="NVIDIA H100 80GB HBM3", compute_capability="9.0",
                        sm_count=132, mem_clock_mhz=2619, bus_width_bits=5120, l2_mib=50.0)
    worker = SimpleNamespace(config=SimpleNamespace(mode="gpu"), hardware=h100)
    op = get_operation("softmax")
    names = [c.name for c in op.cases]
    r = _running()
    r.windows = {name: [(0.1, 0.01)] for name in names}
    r.timed_seen = {name: [(500.0, None), (0.5, None)] for name in names}  # the figures its windows told
    r.result = {"status": "ok", "case_names": names, "runtime_us_median": [500.0] * len(names)}
    assert MeasureWorker._refuted_figures(worker, r) == ""
    r.result["runtime_us_median"] = [0.5] * len(names)  # under a microsecond for 100+ MiB: impossible
    assert "below the case's floor" in MeasureWorker._refuted_figures(worker, r)
    r.result["runtime_us_median"] = [500.0] * len(names)
    del r.windows[names[-1]]
    assert "no timing window of that case" in MeasureWorker._refuted_figures(worker, r)
    worker.config.mode = "interpreter"  # no device timing to check
    assert MeasureWorker._refuted_figures(worker, r) == ""


def test_a_result_figure_its_windows_did_not_tell_is_refused():
    from kernelcast.kernels.harness.children import figure_problem, observe_anchored
    from kernelcast.kernels.harness.worker import _observe_window

    r = _running()
    # a window of its own, told as 300 us (its fastest), and a pair beside the reference: 80 us against 100 us here
    _observe_window(r, "timing", "own", 10.0)
    _observe_window(r, "timed", {"case": "own", "us": 300.0, "reps": 20}, 10.1)
    _observe_window(r, "timing", "pair", 11.0)
    _observe_window(r, "timed", {"case": "pair", "us": 80.0, "reps": 80, "reference_us": 100.0,
                                 "reference_reps": 80}, 11.1)
    observe_anchored(r, {"case": "pair", "us": 80.0, "reference_us_here": 100.0, "ratio": 0.79, "reference_us": 120.0})
    assert figure_problem(r, "own", 300.0) == ""
    assert figure_problem(r, "pair", 120.0 * 0.79, references=(120.0, 9.0)) == ""
    # the result rewritten alone (pygpubench's pipe interposer on the last message): a figure no window told
    assert "none of its timed windows told" in figure_problem(r, "own", 30.0)
    # a pair anchored to a reference runtime the worker never gave, a ratio rewritten far from its medians, medians
    # no window told: each in a child of its own
    for pair, why in (((80.0, 100.0, 0.79, 12.0), "never gave it"), ((80.0, 100.0, 0.079, 120.0), "times apart"),
                      ((8.0, 100.0, 0.079, 120.0), "none of its windows told")):
        forged = _running()
        forged.timed_seen = {"pair": [(80.0, 100.0)]}
        observe_anchored(forged, dict(zip(("us", "reference_us_here", "ratio", "reference_us"), pair), case="pair"))
        assert why in figure_problem(forged, "pair", pair[3] * pair[2], references=(120.0, 9.0)), why


def test_without_the_recheck_round_the_judge_asks_for_no_rechecked_call():
    op = get_operation("softmax")
    cand = op.seed_candidates()[0]
    config = WorkerConfig(mode="interpreter", concurrency=1, seeds=1, recheck=False)
    with MeasureWorker(CPU, config) as worker:
        [got] = list(worker.measure([cand]))
        phases = {phase for cid, _, phase, _, _ in worker.timeline if cid == cand.candidate_id}
    assert got.status == "ok", got.error
    assert "recheck" not in phases and "judged" in phases
