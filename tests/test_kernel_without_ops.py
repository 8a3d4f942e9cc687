"""No operator is named ``0``: an Inductor kernel whose name has no fused-op part.

Inductor names a generated kernel ``cpp_fused_<n>`` / ``triton_<kind>_fused_<n>`` when none of its FX nodes
carries ``original_aten`` (``torch._inductor.utils.get_fused_kernel_name``). A real compile is made to do so
here by a post-grad custom pass that drops that meta (a real Inductor run: only the nodes' meta is changed),
then the compiled train step is profiled and attributed as the workflow does.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from operator_profiler import stages, tables
from operator_profiler.attribution import inductor


class DropOriginalAten(CustomGraphPass):
    """Removes ``original_aten`` from every post-grad FX node."""

    def __call__(self, graph):
        for node in graph.nodes:
            node.meta.pop("original_aten", None)

    def uuid(self):
        return "opprof-test-drop-original-aten"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    out = tmp_path_factory.mktemp("without_ops")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    # what the harness's compile_artifacts sets (harness._configure_inductor), plus the pass; restored after
    settings = {"post_grad_custom_post_pass": DropOriginalAten(), "trace.enabled": True,
                "trace.provenance_tracking_level": 1, "fx_graph_cache": False, "cpp.enable_kernel_profile": True}
    torch._dynamo.reset()
    try:
        with inductor_config.patch(settings), dynamo_config.patch(debug_dir_root=str(out / "inductor")):
            step = torch.compile(model)
            step(x).square().mean().backward()  # compiles the forward and backward graphs
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(x).square().mean().backward()
            prof.export_chrome_trace(str(out / "trace.json"))
    finally:
        torch._dynamo.reset()
    fusion = stages.build_fusion_map(out / "inductor", out / "fusion_map.parquet")
    stages.export_timeline(out / "trace.json", out / "timeline")
    stages.attribute_files(out / "timeline", None, out / "fusion_map.parquet", out / "attribution.parquet")
    return out, fusion


def test_inductor_named_kernels_without_ops(compiled):
    out, _ = compiled
    # independent: the generated kernels' names in output_code.py carry no op
    names = set()
    for code in (out / "inductor").rglob("output_code.py"):
        names |= set(re.findall(r"^(cpp_\w+) = async_compile\.cpp", code.read_text(), re.M))
    assert names and all(re.fullmatch(r"cpp_fused_\d+", n) for n in names), names


def test_fusion_map_lists_no_digit_as_an_op(compiled):
    _, fusion = compiled
    generated = fusion[fusion["kind"] == "cpp"]
    assert len(generated) and not any(op.isdigit() for ops in fusion["fused_ops"] for op in ops)
    # a call site with FX nodes known (the forward, through the provenance JSON) lists their targets
    with_nodes = generated[generated["post_grad_nodes"].map(len) > 0]
    assert (with_nodes["origin"] == "fx_nodes").all()
    assert all(op.startswith("aten::") for ops in with_nodes["fused_ops"] for op in ops)
    # the backward's C++ kernels have neither a comment nor provenance: no op is known
    backward = generated[generated["graph"].str.contains("backward")]
    assert len(backward) and (backward["fused_ops"].map(len) == 0).all()


def test_no_operator_is_named_0(compiled):
    out, _ = compiled
    attribution = tables.read_table(out / "attribution.parquet")
    assert not attribution["operator"].dropna().str.fullmatch(r"\d+").any()
    evidence = attribution["evidence"].map(json.loads)
    site_ops = evidence.map(lambda e: e.get("inductor", {}).get("fused_ops"))
    unnamed = attribution[site_ops.map(lambda ops: ops == [])]
    assert len(unnamed)
    # named by the kernel's own name (graph_<id>_cpp_fused_<n> on the CPU), with the partial-answer reason
    assert (unnamed["operator"] == unnamed["name"]).all() and (unnamed["path"] == "inductor").all()
    assert (unnamed["reason"] == "fusion_map_without_ops").all()
    assert unnamed["name"].str.fullmatch(r"graph_\d+_cpp_fused_\d+").all()
    named = attribution[site_ops.map(lambda ops: bool(ops))]
    assert named["operator"].str.startswith("aten::").all()
    operators = pd.read_parquet(out / "attribution.parquet")["operator"]
    assert "0" not in set(operators.dropna())


@pytest.mark.parametrize("kernel, ops", [
    ("cpp_fused_0", []),
    ("triton_poi_fused_12", []),
    ("triton_poi__0", []),  # descriptive_names off
    ("cpp_fused_add_1_mul_0", ["aten::add", "aten::mul"]),  # descriptive_names="inductor_node": node add_1
    ("cpp_fused_native_layer_norm_0", ["aten::native_layer_norm"]),
])
def test_kernel_name_ops(kernel, ops):
    kdef = inductor._KernelDef(kind="cpp" if kernel.startswith("cpp") else "triton", profiler_name=kernel,
                               gpu_symbol=None)
    vocab = inductor._aten_vocabulary("")
    assert inductor._ops_from_name(kernel, kdef, vocab) == ops
