"""The fusion map (attribution path c) when one kernel name can mean several call sites.

Four situations, each on fixtures built here in the real formats (docs/formats.md#inductor-debug-artifacts:
torch 2.13 ``output_code.py`` with ``Runner.call``, Source-Nodes comments and ``async_compile.triton(...)``
definitions carrying ``inductor_meta['kernel_name']``; the TORCH_TRACE log's ``inductor_output_code`` record
and ``inductor_compile`` chromium event, as written by torch 2.13 with ``TORCH_COMPILE_DEBUG=1``; Kineto GPU
events ``cpu_op``/``cuda_driver``/``cuda_runtime``/``kernel`` with ``correlation`` args):

1. the same generated kernel name in two compiled graphs (a recompile: ``Torch-Compiled Region: 0/0`` and
   ``0/1``; or two graphs told apart only by their cache keys);
2. ``torch.compile(mode="reduce-overhead")``: node kernels replayed by one ``cudaGraphLaunch``;
3. a Triton kernel whose provenance comment lists ``aten.mm``, computed by ``extern_kernels.mm``;
4. a capture window that starts mid-iteration with one kernel reused at two call sites.

The expected answers are read off each fixture's own specification (which graph each call ran, which call
site each launch is), never off the code under test.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from pathlib import Path

import pandas as pd
import pytest

from operator_profiler import stages, tables
from operator_profiler.attribution import inductor
from operator_profiler.attribution.merge import attribute, fused_operator_label
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

# --- Inductor debug dirs --------------------------------------------------------------------------------------------

# A call of call(): ("triton", kernel name, source nodes, Original ATen ops) or ("extern", op, source nodes, ops).
Call = tuple[str, str, list[str], list[str]]


def _triton_def(name: str, symbol: str, nodes: list[str], ops: list[str]) -> str:
    """One kernel definition as torch 2.13 writes it for CUDA (header comment of its first call site)."""
    return f'''
# kernel path: /tmp/torchinductor_user/ab/cab{abs(hash(name)) % 10**6}.py
# Topologically Sorted Source Nodes: [{", ".join(nodes)}], Original ATen: [{", ".join(ops)}]
# Source node to ATen node mapping:
{chr(10).join(f"#   {n} => {n}" for n in nodes)}
{name} = async_compile.triton('{symbol}', \'\'\'
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={{'x': 1024}}, filename=__file__,
    triton_meta={{'signature': {{'in_ptr0': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32), 'constants': {{}}}},
    inductor_meta={{'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': '{name}', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'num_load': 1, 'num_reduction': 0, 'backend_hash': 'B0', 'are_deterministic_algorithms_enabled': False}},
    min_elem_per_thread=0
)
@triton.jit
def {symbol}(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 1024
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_ptr0 + (xindex), None)
    tl.store(out_ptr0 + (xindex), tmp0, None)
\'\'\', device_str='cuda')
'''


def _output_code(calls: list[Call], generic: bool = False, aot_id: str = "0_inference") -> str:
    defs, body, seen = [], [], set()
    for kind, name, nodes, ops in calls:
        if kind == "triton" and name not in seen:
            seen.add(name)
            defs.append(_triton_def(name, "triton_" if generic else name, nodes, ops))
    for i, (kind, name, nodes, ops) in enumerate(calls):
        body.append(f"        # Topologically Sorted Source Nodes: [{', '.join(nodes)}], Original ATen: [{', '.join(ops)}]")
        if kind == "triton":
            body.append("        stream0 = get_raw_stream(0)")
            body.append(f"        {name}.run(buf{i}, buf{i + 1}, 1024, stream=stream0)")
        else:
            body.append(f"        extern_kernels.{name}(buf{i}, arg1_1, out=buf{i + 1})")
    return (f"# AOT ID: ['{aot_id}']\nfrom ctypes import c_void_p, c_long, c_int\nimport torch\n"
            "from torch._inductor.async_compile import AsyncCompile\nasync_compile = AsyncCompile()\n"
            + "".join(defs) + "\nasync_compile.wait(globals())\ndel async_compile\n\nclass Runner:\n"
            "    def __init__(self, partitions):\n        self.partitions = partitions\n\n"
            "    def call(self, args):\n        arg0_1, arg1_1 = args\n        args.clear()\n"
            "        with torch.cuda._DeviceGuard(0):\n            torch.cuda.set_device(0)\n"
            + "\n".join("    " + line for line in body)
            + f"\n        return (buf{len(calls)}, )\n\nrunner = Runner(partitions=[])\ncall = runner.call\n")


def _write_graphs(root: Path, graphs: dict[str, list[Call]], generic: bool = False) -> dict[str, Path]:
    out = {}
    for graph, calls in graphs.items():
        d = root / "torch_compile_debug" / "run_2026_12_01_13_13_06_724457-pid_7768" / "torchinductor" / graph
        d.mkdir(parents=True)
        kind = inductor.graph_kind(graph)
        aot_id = graph.split("__", 1)[1].split("_", 1)[0] + f"_{kind}"  # torch's first line: the AOT ID
        (d / "output_code.py").write_text(_output_code(calls, generic, aot_id))
        out[graph] = d
    return out


def _torch_trace_log(root: Path, compiles: list[tuple[Path, str, bool, str]]) -> None:
    """``dedicated_log_torch_trace_*.log`` with, per compile (debug dir, compile id, is_backward, cache key), the
    ``inductor_output_code`` record (``has_payload`` = MD5 of the payload, the output_code.py text) and the
    ``inductor_compile`` end event, in the layout of torch 2.13's TORCH_TRACE (glog prefix, metadata JSON,
    payload lines prefixed with a tab)."""
    lines = []
    for graph_dir, compile_id, backward, key in compiles:
        frame, n = compile_id.split("/")
        code = (graph_dir / "output_code.py").read_text()
        meta = {"frame_id": int(frame), "frame_compile_id": int(n), "attempt": 0}
        lines.append("V1201 13:13:09.138000 7768 torch/_inductor/graph.py:2745] " + json.dumps(
            {"inductor_output_code": {"filename": "/tmp/torchinductor_user/66/c66.py"}, **meta,
             "has_payload": hashlib.md5(code.encode()).hexdigest()}))
        lines += ["\t" + line for line in code.split("\n")]
        args = {"fn_name": "compile_fx_inner", "compile_id": compile_id, "is_backward": backward}
        if key:  # no key with the FX graph cache off
            args.update({"cache_state": "miss", "key": key})
        event = json.dumps({"name": "inductor_compile", "ts": 1796130792479828.5, "args": args, "ph": "E",
                            "cat": "dynamo_timed", "tid": 0, "pid": 0}, indent=0)
        lines.append("V1201 13:13:12.480000 7768 torch/_dynamo/utils.py:2350] " + json.dumps(
            {"chromium_event": {}, **meta, "has_payload": hashlib.md5(event.encode()).hexdigest()}))
        lines += ["\t" + line for line in event.split("\n")]
    log = root / "torch_compile_debug" / "tlparse" / "dedicated_log_torch_trace_qgctksjt.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(lines) + "\n")


# --- Kineto traces --------------------------------------------------------------------------------------------------

PID, TID, DEVICE, STREAM = 100, 1, 0, 7


class Trace:
    """A Kineto GPU trace built call by call: CPU ranges on one thread, kernels on one stream."""

    def __init__(self):
        self.events: list[dict] = []
        self.corr = 0
        self.gpu_t = 0.0

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = TID, **args) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})

    def launch(self, ts: float, kernels: list[str], api: str = "cuLaunchKernel", tid: int = TID) -> None:
        """A launch call at ``ts`` (1 µs) and its kernels on the GPU (several: a CUDA-graph replay)."""
        self.corr += 1
        cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
        self.events.append({"ph": "X", "cat": cat, "name": api, "pid": PID, "tid": tid, "ts": ts, "dur": 1,
                            "args": {"correlation": self.corr}})
        for k in kernels:
            self.gpu_t = max(self.gpu_t, ts + 2)
            self.events.append({"ph": "X", "cat": "kernel", "name": k, "pid": DEVICE, "tid": STREAM, "ts": self.gpu_t,
                                "dur": 1, "args": {"correlation": self.corr, "device": DEVICE, "stream": STREAM}})
            self.gpu_t += 1.5

    def write(self, path: Path) -> Path:
        with gzip.open(path, "wt") as fh:
            json.dump({"traceEvents": self.events}, fh)
        return path


def _call_events(trace: Trace, t: float, calls: list[Call], record_functions: bool = True) -> float:
    """The launches of one execution of call() from ``t``: a generated kernel inside its CPU-side record function
    (``triton_*`` cpu_op, cuLaunchKernel), an extern call inside its ``aten::<op>`` (cudaLaunchKernel of a
    cuBLAS kernel).  Returns the time after the last one."""
    for kind, name, _, _ in calls:
        if kind == "triton":
            if record_functions:
                trace.op(name, t, 4)
            trace.launch(t + 1, [name])
        else:
            trace.op(f"aten::{name}", t, 4)
            trace.launch(t + 1, ["ampere_sgemm_32x32_sliced1x4_tn"], api="cudaLaunchKernelExC")
        t += 5
    return t


def _attribute(trace_path: Path, fusion: pd.DataFrame) -> pd.DataFrame:
    t = read_kineto(trace_path)
    kl, _, _ = classify_layers(t.kernels, t.ranges, [])
    a = attribute(t.kernels, t.ranges, kl, fusion)
    return a.merge(t.kernels[["kernel_id", "start_ns", "launch_api", "correlation_id"]], on="kernel_id")


def _values(column: pd.Series) -> list:
    """A string column as a list with None for nulls (the table's nulls read back as NaN)."""
    return [v if isinstance(v, str) else None for v in column]


def _inductor(evidence: str) -> dict:
    return json.loads(evidence).get("inductor", {})


def _label(ops: list[str]) -> str:
    return fused_operator_label(["aten::" + o.split(".", 1)[1] for o in ops])


# --- 1. the same kernel name in two compiled graphs -----------------------------------------------------------------

# Two compilations of one frame (a recompile on a new shape, 0/0 and 0/1): the kernel counters restart, so both
# call `triton_poi_fused_add_mul_0`; they were traced from different source lines (different FX nodes).
RECOMPILED = {
    "model__0_inference_0.0": [("triton", "triton_poi_fused_add_mul_0", ["add", "mul"], ["aten.add", "aten.mul"])],
    "model__1_inference_1.1": [("triton", "triton_poi_fused_add_mul_0", ["add_1", "mul_1"], ["aten.add", "aten.mul"])],
}
# With descriptive kernel names off the same name also hides different ops (`triton_poi_fused_0`).
UNNAMED = {
    "model__0_inference_0.0": [("triton", "triton_poi_fused_0", ["add"], ["aten.add"])],
    "model__1_inference_1.1": [("triton", "triton_poi_fused_0", ["mul"], ["aten.mul"])],
}
COMPILE_IDS = {"model__0_inference_0.0": "0/0", "model__1_inference_1.1": "0/1"}
KEYS = {"model__0_inference_0.0": "fwnwpe6eqttwlmeevnif5rlojl4xaglfgrhe5btimqpy5nzqcrvh",
        "model__1_inference_1.1": "fxmfm6um2xxh6xdtqg3bhxfcnnejosgw3uyw6scp2vhecp5jm33j"}


def _recompile_trace(path: Path, graphs: dict[str, list[Call]], regions: bool, steps: int = 2) -> tuple[Path, list]:
    """Each step runs graph 0/0 then 0/1, inside ``Torch-Compiled Region: <id>`` (and, with ``regions``, Inductor's
    ``## Call CompiledFxGraph <key> ##``; torch <= 2.5 traces have no such range).  Returns the trace and, per
    kernel in launch order, the graph that ran it."""
    trace, t, truth = Trace(), 0.0, []
    for _ in range(steps):
        for graph, calls in graphs.items():
            trace.op(f"Torch-Compiled Region: {COMPILE_IDS[graph]}", t, 10 + 5 * len(calls))
            if regions:
                trace.op(f"## Call CompiledFxGraph {KEYS[graph]} ##", t + 2, 6 + 5 * len(calls))
            _call_events(trace, t + 4, calls)
            truth += [graph] * len(calls)
            t += 20 + 5 * len(calls)
    return trace.write(path), truth


def test_recompiled_graph_same_ops_keeps_operator_and_marks_nodes_ambiguous(tmp_path, caplog):
    """torch <= 2.5 layout (no ``## Call`` range), no TORCH_TRACE log: the two graphs differ only in FX nodes, so
    every launch gets the shared operator, never the kernel's own name, and the nodes are marked undecided."""
    _write_graphs(tmp_path / "dbg", RECOMPILED)
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace, truth = _recompile_trace(tmp_path / "t.json.gz", RECOMPILED, regions=False)
    a = _attribute(trace, fusion).sort_values("start_ns")
    assert len(a) == len(truth) == 4
    assert (a["operator"] == _label(["aten.add", "aten.mul"])).all() and (a["path"] == "inductor").all()
    assert a["fused_ops"].map(list).tolist() == [["aten::add", "aten::mul"]] * 4
    assert a["source_nodes"].map(list).tolist() == [[]] * 4
    assert (a["reason"] == "source_nodes_ambiguous").all()
    for ev in a["evidence"]:
        site = _inductor(ev)
        assert site["source_nodes"] == "ambiguous" and site["graph"] is None
        assert site["candidates"] == ["model__0_inference_0.0:0", "model__1_inference_1.1:0"]

    # end to end: the warning names what was undecided, it does not blame the user
    stages.export_timeline(trace, tmp_path / "tl")
    with caplog.at_level(logging.WARNING):
        stages.attribute_files(tmp_path / "tl", None, fusion, tmp_path / "a.parquet")
    messages = " ".join(r.message for r in caplog.records)
    assert "another run" not in messages and "4 with their operator but undecided FX nodes" in messages


def test_recompiled_graph_pinned_by_the_torch_trace_log(tmp_path, caplog):
    """With the TORCH_TRACE log of the compile beside the debug dirs, the compile id of the enclosing
    ``Torch-Compiled Region`` names the graph: each launch gets its own graph's source nodes."""
    dirs = _write_graphs(tmp_path / "dbg", RECOMPILED)
    _torch_trace_log(tmp_path / "dbg", [(dirs[g], COMPILE_IDS[g], False, KEYS[g]) for g in RECOMPILED])
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    assert dict(zip(fusion["graph"], fusion["compile_id"])) == COMPILE_IDS
    assert dict(zip(fusion["graph"], fusion["cache_key"])) == KEYS
    for regions in (False, True):
        trace, truth = _recompile_trace(tmp_path / f"t{regions}.json.gz", RECOMPILED, regions=regions)
        a = _attribute(trace, fusion).sort_values("start_ns")
        assert [_inductor(e)["graph"] for e in a["evidence"]] == truth
        assert a["source_nodes"].map(list).tolist() == [RECOMPILED[g][0][2] for g in truth]
        assert a["reason"].isna().all() and (a["path"] == "inductor").all()
    # the same dirs without the log: nothing pins the graph (the region keys alone do not name a debug dir)
    (tmp_path / "dbg" / "torch_compile_debug" / "tlparse" / "dedicated_log_torch_trace_qgctksjt.log").unlink()
    assert inductor.load_fusion_map(tmp_path / "dbg")["compile_id"].isna().all()


def test_identical_code_of_two_compiles_leaves_the_compile_id_unknown(tmp_path):
    """The log links a debug dir to its compile by the MD5 of its output_code.py; a text two compiles both
    produced names no single compile id, so none is claimed."""
    dirs = _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": UNNAMED["model__0_inference_0.0"]})
    graph_dir = dirs["model__0_inference_0.0"]
    _torch_trace_log(tmp_path / "dbg", [(graph_dir, "0/0", False, "k0"), (graph_dir, "1/0", False, "k1")])
    assert inductor.torch_trace_graph_ids(tmp_path / "dbg", [graph_dir]) == {}
    _torch_trace_log(tmp_path / "other", [(graph_dir, "1/0", False, "k1")])
    assert inductor.torch_trace_graph_ids(tmp_path / "other", [graph_dir]) == {"model__0_inference_0.0": ("1/0", "k1")}


def test_same_name_different_ops_is_refused_with_the_candidate_graphs(tmp_path, caplog):
    """Situation 1: both kernels used to get the kernel's own name as operator, merged into one row,
    and a warning asking whether the map was from another run.  Now, without a log to pin the graph, they are
    unattributed (``ambiguous_compiled_graph``) with both graphs listed; with the log, exact."""
    dirs = _write_graphs(tmp_path / "dbg", UNNAMED)
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    for regions in (False, True):
        trace, truth = _recompile_trace(tmp_path / f"t{regions}.json.gz", UNNAMED, regions=regions)
        a = _attribute(trace, fusion)
        assert len(a) == len(truth)
        assert a["operator"].isna().all() and (a["path"] == "unattributed").all()
        assert (a["reason"] == "ambiguous_compiled_graph").all()
        assert all(_inductor(e) == {"reason": "ambiguous_compiled_graph", "candidates": sorted(UNNAMED)}
                   for e in a["evidence"])
        if regions:
            stages.export_timeline(trace, tmp_path / "tl")
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                stages.attribute_files(tmp_path / "tl", None, fusion, tmp_path / "a.parquet")
            messages = " ".join(r.message for r in caplog.records)
            assert "another run" not in messages
            assert f"{len(truth)} ambiguous_compiled_graph (graphs {', '.join(sorted(UNNAMED))}" in messages
    _torch_trace_log(tmp_path / "dbg", [(dirs[g], COMPILE_IDS[g], False, KEYS[g]) for g in UNNAMED])
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    for regions in (False, True):
        trace, truth = _recompile_trace(tmp_path / f"u{regions}.json.gz", UNNAMED, regions=regions)
        a = _attribute(trace, fusion).sort_values("start_ns")
        assert a["operator"].tolist() == [_label(UNNAMED[g][0][3]) for g in truth]
        assert [_inductor(e)["graph"] for e in a["evidence"]] == truth


def test_cache_key_alone_pins_the_graph(tmp_path):
    """A log with only the ``inductor_compile`` keys known for the graphs (compile ids absent from the trace,
    e.g. a backward call): the ``## Call CompiledFxGraph <key>`` range names the graph."""
    dirs = _write_graphs(tmp_path / "dbg", UNNAMED)
    _torch_trace_log(tmp_path / "dbg", [(dirs[g], COMPILE_IDS[g], False, KEYS[g]) for g in UNNAMED])
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace, t, truth = Trace(), 0.0, []
    for graph in ["model__1_inference_1.1", "model__0_inference_0.0", "model__1_inference_1.1"]:
        trace.op(f"## Call CompiledFxGraph {KEYS[graph]} ##", t, 20)  # no Torch-Compiled Region around it
        _call_events(trace, t + 2, UNNAMED[graph])
        truth.append(graph)
        t += 30
    a = _attribute(trace.write(tmp_path / "k.json.gz"), fusion).sort_values("start_ns")
    assert [_inductor(e)["graph"] for e in a["evidence"]] == truth
    assert a["operator"].tolist() == [_label(UNNAMED[g][0][3]) for g in truth]


def test_direction_separates_forward_and_backward_graphs(tmp_path):
    """A forward and a backward graph both calling ``triton_poi_fused_0`` (counters restart per graph): a call
    inside ``CompiledFunctionBackward`` ran the backward graph, one inside ``CompiledFunction`` the forward."""
    graphs = {"model__0_forward_1.0": [("triton", "triton_poi_fused_0", ["relu"], ["aten.relu"])],
              "model__0_backward_3.1": [("triton", "triton_poi_fused_0", ["threshold_backward"],
                                         ["aten.threshold_backward"])]}
    _write_graphs(tmp_path / "dbg", graphs)
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = Trace()
    trace.op("Torch-Compiled Region: 0/0", 0, 40)
    trace.op("CompiledFunction", 2, 30)
    trace.op("## Call CompiledFxGraph None ##", 4, 20)  # FX graph cache off: key None, pins nothing
    _call_events(trace, 6, graphs["model__0_forward_1.0"])
    trace.op("autograd::engine::evaluate_function: CompiledFunctionBackward", 100, 40)
    trace.op("CompiledFunctionBackward", 102, 30)
    trace.op("## Call CompiledFxGraph None ##", 104, 20)
    _call_events(trace, 106, graphs["model__0_backward_3.1"])
    a = _attribute(trace.write(tmp_path / "fb.json.gz"), fusion).sort_values("start_ns")
    assert a["operator"].tolist() == ["aten::relu", "aten::threshold_backward"]
    assert [_inductor(e)["graph"] for e in a["evidence"]] == list(graphs)


def test_backward_call_takes_the_compile_id_of_its_forward(tmp_path):
    """Training, FX graph cache off (``## Call CompiledFxGraph None ##``), two compilations 0/0 and 0/1 whose
    backward graphs both call ``triton_poi_fused_0`` with different ops.  The backward call has no
    ``Torch-Compiled Region`` around it (the autograd thread runs it); its compile id is the one around the
    forward ``CompiledFunction`` with the same ``Sequence number`` (docs/formats.md#kineto-backward-thread)."""
    graphs = {
        "model__0_forward_1.0": [("triton", "triton_poi_fused_relu_0", ["relu"], ["aten.relu"])],
        "model__0_backward_3.1": [("triton", "triton_poi_fused_0", ["threshold_backward"], ["aten.threshold_backward"])],
        "model__1_forward_4.2": [("triton", "triton_poi_fused_relu_0", ["relu"], ["aten.relu"])],
        "model__1_backward_6.3": [("triton", "triton_poi_fused_0", ["gelu_backward"], ["aten.gelu_backward"])],
    }
    compile_of = {g: "0/0" if g.startswith("model__0") else "0/1" for g in graphs}
    dirs = _write_graphs(tmp_path / "dbg", graphs)
    _torch_trace_log(tmp_path / "dbg", [(dirs[g], compile_of[g], "backward" in g, "") for g in graphs])
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    assert dict(zip(fusion["graph"], fusion["compile_id"])) == compile_of and fusion["cache_key"].isna().all()
    trace, t, truth = Trace(), 0.0, []
    for seq, cid in ((7, "0/0"), (8, "0/1")):
        trace.op(f"Torch-Compiled Region: {cid}", t, 40)
        trace.op("CompiledFunction", t + 2, 30, **{"Sequence number": seq, "Fwd thread id": 0})
        trace.op("## Call CompiledFxGraph None ##", t + 4, 20)
        _call_events(trace, t + 6, graphs[f"model__{cid[-1]}_forward_{'1.0' if cid == '0/0' else '4.2'}"])
        truth.append("forward")
        t += 50
    for seq, backward in ((8, "model__1_backward_6.3"), (7, "model__0_backward_3.1")):  # reverse order
        trace.op("autograd::engine::evaluate_function: CompiledFunctionBackward", t, 40, tid=2)
        trace.op("CompiledFunctionBackward", t + 2, 30, tid=2, **{"Sequence number": seq, "Fwd thread id": 1})
        trace.op("## Call CompiledFxGraph None ##", t + 4, 20, tid=2)
        trace.op("triton_poi_fused_0", t + 6, 4, tid=2)
        trace.launch(t + 7, ["triton_poi_fused_0"], tid=2)
        truth.append(backward)
        t += 50
    a = _attribute(trace.write(tmp_path / "bw.json.gz"), fusion).sort_values("start_ns")
    backward = a[a["name"] == "triton_poi_fused_0"]
    assert [_inductor(e)["graph"] for e in backward["evidence"]] == truth[2:]
    assert backward["operator"].tolist() == [_label(graphs[g][0][3]) for g in truth[2:]]
    assert (backward["forward_operator"] == "CompiledFunction").all()


def test_calls_with_one_key_run_one_graph(tmp_path):
    """Calls with the same cache key ran the same graph; a graph pinned by one key is not another key's.
    Region A shows CPU-side record functions (descriptive names: only graph A fits); region B's kernels show only
    the generic device name ``triton_`` (fits both); B's key differs from A's, so B ran the other graph."""
    graphs = {"g__0_inference_0.0": [("triton", "triton_poi_fused_add_0", ["add"], ["aten.add"])],
              "g__1_inference_1.1": [("triton", "triton_poi_fused_mul_0", ["mul"], ["aten.mul"])]}
    _write_graphs(tmp_path / "dbg", graphs, generic=True)
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = Trace()
    trace.op("## Call CompiledFxGraph keyA ##", 0, 20)
    trace.op("triton_poi_fused_add_0", 2, 4)
    trace.launch(3, ["triton_"])
    trace.op("## Call CompiledFxGraph keyB ##", 30, 20)
    trace.launch(33, ["triton_"])  # no CPU-side event
    a = _attribute(trace.write(tmp_path / "kb.json.gz"), fusion).sort_values("start_ns")
    assert a["operator"].tolist() == ["aten::add", "aten::mul"]
    assert [_inductor(e)["graph"] for e in a["evidence"]] == list(graphs)
    # without region A, nothing excludes graph A for region B: refused, both listed
    trace.events = [e for e in trace.events if e["ts"] >= 30 or e["cat"] == "kernel" and e["ts"] > 33]
    a = _attribute(trace.write(tmp_path / "kb2.json.gz"), fusion)
    assert a["reason"].tolist() == ["ambiguous_compiled_graph"]
    assert _inductor(a["evidence"].iat[0])["candidates"] == sorted(graphs)


# --- 2. CUDA-graph replays (reduce-overhead) ------------------------------------------------------------------------

REPLAYED = [("triton", "triton_poi_fused_add_relu_0", ["add", "relu"], ["aten.add", "aten.relu"]),
            ("extern", "mm", ["mm"], ["aten.mm"]),
            ("triton", "triton_poi_fused_mul_1", ["mul"], ["aten.mul"])]
GEMM = ["ampere_sgemm_32x32_sliced1x4_tn",
        ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams"
         "<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, "
         "float*, void*, long, float*, int*)")]


def _replay_trace(path: Path, regions: bool, steps: int = 2, kernels: list[str] | None = None) -> Path:
    """reduce-overhead: each step's call() is one ``cudaGraphLaunch`` replaying the captured kernels (GEMM and its
    split-K reduce for the extern mm), inside ``Torch-Compiled Region: 0/0`` (and Inductor's ``## Call`` range)."""
    trace, t = Trace(), 0.0
    replayed = kernels or ["triton_poi_fused_add_relu_0", *GEMM, "triton_poi_fused_mul_1"]
    for _ in range(steps):
        trace.op("Torch-Compiled Region: 0/0", t, 30)
        if regions:
            trace.op("## Call CompiledFxGraph fkey ##", t + 2, 20)
        trace.launch(t + 5, replayed, api="cudaGraphLaunch")
        t += 50
    return trace.write(path)


@pytest.mark.parametrize("regions", [False, True], ids=["no_call_range", "call_range"])
def test_cuda_graph_replay_is_attributed_through_the_fusion_map(tmp_path, regions, caplog):
    """Situation 2: the replayed node kernels got the Dynamo region's name as operator (or stayed
    unattributed with ``fusion_map_mismatch`` inside a ``## Call`` range).  Now the generated kernels map to the
    call sites by name and order, the GEMM and its split-K reduce to the one extern call between them."""
    _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": REPLAYED})
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = _replay_trace(tmp_path / "r.json.gz", regions)
    a = _attribute(trace, fusion).sort_values("start_ns")
    assert set(a["launch_api"]) == {"cudaGraphLaunch"} and a["correlation_id"].nunique() == 2
    # each replay: add_relu (call 0), the GEMM and its reduce (call 1, extern mm), mul (call 2)
    expected_calls = [0, 1, 1, 2] * 2
    expected_ops = [_label(REPLAYED[0][3]), "aten::mm", "aten::mm", _label(REPLAYED[2][3])] * 2
    assert a["operator"].tolist() == expected_ops
    assert not a["operator"].str.startswith("Torch-Compiled Region").any()
    assert (a["path"] == "inductor").all() and a["reason"].isna().all()
    sites = [_inductor(e) for e in a["evidence"]]
    assert [s["call_index"] for s in sites] == expected_calls
    assert {s["joined_by"] for s in sites} == {"cuda_graph_replay"}
    assert [s["call_site"] for s in sites] == [True, True, False, True] * 2  # the reduce is not a second mm call
    assert a["source_nodes"].map(list).tolist() == [REPLAYED[c][2] for c in expected_calls]
    stages.export_timeline(trace, tmp_path / "tl")
    with caplog.at_level(logging.WARNING):
        stages.attribute_files(tmp_path / "tl", None, fusion, tmp_path / "a.parquet")
    assert not any("fusion map" in r.message for r in caplog.records)


def test_replayed_gemm_joins_the_eager_mm_row(tmp_path):
    """The extern call's ``Original ATen`` lists the views it absorbed (``aten.t``, ``aten.view``); its replayed
    GEMM is still a call of ``aten::mm``, in the same operator row as an eager ``aten::mm`` of the program."""
    calls = [("triton", "triton_poi_fused_add_relu_0", ["add", "relu"], ["aten.add", "aten.relu"]),
             ("extern", "mm", ["view", "permute", "mm"], ["aten.view", "aten.t", "aten.mm"]),
             ("triton", "triton_poi_fused_mul_1", ["mul"], ["aten.mul"])]
    _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": calls})
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = Trace()
    trace.op("aten::mm", 0, 4)  # eager, before the compiled region
    trace.launch(1, [GEMM[0]], api="cudaLaunchKernelExC")
    trace.op("Torch-Compiled Region: 0/0", 10, 30)
    trace.launch(15, ["triton_poi_fused_add_relu_0", GEMM[0], "triton_poi_fused_mul_1"], api="cudaGraphLaunch")
    a = _attribute(trace.write(tmp_path / "m.json.gz"), fusion).sort_values("start_ns")
    assert a["operator"].tolist() == ["aten::mm", _label(calls[0][3]), "aten::mm", _label(calls[2][3])]
    assert a["path"].tolist() == ["correlation", "inductor", "inductor", "inductor"]
    assert list(a["fused_ops"].iat[2]) == ["aten::mm", "aten::t", "aten::view"]


def test_cuda_graph_replay_that_fits_no_graph_is_refused_never_named_after_the_region(tmp_path, caplog):
    other = [("triton", "triton_poi_fused_add_relu_0", ["add", "relu"], ["aten.add", "aten.relu"]),
             ("triton", "triton_poi_fused_sin_1", ["sin"], ["aten.sin"])]
    _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": other})
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = _replay_trace(tmp_path / "r.json.gz", regions=False)
    a = _attribute(trace, fusion)
    assert a["operator"].isna().all() and (a["reason"] == "cuda_graph_replay_mismatch").all()
    stages.export_timeline(trace, tmp_path / "tl")
    with caplog.at_level(logging.WARNING):
        stages.attribute_files(tmp_path / "tl", None, fusion, tmp_path / "a.parquet")
    assert any("another run" in r.message and "8 cuda_graph_replay_mismatch" in r.message for r in caplog.records)
    # without a fusion map the replay keeps path (a)'s answer: the profiler op around the launch
    a = _attribute(trace, None)
    assert set(a["operator"]) == {"Torch-Compiled Region: 0/0"}


def test_cuda_graph_replay_of_generic_names_is_placed_only_where_the_library_kernels_fit(tmp_path):
    """torch <= 2.5 (``unique_kernel_names=False``): replayed Triton kernels are all ``triton_`` (here with the
    Triton 2.0 suffix) and a replay has no CPU-side events. Besides the count of generated kernels, where the
    library kernels sit tells the graph: a GEMM between the two Triton kernels fits `triton, mm, triton`; a GEMM
    before the first one needs an extern call there, which the graph lacks, so that replay is refused."""
    _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": REPLAYED}, generic=True)
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = _replay_trace(tmp_path / "g.json.gz", regions=False, steps=1,
                          kernels=["triton__0d1d2d", GEMM[0], "triton__0d1d2d"])
    a = _attribute(trace, fusion).sort_values("start_ns")
    assert _values(a["operator"]) == [_label(REPLAYED[0][3]), _label(REPLAYED[1][3]), _label(REPLAYED[2][3])]
    assert a["reason"].isna().all()
    trace = _replay_trace(tmp_path / "h.json.gz", regions=False, steps=1,
                          kernels=[GEMM[0], "triton__0d1d2d", "triton__0d1d2d"])
    a = _attribute(trace, fusion)
    assert _values(a["reason"]) == ["ambiguous_generic_kernel_name"] * 3 and a["operator"].isna().all()
    assert _inductor(a["evidence"].iat[0])["candidates"] == ["model__0_inference_0.0"]


def test_cuda_graph_replay_library_kernels_between_two_extern_calls(tmp_path):
    """Two extern calls (mm, addmm) between two Triton kernels of a replay: with one library kernel each, each call
    has its kernel (an extern_kernels call launches at least one); with three library kernels (a split-K reduce
    somewhere) which call launched which is open: unplaced, the two calls listed."""
    calls = [("triton", "triton_poi_fused_add_relu_0", ["add", "relu"], ["aten.add", "aten.relu"]),
             ("extern", "mm", ["mm"], ["aten.mm"]), ("extern", "addmm", ["linear"], ["aten.addmm"]),
             ("triton", "triton_poi_fused_mul_1", ["mul"], ["aten.mul"])]
    _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": calls})
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace = _replay_trace(tmp_path / "r.json.gz", regions=True, steps=1,
                          kernels=["triton_poi_fused_add_relu_0", GEMM[0], GEMM[0], "triton_poi_fused_mul_1"])
    a = _attribute(trace, fusion).sort_values("start_ns")
    assert _values(a["operator"]) == [_label(c[3]) for c in calls]
    trace = _replay_trace(tmp_path / "s.json.gz", regions=True, steps=1,
                          kernels=["triton_poi_fused_add_relu_0", GEMM[0], GEMM[1], GEMM[0], "triton_poi_fused_mul_1"])
    a = _attribute(trace, fusion).sort_values("start_ns")
    assert _values(a["operator"]) == [_label(calls[0][3]), None, None, None, _label(calls[3][3])]
    assert _values(a["reason"]) == [None] + ["extern_call_not_placed"] * 3 + [None]
    assert _inductor(a["evidence"].iat[1])["candidates"] == ["model__0_inference_0.0:1", "model__0_inference_0.0:2"]


# --- 3. ops listed in the provenance but computed by another kernel ------------------------------------------------

LISTS_MM = [("extern", "mm", ["mm"], ["aten.mm"]),
            ("triton", "triton_poi_fused_add_mm_relu_0", ["add", "mm", "relu"], ["aten.add", "aten.mm", "aten.relu"]),
            # another layer's bias add of an unfused addmm: its own instance of the op, no shared FX node
            ("extern", "addmm", ["linear"], ["aten.addmm"]),
            ("triton", "triton_poi_fused_addmm_gelu_1", ["linear_1", "gelu"], ["aten.addmm", "aten.gelu"])]


def _expected_split(calls: list[Call]) -> dict[str, tuple[list[str], list[str]]]:
    """kernel -> (fused_ops, listed_not_computed) by the documented rule, read off the fixture: an op moves when
    an extern call of the graph runs it and shares a source node with the kernel."""
    out = {}
    for kind, name, nodes, ops in calls:
        if kind != "triton":
            continue
        ops = ["aten::" + o.split(".", 1)[1] for o in ops]
        run = {f"aten::{n}" for k, n, ext_nodes, _ in calls if k == "extern" and set(ext_nodes) & set(nodes)}
        out[name] = (sorted(o for o in ops if o not in run), sorted(o for o in ops if o in run))
    return out


def test_ops_of_an_extern_call_go_to_listed_not_computed(tmp_path):
    """Situation 3: ``aten::add+aten::mm+aten::relu`` for a Triton kernel whose comment lists the mm that
    ``extern_kernels.mm`` computes.  Now: operator ``aten::add+aten::relu``, ``listed_not_computed`` [aten::mm]."""
    dirs = _write_graphs(tmp_path / "dbg", {"model__0_inference_0.0": LISTS_MM})
    fmap = inductor.parse_output_code(dirs["model__0_inference_0.0"])
    expected = _expected_split(LISTS_MM)
    assert expected["triton_poi_fused_add_mm_relu_0"] == (["aten::add", "aten::relu"], ["aten::mm"])
    assert expected["triton_poi_fused_addmm_gelu_1"] == (["aten::addmm", "aten::gelu"], [])
    for row in fmap[fmap["kind"] == "triton"].itertuples():
        assert (row.fused_ops, row.listed_not_computed) == expected[row.kernel]
    assert fmap.loc[fmap["kind"] == "extern", "listed_not_computed"].map(len).eq(0).all()

    # through a Kineto trace (## Call range) and into attribution/kernels.parquet
    trace = Trace()
    trace.op("## Call CompiledFxGraph fkey ##", 0, 40)
    _call_events(trace, 2, LISTS_MM)
    path = trace.write(tmp_path / "t.json.gz")
    stages.export_timeline(path, tmp_path / "tl")
    stages.attribute_files(tmp_path / "tl", None, fmap, tmp_path / "attribution.parquet")
    a = tables.read_table(tmp_path / "attribution.parquet")
    assert tables.ATTRIBUTION.names.index("listed_not_computed") > tables.ATTRIBUTION.names.index("source_nodes")
    fused = a[a["name"] == "triton_poi_fused_add_mm_relu_0"].iloc[0]
    assert fused["operator"] == "aten::add+aten::relu" and "aten::mm" not in fused["operator"]
    assert list(fused["listed_not_computed"]) == ["aten::mm"]
    assert _inductor(fused["evidence"])["listed_not_computed"] == ["aten::mm"]
    gemm = a[a["name"] == "ampere_sgemm_32x32_sliced1x4_tn"]
    assert set(gemm["operator"]) == {"aten::mm", "aten::addmm"}  # the extern calls keep their own ops (path a)


def test_real_backward_layout_copy_lists_the_sdpa_backward_it_feeds():
    """The real torch 2.13 backward graph: ``cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_
    transpose_view_2`` (no comment: ops from its name) lists the SDPA backward that the graph's fallback call
    runs; the copy kernel's operator is its own work."""
    from conftest import real_file

    graph_dir = real_file("inductor-cpu", "torchinductor", "model__0_backward_3.1", "output_code.py").parent
    text = (graph_dir / "output_code.py").read_text()
    fmap = inductor.parse_output_code(graph_dir).set_index("kernel")
    copy = "cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2"
    sdpa = "_scaled_dot_product_flash_attention_for_cpu_backward"
    assert f"torch.ops.aten.{sdpa}.default(" in text and f"{copy}(" in text
    assert fmap.loc[copy, "listed_not_computed"] == [f"aten::{sdpa}"]
    assert fmap.loc[copy, "fused_ops"] == ["aten::transpose", "aten::view"]
    assert fused_operator_label(fmap.loc[copy, "fused_ops"]) == "aten::transpose+aten::view"


# --- 4. reused call sites and windows that start mid-iteration ------------------------------------------------------

REUSED = [("triton", "triton_poi_fused_gelu_0", ["gelu"], ["aten.gelu"]),
          ("extern", "mm", ["linear_1"], ["aten.mm"]),
          ("triton", "triton_poi_fused_gelu_0", ["gelu_1"], ["aten.gelu"]),
          ("triton", "triton_poi_fused_add_1", ["add"], ["aten.add"])]


def _window(calls: list[Call], start: int, count: int) -> list[int]:
    """Call indexes of ``count`` consecutive calls of the repeated call(), starting at call ``start``."""
    return [(start + j) % len(calls) for j in range(count)]


def _kernels(names: list[str], iteration=None) -> pd.DataFrame:
    n = len(names)
    return pd.DataFrame({"kernel_id": range(n), "name": names, "pid": [1] * n,
                         "iteration": pd.array([iteration] * n, dtype="Int64"), "start_ns": [100 * i for i in range(n)]})


def _device_names(calls: list[Call], sites: list[int]) -> list[str]:
    return [calls[c][1] if calls[c][0] == "triton" else GEMM[0] for c in sites]


def test_window_starting_mid_iteration_places_reused_kernel_by_the_graph_order(tmp_path):
    """Situation 4 (nsys, no iteration ranges): a window starting at the second gelu used to give
    every gelu the other call site's source nodes (j mod 2 from the window's start).  The graph's other
    kernel (``triton_poi_fused_add_1``) fixes the offset: each launch gets its real call site."""
    _write_graphs(tmp_path / "dbg", {"m__0_inference_0.0": REUSED})
    fmap = inductor.load_fusion_map(tmp_path / "dbg")
    for start in range(len(REUSED)):
        sites = _window(REUSED, start, 2 * len(REUSED))  # two calls' worth, cut anywhere
        out = inductor.attribute_by_name(_kernels(_device_names(REUSED, sites)), fmap)
        generated = [(i, c) for i, c in enumerate(sites) if REUSED[c][0] == "triton"]
        assert out["call_index"].iloc[[i for i, _ in generated]].tolist() == [c for _, c in generated], start
        assert out["source_nodes"].iloc[[i for i, _ in generated]].tolist() == [REUSED[c][2] for _, c in generated]


def test_reused_kernel_without_an_anchor_keeps_operator_and_marks_nodes_ambiguous(tmp_path, caplog):
    """Only the reused gelu is generated: no launch order fixes which call site a window starts at.  Both
    sites are ``aten::gelu``: the operator stays, source nodes are empty and flagged, the sites listed."""
    calls = REUSED[:3]
    _write_graphs(tmp_path / "dbg", {"m__0_inference_0.0": calls})
    fmap = inductor.load_fusion_map(tmp_path / "dbg")
    names = _device_names(calls, _window(calls, 2, 6))
    out = inductor.attribute_by_name(_kernels(names), fmap)
    gelu = out[[n == "triton_poi_fused_gelu_0" for n in names]]
    assert (gelu["match"] == "same_operator").all() and gelu["call_index"].isna().all()
    assert gelu["fused_ops"].tolist() == [["aten::gelu"]] * len(gelu) and gelu["source_nodes"].map(len).eq(0).all()
    assert gelu["source_nodes_ambiguous"].all()
    assert gelu["candidates"].tolist() == [["m__0_inference_0.0:0", "m__0_inference_0.0:2"]] * len(gelu)
    # a complete measured iteration (our harness's iteration range) is known to start at call 0
    complete = inductor.attribute_by_name(_kernels(_device_names(calls, _window(calls, 0, 3)), iteration=0), fmap)
    assert complete["source_nodes"].tolist() == [["gelu"], [], ["gelu_1"]]

    # end to end on an nsys timeline: operator kept, reason source_nodes_ambiguous, evidence lists the sites
    from nsys_export import Kernel, Runtime, write_nsys_export

    thread = "100:100"
    runtime = [Runtime("cuLaunchKernel", thread, 1_000 * i, 1_000 * i + 500, i + 1, event_class=1)
               for i in range(len(names))]
    kernels = [Kernel(n, 100, 7, 1_000 * i + 600, 1_000 * i + 900, i + 1) for i, n in enumerate(names)]
    export = write_nsys_export(tmp_path / "run.sqlite", runtime=runtime, kernels=kernels)
    stages.export_timeline(export, tmp_path / "tl")
    with caplog.at_level(logging.WARNING):
        a = stages.attribute_files(tmp_path / "tl", None, fmap, tmp_path / "a.parquet")
    a = a[a["name"] == "triton_poi_fused_gelu_0"]
    assert (a["operator"] == "aten::gelu").all() and (a["path"] == "inductor").all()
    assert (a["reason"] == "source_nodes_ambiguous").all() and a["source_nodes"].map(len).eq(0).all()
    ev = _inductor(a["evidence"].iat[0])
    assert ev["source_nodes"] == "ambiguous" and ev["candidates"] == ["m__0_inference_0.0:0", "m__0_inference_0.0:2"]
    assert any(f"{len(a)} with their operator but undecided FX nodes" in r.message for r in caplog.records)


def test_reused_kernel_with_different_ops_is_refused_with_its_sites(tmp_path):
    """A reused kernel whose call sites name different ops (the same code serving ``add`` and ``add_``): where
    the order cannot decide, unattributed, never one site's answer."""
    calls = [("triton", "triton_poi_fused_add_0", ["add"], ["aten.add"]),
             ("triton", "triton_poi_fused_add_0", ["add_1"], ["aten.add_"])]
    _write_graphs(tmp_path / "dbg", {"m__0_inference_0.0": calls})
    fmap = inductor.load_fusion_map(tmp_path / "dbg")
    out = inductor.attribute_by_name(_kernels(["triton_poi_fused_add_0"] * 4), fmap)
    assert (out["reason"] == "kernel_name_in_several_call_sites").all() and out["match"].isna().all()
    assert out["candidates"].tolist() == [["m__0_inference_0.0:0", "m__0_inference_0.0:1"]] * 4


def test_kineto_window_starting_mid_iteration(tmp_path):
    """A Kineto trace whose capture starts inside a compiled call: the first, partial call has no wrapper range
    (it began before the profiler), later calls do.  The partial call's kernels are joined by name, placed by
    the graph order; the complete calls by their wrapper range."""
    _write_graphs(tmp_path / "dbg", {"m__0_inference_0.0": REUSED})
    fusion = inductor.load_fusion_map(tmp_path / "dbg")
    trace, t, truth = Trace(), 0.0, []
    t = _call_events(trace, t, REUSED[2:])  # the tail of a call started before the capture
    truth += [2, 3]
    for _ in range(2):
        trace.op("Torch-Compiled Region: 0/0", t, 5 * len(REUSED) + 4)
        _call_events(trace, t + 2, REUSED)
        truth += [0, 1, 2, 3]
        t += 5 * len(REUSED) + 10
    a = _attribute(trace.write(tmp_path / "w.json.gz"), fusion).sort_values("start_ns")
    generated = [i for i, c in enumerate(truth) if REUSED[c][0] == "triton"]
    rows = a.iloc[generated]
    assert [_inductor(e)["call_index"] for e in rows["evidence"]] == [truth[i] for i in generated]
    assert rows["source_nodes"].map(list).tolist() == [REUSED[truth[i]][2] for i in generated]
    # the reused gelu placed by the graph order; the add has one call site
    assert [_inductor(e)["joined_by"] for e in rows["evidence"]][:2] == ["kernel_name:call_site_order",
                                                                          "kernel_name:unique_call_site"]
    assert set([_inductor(e)["joined_by"] for e in rows["evidence"]][2:]) == {"wrapper_range"}
