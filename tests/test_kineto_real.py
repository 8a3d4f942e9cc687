"""Path (a) on the real torch.profiler traces of ../shared/data/real/kineto/ (HTA test data, 2022-2025).

For every trace, the share of kernels that path (a) links to an operator must equal the ``in_op%``
column of that folder's PROVENANCE.md, computed there by an independent script (inspect_kineto.py):
"kernel correlation equals that of a cuda_runtime/cuda_driver event, and that launch lies inside a
cpu_op on the same pid/tid". ``corr%`` (the launch join alone) and ``ext==corr%`` (the pre-2024
External-id behaviour) are checked against their columns too. Other figures are counted in the test
from the raw JSON with the standard library.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter

import pytest
from conftest import REAL_DATA, real_file

from operator_profiler import aggregate as agg
from operator_profiler.attribution.merge import attribute
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

KINETO = REAL_DATA / "kineto"


def provenance_rows() -> dict[str, dict[str, str]]:
    """file name -> {column: value} of the PROVENANCE.md table (one row per trace)."""
    text = real_file("kineto", "PROVENANCE.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = re.search(r"`(hta_[^`]+\.json(?:\.gz)?)`", cells[0]).group(1)
        rows[name] = dict(zip(header, cells))
    return rows


# The traces with kernel records (the counter-only trace is tested separately below).
TRACES = ["hta_nccl_parser_config__nccl_data.json.gz", "hta_critical_path_alexnet__trace.json.gz",
          "hta_triton_example.json.gz", "hta_negative_queue_length__rank0.json.gz", "hta_df_index_resolver.json.gz",
          "hta_timeline_analysis__sampled_rank-0.json.gz", "hta_cuda_event_sync_multi_stream.json.gz",
          "hta_amd_mi250_minitoy_train.json.gz", "hta_call_stack__backward_thread.json",
          "hta_trace_file_list__inference_rank_1.json.gz", "hta_execution_trace__simple_add_kineto.json.gz"]


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
    # A kernel whose launch no profiler op encloses stays visible, with a reason.
    assert (a.loc[~linked, "path"] == "unattributed").all() and a.loc[~linked, "reason"].notna().all()


@pytest.mark.parametrize("name", TRACES)
def test_external_id_mode_matches_the_trace_era(name):
    row = provenance_rows()[name]
    timeline, a = _attributed(name)
    mode = timeline.diagnostics["external_id_mode"]
    if float(row["ext==corr%"]) == 100:
        assert mode == "correlation"  # pre-2024: never joined to ops
    elif float(row["ext_op%"]) == 100:
        assert mode == "op_id"
        checks = Counter(json.loads(e)["correlation"].get("external_id_check") for e in a["evidence"])
        assert checks == {"agrees": len(a)}  # 100 % of kernels: the op id is in the launch's stack
    # Otherwise no cpu_op carries a comparable id (the 2022 on-demand trace has no cpu_op at all):
    # nothing to check the mode against, and no kernel may be said to disagree.
    assert all(json.loads(e)["correlation"].get("external_id_check") != "disagrees" for e in a["evidence"])


def test_orphan_kernels_and_graph_replays_of_the_negative_queue_trace():
    """705 of 6080 kernels have no launch in the window (PROVENANCE: corr% 88.4); 70 cudaGraphLaunch
    calls replay 135 kernels that share their launch's correlation id (kineto-and-inductor.md §1.8)."""
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
    """CUPTI range-profiler mode (§1.9): 77 cuda_profiler_range events and 77 launches, no kernel."""
    timeline = read_kineto(real_file("kineto", "hta_cupti_profiler__counters_trace.json.gz"))
    assert len(timeline.kernels) == 0
    (warning,) = [w for w in timeline.diagnostics["warnings"] if w.startswith("no kernel events")]
    assert "77 cuda_profiler_range events" in warning and "range-profiler mode" in warning
    assert timeline.diagnostics["event_categories"]["cuda_profiler_range"] == 77


def test_execution_trace_is_refused_with_a_clear_error():
    from operator_profiler.timeline.kineto import TimelineError

    with pytest.raises(TimelineError, match="no 'traceEvents' list"):
        read_kineto(real_file("kineto", "hta_execution_trace__simple_add_et.json.gz"))
