"""Kineto traces with values no profiler writes: each is refused with a TimelineError naming the event, or read
with a warning, on both decoding paths (typed and dict) — never an internal error or a silent repair."""

from __future__ import annotations

import json

import pytest

from operator_profiler.errors import TimelineError
from operator_profiler.timeline.kineto import read_kineto

OPS = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 50,
        "args": {"External id": 1}},
       {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 200, "dur": 10,
        "args": {"External id": 2}}]


def _trace(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize("ts", [1e18, 10**18, -(10**18)])
def test_a_ts_beyond_the_int64_ns_range_is_refused_naming_the_event(tmp_path, typed, ts):
    events = json.loads(json.dumps(OPS))
    events[1]["ts"] = ts
    with pytest.raises(TimelineError, match=r"traceEvents\[1\] at byte offset \d+ \('aten::add', cat 'cpu_op'\) "
                                            r"has a ts/dur beyond the int64 ns range"):
        read_kineto(_trace(tmp_path, events), typed=typed)


@pytest.mark.parametrize("typed", [True, False])
def test_a_flow_or_memcpy_with_such_a_ts_is_left_out(tmp_path, typed):
    events = json.loads(json.dumps(OPS)) + [
        {"ph": "s", "cat": "fwdbwd", "id": 1, "pid": 1, "tid": 1, "ts": 1e18},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 10**18, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 5, "bytes": 4}}]
    timeline = read_kineto(_trace(tmp_path, events), typed=typed)
    assert len(timeline.ranges) == 2 and len(timeline.activities) == 0


@pytest.mark.parametrize("typed", [True, False])
def test_a_negative_dur_on_an_op_is_read_as_zero_length_and_said(tmp_path, typed):
    events = json.loads(json.dumps(OPS))
    events[0]["dur"] = -50
    timeline = read_kineto(_trace(tmp_path, events), typed=typed)
    mm = timeline.ranges[timeline.ranges["name"] == "aten::mm"].iloc[0]
    assert mm["start_ns"] == mm["end_ns"] == 100_000
    assert "1 op/annotation events have a negative dur (first: traceEvents[0] 'aten::mm'): read as zero-length " \
           "at their ts" in timeline.diagnostics["warnings"]
    # the CPU kernel it makes weighs nothing; the other op keeps its 10 µs
    assert sorted(timeline.kernels["duration_ns"].tolist()) == [0, 10_000]


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize(("text", "index", "kind"), [
    ("[1, 2, 3]", 0, "a number"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, "x"]}',
     1, "a string"),
])
def test_array_elements_that_are_not_objects_are_named_not_called_truncated(tmp_path, typed, text, index, kind):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(TimelineError, match=rf"traceEvents\[{index}\] is {kind}, not an event object"):
        read_kineto(path, typed=typed)


@pytest.mark.parametrize("typed", [True, False])
def test_a_really_truncated_array_is_still_called_truncated(tmp_path, typed):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, '
                    '"dur": 1}, {"ph": "X"')
    with pytest.raises(TimelineError, match="array is not closed.*truncated"):
        read_kineto(path, typed=typed)


KERNEL_TRACE = {"schemaVersion": 1, "deviceProperties": [{"id": 0}], "traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 50,
     "args": {"External id": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110, "dur": 5,
     "args": {"correlation": 7, "External id": 1}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 120, "dur": 20,
     "args": {"device": 0, "stream": 7, "correlation": 7, "External id": 1}},
]}


def _kernel_trace(tmp_path, edit) -> "Path":
    trace = json.loads(json.dumps(KERNEL_TRACE))
    edit(trace["traceEvents"])
    path = tmp_path / "k.json"
    path.write_text(json.dumps(trace))  # (json.dumps writes NaN as NaN, as the QA's traces had it)
    return path


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize(("event", "field"), [(2, "ts"), (2, "dur"), (0, "dur")])
def test_a_nan_ts_or_dur_is_refused_naming_the_event(tmp_path, typed, event, field):
    path = _kernel_trace(tmp_path, lambda ev: ev[event].__setitem__(field, float("nan")))
    with pytest.raises(TimelineError, match=rf"traceEvents\[{event}\] .* has no valid ts/dur"):
        read_kineto(path, typed=typed)


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize(("edit", "said"), [
    (lambda ev: ev[2].__setitem__("args", [1, 2]), "1 events whose 'args' is not an object were read without "
                                                   "their args (first: traceEvents[2])"),
    (lambda ev: ev[0].__setitem__("name", None), "1 events whose name is not a string (null, a number, a list) "
                                                 "were named by its text (first: traceEvents[0])"),
    (lambda ev: ev.insert(1, dict(ev[0], tid="thread one")), "1 op/annotation events without an integer pid and tid "
                                                             "were left out (they nest on no thread) (first: traceEvents[1])"),
    (lambda ev: ev.insert(1, 5), "1 array elements that are not event objects were skipped (first: traceEvents[1])"),
    (lambda ev: ev[2].__setitem__("ts", 90), "1 kernels start before their launch call (first: 'gemm')"),
    (lambda ev: ev.append(dict(ev[2], name="gemm2", ts=150)), "2 kernel records share the correlation id of one kernel "
                                                             "launch call with another kernel (first: 'gemm', "
                                                             "correlation id 7)"),
    (lambda ev: ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7,
                           "ts": float("nan"), "dur": 1, "args": {"correlation": 9}}),
     "1 memcpy/memset events without a valid ts/dur were left out of gpu_activities"),
])
def test_what_the_reader_repairs_or_leaves_out_is_said(tmp_path, typed, edit, said):
    timeline = read_kineto(_kernel_trace(tmp_path, edit), typed=typed)
    assert any(w.startswith(said) for w in timeline.diagnostics["warnings"]), timeline.diagnostics["warnings"]


@pytest.mark.parametrize("typed", [True, False])
def test_a_trace_with_no_events_is_refused_even_with_device_properties(tmp_path, typed):
    path = _kernel_trace(tmp_path, lambda ev: ev.clear())
    with pytest.raises(TimelineError, match="no kernel events and no operator events"):
        read_kineto(path, typed=typed)


@pytest.mark.parametrize("typed", [True, False])
def test_a_huge_dur_is_named_as_such(tmp_path, typed):
    path = _kernel_trace(tmp_path, lambda ev: ev[0].__setitem__("dur", 1e300))
    with pytest.raises(TimelineError, match=r"traceEvents\[0\] .*beyond the int64 ns range \(ts 100 µs, dur 1e\+300 µs"):
        read_kineto(path, typed=typed)


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize("tail", [b"garbage", b'{"traceEvents": []}'])
def test_data_after_the_document_is_refused_not_called_truncated(tmp_path, typed, tail):
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(KERNEL_TRACE).encode() + tail)
    with pytest.raises(TimelineError, match="invalid JSON after the 'traceEvents' array"):
        read_kineto(path, typed=typed)


@pytest.mark.parametrize("typed", [True, False])
def test_two_traces_concatenated_are_refused_not_merged(tmp_path, typed):
    many = json.loads(json.dumps(KERNEL_TRACE))
    many["traceEvents"] = many["traceEvents"] * 40
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(many).encode() + json.dumps(many).encode())
    with pytest.raises(TimelineError, match="a second 'traceEvents' array|invalid JSON after the 'traceEvents' array"):
        read_kineto(path, typed=typed)
