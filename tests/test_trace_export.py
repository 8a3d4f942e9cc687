"""trace.json: real timelines -> Chrome/Perfetto trace, checked against the Trace Event
Format rules by an independent validator below (not by the exporter's own code).

Rules checked (Trace Event Format, https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h2I0nSsKchNAn9E,
and Perfetto's legacy JSON importer): the object form with a ``traceEvents`` list and ``displayTimeUnit`` "ms"/"ns";
every event has ``ph``, ``name``, integer ``pid``/``tid``; ``X`` has numeric ``ts`` and ``dur >= 0`` in µs and an
``args`` object; ``M`` is one of process_name/thread_name (``args.name``) or *_sort_index (``args.sort_index``);
``s``/``f`` flows have ``id``, ``cat``, ``ts``, ``f`` has ``bp: "e"``, every ``s`` has exactly one ``f`` with the same
id and cat and the ``s`` is bound to a slice of its thread; ``X`` events nest properly per (pid, tid) (checked with
a stack); every thread with events is named; the file is strict JSON (no NaN).
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA
from nsys_export import Kernel, Memcpy, Nvtx, Runtime, write_nsys_export

from operator_profiler import stages, tables
from operator_profiler.report import markdown as report_md
from operator_profiler.report.trace import build_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = {
    "inductor_cpu": REAL_DATA / "inductor-cpu" / "traces" / "trace_compiled_cpu.json.gz",
    "alexnet": REAL_DATA / "kineto" / "hta_critical_path_alexnet__trace.json.gz",
}
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}


def ns(us: float) -> int:
    """A µs float back to integer ns; asserts it carries no more than ns precision."""
    value = us * 1000
    assert abs(value - round(value)) < 1e-3, us
    return round(value)


def validate(trace: dict) -> dict:
    """Check the Trace Event Format rules above; return X events per (pid, tid) for further checks."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace["displayTimeUnit"] in ("ms", "ns")
    json.loads(json.dumps(trace, allow_nan=False))  # strict JSON
    named_threads, named_processes = set(), set()
    slices = defaultdict(list)
    starts, finishes = {}, {}
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M", "s", "f"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            key = METADATA[e["name"]]
            assert set(e["args"]) == {key}, e
            assert isinstance(e["args"][key], str if key == "name" else int), e
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
        elif e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e["args"], dict) and isinstance(e["cat"], str), e
            start = ns(e["ts"])
            slices[(e["pid"], e["tid"])].append((start, start + ns(e["dur"]), e))
        else:
            assert isinstance(e["cat"], str) and isinstance(e["ts"], (int, float)) and "id" in e, e
            ns(e["ts"])
            table = starts if e["ph"] == "s" else finishes
            if e["ph"] == "f":
                assert e["bp"] == "e", e
            assert (e["id"], e["cat"]) not in table, f"duplicate flow {e}"
            table[(e["id"], e["cat"])] = e
    assert set(starts) == set(finishes), "every flow start needs its finish (same id and cat)"
    # X events nest per thread: sort by start, longer first, and keep a stack of open ends
    for track, events in slices.items():
        assert track in named_threads and track[0] in named_processes, track
        stack: list[int] = []
        for start, end, e in sorted(events, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"{e} overlaps its enclosing slice on {track}"
            stack.append(end)
    # a flow is bound to slices: the start to one enclosing its ts, the finish (bp e) to one enclosing its ts
    for flows in (starts, finishes):
        for e in flows.values():
            t = ns(e["ts"])
            assert any(s <= t <= end for s, end, _ in slices[(e["pid"], e["tid"])]), e
    return slices


def kernel_events(trace: dict) -> dict[int, dict]:
    events = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "cpu_kernel")]
    out = {e["args"]["kernel_id"]: e for e in events}
    assert len(out) == len(events)
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """timeline + attribution folders of the two real Kineto traces (CLI-equivalent stage calls)."""
    out = {}
    for name, trace in TRACES.items():
        if not trace.is_file():
            pytest.skip(f"{trace} is not available")
        d = tmp_path_factory.mktemp(name)
        stages.export_timeline(trace, d / "timeline")
        stages.attribute_files(d / "timeline", None, None, d / "attribution.parquet")
        out[name] = d
    return out


def load(d: Path):
    kernels, ranges = stages.read_timeline(d / "timeline")
    launches = tables.read_table(d / "timeline" / "launches.parquet")
    attribution = tables.read_table(d / "attribution.parquet")
    return kernels, ranges, launches, attribution


def check_kernels_against_tables(trace, kernels, attribution):
    """Every timeline kernel is one event at its own times with its attribution in args."""
    events = kernel_events(trace)
    assert sorted(events) == sorted(int(k) for k in kernels["kernel_id"])
    zero = int(trace["otherData"]["time_zero_ns"])
    att = attribution.set_index("kernel_id")
    for k in kernels.to_dict("records"):
        e = events[int(k["kernel_id"])]
        assert e["name"] == k["name"]
        assert zero + ns(e["ts"]) == k["start_ns"]
        a = att.loc[k["kernel_id"]]
        assert e["args"]["operator"] == (None if pd.isna(a["operator"]) else a["operator"])
        assert e["args"]["path"] == a["path"] and e["args"]["layer_class"] == a["layer_class"]
        assert e["args"]["fused_ops"] == list(a["fused_ops"])
        if a["path"] == "unattributed":
            assert e["args"]["reason"] == a["reason"]
    return events


def test_gpu_kineto_trace_alexnet(real):
    kernels, ranges, launches, attribution = load(real["alexnet"])
    trace = build_trace(kernels, ranges, attribution, launches=launches)
    slices = validate(trace)
    events = check_kernels_against_tables(trace, kernels, attribution)
    assert len(events) == len(kernels) == 79
    # a chosen kernel: the cuDNN offsets kernel that aten::cudnn_convolution launched, on GPU 0 stream 7
    e = events[1]
    assert e["name"].startswith("void cask_cudnn::computeOffsetsKernel")
    assert e["args"]["operator"] == "aten::cudnn_convolution" and e["tid"] == 7 and e["dur"] == 4.0
    gpu_names = {ev["args"].get("name") for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["pid"] == e["pid"]}
    assert {"GPU 0", "stream 7"} <= gpu_names
    # every kernel with a launch call has a flow from its launch to it
    flows = [ev for ev in trace["traceEvents"] if ev["ph"] == "s"]
    assert len(flows) == kernels["launch_start_ns"].notna().sum() == 79
    for s in flows:
        kernel = kernels.set_index("kernel_id").loc[s["id"]]
        assert s["tid"] == kernel["launch_tid"] and ns(s["ts"]) == kernel["launch_start_ns"] - int(
            trace["otherData"]["time_zero_ns"])
    # the CPU ranges and launch calls are there, none dropped (this trace nests)
    cpu = [ev for track, evs in slices.items() for _, _, ev in evs if ev["cat"] not in ("kernel",)]
    assert len(cpu) == len(ranges) + len(launches)
    assert trace["otherData"]["ranges_clipped"] == 0 == trace["otherData"]["kernels_in_overlap_lanes"]


def test_memcpy_and_memset_on_their_streams_with_flows(real):
    """The alexnet trace's gpu_memcpy events (counted here from the raw JSON) are X events on their
    stream, with bytes, copy kind and a flow from the launch call that carries their correlation id."""
    raw = [e for e in json.loads(gzip.decompress(TRACES["alexnet"].read_bytes()))["traceEvents"] if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    assert raw  # the real trace has them, or the test proves nothing
    kernels, ranges, launches, attribution = load(real["alexnet"])
    activities = tables.read_table(real["alexnet"] / "timeline" / "gpu_activities.parquet")
    assert len(activities) == len(raw)
    trace = build_trace(kernels, ranges, attribution, launches=launches, activities=activities)
    validate(trace)
    written = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("memcpy", "memset")),
                     key=lambda e: (e["ts"], e["args"]["correlation_id"]))
    zero = int(trace["otherData"]["time_zero_ns"])
    expected = sorted(raw, key=lambda e: (e["ts"], e["args"]["correlation"]))
    assert len(written) == len(expected) == trace["otherData"]["gpu_activities"]
    for e, r in zip(written, expected):
        assert zero + ns(e["ts"]) == r["ts"] * 1000 and ns(e["dur"]) == r["dur"] * 1000  # int µs in this trace
        assert e["tid"] == r["args"]["stream"] and e["args"]["bytes"] == r["args"]["bytes"]
        assert e["args"]["correlation_id"] == r["args"]["correlation"]
        # "Memcpy HtoD (Pageable -> Device)" -> "Memcpy HtoD", "Memset (Device)" -> "Memset"
        assert e["name"] == r["name"].split(" (")[0] and e["cat"] == r["cat"].removeprefix("gpu_")
    launch_of = {int(c): int(t) for c, t in zip(launches["correlation_id"].dropna(), launches.dropna(
        subset=["correlation_id"])["tid"])}
    flows = {f["id"]: f for f in trace["traceEvents"] if f["ph"] == "s"}
    for e in written:
        assert flows[e["args"]["flow_id"]]["tid"] == launch_of[e["args"]["correlation_id"]]
    assert min(e["args"]["flow_id"] for e in written) > int(kernels["kernel_id"].max())


def test_memcpy_and_memset_totals_in_diagnostics_and_report_line(real):
    """diagnostics.json ``gpu_activities`` against the raw alexnet JSON (counts, µs durations, bytes per kind
    and copy kind), and the report's bullet built from it."""
    raw = [e for e in json.loads(gzip.decompress(TRACES["alexnet"].read_bytes()))["traceEvents"]
           if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    summary = json.loads((real["alexnet"] / "timeline" / "diagnostics.json").read_text())["gpu_activities"]
    for kind in ("memcpy", "memset"):
        mine = [e for e in raw if e["cat"] == f"gpu_{kind}"]
        assert mine, kind
        assert summary[kind]["count"] == len(mine)
        assert summary[kind]["time_ns"] == sum(e["dur"] for e in mine) * 1000  # int µs in this trace
        assert summary[kind]["bytes"] == sum(e["args"]["bytes"] for e in mine)
    copy_kinds = defaultdict(int)
    for e in raw:
        if e["cat"] == "gpu_memcpy":
            copy_kinds[e["name"].split()[1]] += 1
    assert {k: v["count"] for k, v in summary["memcpy"]["by_copy_kind"].items()} == dict(copy_kinds)
    (line,) = report_md.gpu_activity_lines({"gpu_activities": summary})
    assert f"{summary['memcpy']['count']} memcpys (" in line and f"{summary['memset']['count']} memsets (" in line
    assert report_md.gpu_activity_lines({"gpu_activities": {"memcpy": None, "memset": None}}) == []


def test_counters_go_into_kernel_args(real):
    kernels, ranges, launches, attribution = load(real["alexnet"])
    counters = pd.DataFrame({"kernel_id": [1, 2], "ncu_id": [0, 1], "ncu_source": ["a.csv"] * 2,
                             "counters_from": [1, 1], "sm__throughput.avg.pct_of_peak_sustained_elapsed": [12.5, None],
                             "dram__bytes.sum": [4096.0, 8192.0]})
    trace = build_trace(kernels, ranges, attribution, counters=counters, launches=launches)
    validate(trace)
    events = kernel_events(trace)
    assert events[1]["args"]["counters"] == {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.5,
                                             "dram__bytes.sum": 4096.0, "counters_from": 1}
    assert events[2]["args"]["counters"] == {"dram__bytes.sum": 8192.0, "counters_from": 1}
    assert "counters" not in events[3]["args"]


def test_cpu_inductor_trace_puts_cpu_kernels_in_place_of_their_ranges(real):
    kernels, ranges, launches, attribution = load(real["inductor_cpu"])
    trace = build_trace(kernels, ranges, attribution, launches=launches)
    slices = validate(trace)
    events = check_kernels_against_tables(trace, kernels, attribution)
    assert len(events) == len(kernels) == 146
    assert {e["cat"] for e in events.values()} == {"cpu_kernel"}
    # each CPU kernel replaces its op range: the range is not written twice, all others are
    cpu_ranges = [ev for evs in slices.values() for _, _, ev in evs if ev["cat"] != "cpu_kernel"]
    assert len(cpu_ranges) + len(kernels) == len(ranges)
    assert not {ev["args"]["range_id"] for ev in cpu_ranges} & set(kernels["range_id"].dropna().astype(int))
    # its interval is the call's; self time in args
    k = kernels.set_index("kernel_id").loc[1]
    assert events[1]["args"]["operator"] == "aten::addmm" and events[1]["args"]["self_ns"] == k["duration_ns"]
    assert ns(events[1]["dur"]) == k["end_ns"] - k["start_ns"]
    assert not [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]


def test_nsys_timeline_overlaps_unclosed_and_multi_device(tmp_path):
    db = write_nsys_export(
        tmp_path / "r.sqlite",
        runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1),
                 Runtime("cudaLaunchKernel_v7000", "10:1", 160, 165, 2),
                 Runtime("cudaLaunchKernel_v7000", "10:1", 310, 315, 3),
                 Runtime("cudaMemcpyAsync_v3020", "10:1", 195, 199, 4)],
        kernels=[Kernel("gemm", 10, 7, 170, 190, 1), Kernel("relu", 10, 7, 185, 200, 2),  # overlap on stream 7
                 Kernel("add", 10, 13, 320, 330, 3, device=1)],
        memcpy=[Memcpy(10, 7, 201, 205, 4, bytes=4096, copy_kind=2)],
        nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200), Nvtx("aten::relu", 59, "10:1", 158, 170),
              Nvtx("region", 60, "10:1", 120, 260),  # start/end range crossing aten::mm's end: clipped
              Nvtx("aten::add", 59, "10:1", 300, None)],  # never closed: shown up to the capture's end
    )
    stages.export_timeline(db, tmp_path / "timeline")
    stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "a.parquet")
    out = tmp_path / "trace.json"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "trace", "--timeline",
                             str(tmp_path / "timeline"), "--attribution", str(tmp_path / "a.parquet"), "--out",
                             str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    trace = json.loads(out.read_text())
    validate(trace)
    kernels = tables.read_table(tmp_path / "timeline" / "kernels.parquet")
    attribution = tables.read_table(tmp_path / "a.parquet")
    events = check_kernels_against_tables(trace, kernels, attribution)
    by_name = {e["name"]: e for e in events.values()}
    assert by_name["gemm"]["args"]["operator"] == "aten::mm" and by_name["add"]["args"]["operator"] == "aten::add"
    assert by_name["relu"]["tid"] != by_name["gemm"]["tid"]  # overlap lane, not dropped or shortened
    assert ns(by_name["relu"]["dur"]) == 15
    assert by_name["add"]["pid"] != by_name["gemm"]["pid"]  # GPU 1 is its own process
    assert trace["otherData"]["kernels_in_overlap_lanes"] == 1 and trace["otherData"]["ranges_clipped"] == 1
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names[(by_name["relu"]["pid"], by_name["relu"]["tid"])] == "stream 7 (overlap 1)"
    unclosed = [e for e in trace["traceEvents"] if e["name"] == "aten::add" and e["ph"] == "X"]
    assert len(unclosed) == 1 and unclosed[0]["args"]["unclosed"] is True
    assert len([e for e in trace["traceEvents"] if e["ph"] == "s"]) == 4  # 3 kernels and the memcpy
    (copy,) = [e for e in trace["traceEvents"] if e.get("cat") == "memcpy"]
    assert copy["name"] == "Memcpy DtoH" and copy["args"]["bytes"] == 4096 and ns(copy["dur"]) == 4
    assert (copy["pid"], copy["tid"]) == (by_name["gemm"]["pid"], 7)
    assert result.stdout.startswith("3 kernels")


def test_cli_errors_are_one_line(tmp_path, real):
    run = [sys.executable, "-m", "operator_profiler.cli", "trace", "--timeline", str(real["alexnet"] / "timeline"),
           "--out", str(tmp_path / "t.json"), "--attribution"]
    missing = subprocess.run(run + [str(tmp_path / "none.parquet")], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "opprof attribute" in missing.stderr
    other = subprocess.run(run + [str(real["inductor_cpu"] / "attribution.parquet")], capture_output=True, text=True)
    assert other.returncode == 1 and other.stderr.count("\n") == 1, other.stderr
    assert "different timelines" in other.stderr and not (tmp_path / "t.json").exists()


def test_float_microseconds_are_exact_for_epoch_clocks():
    # an absolute-epoch ns clock (1.7e18) cannot be held by a float64 µs; relative to the zero point it can
    kernels = pd.DataFrame({"kernel_id": [0], "pid": [1], "device": [0], "stream": [7], "name": ["k"],
                            "start_ns": [1_796_019_537_311_868_371], "end_ns": [1_796_019_537_311_872_176],
                            "duration_ns": [3805], "launch_tid": [pd.NA], "launch_start_ns": [pd.NA]})
    ranges = tables.empty_frame(tables.RANGES)
    attribution = pd.DataFrame({"kernel_id": [0], "operator": [None], "path": ["unattributed"],
                                "reason": ["no_launch_record"]})
    trace = build_trace(kernels, ranges, attribution)
    validate(trace)
    (e,) = kernel_events(trace).values()
    assert e["ts"] == 0.0 and ns(e["dur"]) == 3805 and not math.isnan(e["dur"])
    assert int(trace["otherData"]["time_zero_ns"]) == 1_796_019_537_311_868_371
