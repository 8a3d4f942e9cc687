"""Inductor programs for :mod:`ground_truth` (test support, not a test): compiled graphs, their runs in a Kineto
trace, their debug directories, and the scenarios ``recompiled_graphs``, ``reduce_overhead``,
``extern_in_provenance`` and ``partial_window`` (rules in :mod:`ground_truth`'s docstring).

A compiled graph is a list of call sites of ``call()``: Triton kernels (one launch each, named
``triton_<poi|per|red>_fused_<ops>_<n>``; the GPU symbol is that name, or ``triton_`` for graphs compiled with
``unique_kernel_names=False``) and extern calls (``extern_kernels.mm`` -> an ``aten::mm`` op launching cuBLAS
kernels). In the trace a run of the graph is ``Torch-Compiled Region: <compile id>`` > ``## Call CompiledFxGraph
<key> ##`` > per call site the CPU-side Triton record function (``cuLaunchKernel``) or the extern ATen op
(docs/formats.md#inductor-kernels-in-kineto). The truth label of a Triton kernel is its call site's ``Original ATen`` ops as
``aten::op`` without view ops and without ops an extern call of the graph computes (shared source node), sorted,
joined by ``+``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from ground_truth import (
    CONFIGS,
    FORWARD_TEMPLATES,
    MAIN_TID,
    Case,
    Config,
    Graph,
    K,
    KernelName,
    Launch,
    Program,
    Recorder,
    _fix,
    _window_case,
)

# Ops that only re-describe memory (never in a label unless nothing else is left); the same list as the
# project's documented rule for fused labels (DESIGN.md §3): view, _unsafe_view, reshape, t, transpose, ...
VIEW_OPS = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "split", "split_with_sizes",
            "squeeze", "unsqueeze", "as_strided", "slice", "select", "alias", "detach", "unbind"}

# (category, Original ATen ops) of the Triton kernels a graph draws from
TRITON_KERNELS = (
    ("poi", ("add", "mul")), ("per", ("native_layer_norm",)), ("poi", ("gelu",)), ("poi", ("relu",)),
    ("per", ("_softmax",)), ("per", ("add", "native_layer_norm")), ("red", ("mul", "sum")),
    ("poi", ("add", "view", "relu")), ("poi", ("cat", "clone")), ("poi", ("embedding", "add")),
)
EXTERN_CALLS = {"mm": ("aten::mm", (("gemm",), ("sgemm", "sgemm_splitk"))),
                "addmm": ("aten::addmm", (("gemm_bias",), ("gemm_bias_small",)))}


def label_of(ops: list[str], computed_elsewhere: set[str] = frozenset()) -> str:
    """``["add", "view", "relu"]`` -> ``"aten::add+aten::relu"``: view ops dropped unless nothing else is left,
    ops computed by another call site dropped, sorted."""
    kept = [op for op in ops if op not in computed_elsewhere]
    compute = [op for op in kept if op not in VIEW_OPS] or kept
    return "+".join(sorted({f"aten::{op}" for op in compute}))


@dataclass
class CallSite:
    """One call of ``call()``; ``kernels``: what runs on the GPU, in order."""

    kind: str  # "triton" | "extern"
    kernel: str  # the name in output_code.py: triton_poi_fused_add_mul_0 | extern_kernels.mm
    original_aten: list[str]  # op names without "aten.": ["add", "mul"]
    source_nodes: list[str]
    kernels: list[tuple[KernelName, Config]]
    label: str  # the truth operator of its kernels
    op: str | None = None  # extern: the ATen op the wrapper calls ("aten::mm")

    @property
    def profiler_name(self) -> str:
        """The name of the call's CPU-side event (Triton record function, or the extern ATen op)."""
        return self.kernel if self.kind == "triton" else self.op


@dataclass
class CompiledGraph:
    dir_name: str  # model__0_inference_0.0
    compile_id: str  # "0/0"
    fx_key: str
    sites: list[CallSite] = field(default_factory=list)
    generic_symbols: bool = False  # unique_kernel_names=False: every Triton GPU symbol is "triton_"


def _node(op: str, rng: random.Random) -> str:
    return op.strip("_") + (f"_{rng.randint(1, 9)}" if rng.random() < 0.5 else "")


def triton_site(category: str, ops: tuple[str, ...], index: int, rng: random.Random, generic: bool,
                computed_elsewhere: set[str] = frozenset(), nodes: list[str] | None = None) -> CallSite:
    name = f"triton_{category}_fused_{'_'.join(sorted(ops))}_{index}"
    symbol = "triton_" if generic else name
    config = Config((rng.choice((64, 128, 512, 4096)), 1, 1), (rng.choice((128, 256)), 1, 1))
    return CallSite("triton", name, list(ops), nodes or [_node(op, rng) for op in ops],
                    [(KernelName(symbol, symbol, symbol), config)], label_of(list(ops), computed_elsewhere))


def extern_site(which: str, rng: random.Random, single_kernel: bool = False, nodes: list[str] | None = None) -> CallSite:
    op, choices = EXTERN_CALLS[which]
    kernels = choices[0] if single_kernel else rng.choice(choices)
    return CallSite("extern", f"extern_kernels.{which}", [which], nodes or [_node(which, rng)],
                    [(K[k], rng.choice(CONFIGS[2:4])) for k in kernels], op, op)


def random_graph(rng: random.Random, dir_name: str, compile_id: str, single_kernel_externs: bool = False,
                 generic: bool | None = None) -> CompiledGraph:
    """3-6 call sites, about a third of them extern calls."""
    generic = rng.random() < 0.3 if generic is None else generic
    graph = CompiledGraph(dir_name, compile_id, f"f{rng.getrandbits(60):015x}", generic_symbols=generic)
    for _ in range(rng.randint(3, 6)):
        if rng.random() < 0.3:
            graph.sites.append(extern_site(rng.choice(("mm", "addmm")), rng, single_kernel_externs))
        else:
            category, ops = rng.choice(TRITON_KERNELS)
            graph.sites.append(triton_site(category, ops, _triton_count(graph), rng, generic))
    return renumber(graph)


def _triton_count(graph: CompiledGraph) -> int:
    return len({s.kernel for s in graph.sites if s.kind == "triton"})


def renumber(graph: CompiledGraph) -> CompiledGraph:
    """Number the Triton kernels by first use, as Inductor's wrapper does (``..._0``, ``..._1``); a reused
    kernel keeps one name."""
    names: dict[str, str] = {}
    for site in graph.sites:
        if site.kind != "triton":
            continue
        new = names.setdefault(site.kernel, f"{site.kernel.rsplit('_', 1)[0]}_{len(names)}")
        site.kernel = new
        if not graph.generic_symbols:
            site.kernels = [(KernelName(new, new, new), site.kernels[0][1])]
    return graph


# ================================================================================================================
# Running a graph


def run_sites(rec: Recorder, graph: CompiledGraph, sites: list[CallSite], tid: int, determined: dict) -> None:
    """Launch the call sites (Triton record function + ``cuLaunchKernel``; extern op + its kernels)."""
    for i, site in enumerate(sites):
        truth = {"source_nodes": list(site.source_nodes), **determined.get(i, {})}
        if site.kind == "triton":
            with rec.op(site.kernel, tid, kernel_backend="triton", kernel_name=site.kernel,
                        kernel_file=f"/tmp/torchinductor_user/{site.kernel[-2:]}/c{site.kernel}.py", stream=0):
                kernel, config = site.kernels[0]
                rec.launch(kernel, config, tid, 0, 7, api="cuLaunchKernel", operator=site.label, **truth)
        else:
            with rec.op(site.op, tid):
                for kernel, config in site.kernels:
                    rec.launch(kernel, config, tid, 0, 7, operator=site.op, **truth)


def run_graph(rec: Recorder, graph: CompiledGraph, tid: int = MAIN_TID, determined: dict | None = None,
              region: bool = True) -> None:
    """One execution of ``call()`` inside its Dynamo region and its ``## Call CompiledFxGraph`` range."""
    with rec.op(f"Torch-Compiled Region: {graph.compile_id}", tid), \
            rec.op(f"## Call CompiledFxGraph {graph.fx_key} ##", tid):
        run_sites(rec, graph, graph.sites, tid, determined or {})


def region_determinacy(graph: CompiledGraph, graphs: list[CompiledGraph]) -> dict[int, dict]:
    """Per call site of ``graph``: whether its operator and source nodes are determined when a region shows its
    profiler-name sequence (every graph with that sequence is a candidate; agreement decides)."""
    names = [s.profiler_name for s in graph.sites]
    candidates = [g for g in graphs if [s.profiler_name for s in g.sites] == names]
    out = {}
    for i, site in enumerate(graph.sites):
        out[i] = {"operator_determined": all(g.sites[i].label == site.label for g in candidates),
                  "source_nodes_determined": all(g.sites[i].source_nodes == site.source_nodes for g in candidates)}
    return out


def _eager_ops(rec: Recorder, rng: random.Random, count: int) -> None:
    for _ in range(count):
        rec.run_tree(_fix(rng.choice(FORWARD_TEMPLATES), rng), MAIN_TID, 0, 7)


def _iterations(rec: Recorder, rng: random.Random, n: int, step) -> None:
    """``n`` iterations under ``ProfilerStep#i``: an eager op, ``step(i)``, an eager op."""
    rec.thread(MAIN_TID, "python3.12")
    for i in range(n):
        with rec.op(f"ProfilerStep#{i}", MAIN_TID, kind="user_annotation"):
            _eager_ops(rec, rng, 1)
            step(i)
            _eager_ops(rec, rng, 1)


def _new(rng: random.Random) -> tuple[Program, Recorder]:
    program = Program()
    return program, Recorder(program, rng, rng.randint(2_000, 60_000), rng.randint(1_000_000, 9_000_000))


def _finish(scenario: str, seed: int, rng: random.Random, program: Program, graphs: list[CompiledGraph]) -> Case:
    case = _window_case(scenario, seed, rng, "kineto", program, sorted(program.launches, key=_launch_order))
    case.inductor_graphs = graphs
    return case


def _launch_order(k: Launch) -> tuple:
    return (k.call.start_ns, k.start_ns)


# ================================================================================================================
# Scenarios


def scenario_recompiled_graphs(seed: int, rng: random.Random) -> Case:
    """Two graphs of one frame (``0/0``, ``0/1``) sharing a kernel name; sometimes the recompiled graph has the
    same call sites with other source nodes (then its regions cannot tell which graph ran)."""
    program, rec = _new(rng)
    g0 = random_graph(rng, "model__0_inference_0.0", "0/0")
    g1 = CompiledGraph("model__0_inference_0.1", "0/1", f"f{rng.getrandbits(60):015x}",
                       generic_symbols=g0.generic_symbols)
    if seed % 3 == 2:  # same kernels, renamed nodes (a recompilation for another shape)
        g1.sites = [CallSite(s.kind, s.kernel, s.original_aten, [n + "_1" for n in s.source_nodes], s.kernels,
                             s.label, s.op) for s in g0.sites]
    else:
        shared = next((s for s in g0.sites if s.kind == "triton"), None)
        g1.sites = [] if shared is None else [triton_site(shared.kernel.split("_")[1], tuple(shared.original_aten),
                                                         int(shared.kernel.rsplit("_", 1)[1]), rng, g0.generic_symbols)]
        g1.sites += random_graph(rng, "", "", generic=g0.generic_symbols).sites
        renumber(g1)  # the shared kernel is the first Triton kernel of both graphs: the same name
    graphs = [g0, g1]
    truth = {id(g): region_determinacy(g, graphs) for g in graphs}
    _iterations(rec, rng, rng.randint(2, 4), lambda i: run_graph(rec, graphs[i % 2], determined=truth[id(graphs[i % 2])]))
    return _finish("recompiled_graphs", seed, rng, program, graphs)


def scenario_extern_in_provenance(seed: int, rng: random.Random) -> Case:
    """``extern_kernels.mm`` followed by a Triton epilogue whose provenance lists ``aten.mm`` too."""
    program, rec = _new(rng)
    graph = random_graph(rng, "model__0_inference_0.0", "0/0")
    mm = extern_site("mm", rng)
    epilogue_ops = rng.choice((("mm", "add", "relu"), ("mm", "add"), ("mm", "mul", "gelu")))
    nodes = mm.source_nodes + [_node(op, rng) for op in epilogue_ops[1:]]
    epilogue = triton_site("poi", epilogue_ops, _triton_count(graph), rng, graph.generic_symbols,
                           computed_elsewhere={"mm"}, nodes=nodes)
    at = rng.randint(0, len(graph.sites))
    graph.sites[at:at] = [mm, epilogue]
    renumber(graph)
    truth = region_determinacy(graph, [graph])
    _iterations(rec, rng, rng.randint(2, 3), lambda i: run_graph(rec, graph, determined=truth))
    return _finish("extern_in_provenance", seed, rng, program, [graph])


def scenario_reduce_overhead(seed: int, rng: random.Random) -> Case:
    """``mode="reduce-overhead"``: one eager run of the graph, its capture, then CUDA-graph replays inside the
    Dynamo region (with or without the ``## Call CompiledFxGraph`` range around ``cudaGraphLaunch``)."""
    program, rec = _new(rng)
    graph = random_graph(rng, "model__0_inference_0.0", "0/0", single_kernel_externs=True)
    truth = region_determinacy(graph, [graph])
    cuda_graph = Graph(graph_id=rng.randint(1, 9))
    call_range = seed % 2 == 1

    def step(i: int) -> None:
        if i == 0:
            run_graph(rec, graph, determined=truth)
            with rec.op(f"Torch-Compiled Region: {graph.compile_id}", MAIN_TID), rec.capture(cuda_graph, MAIN_TID):
                run_sites(rec, graph, graph.sites, MAIN_TID, truth)
            rec.instantiate(cuda_graph, MAIN_TID)
            return
        with rec.op(f"Torch-Compiled Region: {graph.compile_id}", MAIN_TID):
            if call_range:
                with rec.op(f"## Call CompiledFxGraph {graph.fx_key} ##", MAIN_TID):
                    rec.replay(cuda_graph, MAIN_TID, 0, operator_determined=True)
            else:
                rec.replay(cuda_graph, MAIN_TID, 0, operator_determined=True)

    _iterations(rec, rng, rng.randint(3, 4), step)
    case = _finish("reduce_overhead", seed, rng, program, [graph])
    case.notes["call_range"] = call_range
    return case


def scenario_partial_window(seed: int, rng: random.Random) -> Case:
    """A graph with one Triton kernel reused at two call sites (other source nodes); the trace starts inside the
    first iteration's region, so that region's first call sites, its region ranges and ``ProfilerStep#0`` are
    missing."""
    program, rec = _new(rng)
    graph = random_graph(rng, "model__0_inference_0.0", "0/0")
    category, ops = rng.choice(TRITON_KERNELS)
    reused = triton_site(category, ops, _triton_count(graph), rng, graph.generic_symbols)
    again = CallSite("triton", reused.kernel, reused.original_aten, [f"{op.strip('_')}_{rng.randint(10, 19)}" for op in ops],
                     reused.kernels, reused.label)
    graph.sites[1:1] = [reused]
    graph.sites.append(again)
    renumber(graph)
    truth = region_determinacy(graph, [graph])
    sites_of = {}
    for s in graph.sites:
        sites_of.setdefault(s.profiler_name, []).append(s)
    cut_site = rng.randint(1, len(graph.sites) - 1)
    marks = {}

    def step(i: int) -> None:
        if i:
            return run_graph(rec, graph, determined=truth)
        with rec.op(f"Torch-Compiled Region: {graph.compile_id}", MAIN_TID), \
                rec.op(f"## Call CompiledFxGraph {graph.fx_key} ##", MAIN_TID):
            for j, site in enumerate(graph.sites):
                if j == cut_site:
                    marks["cut"] = rec.tick()
                others = sites_of[site.profiler_name]
                partial = {"operator_determined": all(s.label == site.label for s in others),
                           "source_nodes_determined": len(others) == 1}
                run_sites(rec, graph, [site], MAIN_TID, {0: partial})

    _iterations(rec, rng, rng.randint(2, 3), step)
    cut_before(program, marks["cut"])
    case = _finish("partial_window", seed, rng, program, [graph])
    case.notes["cut_site"] = cut_site
    return case


def cut_before(program: Program, t: int) -> None:
    """What a trace started at ``t`` keeps: ops and API calls that start at or after ``t``, and the kernels of
    the kept calls."""
    program.ops = [op for op in program.ops if op.start_ns >= t]
    program.calls = [c for c in program.calls if c.start_ns >= t]
    program.launches = [k for k in program.launches if k.call.start_ns >= t]


INDUCTOR_SCENARIOS = {
    "recompiled_graphs": scenario_recompiled_graphs,
    "reduce_overhead": scenario_reduce_overhead,
    "extern_in_provenance": scenario_extern_in_provenance,
    "partial_window": scenario_partial_window,
}


# ================================================================================================================
# Debug directories

_HEADER = """# AOT ID: ['0_inference']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
from torch._inductor.codegen.multi_kernel import MultiKernelCall
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import grid, split_scan_grid, grid_combo_kernels, start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
"""

_TRITON_DEF = """

# kernel path: /tmp/torchinductor_user/{short}/c{name}.py
# {comment}
{name} = async_compile.triton('{symbol}', '''
import triton
import triton.language as tl
from triton.compiler.compiler import AttrsDescriptor

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints=[4096],
    filename=__file__,
    triton_meta={{'signature': {{'in_ptr0': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32'}}, 'device': DeviceProperties(type='cuda', index=0, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, multi_processor_count=132), 'constants': {{}}}},
    inductor_meta={{'autotune_hints': set(), 'kernel_name': '{name}', 'mutated_arg_names': [], 'no_x_dim': False, 'num_load': 1, 'num_reduction': 0}},
    min_elem_per_thread=0
)
@triton.jit
def {symbol}(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + (xindex), xmask)
    tl.store(out_ptr0 + (xindex), tmp0, xmask)
''', device_str='cuda')
"""


def source_comment(site: CallSite) -> str:
    return (f"Topologically Sorted Source Nodes: [{', '.join(site.source_nodes)}], "
            f"Original ATen: [{', '.join('aten.' + op for op in site.original_aten)}]")


def output_code(graph: CompiledGraph) -> str:
    """``output_code.py`` of a graph: kernel definitions, then ``call()`` with one comment per call site."""
    parts = [_HEADER]
    defined = set()
    for site in graph.sites:
        if site.kind == "triton" and site.kernel not in defined:
            defined.add(site.kernel)
            parts.append(_TRITON_DEF.format(short=site.kernel[-2:], name=site.kernel, comment=source_comment(site),
                                            symbol=site.kernels[0][0].demangled))
    parts.append("\n\nasync_compile.wait(globals())\ndel async_compile\n\ndef call(args):\n"
                 "    arg0_1, arg1_1 = args\n    args.clear()\n"
                 "    assert_size_stride(arg0_1, (64, 64), (64, 1))\n"
                 "    with torch.cuda._DeviceGuard(0):\n        torch.cuda.set_device(0)\n")
    stream = False
    for i, site in enumerate(graph.sites):
        parts.append(f"        buf{i} = empty_strided_cuda((64, 64), (64, 1), torch.float32)\n")
        parts.append(f"        # {source_comment(site)}\n")
        if site.kind == "triton":
            if not stream:
                parts.append("        stream0 = get_raw_stream(0)\n")
                stream = True
            parts.append(f"        {site.kernel}.run({'arg0_1' if i == 0 else f'buf{i - 1}'}, buf{i}, 4096, "
                         "grid=grid(4096), stream=stream0)\n")
        else:
            parts.append(f"        {site.kernel}({'arg0_1' if i == 0 else f'buf{i - 1}'}, arg1_1, out=buf{i})\n")
    parts.append(f"    return (buf{len(graph.sites) - 1}, )\n\n\n"
                 "def benchmark_compiled_module(times=10, repeat=10):\n    return None\n\n\n"
                 "if __name__ == \"__main__\":\n    from torch._inductor.wrapper_benchmark import compiled_module_main\n"
                 "    compiled_module_main('model', benchmark_compiled_module)\n")
    return "".join(parts)


_OVERLOAD = {"mm": "default", "addmm": "default", "native_layer_norm": "default", "_softmax": "default",
             "embedding": "default", "clone": "default", "cat": "default", "gelu": "default", "relu": "default",
             "sum": "dim_IntList", "view": "default"}


def fx_graph_readable(graph: CompiledGraph) -> str:
    """``fx_graph_readable.py``: one post-grad node per source node, named like it, with its ATen target."""
    lines = ["class <lambda>(torch.nn.Module):",
             '    def forward(self, arg0_1: "f32[64, 64]", arg1_1: "f32[64, 64]"):']
    seen = set()
    for n, site in enumerate(graph.sites):
        lines.append(f"         # File: /tmp/model.py:{10 + n} in forward, code: y{n} = step{n}(x)")
        for node, op in zip(site.source_nodes, site.original_aten):
            if node in seen:
                continue
            seen.add(node)
            lines.append(f'        {node}: "f32[64, 64]" = torch.ops.aten.{op}.{_OVERLOAD.get(op, "Tensor")}(arg0_1)')
    lines.append("        return (arg0_1,)")
    return "\n".join(lines) + "\n"


def write_debug_dirs(graphs: list[CompiledGraph], folder: Path) -> None:
    """``folder/torchinductor/<graph dir>/{output_code.py, fx_graph_readable.py}`` per graph."""
    for graph in graphs:
        d = Path(folder) / "torchinductor" / graph.dir_name
        d.mkdir(parents=True, exist_ok=True)
        (d / "output_code.py").write_text(output_code(graph))
        (d / "fx_graph_readable.py").write_text(fx_graph_readable(graph))
