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
