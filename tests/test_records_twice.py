"""Kernel records a trace holds twice (docs/field-cases.md C24): an exact copy of a kernel record (same name, device,
stream, start, duration, correlation id and every other field) is one kernel, counted once and said in
``timeline/diagnostics.json`` (``counts.duplicate_kernel_records``, a warning) and the reports; records that
differ in start time (the nodes of one CUDA-graph launch share its correlation id) stay.

Fixtures are written here from the formats: Kineto events as docs/formats.md#kineto-trace-json describes them (µs,
``args.correlation``, ``graph id``/``graph node id``; the helpers follow docs/field-cases.md#fixture-conventions),
nsys rows in the real table layout of ``tests/nsys_export.py`` (docs/formats.md#nsys-tables, ns). Expected
durations are the fixtures' own numbers.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from nsys_export import Kernel, Nvtx, Runtime, write_nsys_export

from operator_profiler import aggregate as agg
from operator_profiler import stages
from operator_profiler.attribution.merge import attribute
from operator_profiler.cli import main
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.timeline.nsys import read_nsys

PID = 1


def cpu_op(name, tid, ts, dur, ext):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext}}


def launch(api, tid, ts, dur, corr, ext=None):
    args = {"correlation": corr, **({"External id": ext} if ext is not None else {})}
    return {"ph": "X", "cat": "cuda_runtime", "name": api, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kern(name, stream, ts, dur, corr, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream, "device": 0, "grid": [4, 1, 1], "block": [128, 1, 1],
                     **args}}


def _mm_add_events():
    """The issue's case: ``aten::mm`` runs one 40 µs GEMM whose record the trace holds twice, ``aten::add`` one
    9 µs kernel: 40 µs and 49 µs in all, not 80 and 89."""
    gemm = kern("gemm", 7, 110.0, 40.0, 11)
    return [cpu_op("aten::mm", 1, 100.0, 50.0, 1), launch("cudaLaunchKernel", 1, 105.0, 3.0, 11, 1), gemm,
            cpu_op("aten::add", 1, 200.0, 30.0, 2), launch("cudaLaunchKernel", 1, 205.0, 3.0, 12, 2),
            kern("add", 7, 210.0, 9.0, 12), dict(gemm)]


def _trace(tmp_path, events, name="trace.json", **top):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], **top,
                                "traceEvents": events}))
    return path


def _attribute(timeline):
    layers, _, _ = classify_layers(timeline.kernels, timeline.ranges, [])
    return attribute(timeline.kernels, timeline.ranges, layers, None)


@pytest.mark.parametrize("typed", [True, False])
def test_kineto_kernel_record_written_twice_is_counted_once(tmp_path, typed):
    timeline = read_kineto(_trace(tmp_path, _mm_add_events()), typed=typed)
    assert timeline.kernels["name"].tolist() == ["gemm", "add"]
    ops = agg.operators_table(_attribute(timeline), per_iteration=False).set_index("operator")
    assert ops.loc["aten::mm", "time_ns"] == 40_000 and ops.loc["aten::mm", "kernels"] == 1
    assert int(timeline.kernels["duration_ns"].sum()) == 49_000
    d = timeline.diagnostics
    assert d["counts"]["duplicate_kernel_records"] == 1 and d["counts"]["kernels"] == 2
    assert d["counts"]["duplicate_launch_records"] == 0
    assert any(w.startswith("1 kernel record(s) repeat another record in every field") for w in d["warnings"])
    # the copy is no longer taken for a second kernel of the launch call
    assert not any("share the correlation id" in w for w in d["warnings"])


def test_kineto_graph_nodes_sharing_a_correlation_id_stay(tmp_path):
    """Two nodes of one graph launch: same name, same correlation id, other start (and node id): two kernels. A copy
    of one of them (ns timestamps, every field equal) is dropped."""
    node_a = kern("node_kernel", 7, 305.125, 2.0, 20, **{"graph id": 1, "graph node id": 101})
    node_b = kern("node_kernel", 7, 307.25, 2.0, 20, **{"graph id": 1, "graph node id": 102})
    events = [cpu_op("aten::replay", 1, 300.0, 20.0, 1), launch("cudaGraphLaunch", 1, 300.5, 3.0, 20, 1),
              node_a, node_b, dict(node_b)]
    timeline = read_kineto(_trace(tmp_path, events))
    assert timeline.kernels["start_ns"].tolist() == [305_125, 307_250]
    assert timeline.kernels["graph_node_id"].tolist() == [101, 102]
    assert timeline.diagnostics["counts"]["duplicate_kernel_records"] == 1


def test_kineto_whole_us_graph_records_that_look_alike_are_kept_and_said(tmp_path):
    """A trace of whole-µs timestamps (Kineto before 2024, no node ids): two identical records of a graph launch may
    be two nodes run within one µs, so both are kept, with a warning; identical records of a plain launch call
    (which starts one kernel) are one kernel."""
    events = [cpu_op("aten::replay", 1, 300, 20, 1), launch("cudaGraphLaunch", 1, 301, 3, 20, 1),
              kern("tiny_node", 7, 306, 0, 20), kern("tiny_node", 7, 306, 0, 20),
              cpu_op("aten::add", 1, 400, 20, 2), launch("cudaLaunchKernel", 1, 401, 3, 21, 2),
              kern("add", 7, 406, 5, 21), kern("add", 7, 406, 5, 21)]
    timeline = read_kineto(_trace(tmp_path, events))
    assert timeline.kernels["name"].tolist() == ["tiny_node", "tiny_node", "add"]
    d = timeline.diagnostics
    assert d["counts"]["duplicate_kernel_records"] == 1
    assert any(w.startswith("1 kernel record(s) of a CUDA-graph or unknown launch are identical to another (first: "
                            "'tiny_node') in a trace of whole-µs timestamps") for w in d["warnings"])


def test_kineto_records_without_a_valid_time_are_never_taken_for_copies(tmp_path):
    """ts 0 records (a dropped timestamp, docs/field-cases.md C04) carry nothing that tells two executions apart."""
    events = [cpu_op("aten::replay", 1, 300.0, 20.0, 1), launch("cudaGraphLaunch", 1, 300.5, 3.0, 20, 1),
              kern("node_kernel", 7, 0, 0, 20), kern("node_kernel", 7, 0, 0, 20)]
    timeline = read_kineto(_trace(tmp_path, events))
    assert len(timeline.kernels) == 2 and timeline.diagnostics["counts"]["duplicate_kernel_records"] == 0
    assert timeline.diagnostics["counts"]["invalid_timestamp_kernels"] == 2


@pytest.mark.parametrize("typed", [True, False])
def test_kineto_launch_record_written_twice_joins_its_kernel(tmp_path, typed):
    """Two equal launch events of one call are one call: its kernel joins it (two launches with one correlation id
    would otherwise be ambiguous, and the kernel left unattributed)."""
    call = launch("cudaLaunchKernel", 1, 105.0, 3.0, 11, 1)
    events = [cpu_op("aten::mul", 1, 100.0, 50.0, 1), call, dict(call), kern("mul", 7, 110.0, 4.0, 11)]
    timeline = read_kineto(_trace(tmp_path, events), typed=typed)
    d = timeline.diagnostics
    assert d["counts"]["duplicate_launch_records"] == 1 and d["counts"]["launch_calls"] == 1
    assert not any("share their correlation id with another launch" in w for w in d["warnings"])
    assert _attribute(timeline)["operator"].tolist() == ["aten::mul"]


def test_kineto_records_differing_in_one_field_stay(tmp_path):
    """Same name, stream, start, duration and correlation id but another grid: not a copy (two records of one plain
    launch call: the existing warning says the trace may be merged or corrupt)."""
    gemm = kern("gemm", 7, 110.0, 40.0, 11)
    other = kern("gemm", 7, 110.0, 40.0, 11, grid=[8, 1, 1])
    events = [cpu_op("aten::mm", 1, 100.0, 50.0, 1), launch("cudaLaunchKernel", 1, 105.0, 3.0, 11, 1), gemm, other]
    timeline = read_kineto(_trace(tmp_path, events))
    assert len(timeline.kernels) == 2 and timeline.diagnostics["counts"]["duplicate_kernel_records"] == 0
    assert any("2 kernel records share the correlation id" in w for w in timeline.diagnostics["warnings"])


def _nsys_rows():
    """pid 10: ``aten::mm`` launches a GEMM (corr 5) whose KERNEL row is written twice; ``aten::add`` launches a
    cudaGraphLaunch (corr 6) whose two node kernels share the correlation id (other start, other node id)."""
    nvtx = [Nvtx("aten::mm", 59, "10:10", 1_000, 9_000), Nvtx("aten::add", 59, "10:10", 10_000, 19_000)]
    runtime = [Runtime("cudaLaunchKernel_v7000", "10:10", 2_000, 2_100, 5),
               Runtime("cudaGraphLaunch_v10000", "10:10", 11_000, 11_200, 6)]
    gemm = Kernel("gemm", 10, 7, 3_000, 43_000, 5)
    kernels = [gemm, Kernel("node", 10, 7, 50_000, 51_000, 6, graph_node_id=1), Kernel("node", 10, 7, 52_000, 53_500, 6,
                                                                                       graph_node_id=2), gemm]
    return nvtx, runtime, kernels


def test_nsys_kernel_row_written_twice_is_counted_once(tmp_path):
    nvtx, runtime, kernels = _nsys_rows()
    timeline = read_nsys(write_nsys_export(tmp_path / "r.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels))
    assert timeline.kernels["name"].tolist() == ["gemm", "node", "node"]
    assert timeline.kernels["duration_ns"].tolist() == [40_000, 1_000, 1_500]
    d = timeline.diagnostics
    assert d["counts"]["duplicate_kernel_records"] == 1 and d["counts"]["kernels"] == 3
    assert any(w.startswith("1 kernel row(s) repeat another row in every field") for w in d["warnings"])


def test_nsys_export_without_copies_reads_as_before(tmp_path):
    nvtx, runtime, kernels = _nsys_rows()
    timeline = read_nsys(write_nsys_export(tmp_path / "r.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels[:-1]))
    assert len(timeline.kernels) == 3 and timeline.diagnostics["counts"]["duplicate_kernel_records"] == 0
    assert not any("repeat another row" in w for w in timeline.diagnostics["warnings"])


def test_reports_say_how_many_records_were_counted_once(tmp_path):
    """Through the command line: diagnostics.json counts the copy, report.md and report.html say it, and the
    operator table holds aten::mm's 40 µs once."""
    _trace(tmp_path, _mm_add_events(), "twice.json")
    (tmp_path / "layers.json").write_text("[]")
    d = str(tmp_path)
    for args in (["timeline", "--kineto", f"{d}/twice.json", "--out", f"{d}/tl"],
                 ["classify", "--timeline", f"{d}/tl", "--layers", f"{d}/layers.json", "--out", f"{d}/lay"],
                 ["attribute", "--timeline", f"{d}/tl", "--kernel-layers", f"{d}/lay/kernel_layers.parquet",
                  "--out", f"{d}/a.parquet"],
                 ["aggregate", "--attribution", f"{d}/a.parquet", "--instances", f"{d}/lay/instances.parquet",
                  "--classes", f"{d}/lay/classes.json", "--device", "cuda", "--out", f"{d}/agg"],
                 ["report", "--results", f"{d}/agg", "--timeline", f"{d}/tl", "--workload", "t", "--out",
                  f"{d}/report.md"],
                 ["report-html", "--results", f"{d}/agg", "--timeline", f"{d}/tl", "--workload", "t", "--out",
                  f"{d}/report.html"]):
        assert main(args) == 0, args
    diagnostics = json.loads((tmp_path / "tl" / "diagnostics.json").read_text())
    assert diagnostics["counts"]["duplicate_kernel_records"] == 1
    said = "1 kernel record(s) repeat another record in every field"
    assert said in (tmp_path / "report.md").read_text()
    assert said in (tmp_path / "report.html").read_text()
    ops = pd.read_csv(tmp_path / "agg" / "operators.csv").set_index("operator")
    assert ops.loc["aten::mm", "time_ns"] == 40_000 and ops["time_ns"].sum() == 49_000


def test_export_timeline_writes_the_count(tmp_path):
    nvtx, runtime, kernels = _nsys_rows()
    stages.export_timeline(write_nsys_export(tmp_path / "r.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels),
                           tmp_path / "tl")
    diagnostics = json.loads((tmp_path / "tl" / "diagnostics.json").read_text())
    assert diagnostics["counts"]["duplicate_kernel_records"] == 1


@pytest.mark.parametrize("name", ["hta_df_index_resolver.json.gz", "hta_negative_queue_length__rank0.json.gz",
                                  "hta_nccl_parser_config__nccl_data.json.gz", "tracelens_h100_qwen1.5_0.5b_chat.json.gz"])
def test_real_traces_hold_no_copies(name):
    """No false copies on real traces (whole-µs ones among them, where two short kernels of one stream can share ts
    and dur): every record there is its own kernel."""
    from conftest import real_file

    timeline = read_kineto(real_file("kineto", name))
    counts = timeline.diagnostics["counts"]
    assert counts["duplicate_kernel_records"] == 0 and counts["duplicate_launch_records"] == 0
    assert not any("identical to another" in w for w in timeline.diagnostics["warnings"])


def test_real_nsys_exports_hold_no_copies(real_nsys_files):
    for path in real_nsys_files:
        assert read_nsys(path).diagnostics["counts"]["duplicate_kernel_records"] == 0, path.name
