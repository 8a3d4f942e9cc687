"""Tests for attribution path (c), the TorchInductor fusion map (operator_profiler.attribution.inductor).

Expected values are computed independently from the real artifacts in ../shared/data/real (torch 2.13 CPU debug dirs,
their Kineto trace, the Oct-2024 CUDA Longformer dir); see ../shared/docs/kineto-and-inductor.md §3.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

try:
    from operator_profiler.attribution import inductor
except ModuleNotFoundError:  # package not installed: run from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from operator_profiler.attribution import inductor

from operator_profiler.attribution.inductor import (
    FUSION_MAP_COLUMNS,
    InductorArtifactError,
    find_graph_dirs,
    load_fusion_map,
    match_region,
    parse_output_code,
)

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
CPU_DIRS = REAL / "inductor-cpu" / "torchinductor"
FWD = CPU_DIRS / "model__0_forward_1.0"
BWD = CPU_DIRS / "model__0_backward_3.1"
LONGFORMER = REAL / "inductor-cuda" / "AllenaiLongformerBase__0_inference_0.0"
TRACE = REAL / "inductor-cpu" / "traces" / "trace_compiled_cpu.json.gz"
TLPARSE = REAL / "inductor-cpu" / "tlparse_extracted"


def _need(*paths: Path) -> None:
    for p in paths:
        if not p.exists():
            pytest.skip(f"real data not available: {p}")


# --- independent helpers (deliberately simpler than the module) -----------------------------------------------------

_CALL_SITE_RE = re.compile(
    r"^\s+(?:\w+ = )?(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.aten\.\w+\.default|triton_\w+(?=\.run))(?:\.run)?\("
)


def _call_lines(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(r"\s*def call\(", l))
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for l in lines[start + 1:]:
        if l.strip() and len(l) - len(l.lstrip()) <= indent:
            break
        body.append(l)
    return body


def _call_sites(path: Path) -> list[str]:
    return [m.group(1) for l in _call_lines(path) if (m := _CALL_SITE_RE.match(l))]


def _region_kernels(trace: Path) -> list[list[str]]:
    """Per `## Call CompiledFxGraph` region: names of its direct children (events not nested in another child)."""
    events = [e for e in json.load(gzip.open(trace))["traceEvents"] if e.get("ph") == "X"]
    regions = sorted((e for e in events if e["name"].startswith("## Call CompiledFxGraph")), key=lambda e: e["ts"])
    out = []
    for r in regions:
        inside = [
            e for e in events
            if e is not r and (e["pid"], e["tid"]) == (r["pid"], r["tid"])
            and e["ts"] >= r["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"]
        ]
        inside.sort(key=lambda e: (e["ts"], -e["dur"]))
        top, end = [], -1.0
        for e in inside:
            if e["ts"] >= end:  # not nested in the previous top-level child
                top.append(e["name"])
                end = e["ts"] + e["dur"]
        out.append(top)
    return out


@pytest.fixture(scope="module")
def fwd() -> pd.DataFrame:
    _need(FWD)
    return parse_output_code(FWD)


@pytest.fixture(scope="module")
def bwd() -> pd.DataFrame:
    _need(BWD)
    return parse_output_code(BWD)


# --- discovery and call sites ---------------------------------------------------------------------------------------


def test_find_graph_dirs_real_tree():
    _need(REAL)
    expected = sorted({p.parent for p in REAL.rglob("output_code.py")})
    got = find_graph_dirs(REAL)
    assert got == expected
    assert FWD in got and BWD in got and LONGFORMER in got
    assert find_graph_dirs(REAL / "does-not-exist") == []


@pytest.mark.parametrize("graph_dir", [FWD, BWD, LONGFORMER], ids=lambda p: p.name)
def test_call_sites_match_output_code(graph_dir: Path):
    _need(graph_dir)
    df = parse_output_code(graph_dir)
    expected = _call_sites(graph_dir / "output_code.py")
    assert len(expected) > 0
    assert list(df.columns) == FUSION_MAP_COLUMNS
    assert df["kernel"].tolist() == expected
    assert df["call_index"].tolist() == list(range(len(expected)))
    assert (df["graph"] == graph_dir.name).all()
    assert df["call_index"].dtype == "int64"
    assert str(df["debug_handle"].dtype) == "Int64"


def test_debug_handles_and_kinds(fwd: pd.DataFrame, bwd: pd.DataFrame):
    for df, d in ((fwd, FWD), (bwd, BWD)):
        handles = re.findall(r"# \[Provenance debug handles\] (\S+):(\d+)", (d / "output_code.py").read_text())
        assert list(zip(df["kernel"], df["debug_handle"].astype(int))) == [(k, int(n)) for k, n in handles]
    kinds = {k: set(g["kind"]) for k, g in pd.concat([fwd, bwd]).groupby("kernel")}
    assert kinds["extern_kernels.addmm"] == {"extern"} and kinds["extern_kernels.mm"] == {"extern"}
    assert kinds["cpp_fused_native_layer_norm_0"] == {"cpp"}
    assert kinds["torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"] == {"fallback"}
    assert fwd["gpu_symbol"].isna().all()


def test_profiler_names_from_raii_strings(fwd: pd.DataFrame, bwd: pd.DataFrame):
    for df, d in ((fwd, FWD), (bwd, BWD)):
        raii = dict(
            re.findall(r'^(\w+) = async_compile\.cpp_pybinding\(.*?RAIIAtenRecordFunctionHandle \w+\("([^"]+)"',
                       (d / "output_code.py").read_text(), re.M | re.S)
        )
        cpp = df[df["kind"] == "cpp"]
        assert len(cpp) > 0
        assert cpp["profiler_name"].tolist() == [raii[k] for k in cpp["kernel"]]
    names = dict(zip(fwd["kernel"], fwd["profiler_name"]))
    assert names["cpp_fused_native_layer_norm_0"] == "graph_0_cpp_fused_native_layer_norm_0"
    assert names["extern_kernels.addmm"] == "aten::addmm"
    assert names["torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"] == (
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    )


# --- timeline matching against the real Kineto trace ----------------------------------------------------------------


def test_match_region_real_trace():
    _need(TRACE, FWD, BWD)
    regions = _region_kernels(TRACE)
    assert len(regions) == 4  # two compiled training steps x (forward, backward)
    fmap = load_fusion_map(CPU_DIRS)
    for i, graph in enumerate([FWD.name, BWD.name, FWD.name, BWD.name]):
        names = regions[i]
        assert names[0].startswith(("graph_0_cpp_", "aten::"))
        expected = fmap[fmap["graph"] == graph].sort_values("call_index")["profiler_name"].tolist()
        assert names == expected
        assert match_region(names, fmap) == (graph, list(range(len(names))))
    # a region seen only partially (or with an extra kernel) matches no graph
    assert match_region(regions[0][:-1], fmap) is None
    assert match_region(regions[0] + ["aten::mm"], fmap) is None
    assert match_region([], fmap) is None


def test_match_region_first_of_duplicate_graphs(tmp_path: Path):
    _need(FWD)
    fmap = parse_output_code(FWD)
    twin = fmap.assign(graph="a_twin_graph")
    names = fmap["profiler_name"].tolist()
    assert match_region(names, pd.concat([fmap, twin], ignore_index=True))[0] == "a_twin_graph"
    assert match_region(names, load_fusion_map(tmp_path)) is None


# --- provenance JSON ------------------------------------------------------------------------------------------------


def test_provenance_nodes(fwd: pd.DataFrame):
    prov = json.loads((FWD / "inductor_provenance_tracking_node_mappings.json").read_text())
    row = fwd[fwd["kernel"] == "cpp_fused_native_layer_norm_0"].iloc[0]
    post = prov["cppCodeToPost"][f"cpp_fused_native_layer_norm_0:{row['debug_handle']}"]
    assert row["origin"] == "provenance_json"
    assert row["post_grad_nodes"] == post
    assert row["source_nodes"] == list(dict.fromkeys(p for n in post for p in prov["postToPre"].get(n, [])))
    assert row["source_nodes"] == ["layer_norm"]
    readable = (FWD / "fx_graph_readable.py").read_text()
    targets = {m.group(1): f"aten::{m.group(2)}"
               for m in re.finditer(r"^\s*(\w+)(?:: \"[^\"]*\")? = torch\.ops\.aten\.(\w+)\.", readable, re.M)}
    for r in fwd.itertuples():
        assert r.origin == "provenance_json"
        assert r.post_grad_nodes == prov["cppCodeToPost"][f"{r.kernel}:{r.debug_handle}"]
        if r.kind in ("extern", "fallback"):  # the post-grad nodes' own targets
            assert r.fused_ops == sorted({targets[n] for n in r.post_grad_nodes if n in targets})
        else:  # original (pre-decomposition) ATen, as encoded in the kernel name
            middle = re.fullmatch(r"cpp_fused_(.+)_\d+", r.kernel).group(1)
            assert "_".join(op.removeprefix("aten::") for op in r.fused_ops) == middle
    ops = dict(zip(fwd["kernel"], fwd["fused_ops"]))
    assert ops["cpp_fused_native_layer_norm_0"] == ["aten::native_layer_norm"]  # not var_mean/rsqrt/...
    assert ops["cpp_fused_gelu_view_2"] == ["aten::gelu", "aten::view"]  # not erf/mul/add
    assert ops["extern_kernels.addmm"] == ["aten::addmm"]  # the comment also lists native_layer_norm, t, view
    assert ops["torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"][0] == (
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    )
    assert fwd.loc[fwd["kernel"] == "cpp_fused_add_view_3", "source_nodes"].item() == list(
        dict.fromkeys(p for n in prov["cppCodeToPost"]["cpp_fused_add_view_3:9"] for p in prov["postToPre"][n])
    )


def test_provenance_passed_explicitly(bwd: pd.DataFrame):
    _need(TLPARSE, FWD)
    # the tlparse copy of the forward mapping gives the same result as the file in the graph dir
    fwd_explicit = parse_output_code(FWD, TLPARSE / "inductor_provenance_tracking_node_mappings.0.json")
    pd.testing.assert_frame_equal(fwd_explicit, parse_output_code(FWD))
    # the backward mapping is {"version": 2.0} only: nothing changes
    pd.testing.assert_frame_equal(
        parse_output_code(BWD, TLPARSE / "inductor_provenance_tracking_node_mappings.1.json"), bwd
    )
    # no provenance -> extern calls fall back to their own comments, cpp kernels to their names
    plain = parse_output_code(FWD, {})
    assert plain["post_grad_nodes"].map(len).eq(0).all()
    ext = plain[plain["kind"] == "extern"].iloc[0]
    assert ext["origin"] == "source_nodes_comment" and ext["source_nodes"] == ["layer_norm", "linear"]
    assert ext["fused_ops"] == ["aten::addmm", "aten::native_layer_norm", "aten::t", "aten::view"]
    ln = plain[plain["kernel"] == "cpp_fused_native_layer_norm_0"].iloc[0]
    assert ln["origin"] == "kernel_name" and ln["fused_ops"] == ["aten::native_layer_norm"]


# --- kernel-name tokenisation (backward cpp kernels have no comment in 2.13) ----------------------------------------


def test_backward_cpp_kernel_name_tokens(bwd: pd.DataFrame):
    cpp = bwd[bwd["kind"] == "cpp"]
    assert len(cpp) == len([k for k in _call_sites(BWD / "output_code.py") if k.startswith("cpp_")])
    assert (cpp["origin"] == "kernel_name").all()
    assert cpp["source_nodes"].map(len).eq(0).all()
    for r in cpp.itertuples():
        # Inductor joins sorted unique op names, so the tokens must re-join to the name (no leftovers here)
        middle = re.fullmatch(r"cpp_fused_(.+)_\d+", r.kernel).group(1)
        assert all(op.startswith("aten::") for op in r.fused_ops)
        assert "_".join(op.removeprefix("aten::") for op in r.fused_ops) == middle
    ops = dict(zip(cpp["kernel"], cpp["fused_ops"]))
    assert ops["cpp_fused_add_gelu_gelu_backward_native_layer_norm_native_layer_norm_backward_sum_view_1"] == [
        "aten::add", "aten::gelu", "aten::gelu_backward", "aten::native_layer_norm",
        "aten::native_layer_norm_backward", "aten::sum", "aten::view",
    ]
    assert ops["cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2"] == [
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::transpose", "aten::view",
    ]
    # bwd extern calls keep their own call-site comment
    mm = bwd[bwd["kernel"] == "extern_kernels.mm"].iloc[0]
    assert mm["origin"] == "source_nodes_comment"
    assert mm["source_nodes"] == ["view_12", "linear_3", "permute_8", "mm"]


def test_reused_kernel_gets_own_call_sites(bwd: pd.DataFrame):
    cat = bwd[bwd["kernel"] == "cpp_fused_cat_transpose_view_3"]
    assert len(cat) == _call_sites(BWD / "output_code.py").count("cpp_fused_cat_transpose_view_3") == 3
    assert cat["debug_handle"].tolist() == [10, 11, 12]
    assert cat["call_index"].diff().dropna().eq(1).all()  # consecutive launches in call()


# --- Triton (Oct-2024 CUDA dir, generic `triton_` symbols) ----------------------------------------------------------


def test_longformer_triton():
    _need(LONGFORMER)
    df = parse_output_code(LONGFORMER)
    text = (LONGFORMER / "output_code.py").read_text()
    assert (df["kind"] == "triton").all()
    assert (df["gpu_symbol"] == "triton_").all()
    assert df["debug_handle"].isna().all()
    assert df["profiler_name"].tolist() == re.findall(r"'kernel_name': '(\w+)'", text)
    assert (df["origin"] == "source_nodes_comment").all()
    comments = re.findall(r"^\s+# Topologically Sorted Source Nodes: \[(.*)\], Original ATen: \[(.*)\]$",
                          "\n".join(_call_lines(LONGFORMER / "output_code.py")), re.M)
    assert len(comments) == len(df)
    for (src, aten), r in zip(comments, df.itertuples()):
        assert r.source_nodes == src.split(", ")
        assert r.fused_ops == sorted({a.replace("aten.", "aten::") for a in aten.split(", ")})
    first = df.iloc[0]
    assert first["kernel"] == "triton_per_fused__to_copy_cumsum_ne_0"
    assert first["fused_ops"] == ["aten::_to_copy", "aten::cumsum", "aten::ne"]
    assert first["source_nodes"] == ["ne", "mask", "cumsum"]
    # GPU timelines show the generic name; CPU-side record functions the descriptive one
    assert match_region(["triton_"] * 3, df) == (LONGFORMER.name, [0, 1, 2])
    assert match_region(df["profiler_name"].tolist(), df) == (LONGFORMER.name, [0, 1, 2])
    assert match_region(["triton__0d1d2d", "triton__0d1d2d3d4d5d6d7d8d9d10d", "triton__0d1d"], df)[0] == LONGFORMER.name


# --- synthetic: old comment dialect, leaks, reuse, fallbacks --------------------------------------------------------

_OLD_STYLE = '''
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()
aten = torch.ops.aten

# kernel path: /tmp/torchinductor_x/ab/cabc.py
# Source Nodes: [add, mul], Original ATen: [aten.add, aten.mul]
triton_poi_fused_add_mul_0 = async_compile.triton('triton_poi_fused_add_mul_0', """
@triton.jit
def triton_poi_fused_add_mul_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    pass
""", device_str='cuda')

triton_red_fused_sum_frobnicate_1 = async_compile.triton('triton_', """
def triton_(in_ptr0, out_ptr0, xnumel, rnumel):
    pass
""")

cpp_fused_relu_2 = async_compile.cpp("""
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
""")
async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, = args
    args.clear()
    with torch.cuda._DeviceGuard(0):
        buf0 = empty_strided((4, ), (1, ), device='cuda', dtype=torch.float32)
        # Source Nodes: [add, mul], Original ATen: [aten.add, aten.mul]
        # add => add
        # mul => mul
        stream0 = get_raw_stream(0)
        triton_poi_fused_add_mul_0.run(arg0_1, buf0, 4, grid=grid(4), stream=stream0)
        triton_red_fused_sum_frobnicate_1.run(buf0, buf1, 4, 4, grid=grid(4), stream=stream0)
        # Source Nodes: [add_3, mul_7], Original ATen: [aten.add, aten.mul]
        triton_poi_fused_add_mul_0.run(buf1, buf2, 4, grid=grid(4), stream=stream0)
        # Unsorted Source Nodes: [bmm], Original ATen: [aten.bmm]
        extern_kernels.bmm(buf2, buf2, out=buf3)
        buf4 = aten.convolution(buf3, arg0_1, None, [1], [0], [1], False, [0], 1)
        buf5, buf6 = torch.ops.aten.native_dropout.default(buf4, 0.1, True)
        cpp_fused_relu_2(c_void_p(buf5.data_ptr()), c_void_p(buf6.data_ptr()))
        assert_size_stride(buf5, (4, ), (1, ), 'torch.ops.aten.native_dropout.default')
    return (buf6, )


def benchmark_compiled_module(times=10, repeat=10):
    return call([])
'''


def _write_graph(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "torchinductor" / name
    d.mkdir(parents=True)
    (d / "output_code.py").write_text(text)
    return d


def test_old_comment_dialect_and_no_leak(tmp_path: Path):
    d = _write_graph(tmp_path, "model__0_inference_0.0", _OLD_STYLE)
    # the FX graph files extend the op vocabulary used to split kernel names
    (d / "fx_graph_readable.py").write_text('        relu: "f32[4]" = torch.ops.aten.relu.default(buf5)\n'
                                            '        sum_1: "f32[]" = torch.ops.aten.sum.default(buf0)\n')
    df = parse_output_code(d)
    assert df["kernel"].tolist() == [
        "triton_poi_fused_add_mul_0", "triton_red_fused_sum_frobnicate_1", "triton_poi_fused_add_mul_0",
        "extern_kernels.bmm", "aten.convolution", "torch.ops.aten.native_dropout.default", "cpp_fused_relu_2",
    ]
    assert df["kind"].tolist() == ["triton", "triton", "triton", "extern", "fallback", "fallback", "cpp"]
    assert df["profiler_name"].tolist() == [
        "triton_poi_fused_add_mul_0", "triton_red_fused_sum_frobnicate_1", "triton_poi_fused_add_mul_0",
        "aten::bmm", "aten::convolution", "aten::native_dropout", "graph_0_cpp_fused_relu_2",
    ]
    assert df["gpu_symbol"].tolist()[:3] == ["triton_poi_fused_add_mul_0", "triton_", "triton_poi_fused_add_mul_0"]
    assert df["gpu_symbol"].iloc[3:].isna().all()
    assert df["origin"].tolist() == [
        "source_nodes_comment", "kernel_name", "source_nodes_comment", "source_nodes_comment",
        "kernel_name", "kernel_name", "kernel_name",
    ]
    # old format (separated from .run by `# x => y` lines and the stream line)
    assert df.loc[0, "source_nodes"] == ["add", "mul"]
    assert df.loc[0, "fused_ops"] == ["aten::add", "aten::mul"]
    # no leak into the next, uncommented call; unknown name piece kept verbatim
    assert df.loc[1, "source_nodes"] == []
    assert df.loc[1, "fused_ops"] == ["aten::sum", "frobnicate"]
    # the reused kernel gets its own call site's comment
    assert df.loc[2, "source_nodes"] == ["add_3", "mul_7"]
    assert df.loc[3, "source_nodes"] == ["bmm"] and df.loc[3, "fused_ops"] == ["aten::bmm"]
    assert df.loc[4, "fused_ops"] == ["aten::convolution"]
    assert df.loc[6, "fused_ops"] == ["aten::relu"]
    (d / "fx_graph_readable.py").unlink()
    without_fx = parse_output_code(d)  # torch's operator registry still names real ATen ops
    assert without_fx.loc[6, "fused_ops"] == ["aten::relu"]  # still resolved: torch's operator registry is part of the vocabulary
    assert without_fx.loc[1, "fused_ops"] == ["aten::sum", "frobnicate"]  # unknown piece kept verbatim
    assert df["debug_handle"].isna().all()
    assert df["post_grad_nodes"].map(len).eq(0).all()


def test_tokenise_leftovers():
    vocab = ["native_layer_norm_backward", "native_layer_norm", "_to_copy", "add", "view"]
    assert inductor._tokenise("_to_copy_add_native_layer_norm_native_layer_norm_backward_view", vocab) == [
        "aten::_to_copy", "aten::add", "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::view",
    ]
    assert inductor._tokenise("add_foo_bar_view_baz", vocab) == ["aten::add", "foo_bar", "aten::view", "baz"]
    assert inductor._tokenise("_weird_add", vocab) == ["_weird", "aten::add"]


# --- errors and empty input -----------------------------------------------------------------------------------------


def test_malformed_output_code_raises(tmp_path: Path):
    d = _write_graph(tmp_path, "model__0_forward_0.0", "# truncated\nbuf0 = 1\n")
    with pytest.raises(InductorArtifactError) as exc:
        parse_output_code(d)
    msg = str(exc.value)
    assert str(d / "output_code.py") in msg and "def call(" in msg and "Regenerate" in msg
    assert isinstance(exc.value, ValueError)
    with pytest.raises(InductorArtifactError, match="def call"):
        load_fusion_map(tmp_path)
    with pytest.raises(InductorArtifactError, match="not found"):
        parse_output_code(tmp_path / "nowhere")
    (d / "output_code.py").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InductorArtifactError, match="cannot read"):
        parse_output_code(d)


def test_malformed_provenance_raises(tmp_path: Path):
    d = _write_graph(tmp_path, "g", _OLD_STYLE)
    (d / "inductor_provenance_tracking_node_mappings.json").write_text("{not json")
    with pytest.raises(InductorArtifactError, match="not valid JSON"):
        parse_output_code(d)


def test_load_fusion_map_empty(tmp_path: Path):
    df = load_fusion_map(tmp_path)
    assert df.empty and list(df.columns) == FUSION_MAP_COLUMNS
    assert df["call_index"].dtype == "int64" and str(df["debug_handle"].dtype) == "Int64"
    assert match_region(["aten::mm"], df) is None


def test_load_fusion_map_real():
    _need(REAL)
    df = load_fusion_map(REAL)
    assert list(df.columns) == FUSION_MAP_COLUMNS
    assert sorted(df["graph"].unique()) == sorted(p.name for p in find_graph_dirs(REAL))
    per_graph = df.groupby("graph").size().to_dict()
    for d in find_graph_dirs(REAL):
        assert per_graph[d.name] == len(_call_sites(d / "output_code.py"))


_PARTITIONED = '''
cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], r"""
extern "C" void kernel(float* out_ptr0) { RAIIAtenRecordFunctionHandle record_("graph_3_cpp_fused_add_0", nullptr); }
""")
async_compile.wait(globals())

def partition_0(args):
    buf0, = args
    args.clear()
    # Topologically Sorted Source Nodes: [mm], Original ATen: [aten.mm]
    extern_kernels.mm(buf0, buf0, out=buf1)
    cpp_fused_add_0(buf1)
    return (buf1, )


class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        arg0_1, = args
        args.clear()
        cpp_fused_add_0(arg0_1)
        partition0_args = [arg0_1,]
        del arg0_1
        (buf1,) = self.partitions[0](partition0_args)
        del partition0_args
        return (buf1, )

runner = Runner(partitions=[partition_0,])
call = runner.call
'''


def test_graph_partitions_inlined(tmp_path: Path):
    df = parse_output_code(_write_graph(tmp_path, "model__1_inference_1.1", _PARTITIONED))
    assert df["kernel"].tolist() == ["cpp_fused_add_0", "extern_kernels.mm", "cpp_fused_add_0"]
    assert df["profiler_name"].tolist() == ["graph_3_cpp_fused_add_0", "aten::mm", "graph_3_cpp_fused_add_0"]
    assert df["origin"].tolist() == ["kernel_name", "source_nodes_comment", "kernel_name"]
    assert df.loc[2, "source_nodes"] == []  # the partition's mm comment does not leak
