"""Tests for attribution path (c), the TorchInductor fusion map (operator_profiler.attribution.inductor).

Expected values are computed independently from the real artifacts in ../shared/data/real (torch 2.13 CPU debug dirs,
their Kineto trace, the Oct-2024 CUDA Longformer dir); see docs/formats.md#inductor-debug-artifacts.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA, need_real

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

CPU_DIRS = REAL_DATA / "inductor-cpu" / "torchinductor"
FWD = CPU_DIRS / "model__0_forward_1.0"
BWD = CPU_DIRS / "model__0_backward_3.1"
LONGFORMER = REAL_DATA / "inductor-cuda" / "AllenaiLongformerBase__0_inference_0.0"
TRACE = REAL_DATA / "inductor-cpu" / "traces" / "trace_compiled_cpu.json.gz"
TLPARSE = REAL_DATA / "inductor-cpu" / "tlparse_extracted"


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
    need_real(FWD)
    return parse_output_code(FWD)


@pytest.fixture(scope="module")
def bwd() -> pd.DataFrame:
    need_real(BWD)
    return parse_output_code(BWD)


# --- discovery and call sites ---------------------------------------------------------------------------------------


def test_find_graph_dirs_real_tree():
    need_real(REAL_DATA)
    expected = sorted({p.parent for p in REAL_DATA.rglob("output_code.py")})
    got = find_graph_dirs(REAL_DATA)
    assert got == expected
    assert FWD in got and BWD in got and LONGFORMER in got
    assert find_graph_dirs(REAL_DATA / "does-not-exist") == []


@pytest.mark.parametrize("graph_dir", [FWD, BWD, LONGFORMER], ids=lambda p: p.name)
def test_call_sites_match_output_code(graph_dir: Path):
    need_real(graph_dir)
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
    need_real(TRACE, FWD, BWD)
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
    need_real(FWD)
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
    need_real(TLPARSE, FWD)
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
        # Inductor joins sorted unique op names, so the tokens must re-join to the name (no leftovers here);
        # ops the graph's extern/fallback calls run are split off to listed_not_computed
        middle = re.fullmatch(r"cpp_fused_(.+)_\d+", r.kernel).group(1)
        tokens = sorted(r.fused_ops + r.listed_not_computed)
        assert all(op.startswith("aten::") for op in tokens)
        assert "_".join(op.removeprefix("aten::") for op in tokens) == middle
    ops = dict(zip(cpp["kernel"], cpp["fused_ops"]))
    assert ops["cpp_fused_add_gelu_gelu_backward_native_layer_norm_native_layer_norm_backward_sum_view_1"] == [
        "aten::add", "aten::gelu", "aten::gelu_backward", "aten::native_layer_norm",
        "aten::native_layer_norm_backward", "aten::sum", "aten::view",
    ]
    # the layout copy before the SDPA backward lists that op, which the graph's fallback call
    # `torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(...)` computes
    copy = "cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2"
    fallback_ops = {f"aten::{m}" for m in re.findall(r"torch\.ops\.aten\.(\w+)\.\w+\(", "\n".join(_call_lines(BWD / "output_code.py")))}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in fallback_ops
    assert ops[copy] == ["aten::transpose", "aten::view"]
    assert cpp.set_index("kernel").loc[copy, "listed_not_computed"] == [
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    # no other backward cpp kernel lists an op of an extern/fallback call
    extern_ops = fallback_ops | {f"aten::{m}" for m in re.findall(r"extern_kernels\.(\w+)\(", "\n".join(_call_lines(BWD / "output_code.py")))}
    assert all(not (set(r.fused_ops) & extern_ops) for r in cpp.itertuples())
    assert (cpp["listed_not_computed"].map(len) > 0).sum() == 1
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
    need_real(LONGFORMER)
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
    need_real(REAL_DATA)
    df = load_fusion_map(REAL_DATA)
    assert list(df.columns) == FUSION_MAP_COLUMNS
    assert sorted(df["graph"].unique()) == sorted(p.name for p in find_graph_dirs(REAL_DATA))
    per_graph = df.groupby("graph").size().to_dict()
    for d in find_graph_dirs(REAL_DATA):
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


# --- module stack (the FX graph's `# File:` comments) ---------------------------------------------------------------


def _fx_frames(graph_dir: Path) -> dict[str, str]:
    """node -> `# File:` summary above it in fx_graph_readable.py (a summary holds until the next one)."""
    frames, current = {}, None
    for line in (graph_dir / "fx_graph_readable.py").read_text().splitlines():
        if line.strip().startswith("# File: "):
            current = line.strip()[len("# File: "):]
        elif m := re.match(r"^\s+(\w+)(?:: \"[^\"]*\")? = ", line):
            frames.setdefault(m.group(1), current)
    return frames


GEN = "/tmp/gen/gen_inductor_cpu.py"
LINE_39 = f"{GEN}:39 in forward, code: q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)"
LINE_44 = f"{GEN}:44 in forward, code: x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))"
LINE_45 = f"{GEN}:45 in forward, code: x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))"


def test_module_stack_forward_from_provenance_nodes(fwd: pd.DataFrame):
    frames = _fx_frames(FWD)
    text = (FWD / "fx_graph_readable.py").read_text()
    for r in fwd.itertuples():
        # independently: the post-grad nodes' File comments, unique, in the order they appear in the file
        expected = sorted({frames[n] for n in r.post_grad_nodes if frames.get(n)}, key=text.index)
        assert r.module_stack == expected, r.kernel
    stacks = dict(zip(fwd["call_index"], fwd["module_stack"]))
    assert stacks[0] == [LINE_39]  # cpp_fused_native_layer_norm_0: var_mean ... add_1 are under line 39
    assert stacks[1] == [LINE_39]  # extern addmm (post-grad node addmm)
    assert stacks[4] == [LINE_44, LINE_45]  # cpp_fused_add_native_layer_norm_view_1: residual add + ln2
    assert stacks[6] == [LINE_45]  # cpp_fused_gelu_view_2
    assert len(stacks[2]) == 5  # SDPA call: lines 39 (split), 40, 41, 42 (q/k/v views) and 43
    assert list(FUSION_MAP_COLUMNS).index("module_stack") > list(FUSION_MAP_COLUMNS).index("post_grad_nodes")


def test_module_stack_backward_from_source_nodes(bwd: pd.DataFrame):
    # no provenance in the backward: the comment's source nodes (post-grad names in a backward graph)
    mm0 = bwd.iloc[0]
    assert mm0["kernel"] == "extern_kernels.mm" and mm0["source_nodes"] == ["view_12", "linear_3", "permute_8", "mm"]
    assert mm0["module_stack"] == [LINE_45]  # view_12, permute_8, mm are the first nodes, under line 45
    mm6 = bwd.iloc[6]  # [view_17, mul_15, ..., view_18, permute_16, mm_4]: the ln2 backward (45) + residual (44)
    assert mm6["module_stack"] == [LINE_45, LINE_44]
    # cpp kernels without a Source Nodes comment (2.13) have no nodes to look up
    assert bwd.loc[bwd["kind"] == "cpp", "module_stack"].map(len).eq(0).all()


def test_module_stack_longformer_from_header_mapping():
    need_real(LONGFORMER)
    df = parse_output_code(LONGFORMER)
    base = "/home/user/.conda/envs/pytorch-3.10/lib/python3.10/site-packages/transformers/"
    # header of kernel 0: `cumsum => cumsum`, `mask => convert_element_type`, `ne => ne`; in fx_graph_readable.py
    # ne and convert_element_type are under line 419, cumsum under 420
    assert df.loc[0, "module_stack"] == [
        f"{base}models/longformer/modeling_longformer.py:419 in create_position_ids_from_input_ids, "
        "code: mask = input_ids.ne(padding_idx).int()",
        f"{base}models/longformer/modeling_longformer.py:420 in create_position_ids_from_input_ids, "
        "code: incremental_indices = torch.cumsum(mask, dim=1).type_as(mask) * mask",
    ]
    # kernel 2: `extended_attention_mask_2 => full_default_1` (line 1187 of modeling_utils.py)
    assert df.loc[2, "module_stack"] == [
        f"{base}modeling_utils.py:1187 in get_extended_attention_mask, "
        "code: extended_attention_mask = (1.0 - extended_attention_mask) * torch.finfo(dtype).min"
    ]
    header = re.search(r"# Source node to ATen node mapping:\n((?:#   .*\n)+)", (LONGFORMER / "output_code.py").read_text())
    assert "#   mask => convert_element_type" in header.group(1)
    frames = _fx_frames(LONGFORMER)
    assert df.loc[1, "module_stack"][-1] == frames["add_4"]  # the LayerNorm's last node, line 466


def test_module_stack_synthetic(tmp_path: Path):
    d = _write_graph(tmp_path, "m__0_inference_0.0", _OLD_STYLE)
    (d / "fx_graph_readable.py").write_text(
        "class GraphModule(torch.nn.Module):\n"
        "    def forward(self, arg0_1):\n"
        "        # File: /m.py:3 in forward, code: y = x + 1\n"
        '        add: "f32[4]" = torch.ops.aten.add.Tensor(arg0_1, 1)\n'
        "        # No stacktrace found for following nodes\n"
        '        mul: "f32[4]" = torch.ops.aten.mul.Tensor(add, 2)\n'
        "        # File: /m.py:9 in forward, code: z = y * 3\n"
        '        mul_7: "f32[4]" = torch.ops.aten.mul.Tensor(mul, 3)\n'
    )
    df = parse_output_code(d)
    # call 0: `# add => add`, `# mul => mul` lines; mul has no stack trace
    assert df.loc[0, "module_stack"] == ["/m.py:3 in forward, code: y = x + 1"]
    # call 2: no mapping lines; the source nodes [add_3, mul_7] themselves (only mul_7 exists)
    assert df.loc[2, "module_stack"] == ["/m.py:9 in forward, code: z = y * 3"]
    assert df.loc[1, "module_stack"] == []  # no comment, no nodes
    (d / "fx_graph_readable.py").unlink()
    assert parse_output_code(d)["module_stack"].map(len).eq(0).all()  # no FX graph file: empty, no error


# --- exact kernel -> ATen-op maps (read off the output_code.py comment lines / kernel names) -------------------------


def test_exact_maps_forward(fwd: pd.DataFrame):
    # call_index: (kernel, fused_ops, source_nodes). Ops of extern/fallback calls: their post-grad node's target in
    # fx_graph_readable.py (`addmm = torch.ops.aten.addmm.default`); cpp kernels: the ops in the name
    # (`cpp_fused_add_native_layer_norm_view_1` -> add, native_layer_norm, view); source nodes: postToPre of the
    # provenance JSON in the order of cppCodeToPost's node list (`cpp_fused_gelu_view_2:7` -> mul_6 (gelu), ...,
    # view_9 (linear_2) -> [gelu, linear_2]).
    expected = {
        0: ("cpp_fused_native_layer_norm_0", ["aten::native_layer_norm"], ["layer_norm"]),
        1: ("extern_kernels.addmm", ["aten::addmm"], ["linear"]),
        3: ("extern_kernels.addmm", ["aten::addmm"], ["linear_1"]),
        4: ("cpp_fused_add_native_layer_norm_view_1", ["aten::add", "aten::native_layer_norm", "aten::view"],
            ["layer_norm_1", "x", "linear_1"]),
        5: ("extern_kernels.addmm", ["aten::addmm"], ["linear_2"]),
        6: ("cpp_fused_gelu_view_2", ["aten::gelu", "aten::view"], ["gelu", "linear_2"]),
        8: ("cpp_fused_add_view_3", ["aten::add", "aten::view"], ["x_1", "x", "linear_1", "linear_3"]),
    }
    for i, (kernel, ops, src) in expected.items():
        r = fwd.iloc[i]
        assert (r["kernel"], r["fused_ops"], r["source_nodes"]) == (kernel, ops, src), i


def test_exact_maps_backward(bwd: pd.DataFrame):
    # extern mm calls: `# Topologically Sorted Source Nodes: [...], Original ATen: [aten.view, aten.t, aten.mm]`
    # (output_code.py lines 503, 509); cpp kernels: no comment in 2.13 -> the ops in the name.
    expected = {
        0: ("extern_kernels.mm", ["aten::mm", "aten::t", "aten::view"], ["view_12", "linear_3", "permute_8", "mm"]),
        1: ("extern_kernels.mm", ["aten::mm", "aten::t", "aten::view"], ["view_12", "permute_9", "permute_11"]),
        2: ("cpp_fused_gelu_gelu_backward_sum_view_0", ["aten::gelu", "aten::gelu_backward", "aten::sum",
                                                        "aten::view"], []),
        17: ("cpp_fused_sum_view_6", ["aten::sum", "aten::view"], []),
    }
    for i, (kernel, ops, src) in expected.items():
        r = bwd.iloc[i]
        assert (r["kernel"], r["fused_ops"], r["source_nodes"]) == (kernel, ops, src), i
    sdpa = bwd[bwd["kind"] == "fallback"].iloc[0]
    assert sdpa["kernel"] == "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
    assert sdpa["profiler_name"] == "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    # the comment at output_code.py line 562
    assert sdpa["fused_ops"] == ["aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::transpose",
                                 "aten::view"]


def test_exact_maps_longformer():
    need_real(LONGFORMER)
    df = parse_output_code(LONGFORMER)
    # call-site comments at output_code.py lines 258, 263, 274
    assert df["kernel"].tolist() == [
        "triton_per_fused__to_copy_cumsum_ne_0",
        "triton_per_fused__to_copy_add_embedding_mul_native_layer_norm_ne_zeros_1",
        "triton_poi_fused_mul_2",
    ]
    assert df.loc[1, "fused_ops"] == ["aten::_to_copy", "aten::add", "aten::embedding", "aten::mul",
                                      "aten::native_layer_norm", "aten::ne", "aten::zeros"]
    assert df.loc[1, "source_nodes"] == [
        "inputs_embeds", "ne", "mask", "type_as", "incremental_indices", "long", "add", "position_embeddings",
        "add_1", "token_type_ids", "token_type_embeddings", "embeddings", "embeddings_1",
    ]
    assert (df.loc[2, "fused_ops"], df.loc[2, "source_nodes"]) == (["aten::mul"], ["extended_attention_mask_2"])
    # This dir has no extern call (graph 0.0 is the embedding block); the extern -> ATen rule is checked on the
    # CPU dirs (exact maps above) and on a synthetic CUDA-style call() in test_extern_calls_map_to_their_op.


def test_extern_calls_map_to_their_op(tmp_path: Path):
    text = _OLD_STYLE.replace(
        "extern_kernels.bmm(buf2, buf2, out=buf3)",
        "extern_kernels.bmm(buf2, buf2, out=buf3)\n"
        "        extern_kernels.mm(buf2, buf2, out=buf7)\n"
        "        # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.addmm]\n"
        "        extern_kernels.addmm(buf2, buf2, buf2, alpha=1, beta=1, out=buf8)\n"
        "        buf9 = extern_kernels.convolution(buf3, arg0_1, stride=(1,), padding=(0,), dilation=(1,),"
        " transposed=False, output_padding=(0,), groups=1, bias=None)",
    )
    df = parse_output_code(_write_graph(tmp_path, "m__0_inference_0.0", text))
    ext = df[df["kind"] == "extern"]
    assert list(zip(ext["kernel"], ext["profiler_name"], ext["fused_ops"])) == [
        ("extern_kernels.bmm", "aten::bmm", ["aten::bmm"]),
        ("extern_kernels.mm", "aten::mm", ["aten::mm"]),
        ("extern_kernels.addmm", "aten::addmm", ["aten::addmm"]),
        ("extern_kernels.convolution", "aten::convolution", ["aten::convolution"]),
    ]
    assert ext["source_nodes"].tolist() == [["bmm"], [], ["linear"], []]


# --- several graphs and recompilations ------------------------------------------------------------------------------


def _graph_code(calls: list[tuple[str, str, str]], generic: bool = False) -> str:
    """output_code.py with one Triton kernel per distinct name; calls: (kernel, source nodes, ATen ops)."""
    defs = []
    for k in dict.fromkeys(c[0] for c in calls):
        if k.startswith("extern_kernels."):
            continue
        sym = "triton_" if generic else k
        defs.append(f"{k} = async_compile.triton('{sym}', '''\ndef {sym}(in_ptr0, xnumel):\n    pass\n''', "
                    f"device_str='cuda')\n")
    body = []
    for k, src, ops in calls:
        body.append(f"        # Topologically Sorted Source Nodes: [{src}], Original ATen: [{ops}]")
        body.append(f"        {k}(buf0, buf0, out=buf1)" if k.startswith("extern_kernels.")
                    else f"        {k}.run(buf0, 4, grid=grid(4), stream=stream0)")
    return "\n".join(defs) + "\n\ndef call(args):\n    with torch.cuda._DeviceGuard(0):\n" + "\n".join(body) + \
        "\n    return (buf1, )\n"


def test_real_graphs_number_kernels_from_zero():
    need_real(REAL_DATA)
    fmap = load_fusion_map(REAL_DATA)
    assert sorted(fmap["graph"].unique()) == sorted([FWD.name, BWD.name, LONGFORMER.name])
    for d in (FWD, BWD, LONGFORMER):
        # the generated kernels' trailing counters, read off the definitions: 0..k-1 in every graph
        defined = re.findall(r"^\w+_(\d+) = async_compile\.", (d / "output_code.py").read_text(), re.M)
        assert sorted(map(int, defined)) == list(range(len(defined)))
        assert fmap.loc[fmap["graph"] == d.name, "call_index"].tolist() == list(range(len(_call_sites(d / "output_code.py"))))
    # the real trace's regions still find their own graph among all real graphs
    need_real(TRACE)
    for names, graph in zip(_region_kernels(TRACE), [FWD.name, BWD.name, FWD.name, BWD.name]):
        assert match_region(names, fmap) == (graph, list(range(len(names))))


def test_recompiled_graphs_same_kernel_name_different_ops(tmp_path: Path):
    # descriptive_names=False: both graphs number their kernels from 0 and call them triton_poi_fused_0
    _write_graph(tmp_path, "model__0_inference_0.0", _graph_code([
        ("triton_poi_fused_0", "add", "aten.add"), ("triton_poi_fused_1", "relu", "aten.relu")]))
    _write_graph(tmp_path, "model__1_inference_1.1", _graph_code([
        ("triton_poi_fused_0", "mul", "aten.mul"), ("extern_kernels.mm", "mm", "aten.mm")]))
    fmap = load_fusion_map(tmp_path / "torchinductor")
    assert fmap[["graph", "call_index", "kernel"]].values.tolist() == [
        ["model__0_inference_0.0", 0, "triton_poi_fused_0"], ["model__0_inference_0.0", 1, "triton_poi_fused_1"],
        ["model__1_inference_1.1", 0, "triton_poi_fused_0"], ["model__1_inference_1.1", 1, "extern_kernels.mm"],
    ]
    assert match_region(["triton_poi_fused_0", "triton_poi_fused_1"], fmap) == ("model__0_inference_0.0", [0, 1])
    assert match_region(["triton_poi_fused_0", "aten::mm"], fmap) == ("model__1_inference_1.1", [0, 1])
    graph, idx = match_region(["triton_poi_fused_0", "aten::mm"], fmap)
    assert fmap[(fmap["graph"] == graph) & (fmap["call_index"] == idx[0])]["fused_ops"].item() == ["aten::mul"]


def test_match_region_generic_names_ambiguous_across_graphs(tmp_path: Path):
    _write_graph(tmp_path, "a__0_inference_0.0", _graph_code([
        ("triton_poi_fused_add_0", "add", "aten.add"), ("triton_poi_fused_mul_1", "mul", "aten.mul")], generic=True))
    _write_graph(tmp_path, "a__1_inference_1.1", _graph_code([
        ("triton_poi_fused_cos_0", "cos", "aten.cos"), ("triton_poi_fused_sin_1", "sin", "aten.sin")], generic=True))
    fmap = load_fusion_map(tmp_path)
    # GPU names alone fit both graphs, which differ: no guess
    assert match_region(["triton_", "triton_"], fmap) is None
    assert match_region(["triton__0d1d2d", "triton__0d1d"], fmap) is None
    # CPU-side record functions (descriptive names) decide
    assert match_region(["triton_poi_fused_cos_0", "triton_poi_fused_sin_1"], fmap) == ("a__1_inference_1.1", [0, 1])
    # a recompilation with the same code: identical call sites, the first graph is as good as any
    _write_graph(tmp_path, "b__2_inference_2.2", _graph_code([
        ("triton_poi_fused_cos_0", "cos", "aten.cos"), ("triton_poi_fused_sin_1", "sin", "aten.sin")], generic=True))
    fmap = load_fusion_map(tmp_path)
    assert match_region(["triton_poi_fused_cos_0", "triton_"], fmap) == ("a__1_inference_1.1", [0, 1])
    # more descriptive matches win over generic ones
    assert match_region(["triton_", "triton_poi_fused_mul_1"], fmap) == ("a__0_inference_0.0", [0, 1])


# --- C20: kernel names differ between Inductor artifacts and the profiler -------------------------------------------


def test_normalize_kernel_name_c20():
    norm = inductor.normalize_kernel_name
    assert norm("triton_poi_fused_add_cos_0_0d1d2de") == "triton_poi_fused_add_cos_0"  # C20 (a)
    assert norm("triton_poi_fused_add_cos_0") == "triton_poi_fused_add_cos_0"  # the index _0 stays
    assert norm("triton_red_fused_sum_1") == "triton_red_fused_sum_1"
    # real names of hta_negative_queue_length__rank0 (docs/formats.md#kineto-cuda-graphs, docs/field-cases.md C03/C20)
    for real in ("triton__0d1d2d", "triton__0d1d23d", "triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14"):
        assert norm(real) == "triton_" and inductor.is_generic_triton_name(real)
    assert norm("original_kernel_0d1d2d3de4de") == "original_kernel_0d1d2d3de4de"  # only triton* names
    assert norm("cpp_fused_conv2d_1d_0") == "cpp_fused_conv2d_1d_0"
    assert not inductor.is_generic_triton_name("triton_poi_fused_add_cos_0")


_C20 = _graph_code([("triton_poi_fused_add_cos_0", "add, cos", "aten.add, aten.cos"),
                    ("triton_red_fused_sum_1", "sum_1", "aten.sum")])


def _kernels(names: list[str], iterations: list | None = None, pid: int = 1) -> pd.DataFrame:
    n = len(names)
    return pd.DataFrame({
        "kernel_id": range(n), "name": names, "match_key": names, "occurrence": [0] * n, "pid": [pid] * n,
        "iteration": pd.array(iterations if iterations is not None else [None] * n, dtype="Int64"),
        "start_ns": [100 * i for i in range(n)],
    })


def test_c20_by_name(tmp_path: Path):
    fmap = parse_output_code(_write_graph(tmp_path, "model__0_inference_0.0", _C20))
    names = ["triton_poi_fused_add_cos_0_0d1d2de",  # (a) old signature suffix
             "triton_",  # (b') generic name in an nsys-only capture: nothing names the kernel
             "triton_poi_fused_add_cos_0",  # (c) exact
             "triton__0d1d2d",  # Triton 2.0 symbol: generic too
             "volta_sgemm_128x32_nt",  # library kernel of an extern call
             "triton_poi_fused_relu_9"]  # generated but from no graph here
    out = inductor.attribute_by_name(_kernels(names), fmap)
    assert list(out.columns) == inductor.ATTRIBUTE_BY_NAME_COLUMNS
    assert out["fused_ops"].tolist()[:3] == [["aten::add", "aten::cos"], [], ["aten::add", "aten::cos"]]
    assert out["graph"].tolist()[:3] == ["model__0_inference_0.0", None, "model__0_inference_0.0"]
    assert out["call_index"].tolist()[:3] == [0, pd.NA, 0]
    assert out["source_nodes"][0] == ["add", "cos"] and out["match"][0] == "unique_call_site"
    assert out["reason"].tolist() == [None, "ambiguous_generic_kernel_name", None, "ambiguous_generic_kernel_name",
                                      "extern_kernel_name_unknown", "not_in_fusion_map"]
    assert set(out["reason"].dropna()) <= set(inductor.BY_NAME_REASONS)
    # C20 (a) through a region as well: the suffix is dropped before matching
    assert match_region(["triton_poi_fused_add_cos_0_0d1d2de", "triton_red_fused_sum_1"], fmap)[1] == [0, 1]
    empty = inductor.attribute_by_name(_kernels(["triton_poi_fused_add_cos_0"]), load_fusion_map(tmp_path / "x"))
    assert empty["reason"].tolist() == ["no_fusion_map"]


def test_by_name_call_site_order_reused_kernel(tmp_path: Path):
    # one kernel reused at two call sites (two layers), with a different op between them
    code = _graph_code([("triton_poi_fused_gelu_0", "gelu", "aten.gelu"),
                        ("extern_kernels.mm", "linear_1", "aten.mm"),
                        ("triton_poi_fused_gelu_0", "gelu_1", "aten.gelu")])
    fmap = parse_output_code(_write_graph(tmp_path, "m__0_inference_0.0", code))
    names = ["triton_poi_fused_gelu_0", "sm90_gemm", "triton_poi_fused_gelu_0"] * 3
    out = inductor.attribute_by_name(_kernels(names, [0, 0, 0, 1, 1, 1, 2, 2, 2]), fmap)
    gelu = out[out["kernel"] == "triton_poi_fused_gelu_0"]
    assert gelu["call_index"].tolist() == [0, 2] * 3
    assert gelu["source_nodes"].tolist() == [["gelu"], ["gelu_1"]] * 3
    assert (gelu["match"] == "call_site_order").all()
    assert out.loc[out["kernel_id"] == 1, "reason"].item() == "extern_kernel_name_unknown"
    # no iteration ranges: the window may start at either gelu (seen: a capture starting mid-iteration
    # swapped the call sites silently) and the graph's only generated kernel is the reused one, so no launch
    # order fixes the offset: both sites compute aten::gelu -> the operator stays, the FX nodes are undecided
    out = inductor.attribute_by_name(_kernels(names), fmap)
    gelu = out[out["kernel"].notna()]
    assert len(gelu) == 6 and gelu["call_index"].isna().all() and (gelu["match"] == "same_operator").all()
    assert gelu["fused_ops"].tolist() == [["aten::gelu"]] * 6 and gelu["source_nodes"].tolist() == [[]] * 6
    assert gelu["source_nodes_ambiguous"].all()
    assert gelu["candidates"].tolist() == [["m__0_inference_0.0:0", "m__0_inference_0.0:2"]] * 6
    # an iteration captured in part (1 launch for 2 call sites): the order cannot decide either
    out = inductor.attribute_by_name(_kernels(names[:4], [0, 0, 0, 1]), fmap)
    assert out["call_index"].tolist()[:3] == [0, pd.NA, 2]
    assert out["match"].tolist() == ["call_site_order", None, "call_site_order", "same_operator"]
    assert out["reason"].tolist() == [None, "extern_kernel_name_unknown", None, None]


def test_by_name_several_graphs(tmp_path: Path):
    _write_graph(tmp_path, "m__0_inference_0.0", _graph_code([("triton_poi_fused_0", "add", "aten.add")]))
    _write_graph(tmp_path, "m__1_inference_1.1", _graph_code([("triton_poi_fused_0", "mul", "aten.mul")]))
    fmap = load_fusion_map(tmp_path)
    out = inductor.attribute_by_name(_kernels(["triton_poi_fused_0"]), fmap)
    assert out["reason"].tolist() == ["kernel_name_in_several_call_sites"]
    # a recompilation of the same code: same ops and source nodes, graph unknown but the answer is the same
    _write_graph(tmp_path, "n__0_inference_0.0", _graph_code([("triton_poi_fused_add_0", "add", "aten.add")]))
    _write_graph(tmp_path, "n__1_inference_1.1", _graph_code([("triton_poi_fused_add_0", "add", "aten.add")]))
    out = inductor.attribute_by_name(_kernels(["triton_poi_fused_add_0"]), load_fusion_map(tmp_path))
    assert out.loc[0, ["graph", "match", "reason"]].tolist() == [None, "identical_call_sites", None]
    assert out.loc[0, "call_index"] is pd.NA and out.loc[0, "fused_ops"] == ["aten::add"]


def test_by_name_real_cpu_trace():
    """The real compiled CPU trace joined by name only (as for an nsys timeline): each graph_0_cpp_* kernel gets
    the call site at its position in its `## Call CompiledFxGraph` region (computed from the raw JSON)."""
    need_real(TRACE, FWD, BWD)
    from operator_profiler.timeline.kineto import read_kineto

    fmap = load_fusion_map(CPU_DIRS)
    timeline = read_kineto(TRACE)
    k = timeline.kernels
    out = inductor.attribute_by_name(k, fmap).merge(k[["kernel_id", "name"]], on="kernel_id")
    cpp = out[out["name"].str.startswith("graph_0_cpp_")]
    expected = []  # (graph, call_index) of every cpp kernel in trace order, from region positions
    for names, graph in zip(_region_kernels(TRACE), [FWD.name, BWD.name, FWD.name, BWD.name]):
        expected += [(graph, i) for i, n in enumerate(names) if n.startswith("graph_0_cpp_")]
    assert len(cpp) == len(expected) == 2 * (4 + 9)  # 2 steps x (4 fwd + 9 bwd cpp calls)
    assert list(zip(cpp["graph"], cpp["call_index"])) == expected
    # the reused backward kernel: its three call sites in turn, in both steps
    cat = cpp[cpp["name"] == "graph_0_cpp_fused_cat_transpose_view_3"]
    assert cat["call_index"].tolist() == [9, 10, 11] * 2 and (cat["match"] == "call_site_order").all()
    # the extern/fallback ops are left to the correlation path
    assert set(out.loc[out["name"].str.startswith("aten::"), "reason"]) == {"extern_kernel_name_unknown"}


def test_by_name_longformer_generic_and_descriptive():
    need_real(LONGFORMER)
    fmap = parse_output_code(LONGFORMER)
    names = ["triton_"] * 3 + ["triton_per_fused__to_copy_cumsum_ne_0", "triton_poi_fused_mul_2"]
    out = inductor.attribute_by_name(_kernels(names), fmap)
    assert out["reason"].tolist() == ["ambiguous_generic_kernel_name"] * 3 + [None, None]
    assert out["fused_ops"].tolist()[3:] == [["aten::_to_copy", "aten::cumsum", "aten::ne"], ["aten::mul"]]
    assert out["call_index"].tolist()[3:] == [0, 2]


# --- errors at the CLI ----------------------------------------------------------------------------------------------


def _cli(capsys, *argv: str) -> tuple[int, str]:
    from operator_profiler import cli

    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def test_cli_fusion_map_errors(tmp_path: Path, capsys):
    empty = tmp_path / "no_graphs"
    empty.mkdir()
    code, err = _cli(capsys, "fusion-map", "--inductor-dir", str(empty), "--out", str(tmp_path / "f.parquet"))
    assert code == 1 and err.count("\n") == 1
    assert str(empty) in err and "no output_code.py" in err
    bad = _write_graph(tmp_path / "bad", "m__0_forward_0.0", "# truncated\n")
    code, err = _cli(capsys, "fusion-map", "--inductor-dir", str(tmp_path / "bad"), "--out", str(tmp_path / "f.parquet"))
    assert code == 1 and err.count("\n") == 1 and str(bad / "output_code.py") in err and "def call(" in err
    prov = _write_graph(tmp_path / "prov", "m__0_forward_0.0", _OLD_STYLE)
    (prov / "inductor_provenance_tracking_node_mappings.json").write_text("{not json")
    code, err = _cli(capsys, "fusion-map", "--inductor-dir", str(tmp_path / "prov"), "--out", str(tmp_path / "f.parquet"))
    assert code == 1 and err.count("\n") == 1
    assert str(prov / "inductor_provenance_tracking_node_mappings.json") in err and "not valid JSON" in err
    assert not (tmp_path / "f.parquet").exists()
    code, err = _cli(capsys, "fusion-map", "--inductor-dir", str(prov.parent.parent), "--out", str(tmp_path / "g.parquet"))
    assert code == 1  # a tree with one broken graph is an error, not a partial map
    need_real(CPU_DIRS)
    code, _ = _cli(capsys, "fusion-map", "--inductor-dir", str(CPU_DIRS), "--out", str(tmp_path / "ok.parquet"))
    written = pd.read_parquet(tmp_path / "ok.parquet")
    from operator_profiler.work.fused_kernels import FUSION_MAP_WORK_COLUMNS

    assert code == 0 and list(written.columns) == FUSION_MAP_COLUMNS + FUSION_MAP_WORK_COLUMNS
    generated = written[written["kind"] == "cpp"]
    assert len(generated) and generated["work_bytes_read"].notna().all()  # each kernel's own buffer arguments
    assert written.loc[written["kind"] != "cpp", "work_flops"].isna().all()  # extern calls: from recorded shapes
    # backward: `buf20 = reinterpret_tensor(buf23, (2, 16, 64), (3072, 192, 1), 0)  # alias` is what the first
    # cpp_fused_cat_transpose_view_3 call writes (out_ptr0, float)
    cat = written[written["kernel"] == "cpp_fused_cat_transpose_view_3"].sort_values("call_index").iloc[0]
    assert cat["work_bytes_written"] == 2 * 16 * 64 * 4
    assert pd.isna(cat["work_flops"]) and "forward graphs only" in cat["work_note"]
    first_fwd = written[(written["graph"] == FWD.name) & (written["call_index"] == 0)].iloc[0]
    assert list(first_fwd["module_stack"]) == [LINE_39]
