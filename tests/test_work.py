"""Analytic work (FLOPs, ideal bytes) of operator calls and kernels: operator_profiler.work.

Every trace here is recorded by the real torch.profiler (record_shapes) in the test, read by the real Kineto
reader and attributed by the real pipeline stages; expected figures are computed independently (by hand from
the shapes, or by PyTorch's FlopCounterMode running the same model).
"""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import profile, record_function
from torch.utils.flop_counter import FlopCounterMode

from operator_profiler import stages
from operator_profiler.naming import ITERATION_PREFIX
from operator_profiler.roofline import with_roofline
from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.work import flop_rules
from operator_profiler.work.op_calls import EXTRA_FORMULAS, call_work

ITERATIONS = 2


def _record(fn, path, iterations=ITERATIONS):
    """A real Kineto trace of ``iterations`` calls of ``fn``, each in an iteration range."""
    with torch.no_grad():
        fn()  # warm-up: first-call allocations and lazy inits outside the trace
        with profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            for i in range(iterations):
                with record_function(f"{ITERATION_PREFIX}{i}"):
                    fn()
    prof.export_chrome_trace(str(path))
    return path


def _analyse(fn, tmp_path):
    """timeline -> attribution -> work for a traced ``fn``; returns (attribution, work, ranges)."""
    trace = _record(fn, tmp_path / "trace.json")
    stages.export_timeline(trace, tmp_path / "timeline")
    attribution = stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "attribution.parquet")
    work = stages.work_files(tmp_path / "timeline", tmp_path / "attribution.parquet", tmp_path / "work.parquet")
    ranges = pd.read_parquet(tmp_path / "timeline" / "ranges.parquet")
    return attribution, work, ranges


def _calls(tmp_path, fn, name):
    """(Input shapes JSON of the first recorded call of op ``name``, the timeline's ranges)."""
    trace = _record(fn, tmp_path / f"{name.replace(':', '_')}.json", iterations=1)
    ranges = read_kineto(trace).ranges
    rows = ranges[ranges["name"] == name]
    assert len(rows), f"{name} not in the trace"
    return rows["input_shapes"].iloc[0]


def _flop_counter_total(fn) -> int:
    """PyTorch's own count for one call of ``fn``, with CPU flash attention mapped to the registry's SDPA formula."""
    mapping = {getattr(torch.ops.aten, k.split("::")[1]): f() for k, f in EXTRA_FORMULAS.items()}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return counter.get_total_flops()


# ------------------------------------------------------------------------------------------ one call


def test_addmm_with_out_counts_2mnk_reads_its_inputs_and_writes_out(tmp_path):
    m, k, n = 48, 32, 24
    bias, a, b, out = torch.randn(n), torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    shapes = _calls(tmp_path, lambda: torch.addmm(bias, a, b, out=out), "aten::addmm")
    work = call_work("aten::addmm", shapes)
    assert work.flops == work.flops_formula == 2 * m * n * k
    assert work.flops_rule == "pytorch_formula"
    assert work.bytes_read == 4 * (n + m * k + k * n)  # out= is written, not read
    assert work.bytes_written == 4 * m * n
    assert work.dtype == "float32"


def test_bf16_linear_bytes_use_two_bytes_per_element(tmp_path):
    x, w = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16)
    work = call_work("aten::linear", _calls(tmp_path, lambda: F.linear(x, w), "aten::linear"))
    assert work.flops == 2 * 8 * 4 * 16
    assert work.bytes_read == 2 * (8 * 16 + 4 * 16) and work.bytes_written == 2 * 8 * 4
    assert work.dtype == "bfloat16"


def test_convolution_matches_flop_counter_mode(tmp_path):
    conv, x = nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.randn(2, 3, 17, 17)
    work = call_work("aten::conv2d", _calls(tmp_path, lambda: conv(x), "aten::conv2d"))
    assert work.flops == _flop_counter_total(lambda: conv(x)) > 0
    out_elements = 2 * 8 * 9 * 9
    assert work.bytes_written == 4 * out_elements


def test_pointwise_reduction_softmax_and_layer_norm_follow_the_documented_counts(tmp_path):
    x = torch.randn(6, 10)
    assert call_work("aten::gelu", _calls(tmp_path, lambda: F.gelu(x), "aten::gelu")).flops == 60
    assert call_work("aten::sum", _calls(tmp_path, lambda: x.sum(1), "aten::sum")).flops == 60
    assert call_work("aten::_softmax", _calls(tmp_path, lambda: x.softmax(1), "aten::_softmax")).flops == 5 * 60
    ln = nn.LayerNorm(10)
    work = call_work("aten::layer_norm", _calls(tmp_path, lambda: ln(x), "aten::layer_norm"))
    assert work.flops == 5 * 60 and work.flops_rule == "per_element"


def test_copy_contiguous_and_views_move_only_what_they_must(tmp_path):
    src, dst = torch.randn(4, 8).t(), torch.empty(8, 4)
    copy = call_work("aten::copy_", _calls(tmp_path, lambda: dst.copy_(src), "aten::copy_"))
    assert (copy.flops, copy.bytes_read, copy.bytes_written) == (0, 4 * 32, 4 * 32)  # the destination is not read
    contiguous = torch.randn(4, 8)
    strided = torch.randn(8, 4).t()
    made = call_work("aten::contiguous", _calls(tmp_path, lambda: strided.contiguous(), "aten::contiguous"))
    assert made.bytes_read == made.bytes_written == 4 * 32
    view = call_work("aten::view", _calls(tmp_path, lambda: contiguous.view(32), "aten::view"))
    assert (view.flops, view.bytes) == (0, 0)
    bias = torch.randn(8)
    expanded = call_work("aten::add", _calls(tmp_path, lambda: contiguous + bias, "aten::add"))
    assert expanded.bytes_read == 4 * (32 + 8)  # a broadcast input is read once, not per row


def test_unknown_work_is_said_not_guessed(tmp_path):
    lists = call_work("aten::cat", _calls(tmp_path, lambda: torch.cat([torch.ones(2), torch.ones(3)]), "aten::cat"))
    assert lists.flops is None and "TensorList" in lists.note  # Kineto records no dtype for list elements
    assert call_work("aten::mm", None).note.startswith("no input shapes")
    assert "not a registered operator" in call_work("myns::nothing", json.dumps([[[2]], ["float"], [""], [[1]]])).note
    assert flop_rules.rule_for("aten::mkldnn_rnn_layer") is None  # a library RNN: no per-element count exists


# ---------------------------------------------------------------------------------- whole programs


class _ConvBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("model_kind", ["mlp_attention", "conv"])
def test_per_iteration_flops_agree_with_flop_counter_mode(model_kind, tmp_path):
    torch.manual_seed(0)
    if model_kind == "conv":
        model, x = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), *[_ConvBlock(16) for _ in range(3)]).eval(), \
            torch.randn(2, 3, 24, 24)
        fn = lambda: model(x)  # noqa: E731
    else:
        q = torch.randn(2, 4, 32, 16)
        lin = nn.Linear(64, 64)
        h = torch.randn(2, 32, 64)

        def fn():
            return F.scaled_dot_product_attention(q, q, q, is_causal=True).sum() + lin(h).sum()

    attribution, work, _ = _analyse(fn, tmp_path)
    expected = _flop_counter_total(fn)
    measured = work["flops_formula"].sum() / ITERATIONS
    assert expected > 0 and abs(measured - expected) / expected < 0.01
    assert work["flops"].notna().all(), work.loc[work["flops"].isna(), "work_note"].unique()
    # every call is counted once: the in-call rows carry nothing of their own
    assert (work.loc[work["work_rule"] == "in_call", ["flops", "bytes"]] == 0).all().all()


def test_a_call_is_counted_once_on_its_computing_kernel(tmp_path):
    lin, x = nn.Linear(16, 8), torch.randn(4, 16)
    attribution, work, ranges = _analyse(lambda: lin(x), tmp_path)
    joined = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id")
    per_call = joined.groupby("work_call")
    assert (per_call["flops"].apply(lambda s: (s > 0).sum()) == 1).all()  # one carrier per call
    carriers = joined[joined["flops"] > 0]
    assert set(carriers["operator"]) <= {"aten::addmm", "aten::mm"}, joined.to_string()  # never linear's overhead
    assert carriers["flops"].sum() == ITERATIONS * 2 * 4 * 8 * 16


def test_roofline_bound_and_fraction_from_the_ceilings():
    table = pd.DataFrame({
        "operator": ["gemm", "stream", "copy", "view", "unknown"], "time_ns": [1e6, 1e6, 1e6, 1e6, 1e6],
        "flops": [8e7, 1e6, 0.0, 0.0, None], "bytes": [1e6, 4e6, 5e6, 0.0, None],
        "achieved_flops_per_s": [8e10, 1e9, 0.0, 0.0, None], "achieved_bytes_per_s": [1e9, 4e9, 5e9, 0.0, None],
        "intensity": [80.0, 0.25, 0.0, None, None], "work_dtype": ["float32"] * 5,
        "work_known": [True, True, True, True, False], "work_note": [None, None, None, None, "no FLOP rule for x"]})
    ceilings = {"compute_flops_per_s": {"float32": 1e11}, "memory_bytes_per_s": {"copy": 1e10, "best": 1e10}}
    out = with_roofline(table, ceilings).set_index("operator")
    assert out.loc["gemm", "bound"] == "compute" and out.loc["gemm", "ceiling_fraction"] == pytest.approx(0.8)
    assert out.loc["gemm", "roofline"] == "gemm: 80% of fp32 GEMM peak, compute-bound"
    assert out.loc["stream", "bound"] == "memory" and out.loc["stream", "ceiling_fraction"] == pytest.approx(0.4)
    assert out.loc["copy", "bound"] == "memory" and "moves data only" in out.loc["copy", "roofline"]
    assert pd.isna(out.loc["view", "bound"]) and "no work of its own" in out.loc["view", "roofline"]
    assert pd.isna(out.loc["unknown", "bound"]) and "no FLOP rule for x" in out.loc["unknown", "roofline"]
    assert out.loc["gemm", "ridge_intensity"] == pytest.approx(10.0)


def test_an_operator_above_a_ceiling_it_cannot_beat_flags_the_ceiling():
    """The figures of a real run on 2 busy cores: the fp32 GEMM peak measured 55 GFLOP/s while a capture ran beside
    it (90 on a quiet machine), and aten::addmm made 66.55 GFLOP/s: 121 % of the loaded peak, 74 % of the quiet
    one. Memory: 100 MiB per call cannot stay in a 32 MiB cache, 1 MiB can."""
    mib = 2**20
    table = pd.DataFrame({
        "operator": ["aten::addmm", "aten::mm", "big_copy", "small_copy"], "calls": [10, 10, 2, 2],
        "time_ns": [1e6, 1e6, 1e7, 1e5],
        "flops": [6.655e7, 5.445e7, 0.0, 0.0], "bytes": [1e6, 1e6, 2 * 100 * mib, 2 * 1 * mib],
        "work_dtype": ["float32"] * 4, "work_known": [True] * 4, "work_note": [None] * 4})
    table["achieved_flops_per_s"] = table["flops"] / (table["time_ns"] / 1e9)
    table["achieved_bytes_per_s"] = table["bytes"] / (table["time_ns"] / 1e9)
    table["intensity"] = table["flops"] / table["bytes"]
    loaded = {"device": "cpu", "compute_flops_per_s": {"float32": 55e9}, "memory_bytes_per_s": {"best": 1e10},
              "machine": {"last_level_cache": {"bytes": 32 * mib}}}
    out = with_roofline(table, loaded).set_index("operator")
    assert out.loc["aten::addmm", "ceiling_fraction"] == pytest.approx(66.55 / 55)
    assert out.loc["aten::addmm", "roofline"] == (
        "aten::addmm: 121% of fp32 GEMM peak, compute-bound; above the measured peak (121 %): the ceiling was likely "
        "measured low (under load?) or part of the work ran in other operators' kernels; re-measure: snakemake "
        "--forcerun measure_ceilings")
    assert out.loc["aten::mm", "ceiling_fraction"] == pytest.approx(54.45 / 55)  # 99 %: under the peak, no flag
    assert out.loc["aten::mm", "roofline"] == "aten::mm: 99% of fp32 GEMM peak, compute-bound"
    big = 2 * 100 * mib / 1e-2 / 1e10  # 210 % of the bandwidth, 100 MiB per call
    assert out.loc["big_copy", "ceiling_fraction"] == pytest.approx(big)
    assert out.loc["big_copy", "roofline"] == (
        f"big_copy: {big:.0%} of memory bandwidth, memory-bound (moves data only; its 100 MiB per call exceed the 32 "
        f"MiB cache: above the measured bandwidth ({big * 100:.0f} %): the ceiling was likely measured low (under "
        "load?) or part of the work ran in other operators' kernels; re-measure: snakemake --forcerun "
        "measure_ceilings)")
    assert out.loc["small_copy", "ceiling_fraction"] == pytest.approx(2 * mib / 1e-4 / 1e10)
    assert out.loc["small_copy", "roofline"].endswith("(moves data only; above the measured bandwidth: its 1 MiB per "
                                                      "call fit the 32 MiB cache, served from there)")
    assert out["ceiling_exceeded"].tolist() == [True, False, True, False]
    # the quiet machine's peak: 74 %, nothing flagged; without a recorded cache size no memory figure is flagged
    quiet = with_roofline(table, {**loaded, "compute_flops_per_s": {"float32": 90e9}}).set_index("operator")
    assert quiet.loc["aten::addmm", "roofline"] == "aten::addmm: 74% of fp32 GEMM peak, compute-bound"
    no_cache = with_roofline(table, {k: v for k, v in loaded.items() if k != "machine"}).set_index("operator")
    assert no_cache["ceiling_exceeded"].tolist() == [True, False, False, False]
    # nor is it said to come from cache (100 MiB per call, 210 % of the bandwidth: a QA user's reading said so)
    assert no_cache.loc["big_copy", "roofline"].endswith(
        "above the measured bandwidth: whether its data stays in cache is not known (the ceilings record no "
        "last-level cache size), so the ceiling may be under-measured)")
    # a record whose machine names only its GPU (the contract leaves machine's shape free): no cache size either
    named = with_roofline(table, {**loaded, "device": "cuda", "machine": {"gpu": "NVIDIA H100 80GB HBM3"}})
    assert named["ceiling_exceeded"].tolist() == [True, False, False, False]


def test_measured_vs_analytic_compares_only_complete_calls_and_flags_far_ratios():
    """Fixture (no GPU here): four kernels of three calls with ncu-named counters; the expected ratios are the
    sums written out below."""
    from operator_profiler.ncu.catalog import load_catalog
    from operator_profiler.roofline import measured_vs_analytic

    attribution = pd.DataFrame({"kernel_id": [0, 1, 2, 3], "operator": ["aten::copy_", "aten::addmm", "aten::addmm",
                                                                        "aten::gelu"]})
    work = pd.DataFrame({"kernel_id": [0, 1, 2, 3], "flops": [0.0, 2e6, 0.0, 1e3], "bytes": [1e3, 3e4, 0.0, 8e3],
                         "work_call": ["call:0", "call:1", "call:1", "call:2"]})
    counters = pd.DataFrame({
        "kernel_id": [0, 1, 2, 3],
        "dram__bytes.sum": [2.5e3, 2e4, 1e4, 8e3],
        "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": [0.0, 1e5, None, 500.0],
        "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": [0.0, 0.0, 0.0, 0.0],
        "sm__inst_executed_pipe_tensor.sum": [0.0, 4e3, 0.0, 0.0],
    })
    out = measured_vs_analytic(attribution, work, counters, load_catalog()).set_index("operator")
    assert out.loc["aten::copy_", "bytes_ratio"] == pytest.approx(2.5e3 / 1e3)
    assert "extra traffic" in out.loc["aten::copy_", "work_check"]
    # addmm: both kernels of its call have DRAM bytes -> compared; its FMA count lacks kernel 2 -> no FLOP ratio
    assert out.loc["aten::addmm", "bytes_ratio"] == pytest.approx((2e4 + 1e4) / 3e4)
    assert pd.isna(out.loc["aten::addmm", "flops_ratio"])
    assert out.loc["aten::gelu", "flops_ratio"] == pytest.approx(2 * 500 / 1e3)
    assert pd.isna(out.loc["aten::gelu", "work_check"])  # ratio 1: nothing to flag


def test_measured_fp16_flops_count_both_lanes_of_half2_instructions():
    """FP16 instructions are two-wide (HADD2, HMUL2, HFMA2 work on a half2 pair per thread). Fixture kernels whose
    instruction counts follow from their element counts: an fp16 add of 8192 elements runs 8192 / 2 HADD2, a
    scale by a constant 8192 / 2 HMUL2, an fp16 GEMM of 64 x 64 x 32 on the FMA pipe 64 * 64 * 32 / 2 HFMA2; a
    kernel mixing FP32 accumulation (1000 FFMA, 300 FADD, 200 FMUL) with 100 HFMA2. Each operator's measured
    FLOPs are then its analytic FLOPs: an add is 1 FLOP per element, an FMA 2 per pair of operands."""
    from operator_profiler.ncu.catalog import load_catalog
    from operator_profiler.roofline import measured_vs_analytic

    n, (m, k, nn_) = 8192, (64, 32, 64)
    attribution = pd.DataFrame({"kernel_id": [0, 1, 2, 3],
                                "operator": ["aten::add", "aten::mul", "aten::mm", "aten::layer_norm"]})
    gemm_flops = 2 * m * k * nn_
    mixed_flops = 2 * 1000 + 300 + 200 + 2 * 2 * 100  # FP32 FFMA, FADD, FMUL; 100 HFMA2 = 200 FMAs of 2 FLOPs
    work = pd.DataFrame({"kernel_id": [0, 1, 2, 3], "flops": [float(n), float(n), float(gemm_flops),
                                                              float(mixed_flops)],
                         "bytes": [3 * 2 * n, 2 * 2 * n, 2 * (m * k + k * nn_ + m * nn_), 1e4],
                         "work_call": ["call:0", "call:1", "call:2", "call:3"]})
    hadd, hmul, hfma = [n / 2, 0, 0, 0], [0, n / 2, 0, 0], [0, 0, m * k * nn_ / 2, 100]
    counters = pd.DataFrame({
        "kernel_id": [0, 1, 2, 3],
        "sm__sass_thread_inst_executed_op_hadd_pred_on.sum": hadd,
        "sm__sass_thread_inst_executed_op_hmul_pred_on.sum": hmul,
        "sm__sass_thread_inst_executed_op_hfma_pred_on.sum": hfma,
        "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": [0, 0, 0, 1000],
        "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": [0, 0, 0, 300],
        "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": [0, 0, 0, 200],
    })
    out = measured_vs_analytic(attribution, work, counters, load_catalog()).set_index("operator")
    assert out.loc["aten::add", "measured_fp_flops"] == n
    assert out.loc["aten::mul", "measured_fp_flops"] == n
    assert out.loc["aten::mm", "measured_fp_flops"] == gemm_flops
    assert out.loc["aten::layer_norm", "measured_fp_flops"] == mixed_flops
    assert out["flops_ratio"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert out["work_check"].isna().all()  # all at 1: none flagged (at half weights every one was "fewer than counted")


# ------------------------------------------------------------------ the capture's shapes iteration

HARNESS_MODELS = '''
import torch, torch.nn as nn, torch.nn.functional as F

class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
                                    for _ in range(2))
        self.head = nn.Linear(8 * 12 * 12, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x.flatten(1))

class Alternating(nn.Module):
    """Runs other ops on every second call: its iterations are not alike."""
    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(16, 16), 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        return F.relu(y) if self.calls % 2 else torch.tanh(y).mul(2)

def stack():
    torch.manual_seed(0)
    return Stack().eval(), (torch.randn(2, 8, 12, 12),)

def alternating():
    return Alternating().eval(), (torch.randn(4, 16),)

class AlternatingRows(nn.Module):
    """Runs the same ops on every call, on 8 rows then 2 rows: its iterations' shapes are not alike."""
    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(16, 16), 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x[: 8 if self.calls % 2 else 2])

def alternating_rows():
    return AlternatingRows().eval(), (torch.randn(8, 16),)

class StepScalar(nn.Module):
    """A new float scalar every call, as AdamW's bias-corrected step size (addcdiv_(..., value=-lr / (1 - b1^t))):
    the same ops and shapes, the same work, every call."""
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.addcdiv(x, x.abs() + 1, value=-0.01 / (1 - 0.9 ** self.calls))

def step_scalar():
    return StepScalar().eval(), (torch.randn(4, 16),)
'''


@pytest.fixture(scope="module")
def harness_capture(tmp_path_factory):
    from conftest import importable_module

    from operator_profiler.capture import harness

    root = tmp_path_factory.mktemp("work_models")

    def run(factory, iterations=ITERATIONS):
        out = tmp_path_factory.mktemp(factory)
        run = harness.run_capture({"kind": "custom", "factory": f"work_models:{factory}"},
                                  {"seed": 0, "warmup": 1, "iterations": iterations}, "cpu", out / "trace.json.gz",
                                  out / "layers.json", out / "run.json", shapes_path=out / "shapes.json.gz")
        stages.export_timeline(out / "trace.json.gz", out / "timeline")
        stages.attribute_files(out / "timeline", None, None, out / "attribution.parquet")
        work = stages.work_files(out / "timeline", out / "attribution.parquet", out / "work.parquet",
                                 shapes_trace=out / "shapes.json.gz")
        return out, run, work

    with importable_module(root, "work_models", HARNESS_MODELS):
        yield run


def test_the_measured_window_has_no_shapes_and_the_shapes_iteration_gives_them(harness_capture):
    import gzip

    out, run, work = harness_capture("stack")
    measured = json.loads(gzip.open(out / "trace.json.gz").read())["traceEvents"]
    assert not any("Input Dims" in (e.get("args") or {}) for e in measured)  # nothing recorded per op in the window
    assert run["shapes"].startswith("one iteration after the measured window")
    shapes = json.loads(gzip.open(out / "shapes.json.gz").read())["traceEvents"]
    assert any(e.get("name") == f"{ITERATION_PREFIX}shapes" for e in shapes)
    assert work["flops"].notna().all(), work.loc[work["flops"].isna(), "work_note"].unique()
    sys_path_model = __import__("work_models")
    model, inputs = sys_path_model.stack()
    expected = _flop_counter_total(lambda: model(*inputs))
    assert abs(work["flops_formula"].sum() / ITERATIONS - expected) / expected < 0.01


def test_iterations_that_run_other_ops_than_the_shapes_iteration_are_not_paired(harness_capture):
    """Other ops on alternate calls: the two shapes iterations differ, so no measured call gets shapes (the
    alternate measured iterations ran other ops than the first shapes iteration, too)."""
    from operator_profiler.work.shapes_iteration import shapes_for_measured_calls

    out, _, work = harness_capture("alternating", iterations=3)
    attribution = pd.read_parquet(out / "attribution.parquet")
    measured = attribution.loc[attribution["iteration"].notna(), "kernel_id"]
    refused = work[work["kernel_id"].isin(measured)]
    assert refused["flops"].isna().all()
    assert refused["work_note"].str.contains("shapes change between iterations").all()
    # without the check iteration, pairing by invocation order refuses only the iterations that ran other ops
    shapes = read_kineto(out / "shapes.json.gz").ranges
    first_only = shapes[shapes["name"] != f"{ITERATION_PREFIX}shapes.check"]
    ranges = pd.read_parquet(out / "timeline" / "ranges.parquet")
    _, notes = shapes_for_measured_calls(ranges, first_only)
    assert notes and all("ran other ops than the shapes iteration" in n for n in notes.values())


def test_the_conv_block_workload_flops_agree_with_flop_counter_mode(tmp_path):
    """The built-in conv_block kind (eager) through the real harness: the shapes iteration, the timeline, the
    attribution and the work stage, against FlopCounterMode on the same model."""
    from operator_profiler.capture import harness
    from operator_profiler.capture.workloads import build_workload
    from operator_profiler.config import validate_config

    workload = validate_config({"device": "cpu", "workloads": {"c": {
        "kind": "conv_block", "compile": False, "in_channels": 3, "channels": 8, "n_block": 2, "image_size": 12,
        "batch_size": 2}}}, "test")["workloads"]["c"]
    harness.run_capture(workload, {"seed": 0, "warmup": 1, "iterations": ITERATIONS}, "cpu", tmp_path / "t.json.gz",
                        tmp_path / "layers.json", tmp_path / "run.json", shapes_path=tmp_path / "s.json.gz")
    stages.export_timeline(tmp_path / "t.json.gz", tmp_path / "timeline")
    stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "attribution.parquet")
    work = stages.work_files(tmp_path / "timeline", tmp_path / "attribution.parquet", tmp_path / "work.parquet",
                             shapes_trace=tmp_path / "s.json.gz")
    torch.manual_seed(0)
    model, inputs = build_workload(workload, "cpu")
    expected = _flop_counter_total(lambda: model.eval()(*inputs))
    assert work["flops"].notna().all()
    assert abs(work["flops_formula"].sum() / ITERATIONS - expected) / expected < 0.01


def test_reading_a_scalar_is_no_work_not_unknown(tmp_path):
    """A train step's loss.item(): the meta device cannot read a value, and there is nothing to count."""
    loss = torch.tensor(2.0)
    work = call_work("aten::item", _calls(tmp_path, lambda: loss.item(), "aten::item"))
    assert (work.flops, work.bytes) == (0, 0)


def test_a_convolution_call_puts_its_work_on_the_innermost_kernel_that_computes(tmp_path):
    conv, x = nn.Conv2d(3, 8, 3), torch.randn(1, 3, 10, 10)
    attribution, work, _ = _analyse(lambda: conv(x), tmp_path)
    joined = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id")
    carriers = joined[joined["flops"] > 0]
    kernels = pd.read_parquet(tmp_path / "timeline" / "kernels.parquet").merge(attribution[["kernel_id", "operator"]])
    computing_children = kernels[~kernels["operator"].isin(flop_rules.DATA_ONLY_OPS)]
    wrappers = set(computing_children["parent_kernel_id"].dropna().astype(int))  # e.g. aten::convolution
    assert len(carriers) == ITERATIONS and not set(carriers["kernel_id"]) & wrappers
    assert (carriers["flops"] == _flop_counter_total(lambda: conv(x))).all()


def test_a_wrapper_preempted_in_one_call_does_not_take_the_work_of_the_op_it_calls(tmp_path):
    """Field case (an intermittent suite failure under load): a preemption inside aten::_convolution's own 20 us in
    one iteration made its self time outweigh aten::_slow_conv2d_forward's, and the convolution's FLOPs went on the
    wrapper. Simulated on a real trace: that wrapper's self time in the first call is made 10x the child's."""
    from operator_profiler import tables

    conv, x = nn.Conv2d(3, 8, 3), torch.randn(1, 3, 10, 10)
    trace = _record(lambda: conv(x), tmp_path / "trace.json")
    stages.export_timeline(trace, tmp_path / "timeline")
    path = tmp_path / "timeline" / "kernels.parquet"
    kernels = tables.read_table(path)
    wrappers = kernels.index[kernels["name"] == "aten::_convolution"]
    child = kernels.loc[kernels["name"] == "aten::_slow_conv2d_forward", "duration_ns"]
    assert len(wrappers) == ITERATIONS and len(child) == ITERATIONS
    kernels.loc[wrappers[0], "duration_ns"] = 10 * int(child.max())
    tables.write_table(kernels, tables.KERNELS, path)
    attribution = stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "attribution.parquet")
    work = stages.work_files(tmp_path / "timeline", tmp_path / "attribution.parquet", tmp_path / "work.parquet")
    carriers = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id").query("flops > 0")
    assert carriers["operator"].tolist() == ["aten::_slow_conv2d_forward"] * ITERATIONS


def test_a_fused_kernel_does_not_count_an_op_an_extern_call_computes():
    """Compiled conv_block: Inductor's provenance puts the convolution node on the kernel that lays out the conv's
    input, while extern_kernels.convolution computes it (the fusion map's listed_not_computed)."""
    from operator_profiler.work.fused_kernels import _node_flops

    nodes = {"convolution": ("float32", (4, 32, 32, 32), "aten::convolution", "arg0_1"),
             "relu": ("float32", (4, 32, 32, 32), "aten::relu", "convolution")}
    layout = {"post_grad_nodes": ["convolution"], "listed_not_computed": ["aten::convolution"]}
    assert _node_flops(layout, nodes, {})[0] == 0  # moves data only
    bn_relu = {"post_grad_nodes": ["convolution", "relu"], "listed_not_computed": ["aten::convolution"]}
    assert _node_flops(bn_relu, nodes, {})[0] == 4 * 32 * 32 * 32  # the relu, one per element
    alone = {"post_grad_nodes": ["convolution"], "listed_not_computed": []}
    flops, _, note, _ = _node_flops(alone, nodes, {})  # PyTorch's formula, but the node's arguments are not known
    assert flops is None and "formula not applied to aten::convolution" in note  # never a guess


def test_shapes_that_change_between_iterations_are_not_paired(harness_capture):
    """The same ops every call, on 8 rows then 2 rows alternately: pairing by op names alone would credit every
    measured iteration with the shapes iteration's work."""
    out, _, work = harness_capture("alternating_rows", iterations=2)
    assert work["flops"].isna().any()
    assert work.loc[work["flops"].isna(), "work_note"].str.contains("shapes change between iterations").all()


def test_ceilings_without_usable_figures_are_refused_naming_the_file_and_the_fix():
    """QA: an edited ceilings.json ({} or a text figure) was taken for 'not measured' or failed as an internal error."""
    from operator_profiler.errors import InputError
    from operator_profiler.roofline import check_ceilings

    good = {"compute_flops_per_s": {"float32": 1e11}, "memory_bytes_per_s": {"best": 1e10}}
    check_ceilings(good, "c.json")
    for bad in ({}, {**good, "compute_flops_per_s": {"float32": "fast"}},
                {**good, "memory_bytes_per_s": "12 GB/s"}, {**good, "memory_bytes_per_s": {"best": -1.0}},
                {**good, "compute_flops_per_s": {"float32": float("nan")}}):
        with pytest.raises(InputError, match=r"^c\.json: .*--forcerun measure_ceilings"):
            check_ceilings(bad, "c.json")


def test_in_place_views_are_data_only_and_composite_ops_never_carry_work():
    from operator_profiler.work.op_calls import is_composite

    assert flop_rules.is_data_only("aten::as_strided_") and flop_rules.is_data_only("aten::copy_")
    assert not flop_rules.is_data_only("aten::add_")
    assert is_composite("aten::linear") and is_composite("aten::lstm") and not is_composite("aten::mkldnn_rnn_layer")


def test_an_lstm_call_puts_its_work_on_the_library_rnn_kernel(tmp_path):
    """QA: the LSTM's work sat on the bias aten::add nested in aten::mkldnn_rnn_layer (911% of the fp32 peak)."""
    lstm, x = nn.LSTM(8, 16, 2), torch.randn(6, 2, 8)
    attribution, work, _ = _analyse(lambda: lstm(x), tmp_path)
    joined = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id")
    carriers = joined[joined["flops"] > 0]
    assert set(carriers["operator"]) == {"aten::mkldnn_rnn_layer"}, joined.to_string()
    # an LSTM layer step: 4 gates x 2 (multiply-add) x hidden x (input + hidden) per batch row, PyTorch's formula
    expected = 6 * 2 * (2 * 4 * 16 * (8 + 16) + 2 * 4 * 16 * (16 + 16))
    assert carriers["flops_formula"].sum() / ITERATIONS == expected


# ------------------------------------------------------------------ nsys timelines: shapes from the Kineto run

def _recorded_args() -> dict[str, dict]:
    """What torch.profiler's record_shapes writes for aten::linear (x [4, 8], weight [16, 8], no bias), its
    aten::mm and aten::relu ([4, 16]): recorded here by the real profiler, for the synthetic Kineto run."""
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    with profile(record_shapes=True) as prof:
        F.relu(F.linear(x, w))
    args = {}
    for e in prof.events():
        if e.name in ("aten::linear", "aten::mm", "aten::relu") and e.name not in args:
            args[e.name] = e.input_shapes
    assert set(args) == {"aten::linear", "aten::mm", "aten::relu"}
    return args


@pytest.mark.parametrize("nvtx_sizes", [False, True])
def test_nsys_work_takes_its_shapes_from_the_kineto_run_never_the_nvtx_texts(tmp_path, nvtx_sizes):
    """The nsys capture runs emit_nvtx without record_shapes (its texts "aten::mm, seq = N, op_id = M"); older
    exports carry ", sizes = [[...]], input_op_ids = [...]". Either way the work per call comes from the shapes
    the Kineto run recorded (window_shapes): here the NVTX sizes are deliberately wrong (100 x 100 matrices), and
    the FLOPs are still those of the Kineto run's shapes, 2 * 4 * 8 * 16 per linear and 4 * 16 per relu. A
    Kineto run without shapes leaves the work unknown, said so: nothing is taken from the NVTX texts."""
    import gzip

    from nsys_export import write_nsys_export
    from nsys_workflow import ITERATIONS, LAYERS, OPPROF_DOMAIN, PID, synthetic_capture, synthetic_kineto_run

    from operator_profiler.attribution.nvtx import NvtxOptions

    nvtx, runtime, kernels, _ = synthetic_capture()
    if nvtx_sizes:
        for row in nvtx:
            if row.domain == 0 and row.text.startswith("aten::"):
                row.text += ", sizes = [[100, 100], [100, 100]], input_op_ids = [(1, 0), (2, 0)]"
    export = write_nsys_export(tmp_path / "nsys.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels,
                               domains={(PID, OPPROF_DOMAIN): "opprof"})
    stages.export_timeline(export, tmp_path / "timeline")
    if nvtx_sizes:  # the reader still reads the decorated form: names without the decorations, sizes kept apart
        ranges = pd.read_parquet(tmp_path / "timeline" / "ranges.parquet")
        assert set(ranges.loc[ranges["domain_id"] == 0, "name"]) == {"aten::mm", "aten::relu"}
    shapes = {name: [dims, types] for name, (dims, types) in
              {"aten::linear": ([[4, 8], [16, 8], []], ["float", "float", ""]),
               "aten::mm": ([[4, 8], [8, 16]], ["float", "float"]),
               "aten::relu": ([[4, 16]], ["float"])}.items()}
    assert _recorded_args() == {k: v[0] for k, v in shapes.items()}
    flops = {"aten::mm": 2 * 4 * 8 * 16, "aten::relu": 4 * 16}
    for with_shapes in (True, False):
        run = synthetic_kineto_run()
        if with_shapes:
            for e in run["traceEvents"]:
                if e["cat"] == "cpu_op":
                    dims, types = shapes[e["name"]]
                    e["args"].update({"Input Dims": dims, "Input type": types, "Concrete Inputs": [""] * len(dims),
                                      "Input Strides": [[d[1], 1] if len(d) == 2 else [] for d in dims]})
        out = tmp_path / ("with" if with_shapes else "without")
        out.mkdir()
        with gzip.open(out / "kineto.json.gz", "wt") as fh:
            json.dump(run, fh)
        stages.export_timeline(out / "kineto.json.gz", out / "timeline_kineto", "kineto")
        attribution = stages.attribute_files(tmp_path / "timeline", None, None, out / "attribution.parquet",
                                             NvtxOptions(), out / "timeline_kineto")
        work = stages.work_files(tmp_path / "timeline", out / "attribution.parquet", out / "work.parquet",
                                 kineto_dir=out / "timeline_kineto")
        by_op = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id")
        assert len(by_op) == ITERATIONS * len(LAYERS) * 2
        if with_shapes:
            assert (attribution["operator_range_id"] < 0).all()  # every kernel's call is one of the Kineto run's
            assert by_op.groupby("operator")["flops"].agg(lambda s: sorted(set(s))).to_dict() == {
                op: [float(f)] for op, f in flops.items()}
        else:
            assert by_op["flops"].isna().all()
            # the calls named are the Kineto run's outermost ops (aten::linear around aten::mm), not the NVTX ranges
            missing = "no input shapes recorded (the trace was recorded without record_shapes)"
            assert set(by_op["work_note"]) == {f"aten::linear: {missing}", f"aten::relu: {missing}"}


def test_a_float_scalar_that_changes_every_iteration_keeps_the_shapes_known(harness_capture):
    """Field case (HF GPT-2's train step, transformers 5.23): AdamW on the CPU passes a new step size every step
    (addcdiv_'s Scalar value), so the two shapes iterations' recorded inputs differed and every call's work was
    unknown. A non-integral Scalar sizes nothing: the shapes check leaves its value out (docs/work.md)."""
    _, _, work = harness_capture("step_scalar")
    assert work["flops"].notna().all(), work.loc[work["flops"].isna(), "work_note"].unique()
    per_iteration = work["flops"].sum() / ITERATIONS
    # abs (64), + 1 (64), addcdiv: a multiply and an add per element (2 x 64)
    assert per_iteration == 64 + 64 + 2 * 64


def test_the_mkl_gemm_of_a_frozen_linear_counts_2mnk(tmp_path):
    """Inductor freezing on the CPU prepacks a Linear's weight and calls mkl::_mkl_linear(input, packed, weight, bias,
    batch): HF GPT-2's frozen variant had 41 % of its kernel time with unknown work ("no FLOP rule")."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch build has no MKL (no mkl::_mkl_linear)")
    x, w, b = torch.randn(6, 16), torch.randn(8, 16), torch.randn(8)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 6)
    torch.testing.assert_close(torch.ops.mkl._mkl_linear(x, packed, w, b, 6), F.linear(x, w, b))  # it is that GEMM
    work = call_work("mkl::_mkl_linear", _calls(tmp_path, lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, 6),
                                                "mkl::_mkl_linear"))
    assert work.flops == work.flops_formula == 2 * 6 * 8 * 16


FROZEN_MODELS = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    """Conv-BN-ReLU, a dilated conv with a residual add and ReLU, a transposed conv, max pooling, a Linear: what
    Inductor's CPU freezing turns into prepacked oneDNN and MKL calls."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.conv2(y) + y)
        y = torch.relu(self.conv3(self.pool(self.up(y))))
        return self.fc(self.pool(y).flatten(1))  # pooling what a fused conv + ReLU wrote (an opaque FX node)


def net():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(2, 3, 16, 16),)
'''


def test_a_frozen_cpu_model_has_the_work_of_every_kernel(tmp_path):
    """HF ResNet-50 with compile + freezing had 99.5 % of its kernel time with unknown work, HF GPT-2's 59 %:
    Inductor's CPU freezing calls mkldnn::_convolution_pointwise (an epilogue named by strings, an opaque prepacked
    weight) and mkl::_mkl_linear (a packed weight of another shape), which the meta replay cannot rebuild, and its
    generated kernels read the frozen parameters, module-level constants of output_code.py that were not sized.
    Through the workflow's own capture and stages: every kernel's FLOPs and bytes known; per iteration the
    prepacked calls count exactly FlopCounterMode's count of the eager model (conv, dilated conv, transposed conv,
    addmm), their fused epilogue one FLOP per output element and op."""
    from conftest import importable_module, torch_flags_kept
    from workflow_runs import analyse_compiled_capture

    from operator_profiler.capture import jobs as capture
    from operator_profiler.transforms.variants import variant_workload
    from operator_profiler.work.op_calls import PACKED_WEIGHT_OPS

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    harness = {"seed": 0, "warmup": 1, "iterations": 1}
    out = tmp_path / "run"
    with importable_module(tmp_path, "frozen_models", FROZEN_MODELS), torch_flags_kept():
        workload = variant_workload({"kind": "custom", "factory": "frozen_models:net"}, ["compile", "freezing"])
        # the workflow compiles and captures in two processes, each numbering Inductor's graphs from 0 (the
        # profiler's kernel names, graph_0_cpp_fused_relu_0, carry that number): so do the two here, and the
        # process's own numbering goes on afterwards as if they had not run (later tests compile in this process)
        import torch._inductor.compile_fx as compile_fx

        counter = compile_fx._graph_counter
        try:
            compile_fx._graph_counter = itertools.count(0)
            capture.compile_artifacts(workload, harness, "cpu", out / "inductor", workload_name="net")
            compile_fx._graph_counter = itertools.count(0)
            capture.capture_timeline("net", workload, harness, "cpu", "torch", out / "trace.json.gz",
                                     out / "run.json", out / "layers.json", out / "clocks.json",
                                     out_shapes=out / "shapes.json.gz")
        finally:
            compile_fx._graph_counter = counter
        model, inputs = __import__("frozen_models").net()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    attribution, work = analyse_compiled_capture(out)
    assert work["flops"].notna().all() and work["bytes"].notna().all(), work["work_note"].dropna().unique()
    by_op = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id")
    prepacked = by_op[by_op["operator"].isin(list(PACKED_WEIGHT_OPS))]
    assert set(prepacked["operator"]) >= {"mkldnn::_convolution_pointwise", "mkl::_mkl_linear"}
    assert prepacked["flops_formula"].sum() == harness["iterations"] * counter.get_total_flops() > 0

    ranges = read_kineto(out / "shapes.json.gz").ranges
    calls = ranges[ranges["name"].isin(list(PACKED_WEIGHT_OPS))]
    first = {}
    for name, shapes in zip(calls["name"], calls["input_shapes"]):
        first.setdefault(name, call_work(name, shapes))
    conv1 = first["mkldnn::_convolution_pointwise"]  # conv1 + the folded BN (a bias now) + ReLU
    positions = 2 * 8 * 16 * 16
    assert conv1.flops_formula == 2 * 2 * 16 * 16 * 8 * 3 * 9 and conv1.flops - conv1.flops_formula == positions
    assert conv1.bytes_read == 4 * (2 * 3 * 16 * 16 + 8 * 3 * 9 + 8) and conv1.bytes_written == 4 * positions
    linear = first["mkl::_mkl_linear"]  # the logical [10, 256] weight, not MKL's packed blob
    assert linear.flops == 2 * 2 * 256 * 10
    assert 4 * (2 * 256 + 10 * 256) <= linear.bytes_read <= 4 * (2 * 256 + 10 * 256 + 10)


def test_the_backward_of_a_slice_or_select_moves_data(tmp_path):
    """A Llama-family train step's rotary embedding slices q and k: autograd runs aten::slice_backward (a zero-filled
    gradient of the input's size, the slice copied in), which had no rule, so 5.7 % of a tiny Qwen2 train step's
    time had unknown work (a QA user's run). It and select_backward move data: 0 FLOPs, the gradient read and
    the input-sized gradient written."""
    grad = torch.randn(4, 8)
    work = call_work("aten::slice_backward", _calls(
        tmp_path, lambda: torch.ops.aten.slice_backward(grad, [4, 16], 1, 0, 8, 1), "aten::slice_backward"))
    assert (work.flops, work.flops_rule) == (0, "movement")
    assert work.bytes_read == 4 * 4 * 8 and work.bytes_written == 4 * 4 * 16
    row = torch.randn(8)
    work = call_work("aten::select_backward", _calls(
        tmp_path, lambda: torch.ops.aten.select_backward(row, [4, 8], 0, 2), "aten::select_backward"))
    assert (work.flops, work.bytes_written) == (0, 4 * 4 * 8)
