"""Layers called in unusual ways, captured for real (eager, CPU): a layer called twice per forward
(shared weights), the same block object listed twice (ALBERT-style), and a layer called from
inside another layer. Expected instances come from the model structure; kernel sets from the raw
trace's ranges."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import importable_module, torch_flags_kept

from operator_profiler import layers
from operator_profiler.capture import harness
from operator_profiler.timeline.kineto import read_kineto

MODELS = '''
import torch, torch.nn as nn

class Blk(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
    def forward(self, x):
        return torch.relu(self.lin(x)) + x

class Shared(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.blocks = nn.ModuleList([Blk(d) for _ in range(3)])
    def forward(self, x):
        for i in (0, 1, 2, 0):          # blocks[0] runs twice
            x = self.blocks[i](x)
        return x

class Albert(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        b = Blk(d)
        self.blocks = nn.ModuleList([b, b, Blk(d)])   # the same object twice
    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x

class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, d)
    def forward(self, x):
        return torch.sigmoid(self.up(x))

class Outer(nn.Module):
    def __init__(self, d, experts):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.experts = [experts]          # not a submodule: the experts live at the top level
    def forward(self, x, i):
        h = self.norm(x)
        h = self.experts[0][i](h)         # a layer called inside this layer
        return torch.tanh(h) + x

class Nested(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.experts = nn.ModuleList([Expert(d) for _ in range(2)])
        self.blocks = nn.ModuleList([Outer(d, self.experts) for _ in range(2)])
    def forward(self, x):
        for i, blk in enumerate(self.blocks):
            x = blk(x, i)
        return x

def shared():
    return Shared(), (torch.randn(2, 8),)

def albert():
    return Albert(), (torch.randn(2, 8),)

def nested():
    return Nested(), (torch.randn(2, 8),)

class Stages(nn.Module):
    """Two stages of two blocks each, 8 and 16 wide (HF ResNet's stages): the same kernel names in every block."""
    def __init__(self):
        super().__init__()
        self.narrow = nn.ModuleList([Blk(8) for _ in range(2)])
        self.widen = nn.Linear(8, 16)
        self.wide = nn.ModuleList([Blk(16) for _ in range(2)])
    def forward(self, x):
        for blk in self.narrow:
            x = blk(x)
        x = self.widen(x)
        for blk in self.wide:
            x = blk(x)
        return x

def stages():
    return Stages(), (torch.randn(2, 8),)
'''

ITERATIONS = 2


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    root = tmp_path_factory.mktemp("calls")

    def run(factory):
        out = root / factory
        workload = {"kind": "custom", "factory": f"layer_call_models:{factory}", "kwargs": {}, "compile": False}
        with torch_flags_kept():
            harness.run_capture(workload, {"seed": 0, "warmup": 1, "iterations": ITERATIONS}, "cpu",
                                out / "trace.json.gz", out / "layers.json", out / "run.json")
        timeline = read_kineto(out / "trace.json.gz")
        found = json.loads((out / "layers.json").read_text())
        return timeline, found, layers.classify_layers(timeline.kernels, timeline.ranges, found)

    with importable_module(root, "layer_call_models", textwrap.dedent(MODELS)):
        yield run


def test_a_layer_called_twice_is_two_instances_of_one_class(capture):
    _, found, (_, instances, classes) = capture("shared")
    assert [l["path"] for l in found] == ["blocks.0", "blocks.1", "blocks.2"]
    blocks = [c for name, c in classes.items() if name != layers.REST_CLASS]
    assert len(blocks) == 1
    assert blocks[0]["instances"] == ["blocks.0", "blocks.1", "blocks.2", "blocks.0#1"]
    first = instances[instances["iteration"] == 0].set_index("layer")
    assert first.loc["blocks.0#1", "module"] == "blocks.0"
    assert first.loc["blocks.0#1", "kernel_count"] == first.loc["blocks.1", "kernel_count"]


def test_the_same_block_listed_twice_is_two_instances(capture):
    _, found, (_, _, classes) = capture("albert")
    assert [l["path"] for l in found] == ["blocks.0", "blocks.2"]  # named_modules lists the object once
    blocks = [c for name, c in classes.items() if name != layers.REST_CLASS]
    assert len(blocks) == 1 and blocks[0]["instances"] == ["blocks.0", "blocks.0#1", "blocks.2"]


def test_a_layer_inside_a_layer_takes_its_own_kernels(capture):
    timeline, _, (kernel_layers, _, classes) = capture("nested")
    kernels, ranges = timeline.kernels, timeline.ranges
    assigned = kernel_layers.set_index("kernel_id")["layer"]
    first_iteration = ranges[ranges["iteration"] == 0].iloc[0]
    for block, expert in (("blocks.0", "experts.0"), ("blocks.1", "experts.1")):
        outer = ranges[(ranges["layer"] == block) & (ranges["start_ns"] >= first_iteration["start_ns"])].iloc[0]
        inner = ranges[(ranges["layer"] == expert) & (ranges["start_ns"] >= outer["start_ns"])].iloc[0]
        in_outer = (kernels["start_ns"] >= outer["start_ns"]) & (kernels["end_ns"] <= outer["end_ns"])
        in_inner = (kernels["start_ns"] >= inner["start_ns"]) & (kernels["end_ns"] <= inner["end_ns"])
        assert in_inner.any() and (in_outer & ~in_inner).any()
        assert (assigned[kernels.loc[in_inner, "kernel_id"]] == expert).all()
        assert (assigned[kernels.loc[in_outer & ~in_inner, "kernel_id"]] == block).all()
    names = {c["module_class"] for c in classes.values()}
    assert {"Outer", "Expert"} <= names


def test_layers_of_other_widths_with_the_same_kernels_are_other_classes(capture):
    """On the CPU a kernel has no grid, so the blocks of two stages of other widths had the same signature and
    formed one class (HF ResNet-50's four stages): counters measured on an 8-wide block would have stood for the
    16-wide ones. Each stage is a class of its own, N/1 within it."""
    timeline, found, (_, _, classes) = capture("stages")
    assert [l["path"] for l in found] == ["narrow.0", "narrow.1", "wide.0", "wide.1"]
    blocks = sorted((c for name, c in classes.items() if name != layers.REST_CLASS), key=lambda c: c["instances"])
    assert [c["instances"] for c in blocks] == [["narrow.0", "narrow.1"], ["wide.0", "wide.1"]]
    assert blocks[0]["signature"] == blocks[1]["signature"]  # the kernels alike: only the shapes tell them apart
