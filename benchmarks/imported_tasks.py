"""An imported KernelBench problem and GPU MODE task, measured through the real harness, with forecasts.

    PYTHONPATH=$PWD python benchmarks/imported_tasks.py --out DIR

Imports ``examples/kernelbench/row_sum.py`` (+ ``row_sum_new.py``, a Triton ModelNew) and
``examples/gpumode/vectoradd`` (+ ``submission.py``, a Triton custom_kernel) as
operations, then measures each task's reference (its own Model / ref_kernel, the timed
baseline) and the imported candidate with the measurement worker: isolated child
processes, correctness against the reference on seeded inputs, CUDA-event timing with
the L2 flushed. It prints and writes (``DIR/imported_tasks.json``) the reference runtime
per case, the candidate's runtime and speedup (geometric mean over cases), and what the
roofline and learned surrogates forecast for the candidate before it was measured.

Without a GPU it runs the same path under Triton's CPU interpreter on the tasks' small
cases: correctness only, no runtimes. Needs torch, triton, pandas and pyarrow; the
learned forecast also needs scikit-learn and fsspec, and is skipped (with the reason
recorded) where they are missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _forecasts(op, candidate, hardware, reference_us) -> dict:
    """Roofline and learned forecasts of ``candidate`` against the task's reference, made before measuring."""
    from kernelcast.surrogate.forecast import ForecastRequest

    request = ForecastRequest(op.seed_candidates()[0], candidate, op.name, hardware,
                              case_names=tuple(c.name for c in op.cases),
                              anchor_runtime_us=tuple(reference_us or ()))
    out = {}
    makers = {"roofline": _roofline, "learned": lambda: _learned(hardware.gpu_type)}
    for name, make in makers.items():
        try:
            [f] = make().forecast([request])
            out[name] = {"expected_speedup": round(f.expected_speedup, 4), "predicted_bin": f.predicted_bin,
                         "confidence": round(f.max_probability, 4),
                         "probabilities": [round(p, 4) for p in f.probabilities]}
        except Exception as exc:  # noqa: BLE001 - a missing optional package skips one forecaster, recorded
            out[name] = {"skipped": f"{type(exc).__name__}: {exc}"}
    return out


def _roofline():
    from kernelcast.surrogate.baselines import RooflineForecaster

    return RooflineForecaster().fit()


def _learned(gpu_type: str):
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.surrogate.dataset import case_pairs
    from kernelcast.surrogate.learned import LearnedForecaster

    pool = DataRoot(str(REPO / "data" / "pools"))
    pairs = case_pairs(pool, gpu_type=gpu_type)
    if pairs.empty:
        pairs = case_pairs(pool)
    return LearnedForecaster().fit(pairs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for imported_tasks.json (and the imported tasks)")
    p.add_argument("--seeds", type=int, default=3, help="seeded correctness inputs per case")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Before anything starts the harness's fork server: its children find imported tasks here.
    os.environ["KERNELCAST_TASKS"] = str((out / "tasks").resolve())

    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton

    from kernelcast.kernels.formats import import_task
    from kernelcast.kernels.harness.worker import MeasureWorker, WorkerConfig
    from kernelcast.kernels.hardware import INTERPRETER, detect
    from kernelcast.kernels.records import HardwareSpec

    kb = import_task("kernelbench", str(EXAMPLES / "kernelbench" / "row_sum.py"),
                     [str(EXAMPLES / "kernelbench" / "row_sum_new.py")],
                     interpret_sizes=["batch_size=4,dim=300"])
    gm = import_task("gpumode", str(EXAMPLES / "gpumode" / "vectoradd" / "reference.py"),
                     [str(EXAMPLES / "gpumode" / "vectoradd" / "submission.py")], name="vectoradd",
                     specs=str(EXAMPLES / "gpumode" / "vectoradd" / "task.json"))
    hardware = detect() if gpu else HardwareSpec(gpu_type=INTERPRETER, device_name="Triton CPU interpreter",
                                                 torch_version=torch.__version__, triton_version=triton.__version__)
    mode = "gpu" if gpu else "interpreter"
    print(f"measuring on {hardware.device_name} ({hardware.gpu_type}), mode {mode}", file=sys.stderr)
    report = {"device": hardware.device_name, "gpu_type": hardware.gpu_type, "mode": mode,
              "torch": torch.__version__, "triton": triton.__version__, "tasks": []}
    config = WorkerConfig(mode=mode, concurrency=2, seeds=args.seeds, max_seconds_per_case=2.0)
    with MeasureWorker(hardware, config) as worker:
        for op, (candidate,) in (kb, gm):
            reference = op.seed_candidates()[0]
            t0 = time.perf_counter()
            found = {m.candidate_id: m for m in worker.measure([reference, candidate])}
            ref_m, cand_m = found[reference.candidate_id], found[candidate.candidate_id]
            forecasts = _forecasts(op, candidate, hardware, ref_m.runtime_us_median if gpu else ())
            row = {"op": op.name, "format": op.format, "cases": list(cand_m.case_names or ref_m.case_names),
                   "reference_status": ref_m.status, "reference_error": ref_m.error,
                   "reference_us_median": list(ref_m.runtime_us_median),
                   "candidate_id": candidate.candidate_id, "candidate_status": cand_m.status,
                   "candidate_error": cand_m.error, "candidate_us_median": list(cand_m.runtime_us_median),
                   "speedup": cand_m.speedup, "forecast": forecasts,
                   "wall_seconds": round(time.perf_counter() - t0, 2)}
            report["tasks"].append(row)
            speed = f"{cand_m.speedup:.3f}x" if cand_m.speedup else "n/a (no timing)"
            print(f"{op.name}: reference {ref_m.status} {_us(ref_m.runtime_us_median)}; candidate {cand_m.status} "
                  f"{_us(cand_m.runtime_us_median)}; speedup {speed}")
            for name, f in forecasts.items():
                text = (f"expected {f['expected_speedup']:.3f}x, bin {f['predicted_bin']}, "
                        f"confidence {f['confidence']:.2f}") if "skipped" not in f else f"skipped ({f['skipped']})"
                print(f"  forecast {name}: {text}")
    (out / "imported_tasks.json").write_text(json.dumps(report, indent=1, default=_json))
    print(f"written {out / 'imported_tasks.json'}")
    return 0 if all(t["candidate_status"] == "ok" and t["reference_status"] == "ok" for t in report["tasks"]) else 1


def _us(values) -> str:
    return ", ".join(f"{v:.1f} us" for v in values) if values else "(no timing)"


def _json(value):
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


if __name__ == "__main__":
    sys.exit(main())
