"""``opprof match --window`` values that describe no launch are one-line errors (QA round 4)."""

from __future__ import annotations

import json

import pytest
from conftest import run_opprof
from kineto_ncu_writers import launch, write_kineto, write_ncu_csv


@pytest.mark.parametrize("window, says", [
    ("prof=0:0", "window launch_count must be at least 1"),
    ("window.json", "window 'sources' is empty"),
])
def test_a_window_of_no_launch_is_refused(tmp_path, window, says):
    launches = [launch(1, "gemm_kernel", 100), launch(1, "relu_kernel", 200)]
    write_kineto(tmp_path / "trace.json", launches)
    write_ncu_csv(tmp_path / "prof.csv", launches, [0, 1])
    (tmp_path / "window.json").write_text(json.dumps({"sources": {}}))
    for args in (("timeline", "--kineto", "trace.json", "--out", "tl"), ("ncu", "prof.csv", "--out", "prof.parquet")):
        assert run_opprof(*args, cwd=tmp_path).returncode == 0
    result = run_opprof("match", "--timeline", "tl", "--ncu", "prof.parquet", "--window", window, "--out", "m",
                        cwd=tmp_path)
    assert result.returncode == 1
    line, = result.stderr.strip().splitlines()
    assert line.startswith("opprof match: error: ") and says in line, line
    assert not (tmp_path / "m").exists()


def test_a_contiguous_claim_that_fails_refuses_the_kernels_the_rows_could_be(tmp_path):
    """QA round 4 (T11): a 2-row file declared contiguous that is not a run of the timeline's launches refused
    every kernel of the process (window_mismatch); only the launches with a row's token could be what it measured."""
    names = ["a_kernel", "b_kernel", "a_kernel", "c_kernel", "c_kernel", "c_kernel", "b_kernel", "a_kernel"]
    launches = [launch(1, name, 100 + 20 * i) for i, name in enumerate(names)]
    write_kineto(tmp_path / "trace.json", launches)
    write_ncu_csv(tmp_path / "prof.csv", launches, [1, 6])  # b, b: never consecutive in the timeline
    for args in (("timeline", "--kineto", "trace.json", "--out", "tl"), ("ncu", "prof.csv", "--out", "prof.parquet")):
        assert run_opprof(*args, cwd=tmp_path).returncode == 0
    result = run_opprof("match", "--timeline", "tl", "--ncu", "prof.parquet", "--window", "prof=contiguous",
                        "--out", "m", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    diagnostics = json.loads((tmp_path / "m/matched/diagnostics.json").read_text())
    assert diagnostics["counters"]["refused_reasons"] == {"window_mismatch": names.count("b_kernel")}
    assert diagnostics["counters"]["not_measured"] == len(names) - names.count("b_kernel")
    hint, = [h for h in diagnostics["hints"] if "declared window" in h]
    assert "consecutive launches" in hint and "--launch-skip" not in hint
