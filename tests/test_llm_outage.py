"""LLM robustness at the flow level: the forecaster's server dies in the middle of a generation.

A search forecasts with ``OpenAIForecaster`` against a real llama.cpp server (the tiny GGUF of
``tests/test_llm_forecaster.py``). The server is killed with SIGKILL while a generation's
forecasts are being asked for; the candidates it did not answer get unparsed forecasts, which
are never trusted (forced deferral: measured within the budget, or dropped for now), and the
search goes on. The server then comes back on the same port and the last generation parses again.

The trust threshold is set low enough (0.1) that the tiny model's parsed answer, uniform
probabilities (0.125 each), is trusted: an unparsed forecast, uniform too, differs from it only
in its ``parsed`` flag, so a policy that looked at the probabilities alone would trust it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from kernelcast.storage.schema import forecasts_from_frame
from kernelcast.surrogate.llm import OpenAIForecaster
from kernelcast.surrogate.policies import ThresholdPolicy
from kernelcast.tasks.config import SearchConfig
from kernelcast.tasks.search import Search
from kernelcast.tasks.setup import data_root, measure_pool, resolve
from tests.test_llm_forecaster import LLAMA_CPP_PYTHON, TINY_CONTEXT, LlamaServer, tiny_model  # noqa: F401


class PinnedLlamaServer(LlamaServer):
    """A llama.cpp server on a given port, so that a restarted one answers at the address clients know."""

    def __init__(self, model_path, n_ctx: int, port: int):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.log = open(f"{model_path}.{port}.{time.monotonic_ns()}.log", "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", str(n_ctx), "--model_alias", "tiny"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no goodbye to clients mid-request
        self.process.wait()
        self.log.close()


def _kill_after_calls(server: PinnedLlamaServer, forecaster: OpenAIForecaster, calls: int) -> threading.Thread:
    """A watcher that kills ``server`` as soon as ``forecaster`` has sent ``calls`` requests."""

    def watch():
        while forecaster.calls_ < calls:
            time.sleep(0.001)
        server.kill()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_search_goes_on_when_the_llm_server_dies_mid_generation_and_trusts_no_failed_forecast(tiny_model, tmp_path):
    from tests.conftest import free_port

    server = PinnedLlamaServer(tiny_model, TINY_CONTEXT, free_port()).wait_ready()
    children, budget = 4, 6
    cfg = resolve(SearchConfig(op="softmax", gpu_type="h100", budget=budget, generations=3, children=children,
                               surrogate="llm", llm_url=server.base_url, llm_model="tiny", trust_threshold=0.1,
                               seed=2, backend="replay", data=str(tmp_path / "data"), run_id="llm-outage"))
    forecaster = OpenAIForecaster(server.base_url, "tiny", schema_style=LLAMA_CPP_PYTHON, concurrency=1,
                                  retries=1, backoff_s=0.05, timeout_s=30, max_tokens=128)
    root = data_root(cfg)
    pool = measure_pool(cfg)
    try:
        search = Search(cfg, root, pool, forecaster).start()
        search.run_generation(0)
        assert forecaster.calls_ == children
        watcher = _kill_after_calls(server, forecaster, children + 2)  # the second request of generation 1
        search.run_generation(1)
        watcher.join(timeout=5)
        server = PinnedLlamaServer(tiny_model, TINY_CONTEXT, server.port).wait_ready()  # back, same address
        search.run_generation(2)
        result = search.finish()
    finally:
        pool.close()
        if server.process.poll() is None:
            server.stop()

    # Trusted forecasts of a loss are dropped without a measurement, so the budget is a ceiling.
    assert [g.generation for g in result.generations] == [0, 1, 2]
    assert result.budget_used == sum(g.measured for g in result.generations) <= budget
    forecasts = root.read_run_rows("forecasts", "llm-outage", op="softmax")
    parsed = {g: forecasts[forecasts["generation"] == g]["parsed"].tolist() for g in (0, 1, 2)}
    assert all(parsed[0]) and all(parsed[2])  # before the kill, and after the restart
    assert 1 <= sum(parsed[1]) < children  # the kill landed mid-generation: answered, then not
    failed = forecasts_from_frame(forecasts[~forecasts["parsed"]])
    assert all(f.raw_response.startswith("error: ") for f in failed)

    policy = ThresholdPolicy("max_probability", cfg.trust_threshold)
    answered = forecasts_from_frame(forecasts[forecasts["parsed"]])
    assert all(policy.trusted(f) for f in answered)  # the threshold trusts a parsed uniform answer...
    assert not any(policy.trusted(f) for f in failed)  # ...and never the same numbers unparsed
    decisions = root.read_run_rows("decisions", "llm-outage", op="softmax")
    decided = {(int(r.generation), r.candidate_id): r.decision for r in decisions.itertuples()}
    failed_rows = forecasts[~forecasts["parsed"]]
    verdicts = [decided[(int(r.generation), r.candidate_id)] for r in failed_rows.itertuples()]
    assert "trust" not in verdicts and set(verdicts) <= {"measure", "drop"}
    measured = set(root.read_measurements(op="softmax", gpu_type="h100")["candidate_id"])
    deferred_and_measured = [r.candidate_id for r in failed_rows.itertuples() if r.candidate_id in measured]
    assert deferred_and_measured  # the budget went to the candidates the surrogate could not judge
    assert result.best_candidate_id in measured and result.best_speedup > 0
    later = set(forecasts[forecasts["generation"] == 2]["candidate_id"])
    carried = [r.candidate_id for r in failed_rows.itertuples() if decided[(1, r.candidate_id)] == "drop"
               and r.candidate_id in later]
    print(f"\nLLM server killed after {children + 2} requests: generation 1 had {children - sum(parsed[1])} of "
          f"{children} forecasts unparsed ({len(deferred_and_measured)} measured, {verdicts.count('drop')} "
          f"deferred, {len(carried)} of them forecast again in generation 2); none trusted; "
          f"the search finished all 3 generations, {result.budget_used} of {budget} measurements charged")
