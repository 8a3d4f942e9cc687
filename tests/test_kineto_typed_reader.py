"""The Kineto reader's two ways through a chunk of events (operator_profiler.timeline.kineto): chunks
that fit the msgspec schema of the fields it reads are decoded as structs and read a column at a time; any other
chunk is read event by event from dicts (orjson, the C18 repairs). Both must give the same tables, and the typed
way must keep every distinction the dict loop makes (absent vs null, record_shapes text, exact ns, repairs).

Expected values are computed in the tests from the events they write (json, exact integer arithmetic) or by the
dict loop (``read_kineto(path, typed=False)``), which the rest of the test suite checks against real traces.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA, need_real

from operator_profiler.timeline import kineto
from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.timeline.trace_json import open_trace

# Every real Kineto trace but the 54 MB one (hta_df_index_resolver, the benchmark's: ~5 s for both reads here).
REAL_TRACES = [
    "kineto/hta_amd_mi250_minitoy_train.json.gz",
    "kineto/hta_call_stack__backward_thread.json",
    "kineto/hta_critical_path_alexnet__trace.json.gz",
    "kineto/hta_cuda_event_sync_multi_stream.json.gz",
    "kineto/hta_cupti_profiler__counters_trace.json.gz",
    "kineto/hta_execution_trace__simple_add_kineto.json.gz",
    "kineto/hta_nccl_parser_config__nccl_data.json.gz",
    "kineto/hta_negative_queue_length__rank0.json.gz",
    "kineto/hta_timeline_analysis__sampled_rank-0.json.gz",
    "kineto/hta_trace_file_list__inference_rank_1.json.gz",
    "kineto/hta_triton_example.json.gz",
    "kineto/tracelens_h100_bert_small_uncased.json.gz",
    "kineto/tracelens_h100_qwen1.5_0.5b_chat.json.gz",
    "inductor-cpu/traces/trace_compiled_cpu.json.gz",
    "inductor-cpu/traces/trace_eager_cpu.json.gz",
    "inductor-cpu/traces/trace_eager_with_stack_cpu.json.gz",
]


def _same_tables(path: Path) -> kineto.Timeline:
    typed, general = read_kineto(path), read_kineto(path, typed=False)
    for name in ("kernels", "launches", "ranges", "activities"):
        pd.testing.assert_frame_equal(getattr(typed, name), getattr(general, name), check_exact=True)
    assert typed.diagnostics == general.diagnostics
    return typed


def _chunk_kinds(path: Path) -> list[str]:
    """How each chunk was decoded: "_Event" (the typed structs), "_ExactEvent" (those with exact ts), or the class of
    its first element otherwise ("dict")."""
    exact = {kineto._ExactEvent, kineto._ExactFlow, kineto._ExactFlowEnd}
    return ["_ExactEvent" if any(e.__class__ in exact for e in events) else
            "_Event" if events[0].__class__ in kineto._STRUCTS else type(events[0]).__name__
            for _, events in open_trace(path).chunks(kineto._TYPED) if events]


@pytest.mark.parametrize("name", REAL_TRACES)
def test_typed_chunks_give_the_tables_of_the_dict_loop_on_real_traces(name):
    path = need_real(REAL_DATA / name)
    assert _chunk_kinds(path)[0] == "_Event"  # the real layouts fit the schema (else this compares nothing)
    _same_tables(path)


def _x(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_chunk_outside_the_schema_is_read_by_the_dict_loop(tmp_path):
    """A float pid does not fit the schema: the whole chunk goes the general way, where int(1.0) is pid 1."""
    events = [_x("cpu_op", "aten::add", 10, 5), _x("cpu_op", "aten::mul", 20, 5, pid=1.0)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events + [_x("cpu_op", "aten::sub", 30, 5)]}))
    assert _chunk_kinds(path) == ["dict", "dict"]  # the bulk chunk, then the last event (always a dict)
    t = _same_tables(path)
    assert list(t.ranges["pid"]) == [1, 1, 1] and list(t.ranges["start_ns"]) == [10_000, 20_000, 30_000]


def test_record_shapes_text_equals_the_compact_json_of_the_values(tmp_path):
    """``ranges.input_shapes`` is built from the raw text of the four record_shapes args: it must equal the
    compact JSON of their values (Kineto's spaces gone, non-ASCII escaped, a missing member as null)."""
    shapes = [
        {"Input Dims": [[2, 3], [], [3]], "Input type": ["float", "Scalar", "c10::Half"],
         "Concrete Inputs": ["", "1.5e-05", ""], "Input Strides": [[3, 1], [], [1]]},
        {"Input Dims": [[4]], "Input type": ["caf\u00e9 \"q\""]},  # no Concrete Inputs / Input Strides
        {"Input Dims": None, "Input type": ["float"]},  # null dims: no shapes
        {},
    ]
    events = [_x("cpu_op", f"aten::op{i}", 10 * i, 5, **args) for i, args in enumerate(shapes)]
    # Kineto's layout: spaces after ',' and ':' inside the args, as json.dumps writes by default
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events + events}, ensure_ascii=False))
    assert _chunk_kinds(path)[0] == "_Event"
    t = _same_tables(path)

    def expected(args):
        if args.get("Input Dims") is None:
            return None
        values = [args.get(k) for k in ("Input Dims", "Input type", "Concrete Inputs", "Input Strides")]
        return json.dumps(values, separators=(",", ":"))

    got = t.ranges.sort_values("start_ns", kind="stable")["input_shapes"]
    assert [None if pd.isna(v) else v for v in got] == [expected(a) for a in shapes for _ in (0, 1)]
    assert expected(shapes[1]) == '[[[4]],["caf\\u00e9 \\"q\\""],null,null]'


def test_absent_and_null_args_keep_their_difference(tmp_path):
    """``args.device`` absent -> the event's pid (Kineto's device index); JSON null -> no device, as in the dict
    loop. Same for ``stream`` (-> tid). An absent ``External id`` falls back to ``external id``."""
    events = [
        _x("cuda_runtime", "cudaLaunchKernel", 10, 1, pid=9, tid=9, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 1, pid=9, tid=9, correlation=2),
        _x("kernel", "k_absent", 11, 2, pid=3, tid=7, correlation=1, **{"external id": 5}),
        _x("kernel", "k_null", 21, 2, pid=3, tid=7, correlation=2, device=None, stream=None),
        _x("cpu_op", "aten::add", 9, 20, pid=9, tid=9),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert _chunk_kinds(path)[0] == "_Event"
    k = _same_tables(path).kernels.set_index("name")
    assert int(k.loc["k_absent", "device"]) == 3 and int(k.loc["k_absent", "stream"]) == 7
    assert pd.isna(k.loc["k_null", "device"]) and pd.isna(k.loc["k_null", "stream"])
    assert int(k.loc["k_absent", "external_id"]) == 5 and pd.isna(k.loc["k_null", "external_id"])


def test_fractional_ts_beyond_2_43_us_is_decoded_exactly(tmp_path):
    """A float ts of 2**43 µs or more does not determine its ns; such a chunk is decoded with the decimal text."""
    ts_text = "1695835535123456.789"  # absolute epoch µs with ns fractions (early-2024 Kineto)
    text = ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, '
            f'"ts": {ts_text}, "dur": 1.001}}, {{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, '
            '"tid": 1, "ts": 1.5, "dur": 2}, {"ph": "i", "name": "end", "pid": 1, "tid": 1, "ts": 0}]}')
    path = tmp_path / "t.json"
    path.write_text(text)
    assert _chunk_kinds(path)[0] == "_ExactEvent"
    assert float(ts_text) * 1000 != 1695835535123456789  # what a float would give
    r = _same_tables(path).ranges.set_index("name")
    assert int(r.loc["aten::add", "start_ns"]) == 1695835535123456789
    assert int(r.loc["aten::add", "end_ns"]) == 1695835535123456789 + 1001
    assert int(r.loc["aten::mul", "start_ns"]) == 1500


def test_invalid_utf8_in_a_field_the_reader_skips_is_still_repaired_and_reported(tmp_path):
    """msgspec does not check the UTF-8 of strings it skips: such a chunk goes the general way, which repairs the
    event and says so (docs/field-cases.md C18), rather than passing it silently."""
    good = b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    bad = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 3, "dur": 1, ' \
          b'"args": {"Python module": "m\xffod"}}'
    data = b'{"traceEvents": [' + good + b", " + bad + b", " + good.replace(b'"ts": 1', b'"ts": 5') + b"]}"
    path = tmp_path / "t.json"
    path.write_bytes(data)
    t = _same_tables(path)
    assert f"1 event repaired at byte offset {data.index(bad)} " in " ".join(t.warnings)
    assert list(t.ranges["name"]) == ["aten::add", "aten::mul", "aten::add"]


def test_the_first_event_without_ts_is_named_whatever_its_kind(tmp_path):
    """Typed chunks are read a kind at a time (ranges, launches, kernels); the error must still name the first
    event in file order that has no valid ts, as the dict loop does."""
    events = [_x("cpu_op", "aten::add", 1, 5), _x("kernel", "k", None, 2, pid=0, tid=7, correlation=1),
              _x("cpu_op", "aten::mul", None, 5), _x("cpu_op", "aten::sub", 20, 5)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert _chunk_kinds(path)[0] == "_Event"
    messages = []
    for typed in (True, False):
        with pytest.raises(kineto.TimelineError) as err:
            read_kineto(path, typed=typed)
        messages.append(str(err.value))
    assert "traceEvents[1] at byte offset" in messages[0] and "('k', cat 'kernel')" in messages[0]
    assert messages[0] == messages[1]


def test_times_beyond_int64_ns_are_an_error_not_a_wrap(tmp_path):
    """ns are int64 columns: a baseTimeNanoseconds plus ts past 2**63 ns (year 2262) must be refused, not wrap
    around to a negative time (numpy adds silently)."""
    base = 9_000_000_000_000_000_000
    events = [_x("cpu_op", "aten::add", 300_000_000_000_000, 5)]  # + 3e17 ns: 9.3e18 > 2**63 - 1
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": base}))
    for typed in (True, False):
        with pytest.raises(kineto.TimelineError, match="beyond the int64 ns range"):
            read_kineto(path, typed=typed)
    events[0]["ts"] = 100_000_000_000_000  # + 1e17 ns: fits
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": base}))
    assert int(read_kineto(path).ranges["start_ns"].iloc[0]) == base + 100_000_000_000_000 * 1000


def test_event_categories_and_odd_names_are_read_as_the_dict_loop_reads_them(tmp_path):
    """A typed chunk counts the events of each category by code: the dict loop's counts, a missing category
    (null) and the text "None" (both written "None") included, in file order; a name that is null or absent in a
    typed chunk reads as the dict loop reads it ("None", "") and is reported with the first such event's index."""
    events = [_x("cpu_op", "aten::add", 10, 5), _x("None", "odd", 11, 1), _x(None, "no_cat", 12, 1),
              {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 13},
              _x("cpu_op", None, 14, 1), {k: v for k, v in _x("cpu_op", "x", 15, 1).items() if k != "name"},
              _x("user_annotation", "ProfilerStep#1", 9, 20), _x("cpu_op", "aten::mul", 16, 1)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events + events}))
    assert _chunk_kinds(path)[0] == "_Event"
    t = _same_tables(path)
    categories = t.diagnostics["event_categories"]
    assert categories["cpu_op"] == 8 and categories["cpu_instant_event"] == 2 and categories["user_annotation"] == 2
    assert categories["None"] == 2  # the null and the "None" categories both read "None" (2 events each)
    names = t.ranges.sort_values("start_ns", kind="stable")["name"].tolist()
    assert "None" in names and "" in names
    assert any("name is not a string" in w and "(first: traceEvents[4])" in w for w in t.warnings)


def _flow(ph, cat, flow_id, ts, pid=1, tid=1):
    return {"ph": ph, "id": flow_id, "pid": pid, "tid": tid, "ts": ts, "cat": cat, "name": cat, "bp": "e"}


def _events_of_every_kind():
    """A forward op and its backward op bound by a fwdbwd flow, a kernel with its launch and ac2g flow, a memcpy, and
    the events a typed chunk only counts (flow step, instant, global instant, counter, metadata written name first)."""
    return [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python"}},
        _x("cpu_op", "aten::mm", 10, 5, **{"Sequence number": 3, "Fwd thread id": 0}),
        _flow("s", "fwdbwd", 3, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 11, 2, correlation=7),
        _flow("s", "ac2g", 7, 11),
        _x("kernel", "gemm", 20, 3, pid=0, tid=7, correlation=7, device=0, stream=7, grid=[1, 1, 1]),
        _flow("f", "ac2g", 7, 20, pid=0, tid=7),
        _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 24, 1, pid=0, tid=7, correlation=8, bytes=64),
        {"ph": "t", "id": 3, "pid": 2, "tid": 2, "ts": 30, "cat": "fwdbwd", "name": "fwdbwd"},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 31,
         "args": {"Total Allocated": 64, "Bytes": 64, "Addr": 1, "Device Type": 1}},
        {"ph": "I", "cat": "global_instant", "name": "mark", "pid": 1, "tid": 1, "ts": 32},
        {"ph": "C", "cat": "counter", "name": "mem", "pid": 1, "ts": 33, "args": {"bytes": 64}},
        _x("cpu_op", "MmBackward0", 40, 5, pid=1, tid=2, **{"Sequence number": 3, "Fwd thread id": 1}),
        _flow("f", "fwdbwd", 3, 40, pid=1, tid=2),
        _x("cpu_op", "aten::add", 50, 1),
    ]


def test_every_kind_of_event_in_a_typed_chunk_gives_the_dict_loops_tables(tmp_path):
    """Flows, instant, counter and metadata events are decoded by ``ph`` into small structs: the tables (the
    backward op bound to its forward op, the kernel to its launch, the memcpy), the category counts and the
    diagnostics equal the dict loop's."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _events_of_every_kind()}))
    assert _chunk_kinds(path) == ["_Event", "dict"]
    t = _same_tables(path)
    r = t.ranges.set_index("name")
    assert int(r.loc["MmBackward0", "forward_range_id"]) == int(r.loc["aten::mm", "range_id"])
    assert list(t.kernels["name"]) == ["gemm"] and int(t.kernels["correlation_id"].iloc[0]) == 7
    assert list(t.activities["kind"]) == ["memcpy"]
    categories = t.diagnostics["event_categories"]
    assert categories["fwdbwd"] == 3 and categories["ac2g"] == 2 and categories["cpu_instant_event"] == 1
    assert categories["global_instant"] == 1 and categories["counter"] == 1 and categories["None"] == 1


@pytest.mark.parametrize("ph", ["B", "n", None, "absent"])
def test_a_chunk_with_an_event_of_another_ph_is_read_by_the_dict_loop(tmp_path, ph):
    """An event whose ``ph`` is outside the typed union (or null, or missing) does not fit it: the whole chunk is
    read by the dict loop, with the tables of ``typed=False``."""
    events = _events_of_every_kind()
    odd = {"ph": ph, "cat": "odd", "name": "odd", "pid": 1, "tid": 1, "ts": 35, "dur": 1}
    if ph == "absent":
        del odd["ph"]
    events.insert(3, odd)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert _chunk_kinds(path) == ["dict", "dict"]
    t = _same_tables(path)
    assert t.diagnostics["event_categories"]["odd"] == 1
    assert int(t.ranges.set_index("name").loc["MmBackward0", "forward_range_id"]) >= 0


def test_flows_of_an_exact_chunk_bind_by_their_exact_ts(tmp_path):
    """In a chunk decoded with exact ts (a fractional ts of 2**43 µs or more), fwdbwd flows carry the exact ts too
    and bind the backward op to its forward op as the dict loop does."""
    text = json.dumps({"traceEvents": _events_of_every_kind()})  # the two ops and their flows' ends:
    text = text.replace('"ts": 10,', '"ts": 1695835535123456.789,').replace('"ts": 40,', '"ts": 1695835535123499.001,')
    path = tmp_path / "t.json"
    path.write_text(text)
    assert _chunk_kinds(path)[0] == "_ExactEvent"
    t = _same_tables(path)
    r = t.ranges.set_index("name")
    assert int(r.loc["aten::mm", "start_ns"]) == 1695835535123456789
    assert int(r.loc["MmBackward0", "forward_range_id"]) == int(r.loc["aten::mm", "range_id"])


def test_events_skipped_for_their_ph_are_counted_and_warned(tmp_path):
    """An op written as a begin/end pair ('B'/'E') or an event without a 'ph' is not read: the reader says how many,
    with their ph values, instead of leaving the op out without a word; flows, instants and metadata stay unsaid."""
    import gzip
    import json

    source = need_real(REAL_DATA / "kineto" / "hta_triton_example.json.gz")
    trace = json.load(gzip.open(source))
    events = trace["traceEvents"]
    first = next(i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    op = events[first]
    begin = {k: v for k, v in op.items() if k != "dur"} | {"ph": "B"}
    end = {"ph": "E", "cat": op["cat"], "name": op["name"], "pid": op["pid"], "tid": op["tid"], "ts": op["ts"] + op["dur"]}
    second = next(i for i, e in enumerate(events) if i > first and e.get("ph") == "X" and e.get("cat") == "cpu_op")
    no_ph = {k: v for k, v in events[second].items() if k != "ph"}
    events[second] = no_ph
    events[first:first + 1] = [begin, end]
    path = tmp_path / "odd_ph.json"
    path.write_text(json.dumps(trace))
    timeline = read_kineto(path)
    said = [w for w in timeline.diagnostics["warnings"] if "for their 'ph'" in w]
    assert len(said) == 1 and said[0].startswith("3 events were not read for their 'ph' (")
    assert all(part in said[0] for part in ("B 1", "E 1", "None 1", f"(first: traceEvents[{first}])"))
    clean = read_kineto(source)
    assert len(timeline.ranges) == len(clean.ranges) - 2  # the two ops, and nothing else, are missing
    assert not [w for w in clean.diagnostics["warnings"] if "for their 'ph'" in w]


def test_string_column_codes_each_string_in_the_order_first_seen_and_null_as_minus_one():
    """_StringColumn codes a column chunk by chunk: a string's code is its rank among the distinct strings in the
    order they first come (over all chunks), a null's -1; strings() gives back the values, nulls included."""
    import numpy as np

    from operator_profiler.timeline.kineto import _StringColumn

    chunks = [["aten::mm", None, "aten::mm", "aten::add"], [None, None], ["aten::add", "é", "aten::mm"], [],
              ["", "aten::relu", None, "é"]]
    column = _StringColumn()
    for chunk in chunks:
        column.pending.extend(chunk)
        column.flush()
    values = [v for chunk in chunks for v in chunk]
    first_seen = list(dict.fromkeys(v for v in values if v is not None))
    assert list(column.code_of) == first_seen == ["aten::mm", "aten::add", "é", "", "aten::relu"]
    codes = column.codes()
    assert codes.dtype == np.int32
    assert codes.tolist() == [-1 if v is None else first_seen.index(v) for v in values]
    assert [None if isinstance(v, float) else v for v in column.strings(codes).tolist()] == values


def test_a_name_with_a_lone_surrogate_is_read_with_a_replacement_character_and_warned(tmp_path):
    """A ``\\ud800`` escape without its pair is valid JSON syntax but no text: the op, launch and kernel names that
    hold one are read with U+FFFD in its place and the trace's warnings name them (it crashed the parquet conversion
    with a UnicodeEncodeError traceback); two such names that differ only there become one name. Typed and dict
    reads agree."""
    events = [
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm\\ud800", "pid": 1, "tid": 1, "ts": 10, "dur": 50}',
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm\\udfff", "pid": 1, "tid": 1, "ts": 70, "dur": 5}',
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel\\ud801", "pid": 1, "tid": 1, "ts": 20, '
        '"dur": 5, "args": {"correlation": 7}}',
        '{"ph": "X", "cat": "kernel", "name": "gemm\\udc00k", "pid": 0, "tid": 7, "ts": 30, "dur": 9, '
        '"args": {"correlation": 7, "device": 0, "stream": 7}}',
    ]
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
    for typed in (True, False):
        timeline = read_kineto(path, typed=typed)
        assert timeline.ranges["name"].tolist() == ["aten::mm\ufffd", "aten::mm\ufffd"]
        assert timeline.launches["api"].tolist() == ["cudaLaunchKernel\ufffd"]
        assert timeline.kernels["name"].tolist() == ["gemm\ufffdk"]
        warning = next(w for w in timeline.diagnostics["warnings"] if "lone UTF-16 surrogates" in w)
        assert warning.startswith("4 distinct name(s)")
