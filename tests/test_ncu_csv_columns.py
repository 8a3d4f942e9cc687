"""An ncu CSV without usable kernel names is refused by ``opprof ncu`` (QA round 4, T5_columns): a renamed or
lower-case ``Kernel Name`` column, or names all empty, were read as "12 kernels" and then blamed on another
program by ``match``. Fixtures are ncu details CSVs written here with the header edited."""

from __future__ import annotations

import pytest
from conftest import run_opprof
from kineto_ncu_writers import NCU_HEADER, launch, write_ncu_csv

LAUNCHES = [launch(1, "gemm_kernel", 100), launch(1, "relu_kernel", 200)]


@pytest.mark.parametrize("header, says", [
    ([h if h != "Kernel Name" else "Function Name" for h in NCU_HEADER], "no 'Kernel Name' column (it has 'Function Name')"),
    (["ID"] + [h.lower() for h in NCU_HEADER[1:]], "no 'Kernel Name' column (it has 'kernel name')"),
])
def test_a_csv_without_the_kernel_name_column_is_refused(tmp_path, header, says):
    write_ncu_csv(tmp_path / "prof.csv", LAUNCHES, [0, 1], header=header)
    result = run_opprof("ncu", "prof.csv", "--out", "prof.parquet", cwd=tmp_path)
    assert result.returncode == 1
    line, = result.stderr.strip().splitlines()
    assert line.startswith("opprof ncu: error: prof.csv: line 1, the header: ") and says in line, line
    assert '"ID","Process ID","Process Name","Host Name","Kernel Name"' in line
    assert not (tmp_path / "prof.parquet").exists()


def test_a_csv_whose_kernel_names_are_empty_is_refused(tmp_path):
    write_ncu_csv(tmp_path / "prof.csv", LAUNCHES, [0, 1], names={0: "", 1: ""})
    result = run_opprof("ncu", "prof.csv", "--out", "prof.parquet", cwd=tmp_path)
    assert result.returncode == 1
    line, = result.stderr.strip().splitlines()
    # 2 results x 2 metrics: 4 lines, the first on line 2
    assert "prof.csv: line 2, field 'Kernel Name': 4 of 4 rows have an empty kernel name" in line, line
    assert not (tmp_path / "prof.parquet").exists()


def test_errors_cite_no_file_outside_the_repository(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    result = run_opprof("ncu", "empty.csv", "--out", "x.parquet", cwd=tmp_path)
    assert result.returncode == 1 and "shared/docs" not in result.stderr and "docs/DESIGN.md" in result.stderr


@pytest.mark.parametrize("value, says", [
    ("1e400", "'1e400' is not a finite number"),
    ("inf", "'inf' is not a finite number"),
    ("-5", "'-5' is negative, which a byte count cannot be"),
])
def test_non_finite_and_negative_amounts_are_refused_alike(tmp_path, value, says):
    """QA round 4: 1e400 was read as inf while 'inf' was refused; a negative byte count or duration was kept."""
    write_ncu_csv(tmp_path / "prof.csv", LAUNCHES, [0, 1], values={1: value})
    result = run_opprof("ncu", "prof.csv", "--out", "prof.parquet", cwd=tmp_path)
    assert result.returncode == 1
    line, = result.stderr.strip().splitlines()
    # result 1's dram__bytes.sum is the CSV's 4th line
    assert "prof.csv: line 4, field 'Metric Value' (metric 'dram__bytes.sum', ID 1): " + says in line, line
    assert not (tmp_path / "prof.parquet").exists()
