"""The kernelcast command line, end to end on the CPU (interpreter mode), with a local data root."""

import dataclasses

import pandas as pd
import pyarrow.dataset as ds

from kernelcast.flows.cli import main


def test_measure_writes_readable_tables_and_rerun_measures_nothing_twice(tmp_path, capsys):
    root = str(tmp_path / "data")
    assert main(["measure", "--op", "rmsnorm", "--limit", "3", "--data", root]) == 0
    out = capsys.readouterr()
    assert "correctness only" in out.out and "Triton's CPU interpreter" in out.err
    m = pd.read_parquet(tmp_path / "data" / "measurements")
    assert len(m) == 4 and set(m["status"]) == {"ok"}  # 3 variants and the eager seed
    assert set(ds.dataset(tmp_path / "data" / "candidates", partitioning="hive").to_table()["op"].to_pylist()) == {"rmsnorm"}
    assert main(["measure", "--op", "rmsnorm", "--limit", "3", "--data", root]) == 0
    assert "nothing to measure" in capsys.readouterr().err
    assert len(pd.read_parquet(tmp_path / "data" / "measurements")) == 4


def test_measure_checks_beside_each_other_by_default_and_alone_when_asked(tmp_path, capsys):
    assert main(["measure", "--op", "row_sum", "--limit", "3", "--data", str(tmp_path / "a")]) == 0
    shared = capsys.readouterr().out
    assert "checks beside other candidates' checks: 4 of 4 children" in shared  # 3 variants and the eager seed
    assert main(["measure", "--op", "row_sum", "--limit", "3", "--checks-alone", "--data", str(tmp_path / "b")]) == 0
    alone = capsys.readouterr().out
    assert "checks beside other candidates' checks: 0 of 4 children (--checks-alone)" in alone
    verdicts = [pd.read_parquet(tmp_path / d / "measurements").sort_values("candidate_id")["status"].tolist()
                for d in ("a", "b")]
    assert verdicts[0] == verdicts[1] == ["ok"] * 4


def test_show_lists_each_operation_and_gpu_type(tmp_path, capsys):
    root = str(tmp_path / "data")
    main(["measure", "--op", "row_sum,transpose", "--limit", "2", "--data", root])
    capsys.readouterr()
    assert main(["show", "--data", root]) == 0
    shown = capsys.readouterr().out
    assert "row_sum" in shown and "transpose" in shown and "interpreter" in shown


def test_ops_lists_every_operation_with_its_space(capsys):
    assert main(["ops"]) == 0
    shown = capsys.readouterr().out
    for name in ("softmax", "layernorm", "rmsnorm", "cross_entropy", "fp8_quant", "bias_gelu", "row_sum",
                 "transpose", "matmul", "attention"):
        assert name in shown


def test_unknown_operation_is_a_clear_error(tmp_path, capsys):
    assert main(["measure", "--op", "sofmax", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown operation 'sofmax'; known: softmax" in err


def test_negative_limit_is_refused(tmp_path, capsys):
    assert main(["measure", "--op", "softmax", "--limit", "-1", "--data", str(tmp_path)]) == 2
    assert "--limit must be zero or more" in capsys.readouterr().err


def test_gpu_mode_without_a_gpu_is_refused_before_measuring(tmp_path, capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert main(["measure", "--op", "softmax", "--mode", "gpu", "--data", str(tmp_path)]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_evaluate_refuses_an_unknown_surrogate_by_name(tmp_path, capsys):
    assert main(["evaluate", "--surrogate", "lerned", "--data", str(tmp_path)]) == 2
    assert "unknown surrogate 'lerned'; known: learned, source, lmhead, random, roofline" in capsys.readouterr().err


def test_evaluate_refuses_an_unknown_calibrator_before_reading_the_pool(tmp_path, capsys):
    assert main(["evaluate", "--surrogate", "learned", "--calibrator", "beta", "--data", str(tmp_path)]) == 2
    assert "unknown --calibrator 'beta'; known: temperature, isotonic, platt" in capsys.readouterr().err


def _small_prior(path):
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame, measurements_from_frame
    from kernelcast.tasks.config import PACKAGED_POOL

    pool, prior = DataRoot(PACKAGED_POOL), DataRoot(str(path))
    for op, gpu in (("softmax", "h200"), ("rmsnorm", "h100"), ("rmsnorm", "h200")):
        prior.write_candidates(candidates_from_frame(pool.read_candidates(op)))
        prior.write_measurements(measurements_from_frame(pool.read_measurements(op=op, gpu_type=gpu)))
    return prior


def test_train_stores_the_prior_where_a_search_of_that_scope_looks_for_it(prefect_server, tmp_path):
    import contextlib
    import io

    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.config import SearchConfig
    from kernelcast.tasks.setup import model_path, resolve

    prior, data = _small_prior(tmp_path / "prior"), str(tmp_path / "data")
    printed = io.StringIO()
    # Output away from pytest's capture: Prefect's log handlers outlive the test, and must not keep a
    # stream pytest closes.
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--op", "softmax", "--prior-data", prior.uri, "--data", data,
                     "--prior-scope", "other-gpus", "--gpu-type", "h100"])
    assert code == 0 and "(other-gpus) for each of: softmax" in printed.getvalue()

    def stored(scope):
        search = resolve(SearchConfig(op="softmax", surrogate="learned", prior_data=prior.uri, data=data,
                                      backend="replay", gpu_type="h100", prior_scope=scope))
        return DataRoot(data).get_object(model_path(search)) is not None

    assert stored("other-gpus") and not stored("other-ops")


def test_train_refuses_an_unknown_prior_scope_before_fitting(tmp_path, capsys):
    assert main(["train", "--op", "softmax", "--data", str(tmp_path), "--prior-scope", "everything"]) == 2
    assert "unknown prior_scope 'everything'; known: other-ops, other-gpus, all" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_show_and_the_search_summary_flag_a_kernel_computed_below_the_references_precision(tmp_path, capsys):
    from kernelcast.flows.report import best_table
    from kernelcast.kernels.records import Measurement
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.tasks.report import summary_lines
    from kernelcast.tasks.search import SearchResult

    root = str(tmp_path / "data")
    main(["measure", "--op", "row_sum", "--limit", "2", "--data", root])
    data = DataRoot(root)
    measured = data.read_measurements(op="row_sum").merge(data.read_candidates(op="row_sum"), on="candidate_id")
    kernels = measured[~measured["template"].str.endswith("eager")]
    cases = tuple(kernels["case_names"].iloc[0])
    lower = f"case {cases[0]}: lower: tf32/fp16 (2.4e-04) where the reference is float32 (2.4e-08)"
    fast, slow = kernels["candidate_id"].iloc[0], kernels["candidate_id"].iloc[1]
    data.write_measurements([
        Measurement(fast, "row_sum", "h100", "ok", "gpu", case_names=cases, runtime_us_median=(5.0,) * len(cases),
                    speedup=2.0, precision=lower),
        Measurement(slow, "row_sum", "h100", "ok", "gpu", case_names=cases, runtime_us_median=(8.0,) * len(cases),
                    speedup=1.5, precision="float32")])
    row = best_table(data, op="row_sum").set_index("gpu_type").loc["h100"]
    assert row["lower_precision"] == 1 and row["best_precision"] == "lower" and row["speedup"] == 2.0
    assert main(["show", "--data", root, "--op", "row_sum"]) == 0
    assert "lower_precision" in capsys.readouterr().out
    data.write_measurements([Measurement(slow, "row_sum", "h200", "ok", "gpu", case_names=cases,
                                         runtime_us_median=(8.0,) * len(cases), speedup=1.5, precision="float32")])
    assert best_table(data, op="row_sum").set_index("gpu_type").loc["h200", "best_precision"] == "same"
    eager = measured[measured["template"].str.endswith("eager")]["candidate_id"].iloc[0]
    assert best_table(data, op="row_sum").set_index("gpu_type").loc["h200", "reference_host_bound"] == ""
    for gpu, checks, said in (("h200", "window_check: profiled; host-sensitive: none", "no"),
                              ("a100", f"window_check: profiled; anchored: none; host-sensitive: {cases[0]}",
                               f"yes: {cases[0]}")):  # what the reference's row on that GPU type says
        data.write_measurements([Measurement(eager, "row_sum", gpu, "ok", "gpu", case_names=cases,
                                             runtime_us_median=(9.0,) * len(cases), speedup=1.0, checks=checks)])
        assert best_table(data, op="row_sum").set_index("gpu_type").loc[gpu, "reference_host_bound"] == said
    # measured in three processes, its fastest stored: how many, and how far they spread
    data.write_measurements([Measurement(eager, "row_sum", "l40", "ok", "gpu", case_names=cases,
                                         runtime_us_median=(9.0,) * len(cases), speedup=1.0,
                                         checks=f"anchored: none; host-sensitive: {cases[0]}; reference processes: "
                                                f"3 of 3 ok | {cases[0]} 9.0/27.0/12.0 us (host 8.0/26.0/11.0 us)")])
    assert best_table(data, op="row_sum").set_index("gpu_type").loc["l40", "reference_host_bound"] == (
        f"yes: {cases[0]}; fastest of 3 processes, which spread 3.00x")
    # how the best kernel's cases were timed, a pair beside a slowed reference named with how slowed
    assert best_table(data, op="row_sum").set_index("gpu_type").loc["h100", "best_timed"] == ""  # predates the mark
    for gpu, checks, said in (("a10", "anchored: none", "alone"),
                              ("a30", f"anchored: {cases[0]}", f"paired: {cases[0]}"),
                              ("a40", f"anchored: {cases[0]}; anchored beside a slowed reference: {cases[0]} "
                                      f"64.3/21.6 us",
                               f"paired: {cases[0]}; beside a slowed reference 2.98x: {cases[0]}")):
        data.write_measurements([Measurement(fast, "row_sum", gpu, "ok", "gpu", case_names=cases,
                                             runtime_us_median=(5.0,) * len(cases), speedup=2.0, checks=checks)])
        assert best_table(data, op="row_sum").set_index("gpu_type").loc[gpu, "best_timed"] == said

    flagged = SearchResult("r1", "row_sum", "h100", fast, 2.0, "", {}, 8, 1.0, (), False, "budget", lower)
    assert any("below the reference's precision" in line for line in summary_lines(flagged, "d", "t", None))
    same = dataclasses.replace(flagged, best_precision="float32")
    assert not any("precision" in line for line in summary_lines(same, "d", "t", None))
