"""Tests for attribution paths (a) correlation and (c) Inductor fusion map, merged per kernel
(operator_profiler.attribution.correlation / merge).

Expectations are recomputed from the raw JSON of the real torch 2.13 CPU traces (inductor-cpu/traces) with a few
lines of plain Python: the enclosing ops of each kernel, the ``Sequence number`` link from a backward node to its
forward op (docs/formats.md#kineto-backward-thread), and the position of each kernel inside its
``## Call CompiledFxGraph`` region (formats.md#inductor-kernels-in-kineto).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA, need_real

from operator_profiler.attribution import inductor
from operator_profiler.attribution.merge import (
    VIEW_OPS,
    attribute,
    fused_operator_label,
)
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

COMPILED = REAL_DATA / "inductor-cpu" / "traces" / "trace_compiled_cpu.json.gz"
EAGER = REAL_DATA / "inductor-cpu" / "traces" / "trace_eager_cpu.json.gz"
INDUCTOR_DIR = REAL_DATA / "inductor-cpu" / "torchinductor"

CALL_NAME = re.compile(r"^\w+::[\w.]+$")
CPP_KERNEL = re.compile(r"^graph_\d+_cpp_")
REGION = "## Call CompiledFxGraph"


def _events(path: Path) -> list[dict]:
    """X events on CPU threads with exact integer-ns start/end (independent of the reader)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        trace = json.load(fh, parse_float=str, parse_int=str)
    base = int(trace.get("baseTimeNanoseconds") or 0)
    out = []
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X" or ev.get("cat") not in ("cpu_op", "user_annotation"):
            continue
        start = base + round(Fraction(ev["ts"]) * 1000)
        args = ev.get("args", {})
        out.append({
            "name": ev["name"], "cat": ev["cat"], "tid": int(ev["tid"]), "start": start,
            "end": start + round(Fraction(ev["dur"]) * 1000),
            "seq": int(args["Sequence number"]) if "Sequence number" in args else None,
            "fwd": int(args["Fwd thread id"]) if "Fwd thread id" in args else None,
        })
    return out


def _encloses(o: dict, start: int, end: int, tid: int) -> bool:
    return o["tid"] == tid and o["start"] <= start and end <= o["end"]


def _innermost(candidates: list[dict]) -> dict:
    return min(candidates, key=lambda o: (o["end"] - o["start"], -o["start"]))


def _expected_forward_op(events: list[dict], start: int, end: int, tid: int) -> str | None:
    """Innermost backward node (Fwd thread id 1) enclosing the kernel -> innermost forward op with its seq."""
    nodes = [o for o in events if o["fwd"] == 1 and o["seq"] is not None and _encloses(o, start, end, tid)]
    if not nodes:
        return None
    seq = _innermost(nodes)["seq"]
    forward = [o for o in events if o["seq"] == seq and o["fwd"] == 0 and "Backward" not in o["name"]]
    return _innermost(forward)["name"] if forward else None


def _run(trace: Path, fusion_map: pd.DataFrame | None):
    t = read_kineto(trace)
    kl, _, _ = classify_layers(t.kernels, t.ranges, [])
    return t, attribute(t.kernels, t.ranges, kl, fusion_map)


@pytest.fixture(scope="module")
def fusion_map():
    need_real(INDUCTOR_DIR)
    return inductor.load_fusion_map(INDUCTOR_DIR)


@pytest.fixture(scope="module")
def compiled(fusion_map):
    need_real(COMPILED)
    t, a = _run(COMPILED, fusion_map)
    return _events(COMPILED), t, a


@pytest.fixture(scope="module")
def eager():
    need_real(EAGER)
    t, a = _run(EAGER, None)
    return _events(EAGER), t, a


def _expected_region_rows(events: list[dict], fusion_map: pd.DataFrame) -> dict[int, dict]:
    """kernel start_ns -> fusion-map row, by position of the kernel inside its compiled-graph region."""
    calls = [o for o in events if o["cat"] == "cpu_op" and (CALL_NAME.match(o["name"]) or CPP_KERNEL.match(o["name"]))]
    out: dict[int, dict] = {}
    for region in (o for o in events if o["name"].startswith(REGION)):
        inside = [c for c in calls if _encloses(region, c["start"], c["end"], c["tid"])]
        outer = [c for c in inside
                 if not any(o is not c and _encloses(o, c["start"], c["end"], c["tid"]) for o in inside)]
        outer.sort(key=lambda c: c["start"])
        names = [c["name"] for c in outer]
        graphs = [g for g, rows in fusion_map.groupby("graph")
                  if list(rows.sort_values("call_index")["profiler_name"]) == names]
        assert len(graphs) == 1, f"region {region['name']} matches graphs {graphs}"
        rows = fusion_map[fusion_map["graph"] == graphs[0]].sort_values("call_index").to_dict("records")
        for c, row in zip(outer, rows):
            out[c["start"]] = row
    return out


def test_compiled_every_kernel_has_a_record(compiled):
    _, t, a = compiled
    assert len(a) == len(t.kernels)
    assert list(a["kernel_id"]) == list(t.kernels["kernel_id"])
    assert (a["path"] != "unattributed").all()
    assert a["reason"].isna().all()


def test_compiled_cpp_kernels_take_the_fusion_map_ops(compiled, fusion_map):
    events, t, a = compiled
    expected = _expected_region_rows(events, fusion_map)
    a = a.merge(t.kernels[["kernel_id", "start_ns"]], on="kernel_id")
    cpp = a[a["name"].str.match(CPP_KERNEL.pattern)]
    n_cpp_events = sum(1 for o in events if o["cat"] == "cpu_op" and CPP_KERNEL.match(o["name"]))
    assert len(cpp) == n_cpp_events > 0
    for row in cpp.itertuples(index=False):
        want = expected[int(row.start_ns)]
        assert row.path == "inductor"
        assert want["profiler_name"] == row.name
        assert list(row.fused_ops) == list(want["fused_ops"])
        assert list(row.source_nodes) == list(want["source_nodes"])
        parts = row.operator.split("+")
        assert parts == sorted(parts) and set(parts) <= set(want["fused_ops"])
        ev = json.loads(row.evidence)["inductor"]
        assert ev["kernel"] == want["kernel"] and ev["call_index"] == want["call_index"]
        assert ev["graph"] == want["graph"]


def test_compiled_extern_kernels_use_correlation(compiled, fusion_map):
    events, t, a = compiled
    expected = _expected_region_rows(events, fusion_map)
    a = a.merge(t.kernels[["kernel_id", "start_ns"]], on="kernel_id")
    ext = a[a["name"].isin(["aten::addmm", "aten::mm"])]
    n_events = sum(1 for o in events if o["cat"] == "cpu_op" and o["name"] in ("aten::addmm", "aten::mm"))
    assert len(ext) == n_events > 0
    assert (ext["path"] == "correlation").all()
    assert (ext["operator"] == ext["name"]).all()
    # Inside a compiled region the fusion map still contributes the call site's ops.
    for row in ext.itertuples(index=False):
        if int(row.start_ns) in expected:
            assert list(row.fused_ops) == list(expected[int(row.start_ns)]["fused_ops"])
            assert row.operator in row.fused_ops


@pytest.mark.parametrize("case", ["compiled", "eager"])
def test_backward_kernels_get_forward_operator_by_sequence_number(case, request):
    events, t, a = request.getfixturevalue(case)
    a = a.merge(t.kernels[["kernel_id", "start_ns", "end_ns", "launch_tid"]], on="kernel_id")
    n_backward = 0
    seen_nodes = set()
    for row in a.itertuples(index=False):
        start, end, tid = int(row.start_ns), int(row.end_ns), int(row.launch_tid)
        want = _expected_forward_op(events, start, end, tid)
        got = None if pd.isna(row.forward_operator) else row.forward_operator
        assert got == want, (row.kernel_id, row.name)
        if want is not None:
            n_backward += 1
            node = _innermost([o for o in events if o["fwd"] == 1 and o["seq"] is not None
                               and _encloses(o, start, end, tid)])
            seen_nodes.add(node["name"])
    assert n_backward > 0
    assert "MeanBackward0" in seen_nodes
    if case == "compiled":
        assert "CompiledFunctionBackward" in seen_nodes


def test_mean_backward_maps_to_forward_mean(compiled):
    """Spelled out for one node: kernels under MeanBackward0 get the op that created it (same seq, innermost)."""
    events, t, a = compiled
    a = a.merge(t.kernels[["kernel_id", "start_ns", "end_ns"]], on="kernel_id")
    for node in (o for o in events if o["name"] == "MeanBackward0"):
        forward = [o for o in events if o["seq"] == node["seq"] and o["fwd"] == 0]
        assert forward
        inner = _innermost(forward)["name"]
        under = a[(a["start_ns"] >= node["start"]) & (a["end_ns"] <= node["end"])]
        assert len(under) > 0
        assert set(under["forward_operator"]) == {inner}
        assert inner == "aten::mean"


def test_eager_every_kernel_is_its_own_operator(eager):
    events, t, a = eager
    assert len(a) == len(t.kernels) > 0
    assert (a["path"] == "correlation").all()
    assert (a["operator"] == a["name"]).all()
    assert all(CALL_NAME.match(op) for op in a["operator"])
    assert a["fused_ops"].map(len).eq(0).all()
    ev = a["evidence"].map(json.loads)
    assert all(e["correlation"]["operator"] == op and e["correlation"]["stack"][-1] == op
               for e, op in zip(ev, a["operator"]))


def test_operator_range_id_is_the_kernels_own_range(eager):
    _, t, a = eager
    r = t.ranges.set_index("range_id")
    k = t.kernels.set_index("kernel_id")
    for row in a.itertuples(index=False):
        rng = r.loc[int(row.operator_range_id)]
        assert rng["name"] == row.name
        assert int(rng["start_ns"]) == int(k.loc[row.kernel_id, "start_ns"])


def test_without_fusion_map_inductor_kernels_stay_visible(compiled):
    events, t, _ = compiled
    _, a = _run(COMPILED, None)
    assert len(a) == len(t.kernels)
    cpp = a[a["name"].str.match(CPP_KERNEL.pattern)]
    assert len(cpp) == sum(1 for o in events if o["cat"] == "cpu_op" and CPP_KERNEL.match(o["name"]))
    assert (cpp["path"] == "unattributed").all()
    assert (cpp["reason"] == "no_fusion_map").all()
    assert cpp["operator"].isna().all()
    assert cpp["duration_ns"].sum() > 0
    rest = a[~a["name"].str.match(CPP_KERNEL.pattern)]
    assert (rest["path"] == "correlation").all() and (rest["operator"] == rest["name"]).all()


def test_fusion_map_of_another_graph_is_a_mismatch(compiled, fusion_map):
    """Only the forward graph's map: backward-region kernels are unattributed as fusion_map_mismatch."""
    events, t, _ = compiled
    forward_only = fusion_map[fusion_map["graph"].str.contains("forward")]
    assert 0 < len(forward_only) < len(fusion_map)
    _, a = _run(COMPILED, forward_only)
    a = a.merge(t.kernels[["kernel_id", "start_ns", "end_ns", "launch_tid"]], on="kernel_id")
    backward_regions = [o for o in events if o["name"].startswith(REGION)
                        and any(b["name"] == "CompiledFunctionBackward" and _encloses(b, o["start"], o["end"], o["tid"])
                                for b in events)]
    assert backward_regions
    in_bwd = a[[any(_encloses(r, int(s), int(e), int(tid)) for r in backward_regions)
                for s, e, tid in zip(a["start_ns"], a["end_ns"], a["launch_tid"])]]
    cpp = in_bwd[in_bwd["name"].str.match(CPP_KERNEL.pattern)]
    assert len(cpp) > 0
    assert (cpp["path"] == "unattributed").all() and (cpp["reason"] == "fusion_map_mismatch").all()
    fwd_cpp = a[a["name"].str.match(CPP_KERNEL.pattern) & ~a["kernel_id"].isin(in_bwd["kernel_id"])]
    assert len(fwd_cpp) > 0 and (fwd_cpp["path"] == "inductor").all()


# ---------------------------------------------------------------------------------- synthetic GPU


def test_gpu_kernels_join_launch_and_enclosing_op(tmp_path):
    def x(cat, name, ts, dur, pid=100, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        x("cpu_op", "aten::linear", 0, 50),
        x("cpu_op", "aten::addmm", 5, 30),
        x("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
        x("cpu_op", "MyWrapper", 60, 20),  # not a dispatcher op
        x("cuda_runtime", "cudaLaunchKernel", 65, 5, correlation=2),
        x("kernel", "gemm_kernel", 20, 8, pid=0, tid=7, correlation=1, device=0, stream=7),
        x("kernel", "lonely_kernel", 75, 8, pid=0, tid=7, correlation=2, device=0, stream=7),
        x("kernel", "orphan_kernel", 90, 8, pid=0, tid=7, correlation=99, device=0, stream=7),
    ]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t, a = _run(path, None)
    by = a.set_index("name")
    assert by.loc["gemm_kernel", "operator"] == "aten::addmm"
    assert by.loc["gemm_kernel", "path"] == "correlation"
    assert json.loads(by.loc["gemm_kernel", "evidence"])["correlation"]["stack"] == ["aten::linear", "aten::addmm"]
    # No dispatcher op around the launch: the innermost profiler op names it, flagged as such
    # (a custom autograd Function, Inductor's CPU-side kernel event; docs/formats.md#kineto-external-id).
    assert by.loc["lonely_kernel", "path"] == "correlation"
    assert by.loc["lonely_kernel", "operator"] == "MyWrapper"
    assert json.loads(by.loc["lonely_kernel", "evidence"])["correlation"]["operator_kind"] == "cpu_op"
    assert json.loads(by.loc["gemm_kernel", "evidence"])["correlation"]["operator_kind"] == "dispatcher_op"
    assert by.loc["orphan_kernel", "path"] == "unattributed"
    assert by.loc["orphan_kernel", "reason"] == "no_launch_record"
    assert len(a) == 3


# ------------------------------------------------------------------------------- operator labels


def test_fused_operator_label_drops_view_ops_and_sorts():
    assert fused_operator_label(["aten::view", "aten::native_layer_norm", "aten::add"]) == \
        "aten::add+aten::native_layer_norm"
    assert fused_operator_label(["aten::gelu", "aten::view"]) == "aten::gelu"
    assert fused_operator_label(["aten::sum", "aten::gelu_backward", "aten::gelu", "aten::view"]) == \
        "aten::gelu+aten::gelu_backward+aten::sum"


def test_fused_operator_label_only_views_keeps_them():
    assert fused_operator_label(["aten::transpose", "aten::permute", "aten::view"]) == \
        "aten::permute+aten::transpose+aten::view"
    assert {"aten::permute", "aten::transpose", "aten::view"} <= VIEW_OPS


def test_fused_operator_label_keeps_ops_that_copy_data():
    """cat, clone, _to_copy, contiguous move data: they are the kernel's work, not views."""
    assert fused_operator_label(["aten::cat", "aten::transpose", "aten::view"]) == "aten::cat"
    assert not {"aten::cat", "aten::clone", "aten::_to_copy", "aten::contiguous"} & VIEW_OPS


def test_fused_operator_label_empty_is_none():
    assert fused_operator_label([]) is None
    assert fused_operator_label(None) is None


def test_fused_operator_label_keeps_unknown_pieces():
    assert fused_operator_label(["weird_piece", "aten::mul"]) == "aten::mul+weird_piece"


def test_integer_microsecond_trace_still_matches_its_graphs(tmp_path):
    """Kineto before 2024 wrote integer µs: children then end a µs after their parent, or sit as
    zero-length events exactly at its end. The same compute calls must be found, counted once, and
    the compiled regions must still match their graphs."""
    need_real(COMPILED, INDUCTOR_DIR)
    trace = json.load(gzip.open(COMPILED, "rt"))
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "X":
            start, end = int(float(ev["ts"])), int(float(ev["ts"]) + float(ev["dur"]))
            ev["ts"], ev["dur"] = start, end - start  # truncated like the old integer timestamps
    trace.pop("baseTimeNanoseconds", None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(trace))
    old = read_kineto(path)
    new = read_kineto(COMPILED)
    assert Counter(old.kernels["name"]) == Counter(new.kernels["name"])
    # self times never exceed the wall time of the outermost calls (no double counting)
    outermost = old.kernels[old.kernels["parent_kernel_id"].isna()]
    assert old.kernels["duration_ns"].sum() <= (outermost["end_ns"] - outermost["start_ns"]).sum()
    kl, _, _ = classify_layers(old.kernels, old.ranges, [])
    attributed = attribute(old.kernels, old.ranges, kl, inductor.load_fusion_map(INDUCTOR_DIR))
    cpp = attributed[attributed["name"].str.startswith("graph_0_cpp_")]
    assert len(cpp) > 0 and (cpp["path"] == "inductor").all()


# --- C20 (b): a generic `triton_` device kernel resolved through its CPU-side event ----------------------------------

_C20_CODE = '''
triton_poi_fused_add_cos_0 = async_compile.triton('triton_poi_fused_add_cos_0', """
def triton_poi_fused_add_cos_0(in_ptr0, xnumel):
    pass
""", device_str='cuda')
triton_red_fused_sum_1 = async_compile.triton('triton_', """
def triton_(in_ptr0, xnumel, rnumel):
    pass
""", device_str='cuda')

def call(args):
    with torch.cuda._DeviceGuard(0):
        # Topologically Sorted Source Nodes: [add, cos], Original ATen: [aten.add, aten.cos]
        triton_poi_fused_add_cos_0.run(buf0, 4, grid=grid(4), stream=stream0)
        # Topologically Sorted Source Nodes: [sum_1], Original ATen: [aten.sum]
        triton_red_fused_sum_1.run(buf0, 4, 4, grid=grid(4), stream=stream0)
    return (buf1, )
'''


def test_c20_generic_kernel_resolved_through_cpu_side_event(tmp_path):
    """docs/field-cases.md C20 fixture: (a) `triton_poi_fused_add_cos_0_0d1d2de` on the GPU (no CPU-side event) and (b) a
    `triton_` kernel launched by cuLaunchKernel (corr 77) inside the CPU-side event `triton_red_fused_sum_1`,
    both in one `## Call CompiledFxGraph` region (Kineto layout of docs/formats.md#inductor-kernels-in-kineto)."""
    graph = tmp_path / "torchinductor" / "model__0_inference_0.0"
    graph.mkdir(parents=True)
    (graph / "output_code.py").write_text(_C20_CODE)
    fmap = inductor.load_fusion_map(tmp_path)

    def ev(name, cat, ts, dur, pid=100, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        ev("## Call CompiledFxGraph abc ##", "user_annotation", 10, 100),
        ev("cuLaunchKernel", "cuda_driver", 12, 2, correlation=76),
        ev("triton_red_fused_sum_1", "cpu_op", 20, 10),
        ev("cuLaunchKernel", "cuda_driver", 22, 2, correlation=77),
        ev("triton_poi_fused_add_cos_0_0d1d2de", "kernel", 30, 5, pid=0, tid=7, correlation=76, device=0, stream=7),
        ev("triton_", "kernel", 40, 5, pid=0, tid=7, correlation=77, device=0, stream=7),
    ]
    path = tmp_path / "c20.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_kineto(path)
    kl, _, _ = classify_layers(t.kernels, t.ranges, [])
    a = attribute(t.kernels, t.ranges, kl, fmap).set_index("name")
    assert a.loc["triton_poi_fused_add_cos_0_0d1d2de", "fused_ops"] == ["aten::add", "aten::cos"]  # (a)
    assert a.loc["triton_", "fused_ops"] == ["aten::sum"]  # (b)
    assert a.loc["triton_", "path"] == "inductor" and a.loc["triton_", "operator"] == "aten::sum"
    assert json.loads(a.loc["triton_", "evidence"])["inductor"]["call_index"] == 1
    # (b') the same kernels with no CPU-side event and no region (an nsys-only capture): by name only
    by_name = inductor.attribute_by_name(t.kernels, fmap).merge(t.kernels[["kernel_id", "name"]]).set_index("name")
    assert by_name.loc["triton_", "reason"] == "ambiguous_generic_kernel_name"
    assert by_name.loc["triton_poi_fused_add_cos_0_0d1d2de", "fused_ops"] == ["aten::add", "aten::cos"]


def test_fused_copy_kernel_does_not_merge_into_the_op_it_serves(compiled):
    """QA finding: the layout copy ``cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_
    transpose_view_2`` dropped its view ops and took the name of the SDPA backward fallback, doubling
    that op's calls in operators.csv. Counted here from the raw trace: the fallback op runs once per
    step, and so does the copy kernel."""
    from operator_profiler import aggregate as agg

    events, _, a = compiled
    sdpa_bwd = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    fallback_calls = sum(1 for o in events if o["cat"] == "cpu_op" and o["name"] == sdpa_bwd)
    copy_name = "graph_0_cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2"
    copies = sum(1 for o in events if o["cat"] == "cpu_op" and o["name"] == copy_name)
    assert fallback_calls == copies == 2
    ops = agg.operators_table(a, per_iteration=False).set_index("operator")
    assert ops.loc[sdpa_bwd, "calls"] == fallback_calls and ops.loc[sdpa_bwd, "paths"] == "correlation"
    # the SDPA backward is computed by the fallback call, not by the copy kernel that lists it
    label = "aten::transpose+aten::view"
    assert ops.loc[label, "calls"] == copies and ops.loc[label, "paths"] == "inductor"
    copy_rows = a[a["name"] == copy_name]
    assert copy_rows["listed_not_computed"].map(list).tolist() == [[sdpa_bwd]] * copies
    assert all(sdpa_bwd not in f for f in copy_rows["fused_ops"])


def test_a_fused_kernel_of_exactly_the_op_stays_in_its_row():
    """A compiled layer's fused layer norm beside the eager final layer norm (GPT-2's ln_f) is a call of
    the same op: one row. Only a kernel whose label dropped view ops is moved to a row of its own."""
    import numpy as np

    from operator_profiler.attribution.merge import _keep_fused_rows_apart

    operator = np.array(["aten::native_layer_norm", "aten::native_layer_norm", "aten::sdpa_bwd", "aten::sdpa_bwd"],
                        dtype=object)
    path = np.array(["correlation", "inductor", "correlation", "inductor"], dtype=object)
    fused = np.empty(4, dtype=object)
    fused[:] = [[], ["aten::native_layer_norm"], [], ["aten::sdpa_bwd", "aten::transpose", "aten::view"]]
    _keep_fused_rows_apart(operator, path, fused, path == "correlation")
    assert list(operator) == ["aten::native_layer_norm", "aten::native_layer_norm", "aten::sdpa_bwd",
                              "aten::sdpa_bwd+aten::transpose+aten::view"]


def test_membership_columns_copy_each_kernels_layers_spanned_and_share_the_empty_one():
    """stages._with_membership: the kernel_layers columns on the attribution rows, by kernel id (rows in another
    order); spans read from parquet (numpy arrays) become lists, and every kernel spanning no instance (empty,
    null, or not in kernel_layers) gets the one shared empty list (a fresh list per kernel cost 0.9 s of ``opprof
    attribute`` at 1 M kernels)."""
    import numpy as np

    from operator_profiler import stages
    from operator_profiler.layers import NO_SPANS

    kl = pd.DataFrame({"kernel_id": [3, 1, 2, 0], "membership": ["cross_layer", "layer_range", "unknown", "rest"],
                       "layers_spanned": [np.array(["h.0", "h.1"], dtype=object), np.array([], dtype=object), None,
                                          ["h.2"]]})
    result = pd.DataFrame({"kernel_id": [0, 1, 2, 3, 4], "operator": ["a", "b", "c", "d", "e"]})
    out = stages._with_membership(result, kl)
    assert out["membership"].tolist()[:4] == ["rest", "layer_range", "unknown", "cross_layer"]
    assert pd.isna(out["membership"].iloc[4])
    assert out["layers_spanned"].tolist() == [["h.2"], [], [], ["h.0", "h.1"], []]
    assert all(type(v) is list for v in out["layers_spanned"])
    assert [v is NO_SPANS for v in out["layers_spanned"]] == [False, True, True, False, True]
    assert NO_SPANS == [] and "layers_spanned" not in result  # the shared list untouched, the input not changed
