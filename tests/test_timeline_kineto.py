"""Tests for the Kineto reader (operator_profiler.timeline.kineto).

Expected values are computed independently from the real traces in ../shared/data/real (the torch 2.13 CPU
traces of inductor-cpu/traces and two HTA GPU traces), with plain ``json`` and exact rational arithmetic, and
from small synthetic traces written to tmp_path. Format: docs/formats.md#kineto-trace-json.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA, need_real

from operator_profiler import tables
from operator_profiler.timeline import trace_json
from operator_profiler.timeline.kineto import TimelineError, load_trace, read_kineto
from operator_profiler.timeline.model import METADATA_OPS, write_timeline

CPU_TRACES = REAL_DATA / "inductor-cpu" / "traces"
COMPILED = CPU_TRACES / "trace_compiled_cpu.json.gz"
EAGER = CPU_TRACES / "trace_eager_cpu.json.gz"
TRITON = REAL_DATA / "kineto" / "hta_triton_example.json.gz"
ALEXNET = REAL_DATA / "kineto" / "hta_critical_path_alexnet__trace.json.gz"

CALL_NAME = re.compile(r"^\w+::[\w.]+$")
CPP_KERNEL = re.compile(r"^graph_\d+_cpp_")


def _raw(path: Path) -> dict:
    """The trace with numbers kept as their JSON text (so the test does its own exact conversion)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh, parse_float=str, parse_int=str)


def _ns(text: str) -> int:
    """µs as written in the JSON -> integer ns, exactly (round half to even, as Kineto's 3 decimals never need)."""
    return round(Fraction(text) * 1000)


def _is_call(name: str) -> bool:
    return bool(CALL_NAME.match(name)) and name.count("::") == 1 or bool(CPP_KERNEL.match(name))


def _expected_cpu_kernels(trace: dict) -> list[dict]:
    """CPU compute calls with their self time, computed from the raw events.

    A call (dispatcher op / Inductor C++ kernel) is a compute call unless it is a metadata op
    enclosed by a compute call; its self time is its duration minus the durations of the compute
    calls whose innermost enclosing compute call it is.
    """
    base = int(trace.get("baseTimeNanoseconds") or 0)
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and _is_call(ev.get("name", "")):
            start = base + _ns(ev["ts"])
            by_thread[(int(ev["pid"]), int(ev["tid"]))].append(
                {"name": ev["name"], "start": start, "end": start + _ns(ev["dur"]), "pid": int(ev["pid"]),
                 "tid": int(ev["tid"])}
            )
    out = []
    for calls in by_thread.values():
        calls.sort(key=lambda c: (c["start"], -c["end"]))
        compute: list[dict] = []
        for c in calls:
            enclosing = [o for o in compute if o["start"] <= c["start"] and c["end"] <= o["end"]]
            if c["name"] in METADATA_OPS and enclosing:
                continue
            c["parent"] = max(enclosing, key=lambda o: o["start"]) if enclosing else None
            c["self"] = c["end"] - c["start"]
            compute.append(c)
        for c in compute:
            if c["parent"] is not None:
                c["parent"]["self"] -= c["end"] - c["start"]
        out.extend(compute)
    return sorted(out, key=lambda c: (c["start"], c["end"]))


@pytest.fixture(scope="module", params=["compiled", "eager"])
def cpu_case(request):
    path = need_real(COMPILED if request.param == "compiled" else EAGER)
    return _raw(path), read_kineto(path)


def test_cpu_kernel_count_matches_compute_calls(cpu_case):
    trace, timeline = cpu_case
    expected = _expected_cpu_kernels(trace)
    assert len(expected) > 50  # the traces hold two training steps / one eager step of a transformer block
    assert len(timeline.kernels) == len(expected)
    assert Counter(timeline.kernels["name"]) == Counter(c["name"] for c in expected)


def test_cpu_kernel_intervals_are_exact_ns(cpu_case):
    trace, timeline = cpu_case
    expected = _expected_cpu_kernels(trace)
    k = timeline.kernels.sort_values("kernel_id")
    got = sorted(zip(k["start_ns"].astype(int), k["end_ns"].astype(int), k["name"]))
    want = sorted((c["start"], c["end"], c["name"]) for c in expected)
    assert got == want
    selves = {(c["start"], c["name"]): c["self"] for c in expected}
    assert [int(d) for d in k["duration_ns"]] == [selves[(int(s), n)] for s, n in zip(k["start_ns"], k["name"])]
    # Self times conserve the time of the outermost calls: each CPU nanosecond counted once.
    outermost = [c for c in expected if c["parent"] is None]
    assert int(k["duration_ns"].sum()) == sum(c["end"] - c["start"] for c in outermost)
    assert k["parent_kernel_id"].isna().sum() == len(outermost)
    # A CPU kernel is its own launch, on its own thread.
    assert (k["launch_api"] == "cpu").all()
    assert (k["launch_start_ns"].astype(int) == k["start_ns"].astype(int)).all()
    assert (k["launch_end_ns"].astype(int) == k["end_ns"].astype(int)).all()
    tids = {(c["start"], c["name"]): c["tid"] for c in expected}
    assert [int(t) for t in k["launch_tid"]] == [tids[(int(s), n)] for s, n in zip(k["start_ns"], k["name"])]
    assert (k["device"] == -1).all() and (k["stream"] == -1).all()
    assert (k["source"] == "kineto").all()


def test_cpu_kernel_ids_occurrence_and_match_key(cpu_case):
    trace, timeline = cpu_case
    k = timeline.kernels
    assert list(k["kernel_id"]) == list(range(len(k)))
    starts = [int(s) for s in k["start_ns"]]
    assert starts == sorted(starts)
    # Independent per-name running count, in start order from the raw events.
    seen: Counter = Counter()
    want = []
    for c in _expected_cpu_kernels(trace):
        want.append((c["start"], c["name"], seen[c["name"]]))
        seen[c["name"]] += 1
    got = sorted(zip((int(s) for s in k["start_ns"]), k["name"], (int(o) for o in k["occurrence"])))
    assert got == sorted(want)
    assert (k["match_key"] == k["name"]).all()  # no mangled names in a Kineto trace


def test_ranges_nesting_is_consistent(cpu_case):
    trace, timeline = cpu_case
    r = timeline.ranges.set_index("range_id", drop=False)
    n_raw = sum(1 for ev in trace["traceEvents"]
                if ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "user_annotation", "python_function"))
    assert len(r) == n_raw
    assert sorted(r["range_id"]) == list(range(len(r)))
    by_thread = {key: g for key, g in r.groupby(["pid", "tid"])}
    for row in r.itertuples(index=False):
        start, end = int(row.start_ns), int(row.end_ns)
        if pd.isna(row.parent_id):
            assert row.depth == 0
        else:
            p = r.loc[int(row.parent_id)]
            assert (p["pid"], p["tid"]) == (row.pid, row.tid)
            assert int(p["start_ns"]) <= start and end <= int(p["end_ns"])
            assert row.depth == p["depth"] + 1
        # depth = number of other ranges of the thread that enclose this one (no duplicate intervals here).
        g = by_thread[(row.pid, row.tid)]
        enclosing = ((g["start_ns"] <= start) & (g["end_ns"] >= end) & (g["range_id"] != row.range_id)).sum()
        assert row.depth == enclosing


def test_cpu_ranges_carry_seq_and_fwd_thread_id():
    path = need_real(EAGER)
    trace = _raw(path)
    r = read_kineto(path).ranges
    base = int(trace["baseTimeNanoseconds"])
    want = Counter()
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and "Sequence number" in ev.get("args", {}):
            want[(base + _ns(ev["ts"]), ev["name"], int(ev["args"]["Sequence number"]),
                  int(ev["args"]["Fwd thread id"]))] += 1
    with_seq = r[r["seq"].notna()]
    got = Counter(zip((int(s) for s in with_seq["start_ns"]), with_seq["name"], (int(s) for s in with_seq["seq"]),
                      (int(f) for f in with_seq["fwd_thread_id"])))
    assert want and got == want


def test_gpu_triton_kernel_joins_its_driver_launch():
    path = need_real(TRITON)
    trace = _raw(path)
    base = int(trace["baseTimeNanoseconds"])
    events = trace["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(gpu) == 1
    corr = gpu[0]["args"]["correlation"]
    launch = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
              and e.get("args", {}).get("correlation") == corr]
    assert len(launch) == 1
    launch = launch[0]

    t = read_kineto(path)
    assert len(t.kernels) == 1
    k = t.kernels.iloc[0]
    assert k["name"] == gpu[0]["name"]
    assert int(k["correlation_id"]) == int(corr)
    assert k["launch_api"] == launch["name"] == "cuLaunchKernel"
    assert int(k["launch_tid"]) == int(launch["tid"])
    assert int(k["launch_start_ns"]) == base + _ns(launch["ts"])
    assert int(k["launch_end_ns"]) == base + _ns(launch["ts"]) + _ns(launch["dur"])
    assert int(k["start_ns"]) == base + _ns(gpu[0]["ts"])
    assert int(k["duration_ns"]) == _ns(gpu[0]["dur"])
    # Kineto writes the device as the GPU event's pid; the kernel's process is the launch's.
    assert int(k["pid"]) == int(launch["pid"]) != int(gpu[0]["pid"])
    assert int(k["device"]) == int(gpu[0]["args"]["device"])
    assert int(k["stream"]) == int(gpu[0]["args"]["stream"])
    assert k["grid"] == ",".join(gpu[0]["args"]["grid"]) and k["block"] == ",".join(gpu[0]["args"]["block"])
    assert int(k["kernel_id"]) == 0 and int(k["occurrence"]) == 0
    n_launch_events = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"))
    assert len(t.launches) == n_launch_events


def test_gpu_alexnet_kernel_count_and_launch_join():
    path = need_real(ALEXNET)
    trace = _raw(path)
    events = trace["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    t = read_kineto(path)
    k = t.kernels
    assert len(k) == len(gpu) == 79
    assert list(k["kernel_id"]) == list(range(len(k)))
    by_corr = {int(c): e for c, e in launches.items()}
    for row in k.itertuples(index=False):
        launch = by_corr[int(row.correlation_id)]
        assert int(row.launch_start_ns) == _ns(launch["ts"])  # no baseTimeNanoseconds: absolute µs
        assert row.launch_api == launch["name"]
        assert int(row.launch_tid) == int(launch["tid"])
    # Launch order: kernel ids follow the launch calls' start times.
    assert list(k["launch_start_ns"].astype(int)) == sorted(k["launch_start_ns"].astype(int))


def test_write_timeline_roundtrip_keeps_contract(tmp_path):
    path = need_real(COMPILED)
    t = read_kineto(path)
    write_timeline(t, tmp_path)
    back = tables.read_table(tmp_path / "kernels.parquet")
    assert list(back.columns[: len(tables.KERNELS.names)]) == tables.KERNELS.names
    assert list(back["start_ns"]) == list(t.kernels["start_ns"])
    assert len(tables.read_table(tmp_path / "ranges.parquet")) == len(t.ranges)


# ------------------------------------------------------------------------------ synthetic traces


def _write(path: Path, obj, gz: bool = False) -> Path:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def test_integer_ns_without_float_drift(tmp_path):
    base = 1790857026000000000
    # Numbers as Kineto writes them (3 decimals, relative to baseTimeNanoseconds).
    text = (
        '{"baseTimeNanoseconds": %d, "traceEvents": ['
        '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, '
        '"ts": 5162511311507.697, "dur": 0.001}]}' % base
    )
    t = read_kineto(_write(tmp_path / "t.json", text))
    # the drift the reader must avoid: absolute ns (~1.8e18) do not fit a float's 53-bit mantissa
    assert int(base + float("5162511311507.697") * 1000) != base + 5162511311507697
    k = t.kernels.iloc[0]
    assert int(k["start_ns"]) == base + 5162511311507697
    assert int(k["end_ns"]) == base + 5162511311507698
    assert int(k["duration_ns"]) == 1
    r = t.ranges.iloc[0]
    assert int(r["start_ns"]) == base + 5162511311507697


def test_synthetic_nesting_iteration_and_layer_columns(tmp_path):
    def ev(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}

    trace = {"traceEvents": [
        ev("user_annotation", "opprof.iteration:0", 0, 100),
        ev("user_annotation", "opprof.layer:h.0", 10, 50),
        ev("cpu_op", "aten::linear", 12, 20),
        ev("cpu_op", "aten::t", 12, 1),           # metadata op inside aten::linear: part of its self time
        ev("cpu_op", "aten::addmm", 14, 10),      # nested compute call: a kernel of its own
        ev("cpu_op", "aten::copy_", 15, 2),
        ev("cpu_op", "graph_0_cpp_fused_add_0", 40, 5),
        ev("cpu_op", "autograd::engine::evaluate_function: AddBackward0", 70, 10),  # not a dispatcher op
        ev("cpu_op", "aten::mul", 72, 3),
        ev("cpu_op", "aten::mul", 200, 3),        # outside the iteration
        ev("cpu_op", "aten::mul", 0, 3, tid=2),   # another thread: its own nesting
        ev("cpu_op", "aten::view", 90, 1),        # top-level metadata op: a kernel (its time is nobody else's)
        {"ph": "i", "name": "instant", "pid": 7, "tid": 1, "ts": 5},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "x"}},
    ]}
    t = read_kineto(_write(tmp_path / "t.json.gz", trace, gz=True))
    k = t.kernels
    assert list(k["name"]) == ["aten::mul", "aten::linear", "aten::addmm", "aten::copy_", "graph_0_cpp_fused_add_0",
                               "aten::mul", "aten::view", "aten::mul"]
    assert list(k["launch_tid"].astype(int)) == [2, 1, 1, 1, 1, 1, 1, 1]
    assert list(k["start_ns"].astype(int)) == [0, 12000, 14000, 15000, 40000, 72000, 90000, 200000]
    assert list(k["duration_ns"].astype(int)) == [3000, 10000, 8000, 2000, 5000, 3000, 1000, 3000]
    assert [None if pd.isna(p) else int(p) for p in k["parent_kernel_id"]] == [None, None, 1, 2, None, None, None, None]
    assert list(k["occurrence"]) == [0, 0, 0, 0, 0, 1, 0, 2]
    # the iteration range is per process: the other thread's call at ts 0 lies inside it too
    assert [None if pd.isna(i) else int(i) for i in k["iteration"]] == [0, 0, 0, 0, 0, 0, 0, None]

    r = t.ranges.set_index("name")
    assert int(r.loc["aten::copy_", "depth"]) == 4
    assert int(r.loc["opprof.iteration:0", "iteration"]) == 0
    assert r.loc["opprof.layer:h.0", "layer"] == "h.0"
    assert r.loc["aten::linear", "layer"] is None or pd.isna(r.loc["aten::linear", "layer"])
    parent = t.ranges.set_index("range_id").loc[int(r.loc["aten::addmm", "parent_id"]), "name"]
    assert parent == "aten::linear"
    assert len(t.launches) == 0


def test_bare_array_form_is_accepted(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]
    t = read_kineto(_write(tmp_path / "t.json", events))
    assert list(t.kernels["name"]) == ["aten::mm"]
    assert int(t.kernels["start_ns"].iloc[0]) == 1000


def test_truncated_gzip_raises_timeline_error_naming_the_file(tmp_path):
    src = need_real(EAGER).read_bytes()
    bad = tmp_path / "truncated.json.gz"
    bad.write_bytes(src[: len(src) // 2])
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    assert str(bad) in str(err.value)


def test_non_json_raises_timeline_error_naming_the_file(tmp_path):
    bad = _write(tmp_path / "garbage.json", "this is not json {")
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    assert str(bad) in str(err.value)


def test_gzip_of_non_json_raises(tmp_path):
    bad = _write(tmp_path / "garbage.json.gz", "<html>", gz=True)
    with pytest.raises(TimelineError, match=re.escape(str(bad))):
        read_kineto(bad)


@pytest.mark.parametrize("content", [{"events": []}, {"traceEvents": {"a": 1}}, 42])
def test_json_without_trace_events_raises(tmp_path, content):
    bad = _write(tmp_path / "notrace.json", content)
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    assert str(bad) in str(err.value)
    assert "traceEvents" in str(err.value)


def test_missing_file_raises_timeline_error(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(TimelineError, match=re.escape(str(missing))):
        read_kineto(missing)


@pytest.mark.parametrize("drop", ["ts", "dur"])
def test_event_without_ts_names_its_index(tmp_path, drop):
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 2},
    ]
    del events[2][drop]
    bad = _write(tmp_path / "t.json", {"traceEvents": events})
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    msg = str(err.value)
    assert "traceEvents[2]" in msg and "aten::add" in msg and str(bad) in msg


# --- C18: malformed and huge trace JSON (docs/field-cases.md C18; reader: timeline/trace_json.py) ---------

BROKEN_NAME = b'{"device": "cpu"}(12): run'  # unescaped inner quotes, as old Kineto wrote them


def _fixture_a(pretty: bool) -> tuple[bytes, int]:
    """docs/field-cases.md C18 fixture A as raw bytes, and the byte offset of the broken python_function event.

    ``pretty``: Kineto's multi-line layout (output_json.cpp); otherwise one compact line."""
    events = [
        b'{"ph": "X", "cat": "python_function", "name": "' + BROKEN_NAME + b'", "pid": 1, "tid": 1, "ts": 1, "dur": 2}',
        b'{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 3, "dur": 1, '
        b'"args": {"Comms Id": 18446744073709551615}}',
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::bad\xffname", "pid": 1, "tid": 1, "ts": 5, "dur": 1}',
        b'{"ph": "X", "cat": "cpu_op", "name": "ctl\x01\ttab", "pid": 1, "tid": 1, "ts": 7, "dur": 1}',
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "args": {"External id": 1}}',
        b'{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 11, "dur": 1, '
        b'"args": {"correlation": 5, "External id": 1}}',
        b'{"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 12, "dur": 2, '
        b'"args": {"correlation": 5, "stream": 7, "device": 0}}',
    ]
    if pretty:  # Kineto: each event on its own lines, "  {" ... "  }"
        events = [e.replace(b', "name"', b',\n    "name"').replace(b', "args"', b',\n    "args"') for e in events]
        head, sep, tail = b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ', b",\n  ", b'\n  ],\n  "traceName": "a.json"\n}\n'
    else:
        head, sep, tail = b'{"schemaVersion": 1, "traceEvents": [', b", ", b"]}"
    data = head + sep.join(events) + tail
    return data, data.index(b'{"ph": "X", "cat": "python_function"')


@pytest.fixture(params=["pretty.json", "compact.json", "pretty.json.gz"])
def fixture_a(request, tmp_path):
    data, broken_at = _fixture_a(pretty=request.param.startswith("pretty"))
    path = tmp_path / f"c18_{request.param}"
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path, broken_at


def test_c18_unescaped_quotes_event_is_skipped_counted_and_located(fixture_a):
    path, broken_at = fixture_a
    t = read_kineto(path)
    assert f"1 malformed event skipped at byte offset {broken_at} " in " ".join(t.warnings)
    # the rest of the trace still loads: the 4 valid cpu_ops, and nothing from the broken event
    assert sorted(t.ranges["name"]) == sorted(["record_param_comms", "aten::bad\ufffdname", "ctl\x01\ttab", "aten::add"])


def test_c18_launch_chain_still_joins(fixture_a):
    path, _ = fixture_a
    k = read_kineto(path).kernels
    assert len(k) == 1
    row = k.iloc[0]
    assert row["name"] == "add_kernel" and int(row["correlation_id"]) == 5
    assert (int(row["start_ns"]), int(row["end_ns"])) == (12_000, 14_000)
    assert int(row["pid"]) == 1 and int(row["launch_tid"]) == 1 and row["launch_api"] == "cudaLaunchKernel"
    assert (int(row["launch_start_ns"]), int(row["launch_end_ns"])) == (11_000, 12_000)


def test_c18_uint64_id_is_kept_exactly(fixture_a):
    path, _ = fixture_a
    trace = load_trace(path)
    comms = [ev["args"]["Comms Id"] for _, ev in trace.events() if ev.get("name") == "record_param_comms"]
    assert comms == [18446744073709551615] and type(comms[0]) is int


def test_c18_invalid_utf8_and_control_characters_are_repaired_and_reported(fixture_a):
    path, _ = fixture_a
    t = read_kineto(path)
    names = set(t.ranges["name"])
    assert "aten::bad\ufffdname" in names  # byte 0xFF -> U+FFFD
    assert "ctl\x01\ttab" in names  # raw control characters inside a string are kept
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    at = [data.rindex(b"{", 0, data.index(b'"aten::bad')), data.rindex(b"{", 0, data.index(b'"ctl'))]
    assert f"2 events repaired at byte offsets {at[0]}, {at[1]} " in " ".join(t.warnings)


def test_c18_small_blocks_give_the_same_result(fixture_a, monkeypatch):
    """Chunks cut at every few events (and refills mid-event) change nothing."""
    path, _ = fixture_a
    whole = read_kineto(path)
    monkeypatch.setattr(trace_json, "BLOCK", 64)
    small = read_kineto(path)
    assert small.warnings == whole.warnings
    for name in ("kernels", "launches", "ranges"):
        pd.testing.assert_frame_equal(getattr(small, name), getattr(whole, name))


def test_real_trace_in_small_blocks_equals_whole_reads(monkeypatch):
    path = need_real(ALEXNET)
    whole = read_kineto(path)
    monkeypatch.setattr(trace_json, "BLOCK", 4096)
    small = read_kineto(path)
    assert small.warnings == [] and len(small.kernels) == 79
    for name in ("kernels", "launches", "ranges"):
        pd.testing.assert_frame_equal(getattr(small, name), getattr(whole, name))


def test_event_boundary_text_inside_strings_loses_nothing(tmp_path, monkeypatch):
    """Names containing '}, {' (a candidate cut) parse whole even when a chunk is cut there."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::x}}, {{y{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 1}
              for i in range(300)]
    path = _write(tmp_path / "t.json", {"traceEvents": events})
    monkeypatch.setattr(trace_json, "BLOCK", 100)
    t = read_kineto(path)
    assert t.warnings == []
    assert list(t.ranges["name"]) == [e["name"] for e in events]


def test_absolute_epoch_us_with_ns_fractions_stay_exact(tmp_path):
    """The early-2024 form: absolute Unix µs with 3 decimals and no baseTimeNanoseconds
    (docs/formats.md#kineto-time-base); 1.7e15 µs does not fit a float64 to the ns."""
    text = ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, '
            '"ts": 1695835535123456.789, "dur": 12.001}, '
            '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1695835535123500.001, "dur": 0.999}]}')
    assert round(float("1695835535123456.789") * 1000) != 1695835535123456789  # the drift avoided
    t = read_kineto(_write(tmp_path / "t.json.gz", text, gz=True))
    k = t.kernels
    assert list(k["start_ns"].astype("int64")) == [1695835535123456789, 1695835535123500001]
    assert list(k["end_ns"].astype("int64")) == [1695835535123468790, 1695835535123501000]


# A trace in this form *with kernels* crashed the reader ('>=' between str and int): in a
# chunk holding such a ts, every fractional ts/dur comes back as exact decimal text (trace_json).
EARLY_2024_WITH_KERNELS = """{"deviceProperties": [{"id": 0, "name": "Tesla V100-SXM2-32GB"}], "traceEvents": [
{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 8, "ts": 1669843200123456.789, "dur": 40.5,
 "args": {"External id": 5}},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 8, "ts": 1669843200123460.001,
 "dur": 3.25, "args": {"correlation": 77, "External id": 77}},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 8, "ts": 1669843200123470.5,
 "dur": 2.002, "args": {"correlation": 78, "External id": 78}},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 8, "ts": 1669843200123480.999,
 "dur": 1.001, "args": {"correlation": 79, "External id": 79}},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 7, "tid": 8, "ts": 1669843200123490.25,
 "dur": 1.5, "args": {"correlation": 80}},
{"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 1669843200123470.123,
 "dur": 8.008, "args": {"correlation": 77, "External id": 77, "device": 0, "stream": 7}},
{"ph": "X", "cat": "kernel", "name": "dropped_ts_kernel", "pid": 0, "tid": 7, "ts": 0.000, "dur": 0.000,
 "args": {"correlation": 78, "External id": 78, "device": 0, "stream": 7}},
{"ph": "X", "cat": "kernel", "name": "negative_dur_kernel", "pid": 0, "tid": 7, "ts": 1669843200123500.5,
 "dur": -1.250, "args": {"correlation": 79, "External id": 79, "device": 0, "stream": 7}},
{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7, "ts": 0.000,
 "dur": 0.000, "args": {"correlation": 80, "device": 0, "stream": 7, "bytes": 64}}
]}"""


def test_early_2024_form_with_kernels_reads_and_attributes_exactly(tmp_path):
    """Kernels, launches and ops in absolute Unix µs with ns fractions (docs/formats.md#kineto-time-base):
    exact ns everywhere, and the C04 checks (ts 0, negative dur) on exact values: ``0.000`` is a
    dropped timestamp (not a kernel at epoch 0), ``-1.250`` a negative duration."""
    from operator_profiler.attribution.merge import attribute
    from operator_profiler.layers import classify_layers

    assert round(float("1669843200123470.123") * 1000) != 1669843200123470123  # a float64 cannot hold it
    t = read_kineto(_write(tmp_path / "v100.json", EARLY_2024_WITH_KERNELS))
    k = t.kernels.set_index("name")
    sgemm = k.loc["volta_sgemm_128x64_nn"]
    assert (int(sgemm["start_ns"]), int(sgemm["end_ns"])) == (1669843200123470123, 1669843200123478131)
    assert (int(sgemm["launch_start_ns"]), int(sgemm["launch_end_ns"])) == (1669843200123460001, 1669843200123463251)
    assert int(sgemm["duration_ns"]) == 8008 and bool(sgemm["valid_time"])
    # Invalid records are placed at their launch's end with no length (docs/field-cases.md C04).
    for name, launch_end in (("dropped_ts_kernel", 1669843200123472502), ("negative_dur_kernel", 1669843200123482000)):
        assert not bool(k.loc[name, "valid_time"])
        assert int(k.loc[name, "start_ns"]) == int(k.loc[name, "end_ns"]) == launch_end
    assert t.diagnostics["counts"]["invalid_timestamp_kernels"] == 2
    assert t.diagnostics["time_base"] == "absolute_epoch"
    assert len(t.activities) == 0  # the memcpy with ts 0.000 is dropped, not drawn at epoch 0
    layers, _, _ = classify_layers(t.kernels, t.ranges, [])
    a = attribute(t.kernels, t.ranges, layers, None).set_index("name")
    assert list(a["operator"]) == ["aten::mm"] * 3 and set(a["path"]) == {"correlation"}
    assert a.loc["volta_sgemm_128x64_nn", "duration_ns"] == 8008


def test_early_2024_form_with_kernels_through_the_cli(tmp_path):
    """The crash was seen with ``opprof timeline --kineto``: the same fixture through the CLI."""
    import subprocess
    import sys

    trace = _write(tmp_path / "v100.json.gz", EARLY_2024_WITH_KERNELS, gz=True)
    run = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "timeline", "--kineto", str(trace),
                          "--out", str(tmp_path / "timeline")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    kernels = pd.read_parquet(tmp_path / "timeline" / "kernels.parquet").set_index("name")
    assert int(kernels.loc["volta_sgemm_128x64_nn", "start_ns"]) == 1669843200123470123
    assert json.loads((tmp_path / "timeline" / "diagnostics.json").read_text())["counts"]["kernels"] == 3


def test_base_time_after_trace_events_is_applied(tmp_path):
    """Kineto writes baseTimeNanoseconds after traceEvents (here after an INFO list with ']')."""
    base = 1727743122000000000
    text = ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, '
            '"tid": 1, "ts": 7862400000000.125, "dur": 1.5}\n  ],\n  "INFO": ["a]", "b] x"],\n'
            f'  "traceName": "x]",\n  "baseTimeNanoseconds": {base}\n}}\n')
    for name, gz in (("t.json", False), ("t.json.gz", True)):
        k = read_kineto(_write(tmp_path / name, text, gz=gz)).kernels
        assert int(k["start_ns"].iloc[0]) == base + 7862400000000125
        assert int(k["end_ns"].iloc[0]) == base + 7862400000001625


def test_truncated_plain_json_raises_with_byte_offset(tmp_path):
    data, _ = _fixture_a(pretty=True)
    cut = data.index(b'"add_kernel"')
    bad = tmp_path / "cut.json"
    bad.write_bytes(data[:cut])
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    msg = str(err.value)
    assert str(bad) in msg and "truncated" in msg
    assert f"ends at byte offset {cut} " in msg


def test_unconfinable_garbage_raises_with_byte_offset(tmp_path, monkeypatch):
    """A malformed region longer than MAX_RECOVER is an error naming its offset, not an empty trace."""
    good = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    junk = b", ".join([b'{"a": "x" junk }'] * 200)
    data = b'{"traceEvents": [' + good + b", " + junk + b", " + good + b"]}"
    bad = _write(tmp_path / "junk.json", data.decode())
    monkeypatch.setattr(trace_json, "MAX_RECOVER", 1000)
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    msg = str(err.value)
    junk_at = data.index(b'{"a"')
    assert str(bad) in msg and f"event starting at byte offset {junk_at})" in msg


def test_event_without_ts_names_its_byte_offset(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(50)]
    del events[37]["ts"]
    text = json.dumps({"traceEvents": events}, indent=2)
    bad = _write(tmp_path / "t.json", text)
    with pytest.raises(TimelineError) as err:
        read_kineto(bad)
    at = text.encode().index(b'"name": "aten::op37"')
    at = text.encode().rindex(b"{", 0, at)
    assert f"traceEvents[37] at byte offset {at} " in str(err.value)


def write_big_trace(path: Path, kernels: int) -> None:
    """docs/field-cases.md C18 fixture B: ``kernels`` kernel events with their cudaLaunchKernel and cpu_op
    (one ``aten::add`` per kernel), Kineto-style relative float ts after a baseTimeNanoseconds
    written last, gzip level 1, written in chunks (never whole in memory)."""
    op = ('{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": %d.125, "dur": 5.5, '
          '"args": {"External id": %d, "Record function id": 0, "Ev Idx": %d}}')
    rt = ('{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": %d.250, "dur": 1, '
          '"args": {"cbid": 211, "correlation": %d, "External id": %d}}')
    kn = ('{"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": %d.500, "dur": 2.001, '
          '"args": {"External id": %d, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": %d, '
          '"registers per thread": 16, "shared memory": 0, "grid": [128, 1, 1], "block": [128, 1, 1]}}')
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "traceEvents": [\n  ')
        step = 50_000
        for lo in range(0, kernels, step):
            parts = []
            for i in range(lo, min(lo + step, kernels)):
                t = 10 * i + 5_000_000_000_000  # µs after the base: > 2**42, below 2**43
                parts += (op % (t, i + 1, i), rt % (t + 1, i + 1, i + 1), kn % (t + 2, i + 1, i + 1))
            fh.write(((",\n  " if lo else "") + ",\n  ".join(parts)).encode())
        fh.write(b'\n  ],\n  "traceName": "big.json",\n  "baseTimeNanoseconds": 1727743122000000000\n}\n')


BIG_CHILD = """
import json, resource, sys
from operator_profiler.timeline.kineto import read_kineto
t = read_kineto(sys.argv[1])
k = t.kernels
print(json.dumps({"kernels": len(k), "joined": int(k["launch_start_ns"].notna().sum()),
                  "launches": len(t.launches), "ranges": len(t.ranges), "warnings": t.warnings,
                  "first_start": int(k["start_ns"].min()), "ops": int((k["launch_api"] == "cudaLaunchKernel").sum()),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
# docs/field-cases.md C18 fixture B: 2,000,000 kernels (6M events with their launches and ops, ~1.4 GB of JSON,
# 65 MB gzipped). Measured on the 2-core machine: ~9 s to write, ~45 s to read, peak RSS 1.6 GB
# (the streaming parser itself stays near 160 MB; the rest is the tables).
BIG_KERNELS = 2_000_000


@pytest.mark.slow
def test_c18_big_gzipped_trace_streams_with_bounded_memory(tmp_path):
    """docs/field-cases.md C18 fixture B (BIG_KERNELS, see there): a .json.gz of kernels +
    launches + ops, read in a child process whose peak RSS (ru_maxrss) must stay below 2 GB, with
    every kernel joined to its launch and exact ns times."""
    import os
    import subprocess
    import sys

    path = tmp_path / "big.json.gz"
    write_big_trace(path, BIG_KERNELS)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", BIG_CHILD, str(path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["kernels"] == r["joined"] == r["ops"] == r["launches"] == r["ranges"] == BIG_KERNELS
    assert r["warnings"] == []
    assert r["first_start"] == 1727743122000000000 + 5_000_000_000_002_500  # exact ns after the base
    assert r["peak_rss_mb"] < 2048, f"peak RSS {r['peak_rss_mb']:.0f} MB"


def test_ids_beyond_int64_become_null_not_an_overflow(tmp_path):
    """docs/field-cases.md C18: ids above 2**63-1 (here an External id and a correlation) must not overflow the
    int64 columns: they are read as missing."""
    big = 18446744073709551615
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
               "args": {"External id": big, "Sequence number": big}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 11, "dur": 1,
               "args": {"correlation": big, "External id": big}}]
    t = read_kineto(_write(tmp_path / "t.json", {"traceEvents": events}))
    assert t.ranges["external_id"].isna().all() and t.ranges["seq"].isna().all()
    assert t.launches["correlation_id"].isna().all() and t.launches["external_id"].isna().all()
