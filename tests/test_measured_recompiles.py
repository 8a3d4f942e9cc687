"""A compiled model whose guards fail on every call recompiles inside the measured iterations: the capture is
refused in one line (the profile would time Dynamo tracing and Inductor compilation as the model's operators)."""

from __future__ import annotations

import sys

import pytest

from operator_profiler.capture import harness
from operator_profiler.errors import WorkloadError

MODEL = """
import torch

class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1          # a Python int the graph depends on: a new guard value every call
        return self.lin(x) * self.calls

class Stable(Counting):
    def forward(self, x):
        return self.lin(x) * 2

def counting():
    return Counting(), (torch.randn(2, 4),)

def stable():
    return Stable(), (torch.randn(2, 4),)

def bare_sequential():  # torch's own module as the model: model.compile() traces nothing
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), (torch.randn(2, 4),)
"""
SETTINGS = {"seed": 0, "warmup": 2, "warmup_max": 2, "iterations": 2}


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "recompile_models.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("recompile_models", None)


def test_a_model_recompiling_in_the_measured_iterations_is_refused(models, tmp_path):
    workload = {"kind": "custom", "factory": "recompile_models:counting", "compile": True}
    with pytest.raises(WorkloadError, match=r"workload 'mine' was recompiled [1-9]\d* time\(s\) during the measured"):
        harness.run_capture(workload, SETTINGS, "cpu", None, None, tmp_path / "run.json", profiler="none",
                            workload_name="mine")
    assert not (tmp_path / "run.json").exists()


def test_a_stable_compiled_model_is_not_refused(models, tmp_path):
    workload = {"kind": "custom", "factory": "recompile_models:stable", "compile": True}
    run = harness.run_capture(workload, SETTINGS, "cpu", None, None, tmp_path / "run.json", profiler="none",
                              workload_name="mine")
    assert run["compiled"] is True and (tmp_path / "run.json").exists()


def test_a_compile_that_compiles_nothing_is_refused(models, tmp_path):
    """QA: the documented example (a bare nn.Sequential, compile: true) ran eager while run.json said compiled (Dynamo
    does not trace torch's own module forward as the compiled frame); only compile_artifacts failed, as an internal
    error. Now the capture refuses it in one line that says what to do."""
    import torch

    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    workload = {"kind": "custom", "factory": "recompile_models:bare_sequential", "compile": True}
    with pytest.raises(WorkloadError, match=r"workload 'mine': the model is torch's own Sequential, whose forward torch.compile does not "
                                            r"trace.*wrap it in a module of your own"):
        harness.run_capture(workload, SETTINGS, "cpu", None, None, tmp_path / "run.json", profiler="none",
                            workload_name="mine")
    assert counters["stats"]["unique_graphs"] == graphs and not (tmp_path / "run.json").exists()
    assert torch.compile  # the refusal is about the model, not about torch.compile being unavailable
