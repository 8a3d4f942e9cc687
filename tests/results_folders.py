"""A results folder (``results/<workload>/``, the layout of a finished run) written from given operator rows:
the input of report.html and compare.html in the report tests (tests/test_report_html.py, test_noise.py,
test_report_html_browser.py)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

TEMPLATE = "void at::native::elementwise_kernel<128, 4, at::native::Op<float>&>"


def run_json(device: str, kind: str = "gpt2", iterations: int = 2) -> dict:
    return {"versions": {"device": device, "device_name": "NVIDIA H100 80GB HBM3" if device == "cuda" else None,
                         "torch": "2.13.0", "cuda_runtime": "13.0" if device == "cuda" else None,
                         "driver": "580.00" if device == "cuda" else None, "cpu_threads": 1},
            "harness": {"iterations": iterations, "warmup": 1, "seed": 0},
            "workload": {"kind": kind, "compile": False, "n_layer": 2}, "mode": "inference", "compiled": False,
            "compile_mode": None, "timeline": "torch", "profiler": "torch"}


def write_results(folder: Path, ops: list[tuple], device: str = "cpu", kind: str = "gpt2", iterations: int = 2,
                  per_iteration: dict[str, list[int]] | None = None) -> pd.DataFrame:
    """A results folder; ``ops``: (operator, time_ns[, sm_sol, memory_sol]) rows. ``per_iteration``: each
    operator's time in each measured iteration (then time_ns is their sum, and operators.parquet has the
    per-iteration columns aggregate.per_iteration writes). Returns operators.parquet."""
    folder.mkdir(parents=True)
    if per_iteration:
        iterations = len(next(iter(per_iteration.values())))
        ops = [(o[0], sum(per_iteration[o[0]]), *o[2:]) for o in ops]
    total = sum(o[1] for o in ops)
    operators = pd.DataFrame({
        "operator": [o[0] for o in ops], "calls": [2] * len(ops), "kernels": [3] * len(ops),
        "time_ns": [o[1] for o in ops], "time_share": [o[1] / total for o in ops],
        "mean_kernel_ns": [o[1] // 3 for o in ops], "paths": ["correlation"] * len(ops),
        "bottleneck": ["not_collected"] * len(ops), "kernels_without_time": [0] * len(ops)})
    if device == "cuda":
        operators["sm_sol"] = [o[2] for o in ops]
        operators["memory_sol"] = [o[3] for o in ops]
        operators["counters_kernels"] = [0 if o[2] is None else 3 for o in ops]
        operators["bottleneck"] = ["compute" if (o[2] or 0) > (o[3] or 0) else "memory" for o in ops]
    if per_iteration:
        times = [per_iteration[o[0]] for o in ops]
        operators["time_per_iteration_ns"] = [round(sum(t) / iterations) for t in times]
        operators["iteration_min_ns"] = [min(t) for t in times]
        operators["iteration_median_ns"] = [round(statistics.median(t)) for t in times]
        operators["iteration_max_ns"] = [max(t) for t in times]
    operators = operators.sort_values("time_ns", ascending=False).reset_index(drop=True)
    operators.to_parquet(folder / "operators.parquet", index=False)
    pd.DataFrame({"module": ["h.0", "h.1", "(outside layers)"], "kernels": [3, 3, 1],
                  "time_ns": [total // 2, total - total // 2 - 1, 1], "time_share": [0.5, 0.5, 0.0]}
                 ).to_parquet(folder / "modules.parquet", index=False)
    pd.DataFrame({"layer_class": ["Block-1", "rest"], "module_class": ["Block", None], "instances": [2, 1],
                  "kernels_per_instance": [3, 1], "time_ns": [total - 1, 1], "mean_instance_time_ns": [total // 2, 1],
                  "representative": ["h.0", "rest"], "replays_without_dedup": [2, 1], "replays_with_dedup": [1, 1]}
                 ).to_parquet(folder / "layer_classes.parquet", index=False)
    coverage = {"kernel_time_ns": total, "kernel_count": 3 * len(ops), "attributed_count": 3 * len(ops) - 1,
                "coverage_time": 0.99, "by_path": {"correlation": 0.99, "unattributed": 0.01},
                "path_coverage": {"correlation": {"count": 0.9, "time": 0.99}}, "path_agreement_counts": {},
                "iteration_time_ns": {str(i): sum(t[i] for t in per_iteration.values()) for i in range(iterations)}
                if per_iteration else {str(i): total // iterations for i in range(iterations)},
                "counters_coverage": 0.75 if device == "cuda" else None,
                "counters_note": None if device == "cuda" else
                "hardware counters: not collected on CPU (Nsight Compute is GPU-only)",
                "unattributed": [{"name": TEMPLATE, "time_ns": 1000, "count": 1, "reason": "no_enclosing_operator"}],
                "unattributed_reasons": {"no_enclosing_operator": 1}}
    (folder / "coverage.json").write_text(json.dumps(coverage))
    (folder / "capture").mkdir()
    (folder / "capture" / "run.json").write_text(json.dumps(run_json(device, kind, iterations)))
    (folder / "capture" / "clocks_applied.json").write_text(json.dumps(
        {"locked": False, "reason": "policy none"} if device == "cuda" else {"locked": False, "device": "cpu"}))
    return operators


CUDA_OPS = [("aten::addmm", 5_000_000, 81.5, 40.25), ("aten::softmax", 2_000_000, 12.0, 77.0),
            (TEMPLATE, 1_000_000, 3.5, 9.0), ("aten::copy_", 500_000, None, None)]


# The ceilings of the roofline tests (a ceilings.json's figures: FLOP/s per dtype, bytes/s).
CEILINGS = {"schema": 1, "device": "cpu", "threads": 1,
            "compute_flops_per_s": {"float32": 5.0e10, "bfloat16": 8.0e10},
            "memory_bytes_per_s": {"copy": 1.0e10, "triad": 1.2e10, "best": 1.2e10}}


def add_work(folder: Path, work: dict[str, tuple], ceilings: dict | None = CEILINGS,
             ceilings_path: str = "results/ceilings/cpu.json") -> pd.DataFrame:
    """Give the results folder ``folder`` (:func:`write_results`) the work and roofline columns, as the workflow's
    aggregate does: ``work`` maps an operator to (FLOPs, bytes, dtype[, work_note]) over all measured iterations,
    FLOPs or bytes None for unknown work (an operator not in ``work`` has none computed). Each operator's time and
    work are split evenly over one kernel per measured iteration, and operator_profiler.roofline (with_work,
    with_roofline, work_summary) writes the columns and coverage.json ``work``. Returns operators.parquet."""
    from operator_profiler import roofline

    operators = pd.read_parquet(folder / "operators.parquet")
    coverage = json.loads((folder / "coverage.json").read_text())
    iterations = len(coverage["iteration_time_ns"])
    kernels, rows = [], []
    for op, time_ns in zip(operators["operator"], operators["time_ns"]):
        flops, nbytes, dtype, *note = work.get(op, (None, None, None, "no work computed"))
        for i in range(iterations):
            kernel_id = len(kernels)
            share = time_ns // iterations + (time_ns % iterations if i == 0 else 0)
            kernels.append({"kernel_id": kernel_id, "operator": op, "duration_ns": share, "iteration": i})
            rows.append({"kernel_id": kernel_id, "flops": None if flops is None else flops / iterations,
                         "bytes": None if nbytes is None else nbytes / iterations,
                         "flops_formula": None if flops is None else 0.0, "dtype": dtype,
                         "work_rule": "unknown" if flops is None or nbytes is None else "per_element",
                         "work_note": note[0] if note else None})
    attribution = pd.DataFrame(kernels)
    kernel_work = pd.DataFrame(rows).astype({"flops": "float64", "bytes": "float64", "flops_formula": "float64"})
    out = roofline.with_roofline(roofline.with_work(operators, attribution, kernel_work), ceilings)
    out.to_parquet(folder / "operators.parquet", index=False)
    coverage["work"] = roofline.work_summary(attribution, kernel_work, ceilings, ceilings_path if ceilings else None)
    (folder / "coverage.json").write_text(json.dumps(coverage))
    return out
