"""Layer-class broadcast (``opprof match --kernel-layers``) copies counters only between launches of one token
(QA round 4, T10_broadcast). Fixture: a two-iteration Kineto trace (``opprof.iteration:N`` ranges) and an ncu CSV
of iteration 0 only (``--window prof=0:2``), written here."""

from __future__ import annotations

import json

import pandas as pd
from conftest import run_opprof
from kineto_ncu_writers import PID, launch, write_kineto, write_ncu_csv


def _run(tmp_path, grids_iteration_1):
    launches = [launch(11, "gemm_kernel", 100, grid=(8, 1, 1), op="aten::mm"),
                launch(11, "relu_kernel", 200, grid=(16, 1, 1), op="aten::relu"),
                launch(11, "gemm_kernel", 1100, grid=grids_iteration_1[0], op="aten::mm"),
                launch(11, "relu_kernel", 1200, grid=grids_iteration_1[1], op="aten::relu")]
    write_kineto(tmp_path / "trace.json", launches)
    trace = json.loads((tmp_path / "trace.json").read_text())
    trace["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": f"opprof.iteration:{i}", "pid": PID,
                              "tid": 11, "ts": 50 + 1000 * i, "dur": 900, "args": {}} for i in range(2)]
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    (tmp_path / "layers.json").write_text("[]")
    write_ncu_csv(tmp_path / "prof.csv", launches, [0, 1])
    for args in (("timeline", "--kineto", "trace.json", "--out", "tl"),
                 ("classify", "--timeline", "tl", "--layers", "layers.json", "--out", "layers"),
                 ("ncu", "prof.csv", "--out", "prof.parquet")):
        assert run_opprof(*args, cwd=tmp_path).returncode == 0
    result = run_opprof("match", "--timeline", "tl", "--ncu", "prof.parquet", "--out", "m", "--window", "prof=0:2",
                        "--kernel-layers", "layers/kernel_layers.parquet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    matched = pd.read_parquet(tmp_path / "m/matched/kernel_metrics.parquet")
    diagnostics = json.loads((tmp_path / "m/matched/diagnostics.json").read_text())
    return result.stdout, matched, diagnostics


def test_a_kernel_of_another_grid_gets_no_copied_counters(tmp_path):
    """Iteration 1 runs a 4x larger batch: same names, 4x the grids. Copying iteration 0's counters to them was
    counted as `filled` (wrong work per kernel); now each is refused as layer_config_mismatch and the console
    line counts the kernels the file holds."""
    stdout, matched, diagnostics = _run(tmp_path, [(32, 1, 1), (64, 1, 1)])
    assert matched["kernel_id"].tolist() == [0, 1]
    assert matched["dram__bytes.sum"].tolist() == [1_000_000, 1_000_001]
    assert diagnostics["counters"]["with_counters"] == 2
    assert diagnostics["counters"]["refused_reasons"] == {"layer_config_mismatch": 2}
    assert diagnostics["counters"]["kernels"] == 4 and diagnostics["counters"]["not_measured"] == 0
    assert [(r["kernel_id"], r["counters_from"], r["reason"]) for r in diagnostics["broadcast_refused"]] == [
        (2, 0, "layer_config_mismatch"), (3, 1, "layer_config_mismatch")]
    assert stdout.startswith("counters: 2 of 4 kernels; 2 refused (2 layer_config_mismatch)")


def test_the_same_token_is_filled_and_counted(tmp_path):
    """Same names and grids in both iterations: iteration 1 gets iteration 0's counters (counters_from), and the
    console line counts all 4 kernels the file holds (it said 2 of 4)."""
    stdout, matched, diagnostics = _run(tmp_path, [(8, 1, 1), (16, 1, 1)])
    assert matched["kernel_id"].tolist() == [0, 1, 2, 3]
    assert matched["counters_from"].tolist() == [0, 1, 0, 1]
    assert matched["dram__bytes.sum"].tolist() == [1_000_000, 1_000_001, 1_000_000, 1_000_001]
    assert diagnostics["counters"]["with_counters"] == 4 and diagnostics["counters"]["from_layer_class"] == 2
    assert diagnostics["counters"]["not_measured"] == 0 and diagnostics["counters"]["refused"] == 0
    assert stdout.startswith("counters: 4 of 4 kernels; 0 refused")
