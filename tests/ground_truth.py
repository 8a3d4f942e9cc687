"""Programs with known truth: the measuring instrument of the joins (test support, not a test).

``generate(scenario, seed, folder)`` draws a random PyTorch-like program, writes what the profilers would have
written for it (an nsys SQLite export or a Kineto trace, ncu CSVs, Inductor debug directories; the formats are
in :mod:`truth_formats`) and ``truth.json``: for every timeline kernel its operator, its ncu row and whether the
input determines each. Nothing here imports the code under test: the truth follows from how the program was
built, and the determinability rules below are computed from the keys the input shows.

The program
-----------
Ops run on a main thread (forward) and an autograd thread (backward), one thread at a time (the same interleaving
in every run of the program). Each op is a tree of profiler ops (``aten::linear`` > ``aten::addmm``); its leaf
ATen ops launch 0..3 kernels with real kernel names (mangled/demangled/function triples copied from the real nsys
exports' ``StringIds``), shared across ops (one fill kernel for ``aten::fill_`` under ``aten::zero_`` and under
``aten::zeros``), templated (``vectorized_elementwise_kernel<...>`` for add, mul, fill, copy: one function base),
with 1-3 launch configurations each (same-configuration repeats). The body repeats once per iteration on one or
two streams. Every kernel has its own start time (ns), so ``(device, start_ns)`` names it in every reader.

Truth of the operator: the innermost dispatcher op (``ns::name``) enclosing the kernel's launch on its thread
(a graph node: at capture time); a kernel launched outside every op has no operator (an answer is wrong). A kernel
of an Inductor call site is labelled with the call site's ATen ops without pure view ops and without the ops an
extern call computes (sorted, joined by ``+``). A kernel under a ``user_annotation`` only (no op) is labelled by
the innermost annotation that is no iteration marker (``ProfilerStep#N``) and no compiled-graph marker.

Truth of the counters: the ncu row of the same launch in the ncu run (each row's ``smsp__inst_executed.sum`` is a
token naming its launch, ``1_000_000 + uid``; rows of launches the timeline lacks have tokens from 900_000).

What the input determines, per scenario
---------------------------------------
A scenario with variants picks one by ``seed`` modulo their number, so a few consecutive seeds cover them all; the
rest (timeline format nsys/Kineto, Kineto time layout, ncu page raw/details, digit grouping) is drawn at random.

Keys are (kernel, grid, block). A *scope* is one (process, device). Threads never launch concurrently, so within
a scope both runs launch in the same order, except the nodes of one CUDA-graph launch (below).

* ``clean``, ``name_variants``, ``data_parallel``, ``cuda_graph``, Inductor and Kineto scenarios: the window is
  declared as kernel ids (our replay's path) and ncu profiled every launch in it: every pairing is determined,
  position by position per scope, whatever the names look like (``name_variants``: function bases, mangled names,
  another demangler); the names only confirm it.
* ``cuda_graph``: ncu profiles a graph launch's nodes as kernels in some topological order: per captured stream
  the order is kept, across streams it is free. Nodes of one launch with the same key on more than one stream
  cannot be told apart (not determined); same key on one stream, or a key unique in the launch, is determined.
  Operators of node kernels: determined from nsys (the capture-time node creation lies in its op's NVTX range),
  not from Kineto (capture-time launches carry no node id).
* An ncu file whose window is not declared may hold any subsequence of the process's launches (kernel filters):
  a row is determined when every embedding of the file's key sequence in the process's launch sequence puts it
  on the same kernel (the leftmost and the rightmost embedding agree on it).
* ``ncu_missing_launch``: no window; ncu lacks one launch, or profiled only the kernels a name filter
  (``-k regex:``) matched (the embedding rule), or has one extra launch (a helper kernel with a new or an
  existing key): a row is determined when every alignment that explains the difference by one deletion pairs it
  with the same kernel; with a repeated key next to the gap the rows and kernels of the repeat are not.
* ``launch_window``: ncu ran with ``--launch-skip S --launch-count C`` (launches of the process, no kernel
  filter): declared, every row is determined; ``launch_window_unknown``: declared ``contiguous`` (odd seeds),
  the rows are determined when their key sequence occurs at exactly one offset of the process's launch
  sequence; not declared at all (even seeds), the embedding rule.
* ``segments_shuffled``: two ncu files of consecutive launch ranges, passed in the reverse order, IDs from 0 in
  each; no windows: the embedding rule per file (no reasoning across files);
  ``segments_windowed``: the same with both windows declared (``launch_skip``/``launch_count``): determined.
* ``multi_process``: two ranks in one nsys export and in one ncu CSV (``--target-processes all``, ncu's own
  pids, IDs global, the processes interleaved differently). Both sides hold the same processes, one to one: an
  ncu process is determined when a ``--process-map`` is given or every one-to-one map in which each ncu
  process's key sequence is a subsequence of its timeline process's sends it to the same process (rank 1
  launching an extra kernel per iteration, which rank 0's ncu process fits as a subsequence but rank 1's ncu
  process fits only rank 1); two identical ranks are not, on one device or on two: device ordinals do not tell
  processes apart (each process numbers the GPUs it sees, e.g. under ``CUDA_VISIBLE_DEVICES``).
* ``data_parallel``: one process, two devices driven by two threads (ncu ``Device`` 0/1); the interleaving of
  the devices differs between the runs; per device the order is fixed: determined.
* Inductor (Kineto + debug dirs): a region's graph is determined when one compiled graph has its call-site
  sequence (or all graphs that have it agree on the call sites); ``partial_window``: the first iteration is cut
  (the trace starts mid-iteration): its kernels have no region; an operator is determined when every call site
  of the kernel's name agrees on it; source nodes of a name with two call sites are not determined there.
  ``reduce_overhead``: node kernels of a compiled graph's replay are determined by name and order in the replay
  (one stream, one kernel per extern call). ``extern_in_provenance``: an op a Triton call site lists but an
  extern call of the same graph (sharing a source node) computes is not in the Triton kernel's label.
* ``user_annotation``: kernels under ``Optimizer.step#FusedAdam.step`` only: that annotation is the operator.
  ``external_id``: some kernels' ``External id`` names another op than their launch's: the launch's enclosing op
  is the truth (correlation wins), and the disagreements are counted in ``truth.json``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# ================================================================================================================
# Kernel names (real triples: KERNEL.mangledName / demangledName / shortName of the real nsys exports)


@dataclass(frozen=True)
class KernelName:
    """A kernel function as the tools name it: ``demangled`` (nsys/CUPTI style, ``<(int)4, ...>``), ``mangled``
    (Itanium; equal to ``demangled`` for ``extern "C"`` names such as cuBLAS ``nvjet_*`` and Triton kernels) and
    ``function`` (ncu ``--print-kernel-base function``)."""

    mangled: str
    demangled: str
    function: str


def _vec(mangled: str, demangled: str) -> KernelName:
    return KernelName(mangled, demangled, "vectorized_elementwise_kernel")


def _plain(name: str) -> KernelName:
    return KernelName(name, name, name)


K = {
    "add": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
                "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
                "std::array<char *, (unsigned long)3>>(int, T2, T3)"),
    "add_self": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_21CUDAFunctorOnSelf_addIfEESt5arrayIPcLm2"
                     "EEEEviT0_T1_",
                     "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctorOnSelf_add<float>, "
                     "std::array<char *, (unsigned long)2>>(int, T2, T3)"),
    "add_ew": KernelName(
        "_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_15gpu_kernel_implINS0_15CUDAFunctor_addIfEEEEvRNS_18Tensor"
        "IteratorBaseERKT_EUliE_EEviT1_",
        "void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl<at::native::"
        "CUDAFunctor_add<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        "elementwise_kernel"),
    "mul": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15binary_internal10Mul"
                "FunctorIfEEEESt5arrayIPcLm3EEEEviT0_T1_",
                "void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, float, "
                "at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)3>>(int, T2, T3)"),
    "mul_scalar": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13AUnaryFunctorIfffNS0_15binary_internal"
                       "10MulFunctorIfEEEESt5arrayIPcLm2EEEEviT0_T1_",
                       "void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<float, float, "
                       "float, at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)2>>"
                       "(int, T2, T3)"),
    "fill": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
                 "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
                 "std::array<char *, (unsigned long)1>>(int, T2, T3)"),
    "copy_bf16": _vec("_ZN2at6native29vectorized_elementwise_kernelILi8EZNS0_25bfloat16_copy_kernel_cudaERNS_18Tensor"
                      "IteratorBaseEEUlfE_St5arrayIPcLm2EEEEviT0_T1_",
                      "void at::native::vectorized_elementwise_kernel<(int)8, at::native::bfloat16_copy_kernel_cuda("
                      "at::TensorIteratorBase &)::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>"
                      "(int, T2, T3)"),
    "pow": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4EZNS0_51_GLOBAL__N__b1108092_12_PowKernel_cu_398dda3b"
                "_2224229pow_tensor_scalar_kernel_implIffEEvRNS_18TensorIteratorBaseET0_EUlfE_St5arrayIPcLm2EEEEviS6_T1_",
                "void at::native::vectorized_elementwise_kernel<(int)4, void at::native::<unnamed>::pow_tensor_scalar_"
                "kernel_impl<float, float>(at::TensorIteratorBase &, T2)::[lambda(float) (instance 1)], "
                "std::array<char *, (unsigned long)2>>(int, T2, T3)"),
    "eq": _vec("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIffbNS0_51_GLOBAL__N__28ce311f_18_"
               "CompareEQKernel_cu_d8008c9616CompareEqFunctorIfEEEESt5arrayIPcLm3EEEEviT0_T1_",
               "void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, bool, "
               "at::native::<unnamed>::CompareEqFunctor<float>>, std::array<char *, (unsigned long)3>>(int, T2, T3)"),
    "mean": KernelName("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOpsIffffEEjfLi4ELi4EEEEEvT1_",
                       "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps"
                       "<float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)", "reduce_kernel"),
    "layer_norm": KernelName(
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a28vectorized_layer_norm_kernelIffLb0EEEvi"
        "T0_PKT_S6_S6_PS3_S7_PS4_",
        "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, const T1 *, "
        "const T1 *, const T1 *, T2 *, T2 *, T1 *)", "vectorized_layer_norm_kernel"),
    "softmax": KernelName("_ZN43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6320softmax_warp_forwardIfffLi7ELb0ELb0EEEvPT0"
                          "_PKT_iiiPKbib",
                          "void <unnamed>::softmax_warp_forward<float, float, float, (int)7, (bool)0, (bool)0>(T2 *, "
                          "const T1 *, int, int, int, const bool *, int, bool)", "softmax_warp_forward"),
    "gather": KernelName("_ZN2at6native24vectorized_gather_kernelILi16ElEEvPcS2_PT0_illllb",
                         "void at::native::vectorized_gather_kernel<(int)16, long>(char *, char *, T2 *, int, long, "
                         "long, long, long, bool)", "vectorized_gather_kernel"),
    "nll_bwd": KernelName("_ZN2at6native39_GLOBAL__N__df250f02_7_Loss_cu_5b0651e139nll_loss_backward_reduce_cuda_kernel"
                          "_2dIflEEvPT_PKS3_PKT0_S6_S6_biill",
                          "void at::native::<unnamed>::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(T1 *, "
                          "const T1 *, const T2 *, const T1 *, const T1 *, bool, int, int, long, long)",
                          "nll_loss_backward_reduce_cuda_kernel_2d"),
    "gemm": _plain("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN"),
    "gemm_nt": _plain("nvjet_tst_192x192_64x3_1x2_h_bz_coopB_NTN"),
    "gemm_bias": _plain("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"),
    "gemm_bias_small": _plain("nvjet_tst_96x64_64x10_1x2_h_bz_bias_TNN"),
    "sgemm": _plain("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_"
                    "alignc4_execute_kernel__5x_cublas"),
    "sgemm_splitk": _plain("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_"
                           "aligna4_alignc4_execute_split_k_kernel__5x_cublas"),
    "saxpy": KernelName("_Z5saxpyPdS_S_di", "saxpy(double *, double *, double *, double, int)", "saxpy"),
}
# Shaped like the real A100 trace's optimizer kernel; Kineto shows demangled names only.
MULTI_TENSOR_APPLY = _plain(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
    "(at::native::ADAM_MODE)0, false>, double, double, double, double, double, double, bool, float*, float*>"
    "(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false>, double, double, double, double, double, "
    "double, bool, float*, float*)")


def ncu_printed(kernel: KernelName, style: str) -> str:
    """The name ncu prints for ``kernel``: ``--print-kernel-base demangled|function|mangled``, or ``demangled`` by
    another demangler (``other_demangler``: no ``(int)`` casts, no ``void`` return type, ``> >`` between closing
    template brackets; docs/formats.md#ncu-kernel-names)."""
    if style == "demangled":
        return kernel.demangled
    if style == "function":
        return kernel.function
    if style == "mangled":
        return kernel.mangled
    if style == "other_demangler":
        text = re.sub(r"\((?:unsigned )?(?:int|long|bool|char)\)(?=-?\d)", "", kernel.demangled)
        text = text.removeprefix("void ")
        while ">>" in text:
            text = text.replace(">>", "> >")
        return text
    raise ValueError(f"unknown ncu name style {style!r}")


@dataclass(frozen=True)
class Config:
    """A launch configuration (grid, block), as three ints each."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]


# ================================================================================================================
# Op templates: which profiler ops a call makes and which kernels its ATen ops launch


@dataclass(frozen=True)
class Leaf:
    """An op launching kernels: ``choices`` are alternative kernel lists (one is drawn per call site)."""

    name: str
    choices: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Wrap:
    """An op enclosing other ops (``aten::linear`` > ``aten::addmm``), launching nothing itself."""

    name: str
    children: tuple


FORWARD_TEMPLATES = (
    Wrap("aten::linear", (Leaf("aten::addmm", (("gemm_bias",), ("gemm_bias_small",))),)),
    Wrap("aten::matmul", (Leaf("aten::mm", (("gemm",), ("sgemm", "sgemm_splitk"), ("gemm_nt",))),)),
    Wrap("aten::layer_norm", (Leaf("aten::native_layer_norm", (("layer_norm",),)),)),
    Wrap("aten::to", (Wrap("aten::_to_copy", (Leaf("aten::copy_", (("copy_bf16",),)),)),)),
    Wrap("aten::zeros", (Wrap("aten::zero_", (Leaf("aten::fill_", (("fill",),)),)),)),
    Leaf("aten::add", (("add",), ("add_ew",))),
    Leaf("aten::mul", (("mul",), ("mul_scalar",))),
    Leaf("aten::pow", (("pow",),)),
    Leaf("aten::eq", (("eq",),)),
    Leaf("aten::mean", (("mean",),)),
    Wrap("aten::softmax", (Leaf("aten::_softmax", (("softmax",),)),)),
    Leaf("aten::gather", (("gather",),)),
    Leaf("aten::fill_", (("fill",),)),
    Leaf("aten::view", ((),)),
    Leaf("aten::empty_strided", ((),)),
)

BACKWARD_TEMPLATES = (
    Wrap("autograd::engine::evaluate_function: MmBackward0",
         (Wrap("MmBackward0", (Leaf("aten::mm", (("gemm",), ("gemm_nt",))), Leaf("aten::mm", (("gemm_nt",),)))),)),
    Wrap("autograd::engine::evaluate_function: MulBackward0",
         (Wrap("MulBackward0", (Leaf("aten::mul", (("mul",), ("mul_scalar",))),)),)),
    Wrap("autograd::engine::evaluate_function: NllLossBackward0",
         (Wrap("NllLossBackward0", (Leaf("aten::nll_loss_backward", (("nll_bwd",),)),)),)),
    Wrap("autograd::engine::evaluate_function: AddBackward0", (Wrap("AddBackward0", ()),)),
    Wrap("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
         (Wrap("torch::autograd::AccumulateGrad", (Leaf("aten::add_", (("add_self",),)),)),)),
)

CONFIGS = (
    Config((4096, 1, 1), (128, 1, 1)), Config((8192, 1, 1), (128, 1, 1)), Config((2, 66, 1), (384, 1, 1)),
    Config((1, 48, 5), (128, 1, 1)), Config((975, 1, 1), (32, 16, 1)), Config((15600, 1, 1), (32, 4, 1)),
)
DISPATCHER_OP = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_][\w.]*$")  # aten::mm, c10d::allreduce_ (not autograd nodes)
ITERATION_MARKER = re.compile(r"^(?:ProfilerStep#|opprof\.iteration:)\d+$")


def iteration_marker(fmt: str) -> str:
    """The prefix of a measured iteration's range: torch.profiler's ``ProfilerStep#N`` in a Kineto trace, our
    harness's ``opprof.iteration:N`` NVTX range in an nsys capture. Without them the launches of the main and
    the autograd thread that alternate over iterations could be two threads running on their own (DESIGN.md §3,
    bags): the matcher would refuse the kernels both threads launch."""
    return "ProfilerStep#" if fmt == "kineto" else "opprof.iteration:"
COMPILED_GRAPH_MARKER = "## Call CompiledFxGraph"


@dataclass
class Call:
    """One call site of the program body: a template with its kernels and configurations fixed."""

    tree: object  # Leaf/Wrap with, per Leaf, the chosen kernels: see ``_fix``
    thread: str  # "main" | "autograd"
    stream: int


def _with_config(tree, rng: random.Random):
    """The fixed template ``tree`` with every launch given another configuration than its own."""
    kind, name, rest = tree
    if kind == "leaf":
        return ("leaf", name, [(k, rng.choice([c for c in CONFIGS if c != config])) for k, config in rest])
    return ("wrap", name, [_with_config(c, rng) for c in rest])


def _fix(template, rng: random.Random):
    """A template with each Leaf's kernels drawn: ``("leaf", name, [(kernel key, Config), ...])``."""
    if isinstance(template, Leaf):
        kernels = rng.choice(template.choices)
        return ("leaf", template.name, [(k, rng.choice(CONFIGS[: 2 + len(k) % 3])) for k in kernels])
    return ("wrap", template.name, [_fix(c, rng) for c in template.children])


# ================================================================================================================
# The program model (what happened; the writers turn it into files)


@dataclass
class Op:
    """One profiler op (``cpu_op``) or annotation (``user_annotation``) on a thread, ns."""

    name: str
    pid: int
    tid: int
    start_ns: int
    end_ns: int = 0
    kind: str = "cpu_op"
    external_id: int = 0
    args: dict = field(default_factory=dict)


@dataclass
class ApiCall:
    """A CUDA runtime/driver call (a launch) on a thread; ``kernels`` it started (none during graph capture)."""

    name: str  # cudaLaunchKernel | cuLaunchKernel | cudaGraphLaunch
    pid: int
    tid: int
    start_ns: int
    end_ns: int
    correlation: int
    external_id: int = 0


@dataclass
class NodeEvent:
    """A CUDA-graph node creation at capture time (``original`` None) or its clone at instantiation."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    node_id: int
    original: int | None = None


@dataclass
class Launch:
    """One kernel execution of the timeline, with its truth."""

    uid: int
    pid: int
    tid: int
    device: int
    stream: int
    kernel: KernelName
    config: Config
    call: ApiCall
    start_ns: int
    end_ns: int
    operator: str | None
    operator_determined: bool = True
    external_id: int | None = None  # the kernel record's External id (Kineto); None: the launch's
    graph_id: int | None = None
    graph_node_id: int | None = None
    replay: int | None = None  # index of the graph launch it belongs to
    source_nodes: list[str] | None = None  # Inductor call site's source nodes (None: not an Inductor kernel)
    source_nodes_determined: bool = True

    @property
    def key(self) -> tuple:
        return (self.kernel.mangled, self.config.grid, self.config.block)


@dataclass
class Program:
    """Everything the program did, per process; times in ns."""

    processes: dict[int, str] = field(default_factory=dict)
    threads: dict[tuple[int, int], str] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    calls: list[ApiCall] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    node_events: list[NodeEvent] = field(default_factory=list)
    devices: set[int] = field(default_factory=set)
    used_starts: set[tuple[int, int]] = field(default_factory=set)  # (device, start_ns) taken

    def launches_of(self, pid: int) -> list[Launch]:
        """The process's kernels in launch order (launch call start, then kernel start)."""
        return sorted((k for k in self.launches if k.pid == pid), key=lambda k: (k.call.start_ns, k.start_ns))


@dataclass
class CapturedNode:
    kernel: KernelName
    config: Config
    stream: int
    operator: str | None
    node_id: int
    source_nodes: list[str] | None = None


@dataclass
class Graph:
    """A captured CUDA graph: its nodes in capture order."""

    graph_id: int
    nodes: list[CapturedNode] = field(default_factory=list)
    exec_offset: int = 1000  # instantiated node id = capture node id + offset (nsys clones)


class Recorder:
    """Records one process's activity with a running clock; ops nest as ``with`` blocks per thread."""

    def __init__(self, program: Program, rng: random.Random, pid: int, start_ns: int, name: str = "python3.12"):
        self.program, self.rng, self.pid, self.now = program, rng, pid, start_ns
        self.stack: dict[int, list[Op]] = {}
        self.stream_free: dict[tuple[int, int], int] = {}
        self.correlation = 100 + rng.randrange(50)
        self.external_id = 1
        self.capturing: Graph | None = None
        self.replays = 0
        program.processes[pid] = name

    # -- clock and ids
    def tick(self, low: int = 200, high: int = 900) -> int:
        self.now += self.rng.randint(low, high)
        return self.now

    def _next_correlation(self) -> int:
        self.correlation += 1 + self.rng.randrange(3)
        return self.correlation

    def _next_external_id(self) -> int:
        self.external_id += 1
        return self.external_id

    def thread(self, tid: int, name: str) -> None:
        self.program.threads[(self.pid, tid)] = name

    # -- ops
    @contextmanager
    def op(self, name: str, tid: int, kind: str = "cpu_op", **args) -> Iterator[Op]:
        op = Op(name, self.pid, tid, self.tick(), kind=kind, external_id=self._next_external_id(), args=args)
        self.program.ops.append(op)
        self.stack.setdefault(tid, []).append(op)
        try:
            yield op
        finally:
            self.stack[tid].pop()
            op.end_ns = self.tick(100, 400)

    def enclosing(self, tid: int) -> list[Op]:
        return list(self.stack.get(tid, []))

    def truth_operator(self, tid: int) -> str | None:
        """The innermost dispatcher op open on the thread; else the innermost annotation that is no marker."""
        stack = self.enclosing(tid)
        for op in reversed(stack):
            if op.kind == "cpu_op" and DISPATCHER_OP.match(op.name):
                return op.name
        for op in reversed(stack):
            if op.kind == "user_annotation" and not ITERATION_MARKER.match(op.name) \
                    and not op.name.startswith(COMPILED_GRAPH_MARKER):
                return op.name
        return None

    # -- GPU work
    def _kernel_time(self, device: int, stream: int, ready: int, duration: int) -> tuple[int, int]:
        start = max(ready + self.rng.randint(1500, 4000), self.stream_free.get((device, stream), 0) + 300)
        while (device, start) in self.program.used_starts:
            start += 1
        self.program.used_starts.add((device, start))
        self.stream_free[(device, stream)] = start + duration
        return start, start + duration

    def api(self, name: str, tid: int) -> ApiCall:
        start = self.tick()
        stack = self.enclosing(tid)
        call = ApiCall(name, self.pid, tid, start, start + self.rng.randint(2000, 6000), self._next_correlation(),
                       stack[-1].external_id if stack else 0)
        self.now = call.end_ns
        self.program.calls.append(call)
        return call

    def launch(self, kernel: KernelName, config: Config, tid: int, device: int, stream: int,
               api: str = "cudaLaunchKernel", operator: str | None | bool = True, **truth) -> Launch | None:
        """Launch a kernel from the thread (a graph node while capturing: no kernel runs). ``operator``: True
        for the rule of :meth:`truth_operator`, else the label itself."""
        label = self.truth_operator(tid) if operator is True else operator
        call = self.api(api, tid)
        self.program.devices.add(device)
        if self.capturing is not None:
            node_id = len(self.capturing.nodes) + 1 + 100 * self.capturing.graph_id
            self.capturing.nodes.append(CapturedNode(kernel, config, stream, label, node_id, truth.get("source_nodes")))
            self.program.node_events.append(NodeEvent(self.pid, tid, call.start_ns + 1, call.end_ns - 1, node_id))
            return None
        start, end = self._kernel_time(device, stream, call.end_ns, self.rng.randint(2000, 40000))
        launch = Launch(len(self.program.launches), self.pid, tid, device, stream, kernel, config, call, start, end,
                        label, **truth)
        self.program.launches.append(launch)
        return launch

    @contextmanager
    def capture(self, graph: Graph, tid: int) -> Iterator[Graph]:
        self.capturing = graph
        try:
            yield graph
        finally:
            self.capturing = None

    def instantiate(self, graph: Graph, tid: int) -> None:
        at = self.tick()
        for node in graph.nodes:
            self.program.node_events.append(NodeEvent(self.pid, tid, at, at + 1, node.node_id + graph.exec_offset,
                                                      original=node.node_id))
        self.now = at + 10

    def replay(self, graph: Graph, tid: int, device: int, operator_determined: bool) -> list[Launch]:
        """``cudaGraphLaunch``: every node runs on its captured stream, streams concurrently."""
        call = self.api("cudaGraphLaunch", tid)
        replay = self.replays
        self.replays += 1
        out = []
        for node in graph.nodes:
            start, end = self._kernel_time(device, node.stream, call.end_ns, self.rng.randint(2000, 30000))
            out.append(Launch(len(self.program.launches), self.pid, tid, device, node.stream, node.kernel,
                              node.config, call, start, end, node.operator, operator_determined,
                              graph_id=graph.graph_id, graph_node_id=node.node_id + graph.exec_offset, replay=replay,
                              source_nodes=node.source_nodes))
            self.program.launches.append(out[-1])
        return out

    def run_tree(self, tree, tid: int, device: int, stream: int) -> None:
        """Run a fixed template (``_fix``) on the thread."""
        kind, name, rest = tree
        with self.op(name, tid):
            if kind == "leaf":
                for key, config in rest:
                    self.launch(K[key], config, tid, device, stream)
            else:
                for child in rest:
                    self.run_tree(child, tid, device, stream)


# ================================================================================================================
# Random eager programs

MAIN_TID, AUTOGRAD_TID = 1, 2


def random_body(rng: random.Random, streams: tuple[int, ...] = (7,), backward: bool = True) -> list[Call]:
    """One iteration's call sites: 3-8 forward ops on the main thread, then 0-4 backward nodes on the autograd
    thread; each on one of ``streams`` (mostly the first)."""
    body = [Call(_fix(rng.choice(FORWARD_TEMPLATES), rng), "main", _stream(rng, streams))
            for _ in range(rng.randint(3, 8))]
    if backward:
        body += [Call(_fix(rng.choice(BACKWARD_TEMPLATES), rng), "autograd", _stream(rng, streams))
                 for _ in range(rng.randint(0, 4))]
    return body


def _stream(rng: random.Random, streams: tuple[int, ...]) -> int:
    return streams[0] if len(streams) == 1 or rng.random() < 0.7 else rng.choice(streams[1:])


def run_iterations(rec: Recorder, body: list[Call], iterations: int, device: int = 0, markers: str | None = None,
                   bare_launches: bool = True, prologue: list[Call] | None = None) -> list[list[Launch]]:
    """Run ``prologue`` once, then ``body`` ``iterations`` times (``ProfilerStep#N`` annotations with
    ``markers``); returns each iteration's launches. ``bare_launches``: an occasional kernel launched outside
    every op (a raw extension kernel): its truth is "no operator"."""
    rec.thread(MAIN_TID, "python3.12")
    rec.thread(AUTOGRAD_TID, "pt_autograd_0")
    for call in prologue or []:
        rec.run_tree(call.tree, MAIN_TID, device, call.stream)
    per_iteration = []
    for i in range(iterations):
        first = len(rec.program.launches)
        scope = rec.op(f"{markers}{i}", MAIN_TID, kind="user_annotation") if markers else _nothing()
        with scope:
            for n, call in enumerate(body):
                tid = MAIN_TID if call.thread == "main" else AUTOGRAD_TID
                rec.run_tree(call.tree, tid, device, call.stream)
                if bare_launches and n == 1 and rec.rng.random() < 0.5:
                    rec.launch(K["saxpy"], CONFIGS[0], MAIN_TID, device, 7)
        per_iteration.append(rec.program.launches[first:])
    return per_iteration


@contextmanager
def _nothing():
    yield None


# ================================================================================================================
# The ncu side: rows of the ncu run, in profiling order


@dataclass
class NcuRow:
    """One profiled result: ``launch`` is the timeline kernel it measured (None: a launch the timeline lacks)."""

    launch: Launch | None
    kernel: KernelName
    config: Config
    pid: int
    device: int
    stream: int
    token: int
    duration_ns: int


@dataclass
class NcuFile:
    """One ncu CSV: its rows in ID order, how names are printed and which page is exported."""

    name: str
    rows: list[NcuRow]
    style: str = "demangled"
    page: str = "raw"
    grouping: bool = False  # en-locale digit grouping ("1,000,042")
    window: dict | None = None  # declared window: {"launch_skip", "launch_count"} or {"kernels": [...]}


def token_of(launch: Launch) -> int:
    return 1_000_000 + launch.uid


def ncu_row(launch: Launch, ncu_pid: int) -> NcuRow:
    return NcuRow(launch, launch.kernel, launch.config, ncu_pid, launch.device, launch.stream, token_of(launch),
                  launch.end_ns - launch.start_ns + 17)


def helper_row(kernel: KernelName, config: Config, ncu_pid: int, device: int, index: int) -> NcuRow:
    return NcuRow(None, kernel, config, ncu_pid, device, 7, 900_000 + index, 3333 + index)


def ncu_order(launches: list[Launch], rng: random.Random) -> list[Launch]:
    """The order ncu profiles ``launches`` (given in timeline launch order) in: the same, except the nodes of
    each graph launch, which run in a random order that keeps each captured stream's order."""
    out: list[Launch] = []
    i = 0
    while i < len(launches):
        k = launches[i]
        if k.replay is None:
            out.append(k)
            i += 1
            continue
        block = [x for x in launches[i:] if x.replay == k.replay]
        out.extend(interleave([[x for x in block if x.stream == s] for s in sorted({x.stream for x in block})], rng))
        i += len(block)
    return out


def interleave(sequences: list[list], rng: random.Random) -> list:
    """A random merge of ``sequences`` keeping each one's order."""
    pending = [list(s) for s in sequences if s]
    out = []
    while pending:
        seq = rng.choice(pending)
        out.append(seq.pop(0))
        pending = [s for s in pending if s]
    return out


# ================================================================================================================
# What the input determines (pure functions of key sequences; see the module docstring)


def graph_ambiguous(launches: list[Launch]) -> set[int]:
    """uids of graph-node kernels whose key occurs on two or more streams within their graph launch."""
    groups: dict[tuple, set[int]] = {}
    for k in launches:
        if k.replay is not None:
            groups.setdefault((k.pid, k.replay, k.key), set()).add(k.stream)
    return {k.uid for k in launches if k.replay is not None and len(groups[(k.pid, k.replay, k.key)]) > 1}


def gap_positions(longer: list, shorter: list) -> list[int]:
    """Positions ``i`` of ``longer`` such that ``longer`` without element ``i`` equals ``shorter``."""
    if len(longer) != len(shorter) + 1:
        return []
    prefix = 0
    while prefix < len(shorter) and longer[prefix] == shorter[prefix]:
        prefix += 1
    suffix = 0
    while suffix < len(shorter) and longer[-1 - suffix] == shorter[-1 - suffix]:
        suffix += 1
    return [i for i in range(len(longer)) if i <= prefix and len(longer) - 1 - i <= suffix]


def determined_under_gap(longer: list, shorter: list) -> set[int]:
    """Indices of ``shorter`` paired with the same element of ``longer`` by every one-deletion alignment."""
    gaps = gap_positions(longer, shorter)
    if not gaps:
        return set()
    low, high = min(gaps), max(gaps)
    return {j for j in range(len(shorter)) if j < low or j >= high}


def offsets(sequence: list, part: list) -> list[int]:
    """Every offset at which ``part`` occurs contiguously in ``sequence``."""
    n = len(part)
    return [i for i in range(len(sequence) - n + 1) if sequence[i:i + n] == part] if n else []


def embedding_pinned(sequence: list, part: list) -> set[int]:
    """Indices of ``part`` that every embedding of ``part`` as a subsequence of ``sequence`` puts at the same
    position (the rows of an ncu file whose window is unknown: any launches may have been filtered out). The
    greedy leftmost and rightmost embeddings bound every embedding, so a row is pinned where they agree."""
    left, i = [], 0
    for key in part:
        while i < len(sequence) and sequence[i] != key:
            i += 1
        if i == len(sequence):
            return set()
        left.append(i)
        i += 1
    right, i = [], len(sequence) - 1
    for key in reversed(part):
        while sequence[i] != key:
            i -= 1
        right.append(i)
        i -= 1
    right.reverse()
    return {j for j in range(len(part)) if left[j] == right[j]}


def is_subsequence(part: list, sequence: list) -> bool:
    it = iter(sequence)
    return all(key in it for key in part)


def process_assignments(ncu: dict[int, list], timeline: dict[int, list]) -> list[dict[int, int]]:
    """Every one-to-one map of ncu processes to timeline processes in which each ncu process's key sequence is a
    subsequence of its timeline process's."""
    from itertools import permutations

    ncu_pids = sorted(ncu)
    return [dict(zip(ncu_pids, chosen)) for chosen in permutations(sorted(timeline), len(ncu_pids))
            if all(is_subsequence(ncu[n], timeline[t]) for n, t in zip(ncu_pids, chosen))]


# ================================================================================================================
# Truth


@dataclass
class Case:
    """A generated program and its inputs: what ``truth.json`` holds."""

    scenario: str
    seed: int
    program: Program
    timeline_format: str  # "nsys" | "kineto"
    ncu_files: list[NcuFile]
    determined: set[int]  # uids whose ncu pairing the input determines
    process_map: dict[int, int] | None = None
    kineto_time: str = "relative"
    inductor_graphs: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    external_id_disagreements: int = 0
    repeated_records: list[int] = field(default_factory=list)  # uids whose kernel record the file holds twice


def truth_record(case: Case, paths: dict) -> dict:
    """The ``truth.json`` object of a case (``paths``: where the writers put the files, relative names)."""
    rows_of: dict[int, tuple[str, int]] = {}
    ncu_rows = []
    for f in case.ncu_files:
        for i, row in enumerate(f.rows):
            if row.launch is not None:
                rows_of[row.launch.uid] = (f.name, i)
            ncu_rows.append({"file": f.name, "id": i, "token": row.token,
                             "kernel_uid": None if row.launch is None else row.launch.uid})
    kernels = []
    for k in case.program.launches:
        ncu = rows_of.get(k.uid)
        kernels.append({
            "uid": k.uid, "pid": k.pid, "device": k.device, "start_ns": k.start_ns + paths.get("time_base_ns", 0),
            "name": k.kernel.demangled, "operator": k.operator, "operator_determined": k.operator_determined,
            "source_nodes": k.source_nodes, "source_nodes_determined": k.source_nodes_determined,
            "ncu": None if ncu is None else {"file": ncu[0], "id": ncu[1]}, "token": token_of(k) if ncu else None,
            "counters_determined": ncu is not None and k.uid in case.determined,
        })
    start_of = {k.uid: (k.device, k.start_ns + paths.get("time_base_ns", 0)) for k in case.program.launches}
    windows = {}
    for f in case.ncu_files:
        if f.window is not None and "kernel_uids" in f.window:
            windows[f.name] = {"kernels": [list(start_of[u]) for u in f.window["kernel_uids"]]}
        elif f.window is not None:
            windows[f.name] = dict(f.window)
    return {
        "scenario": case.scenario, "seed": case.seed, "timeline_format": case.timeline_format,
        "timeline": paths["timeline"], "ncu_files": [paths["ncu"][f.name] for f in case.ncu_files],
        "inductor_dir": paths.get("inductor"), "windows": windows or None,
        "process_map": {str(a): b for a, b in case.process_map.items()} if case.process_map else None,
        "kernels": kernels, "ncu_rows": ncu_rows, "notes": case.notes,
        "external_id_disagreements": case.external_id_disagreements,
    }


def window_of(launches: list[Launch]) -> dict:
    """A declared window of kernels (the replay's ``kernel_ids``, before the reader numbers them): their uids,
    written to ``truth.json`` as ``[device, start_ns]`` pairs."""
    return {"kernel_uids": [k.uid for k in launches]}


def load_truth(folder: Path) -> dict:
    return json.loads((Path(folder) / "truth.json").read_text())


# ================================================================================================================
# Scenarios


def _eager(rng: random.Random, fmt: str, streams=(7, 13), iterations: tuple[int, int] = (2, 4),
           prologue: bool = False) -> tuple[Program, Recorder, list[list[Launch]]]:
    program = Program()
    rec = Recorder(program, rng, pid=rng.randint(2_000, 60_000), start_ns=rng.randint(1_000_000, 9_000_000))
    body = random_body(rng, streams)
    first = [Call(_fix(rng.choice(FORWARD_TEMPLATES), rng), "main", 7)] if prologue else None
    its = run_iterations(rec, body, rng.randint(*iterations), markers=iteration_marker(fmt), prologue=first)
    return program, rec, its


def _fmt(rng: random.Random) -> str:
    return rng.choice(("nsys", "kineto"))


def _kineto_time(rng: random.Random) -> str:
    return "absolute_fraction" if rng.random() < 0.3 else "relative"


def _ncu_file(rng: random.Random, name: str, rows: list[NcuRow], **options) -> NcuFile:
    return NcuFile(name, rows, page=rng.choice(("raw", "raw", "details")), grouping=rng.random() < 0.3, **options)


def _ncu_pid(rng: random.Random, avoid: set[int]) -> int:
    pid = rng.randint(60_001, 90_000)
    return pid + 1 if pid in avoid else pid


def _window_case(scenario: str, seed: int, rng: random.Random, fmt: str, program: Program,
                 window: list[Launch], style: str = "demangled") -> Case:
    """ncu profiled exactly ``window`` (declared as kernel ids): determined but for ambiguous graph nodes."""
    ncu_pid = _ncu_pid(rng, set(program.processes))
    rows = [ncu_row(k, ncu_pid) for k in ncu_order(window, rng)]
    f = _ncu_file(rng, "profile.csv", rows, style=style, window=window_of(window))
    determined = {k.uid for k in window} - graph_ambiguous(window)
    return Case(scenario, seed, program, fmt, [f], determined, kineto_time=_kineto_time(rng))


def scenario_clean(seed: int, rng: random.Random) -> Case:
    fmt = _fmt(rng)
    program, _, its = _eager(rng, fmt)
    window = [k for it in its[1:] for k in it]  # iteration 0 is the warm-up, outside the replayed window
    return _window_case("clean", seed, rng, fmt, program, window)


def scenario_name_variants(seed: int, rng: random.Random) -> Case:
    fmt = _fmt(rng)
    program, _, its = _eager(rng, fmt)
    styles = ("function", "other_demangler", "mangled") if fmt == "nsys" else ("function", "other_demangler")
    style = styles[seed % len(styles)]
    case = _window_case("name_variants", seed, rng, fmt, program, [k for it in its for k in it], style)
    case.notes["style"] = style
    return case


def scenario_ncu_missing_launch(seed: int, rng: random.Random) -> Case:
    fmt = _fmt(rng)
    program, rec, _ = _eager(rng, fmt)
    launches = program.launches_of(rec.pid)
    keys = [k.key for k in launches]
    ncu_pid = _ncu_pid(rng, set(program.processes))
    rows = [ncu_row(k, ncu_pid) for k in launches]
    variant = ("dropped", "extra_new", "extra_existing", "name_filter")[seed % 4]
    if variant == "dropped":
        del rows[rng.randrange(len(rows))]
        ok = determined_under_gap(keys, [(r.kernel.mangled, r.config.grid, r.config.block) for r in rows])
        determined = {rows[j].launch.uid for j in ok}
    elif variant == "name_filter":
        chosen = {k.kernel.function for k in launches if "gemm" in k.kernel.function or "nvjet" in k.kernel.function}
        chosen = chosen or {launches[0].kernel.function}
        rows = [r for r in rows if r.kernel.function in chosen]
        part = [r.launch.key for r in rows]
        determined = {rows[j].launch.uid for j in embedding_pinned(keys, part)}
    else:
        at = rng.randrange(len(rows) + 1)
        if variant == "extra_new":
            helper = helper_row(K["gather"] if not any(k.kernel == K["gather"] for k in launches) else K["eq"],
                                CONFIGS[3], ncu_pid, 0, 0)
        else:
            model = rng.choice(launches)
            helper = helper_row(model.kernel, model.config, ncu_pid, model.device, 0)
        rows.insert(at, helper)
        ncu_keys = [(r.kernel.mangled, r.config.grid, r.config.block) for r in rows]
        determined = {launches[i].uid for i in determined_under_gap(ncu_keys, keys)}
    case = Case("ncu_missing_launch", seed, program, fmt, [_ncu_file(rng, "profile.csv", rows)], determined,
                kineto_time=_kineto_time(rng))
    case.notes["variant"] = variant
    return case


def _launch_window(scenario: str, seed: int, rng: random.Random, declared: bool) -> Case:
    """``declared``: the window is given as skip/count; else it is declared ``contiguous`` (odd seeds) or not at
    all (even seeds)."""
    fmt = _fmt(rng)
    program, rec, _ = _eager(rng, fmt, prologue=rng.random() < 0.5)
    launches = program.launches_of(rec.pid)
    count = rng.randint(3, max(3, len(launches) // 2))
    skip = rng.randint(0, len(launches) - count)
    part = launches[skip:skip + count]
    ncu_pid = _ncu_pid(rng, set(program.processes))
    keys, part_keys = [k.key for k in launches], [k.key for k in part]
    if declared:
        window, determined = {"launch_skip": skip, "launch_count": count}, {k.uid for k in part}
    elif seed % 2:
        placed = len(offsets(keys, part_keys)) == 1
        window, determined = {"contiguous": True}, {k.uid for k in part} if placed else set()
    else:
        window, determined = None, {part[j].uid for j in embedding_pinned(keys, part_keys)}
    f = _ncu_file(rng, "window.csv", [ncu_row(k, ncu_pid) for k in part], window=window)
    case = Case(scenario, seed, program, fmt, [f], determined, kineto_time=_kineto_time(rng))
    case.notes.update(launch_skip=skip, launch_count=count, window=window)
    return case


def scenario_launch_window(seed: int, rng: random.Random) -> Case:
    return _launch_window("launch_window", seed, rng, declared=True)


def scenario_launch_window_unknown(seed: int, rng: random.Random) -> Case:
    return _launch_window("launch_window_unknown", seed, rng, declared=False)


def _segments(scenario: str, seed: int, rng: random.Random, declared: bool) -> Case:
    fmt = _fmt(rng)
    program, rec, _ = _eager(rng, fmt, prologue=rng.random() < 0.5)
    launches = program.launches_of(rec.pid)
    cut = rng.randint(2, len(launches) - 2)
    ncu_pid = _ncu_pid(rng, set(program.processes))
    keys = [k.key for k in launches]
    files, determined = [], set()
    for name, skip, part in (("segment_1.csv", 0, launches[:cut]), ("segment_0.csv", cut, launches[cut:])):
        window = {"launch_skip": skip, "launch_count": len(part)} if declared else None
        files.append(_ncu_file(rng, name, [ncu_row(k, ncu_pid) for k in part], window=window))
        pinned = range(len(part)) if declared else embedding_pinned(keys, [k.key for k in part])
        determined |= {part[j].uid for j in pinned}
    files.reverse()  # the later segment first: "segment_0.csv" sorts first, as a glob gives them
    case = Case(scenario, seed, program, fmt, files, determined, kineto_time=_kineto_time(rng))
    case.notes.update(cut=cut, declared=declared)
    return case


def scenario_segments_shuffled(seed: int, rng: random.Random) -> Case:
    return _segments("segments_shuffled", seed, rng, declared=False)


def scenario_segments_windowed(seed: int, rng: random.Random) -> Case:
    return _segments("segments_windowed", seed, rng, declared=True)


def scenario_multi_process(seed: int, rng: random.Random) -> Case:
    """Two ranks in one nsys export; one ncu CSV of both (``--target-processes all``)."""
    variant = ("devices", "sequence", "identical", "mapped")[seed % 4]
    program = Program()
    body = random_body(rng, (7,))
    iterations = rng.randint(2, 3)
    pids = rng.sample(range(2_000, 60_000), 2)
    start = rng.randint(1_000_000, 2_000_000)
    per_rank = []
    for rank, pid in enumerate(pids):
        rec = Recorder(program, random.Random(rng.random()), pid, start + rng.randint(0, 50_000))
        rank_body = body
        if variant == "sequence" and rank == 1:
            rank_body = body + [Call(("leaf", "aten::mean", [("mean", CONFIGS[4])]), "main", 7)]
        device = rank if variant == "devices" else 0
        run_iterations(rec, rank_body, iterations, device=device, markers=iteration_marker("nsys"),
                       bare_launches=False)
        per_rank.append(program.launches_of(pid))
    ncu_pids = rng.sample(range(60_001, 90_000), 2)
    rows = interleave([[ncu_row(k, ncu_pids[r]) for k in launches] for r, launches in enumerate(per_rank)], rng)
    signature = {pids[r]: [k.key for k in launches] for r, launches in enumerate(per_rank)}
    maps = process_assignments({ncu_pids[r]: signature[pids[r]] for r in range(2)}, signature)
    determined = set()
    for r, launches in enumerate(per_rank):
        if variant == "mapped" or {m[ncu_pids[r]] for m in maps} == {pids[r]}:
            pinned = embedding_pinned(signature[pids[r]], signature[pids[r]])
            determined |= {launches[j].uid for j in pinned}
    case = Case("multi_process", seed, program, "nsys", [_ncu_file(rng, "ranks.csv", rows)], determined,
                process_map={ncu_pids[r]: pids[r] for r in range(2)} if variant == "mapped" else None)
    case.notes.update(variant=variant, ncu_pids=ncu_pids, timeline_pids=pids)
    return case


def scenario_data_parallel(seed: int, rng: random.Random) -> Case:
    """One process driving two devices from two replica threads (``nn.DataParallel``)."""
    fmt = _fmt(rng)
    program = Program()
    rec = Recorder(program, rng, rng.randint(2_000, 60_000), rng.randint(1_000_000, 9_000_000))
    body = random_body(rng, (7,), backward=False)
    replica_tids = (11, 12)
    for device, tid in enumerate(replica_tids):
        rec.thread(tid, f"replica_{device}")
    for i in range(rng.randint(2, 3)):
        scope = rec.op(f"ProfilerStep#{i}", MAIN_TID, kind="user_annotation") if fmt == "kineto" else _nothing()
        with scope:
            for call in body:
                for device, tid in enumerate(replica_tids):
                    rec.run_tree(call.tree, tid, device, call.stream)
    launches = program.launches_of(rec.pid)
    per_device = [[k for k in launches if k.device == d] for d in (0, 1)]
    ncu_pid = _ncu_pid(rng, set(program.processes))
    rows = [ncu_row(k, ncu_pid) for k in interleave(per_device, rng)]
    f = _ncu_file(rng, "replicas.csv", rows, window=window_of(launches))
    return Case("data_parallel", seed, program, fmt, [f], {k.uid for k in launches}, kineto_time=_kineto_time(rng))


def scenario_cuda_graph(seed: int, rng: random.Random) -> Case:
    """Eager ops, a graph captured on two streams (same-key nodes on one or on both streams, same name with
    another configuration), replayed 2-3 times between eager ops."""
    fmt = _fmt(rng)
    program = Program()
    rec = Recorder(program, rng, rng.randint(2_000, 60_000), rng.randint(1_000_000, 9_000_000))
    rec.thread(MAIN_TID, "python3.12")
    eager = random_body(rng, (7,), backward=False)[:3]
    nodes = [Call(_fix(rng.choice(FORWARD_TEMPLATES), rng), "main", rng.choice((7, 13))) for _ in range(rng.randint(3, 6))]
    twin = rng.choice(nodes)
    nodes.append(Call(twin.tree, "main", rng.choice((7, 13))))  # same kernels, same configs: on one or two streams
    if rng.random() < 0.7:  # a node of the same kernels with another launch configuration
        other = rng.choice(nodes)
        nodes.append(Call(_with_config(other.tree, rng), "main", rng.choice((7, 13))))
    graph = Graph(graph_id=1 + rng.randrange(5))
    with rec.capture(graph, MAIN_TID):
        for call in nodes:
            rec.run_tree(call.tree, MAIN_TID, 0, call.stream)
    rec.instantiate(graph, MAIN_TID)
    for _ in range(rng.randint(2, 3)):
        for call in eager:
            rec.run_tree(call.tree, MAIN_TID, 0, call.stream)
        rec.replay(graph, MAIN_TID, 0, operator_determined=fmt == "nsys")
    window = program.launches_of(rec.pid)
    case = _window_case("cuda_graph", seed, rng, fmt, program, window)
    case.notes["graph_nodes"] = len(graph.nodes)
    return case


def scenario_user_annotation(seed: int, rng: random.Random) -> Case:
    """A Kineto training loop whose optimizer step launches ``multi_tensor_apply_kernel`` under
    ``Optimizer.step#FusedAdam.step`` only; ``zero_grad`` and ``forward`` annotations enclose ATen ops (which win)."""
    program = Program()
    rec = Recorder(program, rng, rng.randint(2_000, 60_000), rng.randint(1_000_000, 9_000_000))
    body = random_body(rng, (7,))
    rec.thread(MAIN_TID, "python3.12")
    rec.thread(AUTOGRAD_TID, "pt_autograd_0")
    for i in range(rng.randint(2, 3)):
        with rec.op(f"ProfilerStep#{i}", MAIN_TID, kind="user_annotation"):
            with rec.op("Optimizer.zero_grad#FusedAdam.zero_grad", MAIN_TID, kind="user_annotation"):
                rec.run_tree(("leaf", "aten::fill_", [("fill", CONFIGS[0])]), MAIN_TID, 0, 7)
            with rec.op("## forward ##", MAIN_TID, kind="user_annotation"):
                for call in body:
                    rec.run_tree(call.tree, MAIN_TID if call.thread == "main" else AUTOGRAD_TID, 0, call.stream)
            with rec.op("Optimizer.step#FusedAdam.step", MAIN_TID, kind="user_annotation"):
                for _ in range(rng.randint(1, 3)):
                    rec.launch(MULTI_TENSOR_APPLY, CONFIGS[3], MAIN_TID, 0, 7)
    return _window_case("user_annotation", seed, rng, "kineto", program, program.launches_of(rec.pid))


def scenario_external_id(seed: int, rng: random.Random) -> Case:
    """A Kineto trace where some kernels' ``External id`` names another op than the one around their launch."""
    program, rec, _ = _eager(rng, "kineto")
    op_ids = [op.external_id for op in program.ops if op.kind == "cpu_op"]
    moved = 0
    for k in program.launches:
        if rng.random() < 0.2 and k.call.external_id:
            k.external_id = rng.choice([e for e in op_ids if e != k.call.external_id])
            moved += 1
    case = _window_case("external_id", seed, rng, "kineto", program, program.launches_of(rec.pid))
    case.external_id_disagreements = moved
    return case


def scenario_duplicate_records(seed: int, rng: random.Random) -> Case:
    """A trace that holds some kernel records twice, each copy equal to the record in every field (a corrupt or a
    merged trace: docs/field-cases.md C24), written after the other kernel records. Variants: an eager program, or
    the ``cuda_graph`` program, whose node kernels of one graph launch share its correlation id but not their
    start (they are not copies). The truth has each kernel once; what the input determines is what the same file
    without the copies determines."""
    variant = ("eager", "graph")[seed % 2]
    if variant == "graph":
        case = scenario_cuda_graph(seed, rng)
    else:
        fmt = _fmt(rng)
        program, _, its = _eager(rng, fmt)
        case = _window_case("duplicate_records", seed, rng, fmt, program, [k for it in its[1:] for k in it])
    case.scenario = "duplicate_records"
    launches = case.program.launches
    chosen = rng.sample(launches, min(len(launches), rng.randint(1, 3)))
    if variant == "graph":  # and a node kernel of a graph launch among them
        nodes = [k for k in launches if k.replay is not None and k not in chosen]
        chosen.append(rng.choice(nodes))
    case.repeated_records = sorted(k.uid for k in chosen)
    case.notes.update(variant=variant, repeated=case.repeated_records)
    return case


def scenario_pid_reuse(seed: int, rng: random.Random) -> Case:
    """An nsys export of 2-3 processes that ran one after the other with the same pid (DataLoader workers
    re-spawned every epoch, docs/field-cases.md C25), each its own program, with its correlation ids counted from
    about 100 again (so the same ids name launch calls of each). The pid's next process starts 50-500 ms after the
    previous one's last call. Every operator is determined by the launch call of the kernel's own process.
    ncu profiled the last process: variant ``window`` declares its kernels (our replay's path: determined),
    variant ``embedding`` declares nothing, and the embedding rule over the pid's launches (all its processes:
    the ncu run's processes are not the timeline's) says what is determined."""
    variant = ("window", "embedding")[seed % 2]
    program = Program()
    pid = rng.randint(2_000, 60_000)
    start = rng.randint(1_000_000, 9_000_000)
    lives = []
    for _ in range(rng.randint(2, 3)):
        rec = Recorder(program, random.Random(rng.random()), pid, start, name="pt_data_worker")
        first = len(program.launches)
        run_iterations(rec, random_body(rng, (7,)), rng.randint(2, 3), markers=iteration_marker("nsys"))
        lives.append(program.launches[first:])
        start = rec.now + rng.randint(50_000_000, 500_000_000)
    last = sorted(lives[-1], key=lambda k: (k.call.start_ns, k.start_ns))
    ncu_pid = _ncu_pid(rng, set(program.processes))
    rows = [ncu_row(k, ncu_pid) for k in last]
    if variant == "window":
        f = _ncu_file(rng, "worker.csv", rows, window=window_of(last))
        determined = {k.uid for k in last}
    else:
        f = _ncu_file(rng, "worker.csv", rows)
        keys = [k.key for k in program.launches_of(pid)]
        determined = {last[j].uid for j in embedding_pinned(keys, [k.key for k in last])}
    case = Case("pid_reuse", seed, program, "nsys", [f], determined)
    case.notes.update(variant=variant, processes=len(lives), pid=pid)
    return case


SCENARIOS = {
    "clean": scenario_clean,
    "ncu_missing_launch": scenario_ncu_missing_launch,
    "launch_window": scenario_launch_window,
    "launch_window_unknown": scenario_launch_window_unknown,
    "segments_shuffled": scenario_segments_shuffled,
    "segments_windowed": scenario_segments_windowed,
    "multi_process": scenario_multi_process,
    "data_parallel": scenario_data_parallel,
    "cuda_graph": scenario_cuda_graph,
    "name_variants": scenario_name_variants,
    "user_annotation": scenario_user_annotation,
    "external_id": scenario_external_id,
    "duplicate_records": scenario_duplicate_records,
    "pid_reuse": scenario_pid_reuse,
}


def all_scenarios() -> dict:
    """Every scenario: the eager ones above and the Inductor ones of :mod:`truth_inductor`."""
    from truth_inductor import INDUCTOR_SCENARIOS

    return {**SCENARIOS, **INDUCTOR_SCENARIOS}


def build(scenario: str, seed: int) -> Case:
    """The case of ``scenario`` for ``seed`` (deterministic: a ``random.Random`` seeded from both)."""
    scenarios = all_scenarios()
    if scenario not in scenarios:
        raise KeyError(f"unknown scenario {scenario!r}; known: {', '.join(scenarios)}")
    return scenarios[scenario](seed, random.Random(f"{scenario}:{seed}"))


def generate(scenario: str, seed: int, folder: Path) -> dict:
    """Build the case and write its files and ``truth.json`` into ``folder``; returns the truth record."""
    from truth_formats import write_case

    return write_case(build(scenario, seed), Path(folder))
