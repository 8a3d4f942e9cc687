"""No ``opprof`` subcommand writes over one of its own inputs (QA round 4, T12_overwrite): a one-line error, a
non-zero exit and the input left byte for byte as it was."""

from __future__ import annotations

import pytest
from conftest import run_opprof
from kineto_ncu_writers import launch, write_kineto, write_ncu_csv


@pytest.fixture()
def inputs(tmp_path):
    launches = [launch(1, "gemm_kernel", 100, op="aten::mm"), launch(1, "relu_kernel", 200, op="aten::relu")]
    write_kineto(tmp_path / "trace.json", launches)
    write_ncu_csv(tmp_path / "prof.csv", launches, [0, 1])
    assert run_opprof("timeline", "--kineto", "trace.json", "--out", "tl", cwd=tmp_path).returncode == 0
    return tmp_path


@pytest.mark.parametrize("args, victim", [
    (("ncu", "prof.csv", "--out", "prof.csv"), "prof.csv"),
    (("attribute", "--timeline", "tl", "--out", "tl/kernels.parquet"), "tl/kernels.parquet"),
    (("timeline", "--kineto", "trace.json", "--out", "trace.json"), "trace.json"),
    (("trace", "--timeline", "tl", "--attribution", "tl/kernels.parquet", "--out", "tl/ranges.parquet"),
     "tl/ranges.parquet"),
])
def test_an_output_over_an_input_is_refused(inputs, args, victim):
    before = (inputs / victim).read_bytes()
    result = run_opprof(*args, cwd=inputs)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "would be overwritten while it is read" in lines[0], result.stderr
    assert (inputs / victim).read_bytes() == before


def test_an_output_beside_the_inputs_is_fine(inputs):
    """Writing next to an input folder, or a report inside the folder it reads, is the normal use."""
    result = run_opprof("attribute", "--timeline", "tl", "--out", "attribution/kernels.parquet", cwd=inputs)
    assert result.returncode == 0, result.stderr
    assert (inputs / "attribution/kernels.parquet").stat().st_size > 0
