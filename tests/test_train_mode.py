"""A compiled training step end to end (real torch.compile on the CPU): forward and backward graphs,
backward kernels linked to their forward op and layer, fusion map for both graphs."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import torch_flags_kept

from operator_profiler import stages, tables
from operator_profiler.attribution import inductor
from operator_profiler.capture import jobs as capture

N_LAYER = 2
WORKLOAD = {"kind": "gpt2", "mode": "train", "compile": True, "compile_scope": "layers", "n_layer": N_LAYER,
            "n_embd": 16, "n_head": 2,
            "vocab_size": 32, "n_positions": 16, "batch_size": 1, "seq_len": 8}


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    with torch_flags_kept():
        settings = {"seed": 0, "warmup": 1, "iterations": 1}
        capture.compile_artifacts(WORKLOAD, settings, "cpu", out / "inductor")
        capture.capture_timeline("tiny", WORKLOAD, {**settings, "iterations": 2}, "cpu", "torch",
                                out / "trace.json.gz", out / "run.json", out / "layers.json", out / "clocks.json")
    stages.build_fusion_map(out / "inductor", out / "fusion_map.parquet")
    stages.export_timeline(out / "trace.json.gz", out / "timeline")
    stages.classify(out / "timeline", out / "layers.json", out / "instances.parquet", out / "kernel_layers.parquet",
                    out / "classes.json", out / "classes")
    stages.attribute_files(out / "timeline", out / "kernel_layers.parquet", out / "fusion_map.parquet",
                           out / "attribution.parquet")
    return out


def test_forward_and_backward_graphs_are_in_the_fusion_map(train_run):
    graphs = [p.name for p in inductor.find_graph_dirs(train_run / "inductor")]
    assert any("forward" in g for g in graphs) and any("backward" in g for g in graphs)


def test_backward_kernels_belong_to_their_forward_layer(train_run):
    attribution = tables.read_table(train_run / "attribution.parquet")
    kernels = tables.read_table(train_run / "timeline" / "kernels.parquet")
    ranges = tables.read_table(train_run / "timeline" / "ranges.parquet")
    # Independent: kernels inside a CompiledFunctionBackward node are the blocks' backward kernels.
    backward_nodes = ranges[ranges["name"] == "CompiledFunctionBackward"]
    assert len(backward_nodes) == N_LAYER * 2  # 2 layers x 2 measured iterations
    inside = pd.Series(False, index=kernels.index)
    for node in backward_nodes.itertuples():
        inside |= (kernels["launch_tid"] == node.tid) & (kernels["start_ns"] >= node.start_ns) & (kernels["end_ns"] <= node.end_ns)
    backward = attribution.set_index("kernel_id").loc[kernels.loc[inside, "kernel_id"]]
    assert len(backward) > 0
    assert (backward["forward_operator"] == "CompiledFunction").all()
    assert set(backward["layer"]) == {f"transformer.h.{i}" for i in range(N_LAYER)}
    # every backward kernel is attributed, the fused C++ ones through the backward graph's fusion map
    assert (backward["path"] != "unattributed").all()
    fused = backward[backward["name"].str.startswith("graph_")] if "name" in backward else backward
    assert (fused["path"] == "inductor").all() and len(fused) > 0


def test_layer_class_signature_covers_forward_and_backward(train_run):
    classes = json.loads((train_run / "classes.json").read_text())
    blocks = [c for name, c in classes.items() if name != "rest"]
    assert len(blocks) == 1 and blocks[0]["instances"] == [f"transformer.h.{i}" for i in range(N_LAYER)]
    kl = pd.read_parquet(train_run / "kernel_layers.parquet")
    attribution = tables.read_table(train_run / "attribution.parquet")
    first = attribution[(attribution["iteration"] == 0) & (attribution["layer"] == "transformer.h.0")]
    # the signature is the instance's kernels of the first iteration, backward ones included
    assert len(first) == len(blocks[0]["signature"])
    assert (first["forward_operator"] == "CompiledFunction").any() and first["forward_operator"].isna().any()
    assert [s[0] for s in blocks[0]["signature"]] == first.sort_values("kernel_id")["name"].tolist()
    assert set(kl.loc[kl["layer"].notna(), "layer_class"]) == {blocks[0]["class"]}
