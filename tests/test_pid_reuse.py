"""Processes that used one pid in turn in an nsys export (docs/field-cases.md C25): DataLoader workers re-spawned every
epoch get the pid of an earlier worker, and CUPTI correlation ids restart in each process, so (pid, correlation id)
names a launch call of each. Every GPU activity must join the launch call of its own process (pid + the process's
first launch call), or stay unattributed with reason ``pid_reused``: never take another process's operator.

Fixtures are nsys rows in the real table layout of ``tests/nsys_export.py`` (docs/formats.md#nsys-tables; times in
ns; ``globalTid`` from ``"pid:tid"``, docs/formats.md#nsys-identifiers; emit_nvtx push/pop ranges, eventType 59).
The real exports hold one ``PROCESSES`` row per pid and no process start time, so the fixtures do too. Expected
operators are the NVTX ranges around each kernel's own launch call in the fixture.
"""

from __future__ import annotations

import json

import numpy as np
from nsys_export import GraphNode, Kernel, Memcpy, Nvtx, Runtime, write_nsys_export

from operator_profiler import stages
from operator_profiler.attribution.nvtx import attribute_nvtx
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.nsys import read_nsys
from operator_profiler.timeline.process_lives import LIFE_GAP_NS, find_lives

PID = 4711
API = "cudaLaunchKernel_v7000"
MS = 1_000_000


def worker(start: int, op: str, kernel: str, correlations: list[int], tid: int = PID) -> dict:
    """One worker process's rows: an NVTX range ``op`` at ``start`` around one launch call per correlation id (1 µs
    apart), each kernel 300 ns after its call."""
    calls = [Runtime(API, f"{PID}:{tid}", start + 1_000 * (i + 1), start + 1_000 * (i + 1) + 200, c)
             for i, c in enumerate(correlations)]
    kernels = [Kernel(kernel, PID, 7, r.start + 500, r.start + 800, r.correlation) for r in calls]
    nvtx = [Nvtx(op, 59, f"{PID}:{tid}", start, start + 1_000 * (len(correlations) + 2))]
    return {"runtime": calls, "kernels": kernels, "nvtx": nvtx}


def export(path, *workers, **options):
    rows = {"runtime": [], "kernels": [], "nvtx": []}
    for w in workers:
        for key in rows:
            rows[key] += w[key]
    return write_nsys_export(path, processes={PID: "pt_data_worker_0"}, **rows, **options)


def attributed(path):
    timeline = read_nsys(path)
    layers, _, _ = classify_layers(timeline.kernels, timeline.ranges, [])
    result = attribute_nvtx(timeline.kernels, timeline.ranges, layers)
    return timeline, result


def listed(column) -> list:
    """A column's values with None for a missing one."""
    return [None if v is None or v != v else v for v in column.tolist()]


def test_second_worker_keeps_its_own_operator(tmp_path):
    """The issue's case: the worker started 200 ms after the first one ended gets its pid, and its correlation ids 1
    and 2 are the first one's too: its kernels are its own aten::add's, not the first worker's aten::mm."""
    first = worker(1 * MS, "aten::mm", "gemm", [1, 2])
    second = worker(205 * MS, "aten::add", "add_kernel", [1, 2])
    timeline, result = attributed(export(tmp_path / "w.sqlite", first, second))
    assert listed(result["operator"]) == ["aten::mm", "aten::mm", "aten::add", "aten::add"]
    assert result["reason"].isna().all()
    k = timeline.kernels
    # each kernel joined the call that launched it (500 ns before its start)
    assert (k["start_ns"] - k["launch_start_ns"]).tolist() == [500] * 4
    assert k["process_life"].tolist() == [0, 0, 1, 1]
    d = timeline.diagnostics
    assert d["process_lives"] == {str(PID): [
        {"life": 0, "first_launch_ns": 1 * MS + 1_000, "launch_calls": 2, "kernels": 2},
        {"life": 1, "first_launch_ns": 205 * MS + 1_000, "launch_calls": 2, "kernels": 2}]}
    assert d["counts"]["pid_reused_kernels"] == 0
    assert any(w.startswith(f"pid {PID} by 2 processes in turn") for w in d["warnings"])


def test_three_workers_and_their_copies(tmp_path):
    """Three workers; the third one's memcpy (correlation id 2) joins its own call, and a worker whose ids do not
    restart below the previous one's (5, 6 after 1, 2) needs no separating: its keys are unique in the pid."""
    w1 = worker(1 * MS, "aten::mm", "gemm", [1, 2])
    w2 = worker(100 * MS, "aten::add", "add_kernel", [5, 6])
    w3 = worker(300 * MS, "aten::mul", "mul_kernel", [1, 2, 3])
    memcpy = Memcpy(PID, 7, 300 * MS + 2_600, 300 * MS + 2_900, 2)
    timeline, result = attributed(export(tmp_path / "w.sqlite", w1, w2, w3, memcpy=[memcpy]))
    assert listed(result["operator"]) == ["aten::mm"] * 2 + ["aten::add"] * 2 + ["aten::mul"] * 3
    # w1 and w2 are one life to the reader (2 -> 5 is no restart), w3 another (6 -> 1)
    assert timeline.kernels["process_life"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    act = timeline.activities.iloc[0]
    assert act["launch_start_ns"] == 300 * MS + 2_000
    assert [e["first_launch_ns"] for e in timeline.diagnostics["process_lives"][str(PID)]] == [
        1 * MS + 1_000, 300 * MS + 1_000]


def test_workers_that_cannot_be_told_apart_stay_unattributed(tmp_path):
    """The ids restart, but 0.5 ms after the first worker's last call (less than LIFE_GAP_NS: not a new process's
    start): the ids both use join nothing (reason pid_reused); an id only one uses still joins."""
    assert LIFE_GAP_NS > MS // 2
    first = worker(1 * MS, "aten::mm", "gemm", [1, 2, 3])
    second = worker(1 * MS + 5_500, "aten::add", "add_kernel", [1, 2])
    timeline, result = attributed(export(tmp_path / "w.sqlite", first, second))
    by_corr = result.assign(corr=timeline.kernels["correlation_id"].to_numpy())
    assert listed(by_corr["operator"]) == [None, None, "aten::mm", None, None]
    assert listed(by_corr["reason"]) == ["pid_reused", "pid_reused", None, "pid_reused", "pid_reused"]
    d = timeline.diagnostics
    assert d["counts"]["pid_reused_kernels"] == 4
    assert any(f"pid(s) {PID} hold launch calls that repeat a correlation id" in w and "4 kernel(s)" in w
               for w in d["warnings"])
    assert not any("have a correlation id with no CUDA API row" in w for w in d["warnings"])


def test_kernel_whose_own_call_is_missing_never_takes_another_workers(tmp_path):
    """The second worker's kernel of id 3 has no launch row (cut from the export): the first worker's call 3 is not
    its call, so it stays unattributed (pid_reused) instead of taking aten::mm."""
    first = worker(1 * MS, "aten::mm", "gemm", [1, 2, 3])
    second = worker(200 * MS, "aten::add", "add_kernel", [1, 2, 3])
    second["runtime"] = second["runtime"][:2]
    timeline, result = attributed(export(tmp_path / "w.sqlite", first, second))
    assert listed(result["operator"]) == ["aten::mm"] * 3 + ["aten::add"] * 2 + [None]
    assert result["reason"].iloc[-1] == "pid_reused"


def test_kernel_before_its_workers_first_call_is_refused_when_either_could_own_it(tmp_path):
    """A kernel recorded 0.4 ms before the second worker's first call (clock skew allowance) whose id the first
    worker also used: either worker's; unattributed."""
    first = worker(1 * MS, "aten::mm", "gemm", [1, 2])
    second = worker(200 * MS, "aten::add", "add_kernel", [1, 2])
    skewed = second["kernels"][0]
    second["kernels"][0] = Kernel(skewed.name, PID, 7, 200 * MS - 400_000, 200 * MS - 399_000, skewed.correlation)
    timeline, result = attributed(export(tmp_path / "w.sqlite", first, second))
    mine = result[timeline.kernels["start_ns"].to_numpy() == 200 * MS - 400_000]
    assert listed(mine["operator"]) == [None] and mine["reason"].tolist() == ["pid_reused"]
    assert result["operator"].dropna().tolist() == ["aten::mm", "aten::mm", "aten::add"]


def test_graph_nodes_of_each_worker_take_their_own_capture(tmp_path):
    """CUDA-graph node ids repeat in each worker too: a replayed node kernel takes the node created in its own
    worker's capture (its NVTX op), found by its replay's launch call's life."""
    rows = []
    for life, (start, op) in enumerate(((1 * MS, "aten::linear"), (300 * MS, "aten::conv2d"))):
        w = worker(start, op, "unused", [])
        nvtx = [Nvtx(op, 59, f"{PID}:{PID}", start + 100, start + 900)]
        nodes = [GraphNode(f"{PID}:{PID}", start + 200, start + 300, 1),
                 GraphNode(f"{PID}:{PID}", start + 1_000, start + 1_001, 1001, original_graph_node_id=1)]
        call = Runtime("cudaGraphLaunch_v10000", f"{PID}:{PID}", start + 2_000, start + 2_200, 7)
        kernel = Kernel(f"node_kernel_{life}", PID, 7, start + 2_500, start + 3_000, 7, graph_node_id=1001)
        rows.append((nvtx, nodes, call, kernel))
    # a second launch call per worker with its own id, so that ids repeat (7 in both) and restart (7 after 9)
    extra = [Runtime(API, f"{PID}:{PID}", 1 * MS + 4_000, 1 * MS + 4_200, 9)]
    extra_kernel = [Kernel("tail", PID, 7, 1 * MS + 4_500, 1 * MS + 4_800, 9)]
    path = write_nsys_export(
        tmp_path / "g.sqlite", processes={PID: "w"},
        nvtx=[n for r in rows for n in r[0]] + [Nvtx("aten::tail", 59, f"{PID}:{PID}", 1 * MS + 3_900, 1 * MS + 5_000)],
        graph_nodes=[g for r in rows for g in r[1]], runtime=[r[2] for r in rows] + extra,
        kernels=[r[3] for r in rows] + extra_kernel)
    timeline, result = attributed(path)
    by_name = dict(zip(timeline.kernels["name"], result["operator"]))
    assert by_name == {"node_kernel_0": "aten::linear", "tail": "aten::tail", "node_kernel_1": "aten::conv2d"}


def test_exports_without_reuse_read_as_before(tmp_path):
    """Backtrace copies of a call (schemas without eventClass: the copy overlaps the call) and ids that a second
    thread takes out of time order (an inversion 100 ns apart) are no reuse: no lives, no extra columns."""
    calls = [Runtime(API, f"{PID}:{PID}", 1_000, 1_300, 1), Runtime("cudaLaunchKernel", f"{PID}:{PID}", 990, 1_310, 1),
             Runtime(API, f"{PID}:{PID + 1}", 2_000, 2_200, 3), Runtime(API, f"{PID}:{PID}", 2_100, 2_300, 2)]
    kernels = [Kernel("a", PID, 7, 1_500, 1_600, 1), Kernel("b", PID, 7, 2_500, 2_600, 3),
               Kernel("c", PID, 8, 2_550, 2_650, 2)]
    nvtx = [Nvtx("aten::a", 59, f"{PID}:{PID}", 500, 1_800), Nvtx("aten::b", 59, f"{PID}:{PID + 1}", 1_900, 2_250),
            Nvtx("aten::c", 59, f"{PID}:{PID}", 2_050, 2_400)]
    path = write_nsys_export(tmp_path / "n.sqlite", processes={PID: "p"}, runtime=calls, kernels=kernels, nvtx=nvtx,
                             runtime_event_class=False)
    timeline, result = attributed(path)
    assert find_lives(timeline.launches) is None
    assert "process_life" not in timeline.kernels and "process_lives" not in timeline.diagnostics
    assert listed(result["operator"]) == ["aten::a", "aten::b", "aten::c"]


def test_an_inversion_inside_a_worker_splits_nothing(tmp_path):
    """A reused pid whose first worker has two threads taking ids out of time order (4 before 3, overlapping calls):
    only the restart 200 ms later begins a new life."""
    first = worker(1 * MS, "aten::mm", "gemm", [1, 2])
    first["runtime"] += [Runtime(API, f"{PID}:{PID + 1}", 1 * MS + 5_000, 1 * MS + 5_300, 4),
                         Runtime(API, f"{PID}:{PID}", 1 * MS + 5_100, 1 * MS + 5_400, 3)]
    first["kernels"] += [Kernel("k4", PID, 8, 1 * MS + 6_000, 1 * MS + 6_100, 4),
                         Kernel("k3", PID, 7, 1 * MS + 6_200, 1 * MS + 6_300, 3)]
    first["nvtx"] += [Nvtx("aten::other", 59, f"{PID}:{PID + 1}", 1 * MS + 4_900, 1 * MS + 5_500),
                      Nvtx("aten::sub", 59, f"{PID}:{PID}", 1 * MS + 5_050, 1 * MS + 5_450)]
    second = worker(200 * MS, "aten::add", "add_kernel", [1, 2, 3, 4])
    timeline, result = attributed(export(tmp_path / "w.sqlite", first, second))
    lives = find_lives(timeline.launches)
    assert lives.starts[PID].tolist() == [1 * MS + 1_000, 200 * MS + 1_000]
    ops = dict(zip(timeline.kernels["start_ns"], listed(result["operator"])))
    assert ops[1 * MS + 6_000] == "aten::other" and ops[1 * MS + 6_200] == "aten::sub"
    assert listed(result["operator"]).count("aten::add") == 4 and result["reason"].isna().all()


def test_the_timeline_stage_writes_the_lives(tmp_path):
    first = worker(1 * MS, "aten::mm", "gemm", [1, 2])
    second = worker(205 * MS, "aten::add", "add_kernel", [1, 2])
    stages.export_timeline(export(tmp_path / "w.sqlite", first, second), tmp_path / "tl")
    diagnostics = json.loads((tmp_path / "tl" / "diagnostics.json").read_text())
    assert [e["kernels"] for e in diagnostics["process_lives"][str(PID)]] == [2, 2]
    result = stages.attribute_files(tmp_path / "tl", None, None, tmp_path / "a.parquet")
    assert listed(result["operator"]) == ["aten::mm", "aten::mm", "aten::add", "aten::add"]
    assert np.array_equal(result["kernel_id"].to_numpy(), np.arange(4))


def test_real_exports_have_one_process_per_pid(real_nsys_files):
    """No false lives on the real exports (2021 to 2026, with CUDA backtrace rows, multi-process and multi-thread
    ones): their readings are unchanged."""
    for path in real_nsys_files:
        timeline = read_nsys(path)
        assert find_lives(timeline.launches) is None, path.name
        assert "process_lives" not in timeline.diagnostics and "launch_refused" not in timeline.kernels, path.name
