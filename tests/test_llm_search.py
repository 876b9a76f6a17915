"""benchmarks/llm_search.py live: the comparison with a real model server writing the children.

llama.cpp serves the tiny GGUF the forecaster tests write; its answers are noise, so every child
is dropped by the static checks. What must hold is the live path itself: each search asks the
server (generator freeform), measures through the harness (backend local, under Triton's CPU
interpreter here), and the benchmark writes its rows as each finishes, then reads several files
back into one table.
"""

from __future__ import annotations

import json

from tests.test_llm_forecaster import server, tiny_model  # noqa: F401 (fixtures)

from benchmarks import llm_search


def test_a_live_comparison_asks_the_server_and_writes_its_rows(server, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "live.json"
    argv = ["--live", server.base_url, "--live-model", "tiny", "--ops", "softmax", "--seeds", "1", "--budgets", "2",
            "--generations", "1", "--surrogates", "roofline", "--modes", "measurements", "--gpu-type", "interpreter",
            "--data", str(tmp_path / "data"), "--json", str(out)]
    assert llm_search.main(argv) == 0
    [row] = json.loads(out.read_text())["runs"]
    assert (row["op"], row["surrogate"], row["generator"], row["backend"]) == ("softmax", "roofline", "freeform",
                                                                                 "local")
    assert row["baseline_stop_reason"] and row["surrogate_stop_reason"]
    from kernelcast.storage.dataset import DataRoot

    asked = DataRoot(str(tmp_path / "data")).read("generations")["generator_asked"]
    assert len(asked) == 2 and (asked > 0).all()  # both searches asked the live server for children

    # Two processes' files make one table; a replayed run's file has no "generator" and still reads.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"trees": [], "runs": [{**row, "op": "transpose"}]}))
    capsys.readouterr()
    assert llm_search.main(["--summary-only", "--json", str(out), str(other), "--surrogates", "roofline",
                            "--budgets", "2", "--modes", "measurements"]) == 0
    assert "Live search" in capsys.readouterr().out


def test_live_runs_need_their_operations_and_one_output_file(tmp_path):
    import pytest

    with pytest.raises(SystemExit):
        llm_search.main(["--live", "http://127.0.0.1:9/v1"])
    with pytest.raises(SystemExit):
        llm_search.main(["--json", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
