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
