"""What a finished search leaves behind: the best kernel's source, the generation table, the search curve."""

from __future__ import annotations

import dataclasses
import io

import pandas as pd


def generation_table(result) -> pd.DataFrame:
    return pd.DataFrame([dataclasses.asdict(s) for s in result.generations])


def search_curve_png(result) -> bytes:
    """Best measured speedup against measurements charged, one point per generation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = generation_table(result)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if not table.empty:
        ax.step(table["budget_used"], table["best_speedup"].astype(float), where="post", marker="o")
    ax.set_xlabel("measurements charged")
    ax.set_ylabel("best measured speedup (x eager)")
    ax.set_title(f"{result.op} on {result.gpu_type}: {result.run_id}", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out.getvalue()


def search_artifacts(result) -> dict[str, str | bytes]:
    header = (f"# kernelcast best kernel for {result.op} on {result.gpu_type} (run {result.run_id})\n"
              f"# candidate {result.best_candidate_id}, measured speedup {result.best_speedup}\n"
              f"# launch params: {result.best_params}\n")
    return {"best_kernel.py": header + result.best_source,
            "generations.csv": generation_table(result).to_csv(index=False),
            "search_curve.png": search_curve_png(result)}


def summary_lines(result, data_uri: str, tracking_uri: str, prefect_ui: str | None) -> list[str]:
    speed = f"{result.best_speedup:.3f}x eager PyTorch" if result.best_speedup else "none succeeded"
    how = "replayed from the measured pool (no GPU here)" if result.replayed else "measured on this GPU"
    lines = [f"search {result.run_id}: {result.op} on {result.gpu_type}, {len(result.generations)} generations, "
             f"{result.budget_used} measurements ({how}), {result.gpu_seconds:.1f} GPU-seconds charged",
             f"best measured kernel: {result.best_candidate_id} at {speed}; params {result.best_params}"]
    for s in result.generations:
        best = f"{s.best_speedup:.3f}" if s.best_speedup else "-"
        acc = f"{s.surrogate_bin_accuracy:.2f}" if s.surrogate_bin_accuracy is not None else "-"
        lines.append(f"  gen {s.generation}: generated {s.generated}, measured {s.measured} (reused {s.reused}), "
                     f"trusted {s.trusted}, dropped {s.dropped}, best {best}, surrogate bin accuracy {acc}")
    lines += [f"resume or replay this run: kernelcast search --run-id {result.run_id} (with the same settings)",
              f"data:   {data_uri}  (tables runs, candidates, forecasts, decisions, measurements, generations)",
              f"MLflow: {tracking_uri}  (mlflow ui --backend-store-uri {tracking_uri})"]
    if prefect_ui:
        lines.append(f"Prefect: {prefect_ui}")
    return lines
