"""Path (a) on the real torch.profiler traces of ../shared/data/real/kineto/ (HTA and TraceLens test
data, 2022-2025).

For every trace, the share of kernels that path (a) links to an operator must equal the ``in_op%``
column of that folder's PROVENANCE.md (or PROVENANCE.tracelens.md), computed there by an independent
script (inspect_kineto.py, or the stdlib script the TraceLens note names):
"kernel correlation equals that of a cuda_runtime/cuda_driver event, and that launch lies inside a
cpu_op on the same pid/tid". ``corr%`` (the launch join alone) and ``ext==corr%`` (the pre-2024
External-id behaviour) are checked against their columns too. Other figures are counted in the test
from the raw JSON with the standard library.
"""

from __future__ import annotations

import gzip
import heapq
import json
import re
from collections import Counter
from decimal import Decimal

import pandas as pd
import pytest
from conftest import REAL_DATA, real_file

from operator_profiler import aggregate as agg
from operator_profiler.attribution.merge import attribute
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

KINETO = REAL_DATA / "kineto"


def provenance_rows() -> dict[str, dict[str, str]]:
    """file name -> {column: value} of the PROVENANCE.md and PROVENANCE.tracelens.md tables (one row per trace)."""
    rows = {}
    for note in ("PROVENANCE.md", "PROVENANCE.tracelens.md"):
        text = real_file("kineto", note).read_text()
        lines = [line for line in text.splitlines() if line.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            name = re.search(r"`((?:hta|tracelens)_[^`]+\.json(?:\.gz)?)`", cells[0]).group(1)
            rows[name] = dict(zip(header, cells))
    return rows


# The traces with kernel records (the counter-only trace is tested separately below).
TRACES = ["hta_nccl_parser_config__nccl_data.json.gz", "hta_critical_path_alexnet__trace.json.gz",
          "hta_triton_example.json.gz", "hta_negative_queue_length__rank0.json.gz", "hta_df_index_resolver.json.gz",
          "hta_timeline_analysis__sampled_rank-0.json.gz", "hta_cuda_event_sync_multi_stream.json.gz",
          "hta_amd_mi250_minitoy_train.json.gz", "hta_call_stack__backward_thread.json",
          "hta_trace_file_list__inference_rank_1.json.gz", "hta_execution_trace__simple_add_kineto.json.gz",
          "tracelens_h100_bert_small_uncased.json.gz", "tracelens_h100_qwen1.5_0.5b_chat.json.gz"]


def _load_raw(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


_cache: dict = {}


def _attributed(name):
    if name not in _cache:
        timeline = read_kineto(real_file("kineto", name))
        layers, _, _ = classify_layers(timeline.kernels, timeline.ranges, [])
        _cache[name] = (timeline, attribute(timeline.kernels, timeline.ranges, layers, None))
    return _cache[name]


@pytest.mark.parametrize("name", TRACES)
def test_share_linked_to_an_operator_equals_provenance(name):
    row = provenance_rows()[name]
    timeline, a = _attributed(name)
    kernels_column = row["kernels (uniq names)"]
    assert len(a) == int(kernels_column.split()[0])
    linked = a["evidence"].map(lambda e: json.loads(e)["correlation"]["operator"] is not None)
    assert round(100 * linked.mean(), 1) == float(row["in_op%"])
    joined = timeline.kernels["launch_start_ns"].notna()
    assert round(100 * joined.mean(), 1) == float(row["corr%"])
    # A kernel whose launch no profiler op encloses stays visible: unattributed with a reason, or named
    # by the user annotation around its launch (path user_annotation, tested below).
    unlinked = a[~linked]
    assert unlinked["path"].isin(["unattributed", "user_annotation"]).all()
    assert unlinked.loc[unlinked["path"] == "unattributed", "reason"].notna().all()


@pytest.mark.parametrize("name", TRACES)
def test_external_id_mode_matches_the_trace_era(name):
    row = provenance_rows()[name]
    timeline, a = _attributed(name)
    mode = timeline.diagnostics["external_id_mode"]
    if float(row["ext==corr%"]) == 100:
        assert mode == "correlation"  # pre-2024: never joined to ops
    elif float(row["ext_op%"]) > 0:
        assert mode == "op_id"
        checks = Counter(json.loads(e)["correlation"].get("external_id_check") for e in a["evidence"])
        # ext_op% of the kernels: the op id is in the launch's stack (the rest have no launch record)
        assert set(checks) <= {"agrees", None} and round(100 * checks["agrees"] / len(a), 1) == float(row["ext_op%"])
        assert agg.external_id_disagreements(a) == {"checked": checks["agrees"], "count": 0, "time_ns": 0,
                                                    "examples": []}
    # Otherwise no cpu_op carries a comparable id (the 2022 on-demand trace has no cpu_op at all):
    # nothing to check the mode against, and no kernel may be said to disagree.
    assert all(json.loads(e)["correlation"].get("external_id_check") != "disagrees" for e in a["evidence"])


def test_orphan_kernels_and_graph_replays_of_the_negative_queue_trace():
    """705 of 6080 kernels have no launch in the window (PROVENANCE: corr% 88.4); 70 cudaGraphLaunch
    calls replay 135 kernels that share their launch's correlation id (docs/formats.md#kineto-cuda-graphs)."""
    name = "hta_negative_queue_length__rank0.json.gz"
    raw = _load_raw(real_file("kineto", name))["traceEvents"]
    launches = {e["args"]["correlation"]: e["name"] for e in raw
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    graph_kernels = [e for e in raw if e.get("cat") == "kernel" and launches.get(e["args"]["correlation"]) == "cudaGraphLaunch"]
    assert len(graph_kernels) == 135
    orphans = sum(1 for e in raw if e.get("cat") == "kernel" and e["args"].get("correlation") not in launches)
    assert orphans == 705
    timeline, a = _attributed(name)
    assert (a["reason"] == "no_launch_record").sum() == orphans
    assert timeline.diagnostics["counts"]["orphan_kernels"] == orphans
    # One process launched everything in this file (torch.profiler writes a file per process): the orphans are
    # its kernels too, not a process of their own named after the GPU event's pid (the device index).
    launch_pids = {e["pid"] for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    assert len(launch_pids) == 1 and set(timeline.kernels["pid"]) == launch_pids
    replayed = a.merge(timeline.kernels[["kernel_id", "launch_api"]], on="kernel_id")
    replayed = replayed[replayed["launch_api"] == "cudaGraphLaunch"]
    assert len(replayed) == 135
    # The op around each replay: the compiled region's autograd Function (forward or backward).
    assert set(replayed["operator"]) == {"CompiledFunction", "CompiledFunctionBackward"}
    # launch calls, not kernels: 70 graph launches (PROVENANCE.md)
    assert timeline.diagnostics["launch_apis"]["cudaGraphLaunch"] == 70


def test_backward_kernels_get_their_forward_op_through_fwdbwd_flows():
    """nccl_data (DDP ResNet training, 2024-05): 543 fwdbwd flows from the main thread to the autograd
    thread. Every kernel launched inside a backward op with a flow gets that flow's forward op."""
    name = "hta_nccl_parser_config__nccl_data.json.gz"
    raw = _load_raw(real_file("kineto", name))["traceEvents"]
    flows = [e for e in raw if e.get("cat") == "fwdbwd"]
    assert len(flows) == 2 * 543 and len({(e["tid"]) for e in flows if e["ph"] == "f"}) == 1
    timeline, a = _attributed(name)
    bound = timeline.ranges[timeline.ranges["forward_range_id"].notna()]
    assert len(bound) == 543
    # Independent expectation: the forward op at each flow's "s" point, by (tid, ts) on the raw events.
    ops_at = {}
    for e in raw:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops_at.setdefault((e["tid"], e["ts"]), []).append(e["name"])
    starts = {e["id"]: ops_at.get((e["tid"], e["ts"])) for e in flows if e["ph"] == "s"}
    assert all(starts.values())
    backward_thread = flows[0]["tid"] if flows[0]["ph"] == "f" else next(e["tid"] for e in flows if e["ph"] == "f")
    on_bwd = a.merge(timeline.kernels[["kernel_id", "launch_tid"]], on="kernel_id")
    on_bwd = on_bwd[on_bwd["launch_tid"] == backward_thread]
    assert len(on_bwd) > 1000
    with_forward = on_bwd[on_bwd["forward_operator"].notna()]
    # The rest run in work that no autograd node of the forward made: DDP's gradient averaging
    # (torch::distributed::reducer::mul_out inside AccumulateGrad's hook) and its allreduce.
    without = on_bwd[on_bwd["forward_operator"].isna()]
    stacks = without["evidence"].map(lambda e: json.loads(e)["correlation"]["stack"])
    ddp = stacks.map(lambda st: "torch::distributed::reducer::mul_out" in st or "c10d::allreduce_" in st)
    assert ddp.all() and len(with_forward) + len(without) == len(on_bwd)
    assert len(with_forward) > 1000
    forward_names = {n for names in starts.values() for n in names}
    assert set(with_forward["forward_operator"]) <= forward_names


def test_amd_rocm_trace_attributes_every_kernel():
    """ROCm Kineto reuses the cuda_runtime/kernel categories (PROVENANCE: 14 kernels, in_op 100 %)."""
    timeline, a = _attributed("hta_amd_mi250_minitoy_train.json.gz")
    assert len(a) == 14 and (a["path"] == "correlation").all()
    assert agg.coverage(a, counters_collected=False)["coverage_time"] == 1.0
    assert {d["name"] for d in timeline.diagnostics["devices"]} == {"AMD Radeon Graphics"}


def test_counter_only_trace_gives_a_no_kernel_events_diagnostic():
    """CUPTI range-profiler mode (formats.md#kineto-counters): 77 cuda_profiler_range events and 77 launches, no kernel."""
    timeline = read_kineto(real_file("kineto", "hta_cupti_profiler__counters_trace.json.gz"))
    assert len(timeline.kernels) == 0
    (warning,) = [w for w in timeline.diagnostics["warnings"] if w.startswith("no kernel events")]
    assert "77 cuda_profiler_range events" in warning and "range-profiler mode" in warning
    assert timeline.diagnostics["event_categories"]["cuda_profiler_range"] == 77


def test_execution_trace_is_refused_with_a_clear_error():
    from operator_profiler.timeline.kineto import TimelineError

    with pytest.raises(TimelineError, match="no 'traceEvents' list"):
        read_kineto(real_file("kineto", "hta_execution_trace__simple_add_et.json.gz"))


# --- Independent expectations, from the raw JSON with the standard library ---------------------------------
# (numbers as Decimal, so that enclosure is decided on the exact written values)

LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
# user_annotation ranges that name no kernel (DESIGN.md §3): our harness's, profiler steps, compiled regions
NOT_AN_OPERATOR_ANNOTATION = re.compile(r"^(?:opprof\.|ProfilerStep#\d+$|## Call CompiledFxGraph)")
_exact: dict = {}


def _load_exact(name):
    if name not in _exact:
        path = real_file("kineto", name)
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as fh:
            _exact[name] = json.load(fh, parse_float=Decimal)["traceEvents"]
    return _exact[name]


def _ranges_around(events, launches) -> dict[int, list[dict]]:
    """id(launch) -> the cpu_op/user_annotation events of its thread with ``ts <= launch ts`` and
    ``ts + dur >= launch ts + dur``: a sweep per thread in time order, keeping the ranges not yet ended
    in a heap (plain scanning would take minutes on the larger traces)."""
    by_thread: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    result = {}
    for thread, thread_launches in _group(launches).items():
        ranges = sorted(by_thread.get(thread, []), key=lambda r: r["ts"])
        pending, i = [], 0
        for launch in sorted(thread_launches, key=lambda e: e["ts"]):
            t0, t1 = launch["ts"], launch["ts"] + launch["dur"]
            while i < len(ranges) and ranges[i]["ts"] <= t0:
                heapq.heappush(pending, (ranges[i]["ts"] + ranges[i]["dur"], i))
                i += 1
            while pending and pending[0][0] < t0:  # ended before this launch (and every later one) starts
                heapq.heappop(pending)
            result[id(launch)] = [ranges[j] for end, j in pending if end >= t1]
    return result


def _group(launches) -> dict:
    grouped: dict = {}
    for e in launches:
        grouped.setdefault((e["pid"], e["tid"]), []).append(e)
    return grouped


def expected_paths(events) -> list[dict]:
    """Per kernel event: ``correlation``, ``name``, ``path`` and, for the user_annotation path, ``operator``:
    the launch (same correlation, a cuda_runtime/cuda_driver event) inside a cpu_op of its thread ->
    ``correlation``; else inside user annotations that may name an operator -> ``user_annotation``, the
    innermost (latest start, then shortest) one's name; no launch -> ``no_launch_record``; else ``unattributed``."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    around_launch = _ranges_around(events, launches.values())
    out = []
    for k in events:
        if k.get("ph") != "X" or k.get("cat") != "kernel":
            continue
        corr = k["args"].get("correlation")
        entry = {"correlation": corr, "name": k["name"], "operator": None}
        launch = launches.get(corr)
        if launch is None:
            entry["path"] = "no_launch_record"
        else:
            around = around_launch[id(launch)]
            annotations = [r for r in around if r["cat"] == "user_annotation"
                           and not NOT_AN_OPERATOR_ANNOTATION.match(r["name"])]
            if any(r["cat"] == "cpu_op" for r in around):
                entry["path"] = "correlation"
            elif annotations:
                entry["path"] = "user_annotation"
                entry["operator"] = max(annotations, key=lambda r: (r["ts"], -r["dur"]))["name"]
            else:
                entry["path"] = "unattributed"
        entry["duration_ns"] = int(k["dur"] * 1000)
        out.append(entry)
    return out


def _attributed_rows(timeline, a) -> Counter:
    """(correlation, name, path, operator of the user_annotation path) per kernel of our attribution."""
    rows = a.merge(timeline.kernels[["kernel_id", "correlation_id"]], on="kernel_id")
    path = rows["path"].where(rows["reason"] != "no_launch_record", "no_launch_record")
    operator = [op if p == "user_annotation" else None for op, p in zip(rows["operator"], rows["path"])]
    return Counter(zip(rows["correlation_id"].astype("int64"), rows["name"], path, operator))


@pytest.mark.parametrize(("name", "kernels"), [("hta_negative_queue_length__rank0.json.gz", 90),
                                               ("hta_timeline_analysis__sampled_rank-0.json.gz", 16)])
def test_kernels_only_a_user_annotation_encloses_are_named_by_it(name, kernels):
    """FusedAdam's / EMAOptimizer's multi_tensor_apply kernels launched under the optimizer's
    record_function only (A100 training traces). Each gets the innermost such annotation, path
    user_annotation; the counts, the time share (8.0 % of the A100 trace's kernel time, 0.1 % of the
    sampled one's) and the coverage it adds are computed from the raw JSON."""
    expected = expected_paths(_load_exact(name))
    by_annotation = [e for e in expected if e["path"] == "user_annotation"]
    assert len(by_annotation) == kernels
    timeline, a = _attributed(name)
    ours = _attributed_rows(timeline, a)
    assert ours == Counter((e["correlation"], e["name"], e["path"], e["operator"]) for e in expected)
    assert {e["operator"] for e in by_annotation} <= {"Optimizer.step#FusedAdam.step", "Optimizer.step#EMAOptimizer.step"}
    cov = agg.coverage(a, counters_collected=False)
    total = sum(e["duration_ns"] for e in expected if e["duration_ns"] >= 0)
    share = sum(e["duration_ns"] for e in by_annotation) / total
    assert cov["by_path"]["user_annotation"] == pytest.approx(share, rel=1e-12)
    assert cov["path_coverage"]["user_annotation"]["count"] == pytest.approx(kernels / len(expected), rel=1e-12)
    named = sum(e["duration_ns"] for e in expected if e["path"] in ("correlation", "user_annotation"))
    assert cov["coverage_time"] == pytest.approx(named / total, rel=1e-12)
    # one call per optimizer step: the annotation instance is the call
    steps = a.loc[a["path"] == "user_annotation", "operator_range_id"].nunique()
    ranges = timeline.ranges
    assert steps == len(ranges[ranges["name"].str.startswith("Optimizer.step#")
                               & ranges["range_id"].isin(a["operator_range_id"].dropna())])


TRACELENS = {"tracelens_h100_bert_small_uncased.json.gz": 60, "tracelens_h100_qwen1.5_0.5b_chat.json.gz": 1465}


@pytest.mark.parametrize("name", sorted(TRACELENS))
def test_tracelens_h100_traces_through_timeline_and_attribute(tmp_path, name):
    """The H100 transformer traces of PROVENANCE.tracelens.md, through the code of ``opprof timeline
    --kineto`` and ``opprof attribute`` (stages.export_timeline / attribute_files): kernels, orphans
    (no launch record: Qwen's first 436 kernels, whose correlation ids precede every launch in the file),
    launch calls per API, and kernels per path, all counted from the raw JSON."""
    from operator_profiler import stages

    events = _load_exact(name)
    expected = expected_paths(events)
    assert len(expected) == TRACELENS[name] == int(provenance_rows()[name]["kernels (uniq names)"].split()[0])
    launch_corr = [e["args"]["correlation"] for e in events if e.get("cat") in LAUNCH_CATS and e.get("ph") == "X"]
    orphans = [e for e in expected if e["path"] == "no_launch_record"]
    if orphans:
        assert max(e["correlation"] for e in orphans) < min(launch_corr)
    launch_name = {e["args"]["correlation"]: e["name"] for e in events
                   if e.get("cat") in LAUNCH_CATS and e.get("ph") == "X"}
    apis = Counter(launch_name[c] for c in {e["correlation"] for e in expected if e["path"] != "no_launch_record"})

    stages.export_timeline(real_file("kineto", name), tmp_path / "timeline")
    diagnostics = json.loads((tmp_path / "timeline" / "diagnostics.json").read_text())
    assert diagnostics["counts"]["kernels"] == len(expected)
    assert diagnostics["counts"]["orphan_kernels"] == len(orphans) == {60: 0, 1465: 436}[len(expected)]
    assert diagnostics["launch_apis"] == dict(apis)
    assert diagnostics["time_base"] == "relative" and diagnostics["external_id_mode"] == "op_id"
    assert [d["name"] for d in diagnostics["devices"]] == ["NVIDIA H100 80GB HBM3"]
    a = stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "kernels.parquet")
    path = a["path"].where(a["reason"] != "no_launch_record", "no_launch_record")
    assert Counter(path) == Counter(e["path"] for e in expected)
    assert (a.loc[path == "no_launch_record", "path"] == "unattributed").all()
    kernels = pd.read_parquet(tmp_path / "timeline" / "kernels.parquet")
    # exact ns: baseTimeNanoseconds + the written µs, for every kernel
    base = int(diagnostics["base_time_ns"])
    written = Counter((e["correlation"], base + int(k["ts"] * 1000)) for e, k in zip(
        expected, (k for k in events if k.get("ph") == "X" and k.get("cat") == "kernel")))
    assert Counter(zip(kernels["correlation_id"].astype("int64"), kernels["start_ns"].astype("int64"))) == written


def test_v100_trace_in_the_early_2024_form_with_ns_fractions_reads_exactly(tmp_path):
    """Absolute-epoch µs with ns fractions *and* kernels crashed the reader. No trace here is
    stored in that form (the V100 one, hta_df_index_resolver, has integer µs), so it is rewritten into it:
    every ``ts`` + 0.789 µs and every ``dur`` written ``N.000``. Every time must then be the integer
    trace's + 789 ns exactly, with the same kernels (19,370, PROVENANCE.md) and ranges."""
    name = "hta_df_index_resolver.json.gz"
    with gzip.open(real_file("kineto", name), "rb") as fh:
        text = fh.read()
    text = re.sub(rb'"ts": (\d+)', rb'"ts": \1.789', text)
    text = re.sub(rb'"dur": (\d+)', rb'"dur": \1.000', text)
    assert re.search(rb'"ts": 1669\d{12}\.789', text)  # absolute Unix µs (2022-11-30) with a fraction
    (tmp_path / "v100.json").write_bytes(text)
    del text
    fractional = read_kineto(tmp_path / "v100.json")
    integer, _ = _attributed(name)
    assert len(fractional.kernels) == 19370 == int(provenance_rows()[name]["kernels (uniq names)"].split()[0])
    shifted = fractional.kernels.copy()
    for column in ("start_ns", "end_ns", "launch_start_ns", "launch_end_ns"):
        shifted[column] = shifted[column] - 789
    pd.testing.assert_frame_equal(shifted, integer.kernels)
    ranges = fractional.ranges.copy()
    ranges["start_ns"], ranges["end_ns"] = ranges["start_ns"] - 789, ranges["end_ns"] - 789
    pd.testing.assert_frame_equal(ranges, integer.ranges)  # so the attribution is the same too
    assert fractional.diagnostics["counts"] == integer.diagnostics["counts"]
