"""Invocation-order matching of ncu rows to timeline kernels (issue #4 item 3; cases C02, C15, C16, C23)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import real_file

from operator_profiler import stages
from operator_profiler.matching import base_name, match_invocations, names_agree
from operator_profiler.ncu.csv_reader import NcuCsvError

REAL_NCU = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real" / "ncu"
DROPOUT = "a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv"
HDR = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
       '"Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _real(name: str) -> Path:
    return real_file("ncu", name)


def _row(i, name, metric, unit, value, grid="(1, 1, 1)", block="(1, 1, 1)"):
    return (f'"{i}","500","python","h","{name}","1","7","{block}","{grid}","Command line profiler metrics",'
            f'"{metric}","{unit}","{value}"\n')


def _ncu(tmp_path, text, name="run.csv") -> pd.DataFrame:
    csv = tmp_path / name
    csv.write_text(text, encoding="utf-8")
    return stages.parse_ncu_files([csv], tmp_path / (name + ".parquet"))


def _kernels(names, **cols) -> pd.DataFrame:
    df = pd.DataFrame({"kernel_id": range(len(names)), "pid": 1, "name": names, "mangled_name": None,
                       "match_key": names, "stream": 7, "grid": "1,1,1", "block": "1,1,1"})
    for c, v in cols.items():
        df[c] = v
    df["occurrence"] = df.groupby(["pid", "match_key"]).cumcount()
    return df


# ------------------------------------------------------------------------------------------- names

def test_names_agree_across_print_kernel_base_forms():
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_"
    new = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)"
    old = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>>(int, float)"
    assert base_name(mangled) == base_name(new) == base_name(old) == "vectorized_elementwise_kernel"
    assert names_agree(new, mangled, mangled) and names_agree(new, None, old) and names_agree(new, None, mangled)
    assert names_agree(new, None, "vectorized_elementwise_kernel")  # --print-kernel-base function
    assert not names_agree(new, mangled, "_ZN2at6native29vectorized_elementwise_kernelILi2EEEvi")  # mangled: exact
    assert not names_agree("triton_mm_0", None, "triton_mm_1")


# -------------------------------------------------------------------------------------------- C02

def test_c02_nvtx_filter_drops_backward_kernels(tmp_path):
    kernels = _kernels(["fwd_kernel", "bwd_kernel", "fwd_kernel", "bwd_kernel"], launch_tid=[1, 2, 1, 2])
    ncu = _ncu(tmp_path, HDR + _row(0, "fwd_kernel", "Duration", "usecond", "10.0")
               + _row(1, "fwd_kernel", "Duration", "usecond", "11.0"))
    matched, diag = match_invocations(kernels, ncu)
    assert matched[["kernel_id", "ncu_id"]].values.tolist() == [[0, 0], [2, 1]]
    assert matched["Duration"].tolist() == pytest.approx([10e-6, 11e-6])
    assert (diag["matched"], diag["timeline_only"], diag["ncu_only"]) == (2, 2, 0)
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [
        (1, "launched_on_other_thread"), (3, "launched_on_other_thread")]
    assert diag["coverage_by_name"] == {"bwd_kernel": "0/2", "fwd_kernel": "2/2"}
    assert any("C02" in h for h in diag["hints"]) and diag["name_disagreements"] == []


def test_c02_fixture_b_no_kernels_profiled_is_an_error(tmp_path):
    csv = tmp_path / "run.csv"
    csv.write_text("==PROF== Connected to process 42 (/usr/bin/python3)\n==PROF== Disconnected from process 42\n"
                   "==WARNING== No kernels were profiled.\n")
    with pytest.raises(NcuCsvError):
        stages.parse_ncu_files([csv], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


# -------------------------------------------------------------------------------------------- C15

def _c15(tmp_path, configs):
    text = HDR + "".join(_row(i, "triton_mm_0", "gpu__time_duration.sum", "nsecond", 100 + i, grid=g, block=b)
                         for i, (g, b) in enumerate(configs))
    ncu = _ncu(tmp_path, text)
    kernels = _kernels(["other", "triton_mm_0", "triton_mm_0"], grid="128,1,1", block="128,1,1")
    return match_invocations(kernels, ncu)


def test_c15_autotune_surplus_disambiguated_by_launch_configuration(tmp_path):
    configs = [("(64, 1, 1)", "(256, 1, 1)"), ("(256, 1, 1)", "(64, 1, 1)"), ("(128, 1, 1)", "(256, 1, 1)"),
               ("(32, 1, 1)", "(128, 1, 1)"), ("(128, 1, 1)", "(128, 1, 1)"), ("(128, 1, 1)", "(128, 1, 1)")]
    matched, diag = _c15(tmp_path, configs)
    assert matched[["kernel_id", "ncu_id"]].values.tolist() == [[1, 4], [2, 5]]
    assert matched["gpu__time_duration.sum"].tolist() == pytest.approx([104e-9, 105e-9])
    assert [(r["ncu_id"], r["reason"]) for r in diag["ncu_only_rows"]] == [
        (i, "likely_autotune_or_benchmark") for i in range(4)]
    assert diag["per_key"]["triton_mm_0"] == {"timeline": 2, "ncu": 6, "matched": 2, "status": "ncu_surplus"}
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [(0, "not_in_ncu")]


def test_c15_surplus_indistinguishable_is_a_count_mismatch(tmp_path):
    matched, diag = _c15(tmp_path, [("(128, 1, 1)", "(128, 1, 1)")] * 6)
    assert matched.empty and diag["matched"] == 0
    assert diag["per_key"]["triton_mm_0"]["status"] == "count_mismatch"
    assert diag["ncu_only_reasons"] == {"count_mismatch": 6}
    assert diag["timeline_only_reasons"] == {"count_mismatch": 2, "not_in_ncu": 1}
    assert any("launch-skip" in h for h in diag["hints"])


def test_c15_launch_skip_window(tmp_path):
    """The same fixture replayed with --launch-skip: the window drops the first timeline launch of the key."""
    ncu = _ncu(tmp_path, HDR + _row(0, "triton_mm_0", "gpu__time_duration.sum", "nsecond", "7"))
    kernels = _kernels(["triton_mm_0", "triton_mm_0"])
    matched, diag = match_invocations(kernels, ncu, {"launch_skip": {"triton_mm_0": 1}, "launch_count": 1})
    assert matched[["kernel_id", "ncu_id"]].values.tolist() == [[1, 0]]
    assert (diag["outside_window"], diag["timeline_only"]) == (1, 0)


# -------------------------------------------------------------------------------------------- C16

def test_c16_nccl_kernels_are_timeline_only_with_coverage_split(tmp_path):
    kernels = _kernels(["gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"], stream=[7, 20],
                       duration_ns=[250, 740], launch_tid=1)
    ncu = _ncu(tmp_path, HDR + _row(0, "gemm", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "80"))
    matched, diag = match_invocations(kernels, ncu)
    assert matched[["kernel_id", "ncu_id"]].values.tolist() == [[0, 0]]
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [(1, "communication_not_profiled")]
    cov = diag["counters_coverage"]
    assert (cov["compute"]["with_counters_ns"], cov["compute"]["time_ns"]) == (250, 250)
    assert (cov["communication"]["with_counters_ns"], cov["communication"]["time_ns"]) == (0, 740)
    assert cov["overall"]["fraction"] == pytest.approx(250 / 990)


# -------------------------------------------------------------------------------------------- C23

def test_c23_formatted_csv_values_arrive_normalized_on_the_matched_kernels(tmp_path):
    pre = ('==PROF== Connected to process 500 (/usr/bin/python3)\nepoch 1 loss 0.3\n'
           '==PROF== Profiling "gemm" - 0: 0%....50%....100% - 8 passes\n')
    text = pre + HDR + "".join([
        _row(0, "gemm", "Duration", "usecond", "1,234.56"), _row(0, "gemm", "Elapsed Cycles", "cycle", "6,655"),
        _row(0, "gemm", "DRAM Throughput", "%", "87.30"), _row(0, "gemm", "L1/TEX Hit Rate", "%", "n/a"),
        _row(1, "gemm", "Duration", "msecond", "1.20"), _row(1, "gemm", "Memory Throughput", "Gbyte/second", "812.40"),
        _row(2, "gemm", "Memory Throughput", "Tbyte/second", "1.61"), _row(2, "gemm", "Duration", "nsecond", "950")])
    ncu = _ncu(tmp_path, text)
    matched, diag = match_invocations(_kernels(["gemm"] * 3), ncu)
    assert diag["matched"] == 3 and matched.kernel_id.tolist() == [0, 1, 2]
    assert matched["Duration"].tolist() == pytest.approx([1.23456e-3, 1.2e-3, 950e-9])
    assert matched["Elapsed Cycles"].iloc[0] == 6655
    assert matched["Memory Throughput"].iloc[1:].tolist() == pytest.approx([8.124e11, 1.61e12])
    assert matched["L1/TEX Hit Rate"].isna().iloc[0]  # n/a -> null, not 0
    assert matched.attrs["units"]["Duration"] == "second"


# ------------------------------------------------------------------------------------ real file

def test_real_dropout_162_launches_with_one_renamed_timeline_kernel(tmp_path):
    ncu = stages.parse_ncu_files([_real(DROPOUT)], tmp_path / "ncu.parquet")
    name = ncu["name"].iloc[0]
    assert len(ncu) == 162 and ncu["name"].nunique() == 1
    kernels = _kernels([name] * 162, pid=33512, grid="1024,1,1", block="256,1,1", launch_tid=33512,
                       duration_ns=12000)
    renamed = ("void at::native::(anonymous namespace)::fused_dropout_kernel<double, double, unsigned int, 1>"
               "(at::cuda::detail::TensorInfo<double, unsigned int>)")
    kernels.loc[100, "name"] = renamed  # the timeline calls launch 100 something else; its key is unchanged
    matched, diag = match_invocations(kernels, ncu)
    assert matched.kernel_id.tolist() == list(range(100)) and matched.ncu_id.tolist() == list(range(100))
    assert matched["dram__bytes.sum"].iloc[0] == 4194688.0
    assert len(diag["name_disagreements"]) == 1
    d = diag["first_divergence"][name]
    assert (d["position"], d["kernel_id"], d["ncu_id"], d["timeline_name"], d["ncu_name"]) == (
        100, 100, 100, renamed, name)
    assert (diag["matched"], diag["timeline_only"], diag["ncu_only"]) == (100, 62, 62)
    assert diag["timeline_only_reasons"] == {"after_name_divergence": 62}
    assert diag["ncu_only_reasons"] == {"after_name_divergence": 62}
    assert diag["per_key"][name] == {"timeline": 162, "ncu": 162, "matched": 100, "status": "diverged"}


# ---------------------------------------------------------------------------------------- CLI

def test_opprof_match_writes_metrics_and_diagnostics(tmp_path):
    ncu = tmp_path / "ncu.parquet"
    csv = tmp_path / "run.csv"
    csv.write_text(HDR + _row(0, "k", "dram__bytes.sum", "Kbyte", "2") + _row(1, "k", "dram__bytes.sum", "byte", "5"))
    stages.parse_ncu_files([csv], ncu)
    (tmp_path / "timeline").mkdir()
    _kernels(["k", "k", "j"]).to_parquet(tmp_path / "timeline" / "kernels.parquet", index=False)
    r = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "match", "--timeline", str(tmp_path / "timeline"),
                        "--ncu", str(ncu), "--out", str(tmp_path)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "2 matched, 0 ncu-only, 1 timeline-only" in r.stdout
    metrics = pd.read_parquet(tmp_path / "matched" / "kernel_metrics.parquet")
    assert metrics[["kernel_id", "ncu_id", "dram__bytes.sum"]].values.tolist() == [[0, 0, 2000.0], [1, 1, 5.0]]
    diag = json.loads((tmp_path / "matched" / "diagnostics.json").read_text())
    assert diag["units"] == {"dram__bytes.sum": "byte"} and diag["timeline_only_kernels"][0]["reason"] == "not_in_ncu"


# Layer-class broadcast ---------------------------------------------------------------------------


def test_counters_of_the_measured_instance_are_broadcast_by_position():
    """Two identical layers (one class) and one kernel outside layers: ncu measured only blocks.0
    (the representative) and the rest kernel; blocks.1 gets blocks.0's counters position by position.
    A kernel whose position has a different kernel name in the representative gets none."""
    from operator_profiler.matching import broadcast_to_instances

    kernels = pd.DataFrame({"kernel_id": range(7),
                            "match_key": ["gemm", "relu", "gemm", "relu", "copy", "gemm", "oddball"]})
    kernel_layers = pd.DataFrame({
        "kernel_id": range(7),
        "layer_class": ["Block-1", "Block-1", "Block-1", "Block-1", "rest", "Block-1", "Block-1"],
        "position": [0, 1, 0, 1, 0, 0, 1],  # kernels 5, 6: blocks.0 again in a later iteration, one odd kernel
    })
    matched = pd.DataFrame({"kernel_id": [0, 1, 4], "ncu_id": [0, 1, 2], "dram__bytes.sum": [100.0, 10.0, 7.0]})
    matched.attrs = {"units": {"dram__bytes.sum": "byte"}}
    counters, stats = broadcast_to_instances(matched, kernels, kernel_layers)
    got = counters.set_index("kernel_id")
    assert got["counters_from"].to_dict() == {0: 0, 1: 1, 2: 0, 3: 1, 4: 4, 5: 0}
    assert got["dram__bytes.sum"].to_dict() == {0: 100.0, 1: 10.0, 2: 100.0, 3: 10.0, 4: 7.0, 5: 100.0}
    assert 6 not in got.index  # 'oddball' at the position of 'relu': not guessed
    assert stats["Block-1"] == {"kernels": 6, "measured": 2, "filled": 3, "without_counters": 1, "name_mismatch": 1}
    assert counters.attrs["units"] == {"dram__bytes.sum": "byte"}


def test_two_measured_instances_report_how_far_apart_they_are():
    from operator_profiler.matching import broadcast_to_instances

    kernels = pd.DataFrame({"kernel_id": range(4), "match_key": ["gemm", "relu", "gemm", "relu"]})
    kernel_layers = pd.DataFrame({"kernel_id": range(4), "layer_class": "Block-1", "position": [0, 1, 0, 1]})
    matched = pd.DataFrame({"kernel_id": range(4), "ncu_id": range(4),
                            "dram__bytes.sum": [100.0, 10.0, 110.0, 10.0], "sm__throughput.avg.pct_of_peak_sustained_elapsed":
                            [50.0, 20.0, 50.0, 25.0]})
    counters, stats = broadcast_to_instances(matched, kernels, kernel_layers)
    assert counters["counters_from"].tolist() == [0, 1, 2, 3]  # measured kernels keep their own
    diff = stats["Block-1"]["verify_max_relative_difference"]
    assert diff["dram__bytes.sum"] == pytest.approx(10 / 110)
    assert diff["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(5 / 25)
