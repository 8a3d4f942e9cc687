"""Train mode end to end on the CPU with real torch: the train step (loss, backward,
optimizer), its phases in the profile and the reports, the reason identical layers fall into several classes,
and the errors of a model that raises (its traceback in the job's log, its file:line in the one-line message).

Expected values are recomputed here from the timeline's own tables (ranges, kernels), not copied from the code.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import importable_module

from operator_profiler import stages, tables
from operator_profiler.capture import harness, training
from operator_profiler.capture import jobs as capture
from operator_profiler.errors import WorkloadError
from operator_profiler.naming import PHASE_PREFIX, PHASES
from operator_profiler.results import ReportPaths
from operator_profiler.rule_runner import run_rule

MODELS = '''
import torch

CALLS = []


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.lin(self.norm(x))


class Stack(torch.nn.Module):
    def __init__(self, width, n):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(n)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build(width=8, n=3):
    return Stack(width, n), (torch.randn(2, 4, width),)


def sum_loss(output, inputs):
    CALLS.append((type(output).__name__, len(inputs)))
    return output.sum()


def not_scalar_loss(output, inputs):
    return output


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("the backward of my op failed")  # MARK backward


class BadBackward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return Doubled.apply(self.lin(x))


def build_bad_backward():
    return BadBackward(), (torch.randn(2, 4),)


class BadForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) @ torch.ones(3, 3)  # MARK forward


def build_bad_forward():
    return BadForward(), (torch.randn(2, 4),)


def build_raises():
    raise KeyError("no such checkpoint")  # MARK factory
'''

SETTINGS = {"seed": 0, "warmup": 1, "warmup_max": 1, "iterations": 2}  # a fixed warm-up
TRAIN = {"kind": "custom", "factory": "train_models:build", "kwargs": {}, "compile": False, "mode": "train",
         "optimizer": "sgd", "lr": 0.1, "loss_fn": None}


def line_of(mark: str) -> int:
    """The 1-based line of MODELS holding ``# MARK <mark>``."""
    return next(i for i, line in enumerate(MODELS.splitlines(), 1) if line.endswith(f"# MARK {mark}"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with importable_module(tmp_path_factory.mktemp("train_models"), "train_models", MODELS):
        import train_models

        yield train_models


@pytest.fixture(scope="module")
def train_run(models, tmp_path_factory):
    """A real eager train capture of a 3-block residual stack, analysed up to both reports."""
    out = tmp_path_factory.mktemp("train_run")
    capture.capture_timeline("stack", TRAIN, SETTINGS, "cpu", "torch", out / "trace.json.gz", out / "run.json",
                             out / "layers.json", out / "clocks.json")
    stages.export_timeline(out / "trace.json.gz", out / "timeline")
    stages.classify(out / "timeline", out / "layers.json", out / "instances.parquet", out / "kernel_layers.parquet",
                    out / "classes.json", out / "classes")
    stages.attribute_files(out / "timeline", out / "kernel_layers.parquet", None, out / "attribution.parquet")
    stages.aggregate_files(out / "attribution.parquet", out / "instances.parquet", out / "classes.json",
                           {"per_iteration": True, "device": "cpu"}, out / "operators.parquet", out / "operators.csv",
                           out / "modules.parquet", out / "layer_classes.parquet", out / "coverage.json",
                           out_phases=out / "phases.parquet")
    paths = ReportPaths.of_folder(out)
    paths.run = out / "run.json"
    stages.report_files("stack", ReportPaths(out / "coverage.json", out / "operators.parquet", out / "modules.parquet",
                                             out / "layer_classes.parquet", run=paths.run, phases=paths.phases),
                        {"top_operators": 20}, out / "report.md")
    stages.report_html_files("stack", paths, {"top_operators": 20}, out / "report.html")
    return out


def _phase_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    mine = ranges[ranges["name"].astype(str).str.startswith(PHASE_PREFIX)]
    return mine.assign(phase=mine["name"].astype(str).str.removeprefix(PHASE_PREFIX)).sort_values("start_ns")


# ------------------------------------------------------------------------------ the loss


def test_default_loss_of_each_output_kind():
    y = torch.randn(3, 2, requires_grad=True)
    expected = y.float().square().mean()
    assert torch.equal(training.default_loss(y), expected)
    # a tuple or dict: every floating-point tensor that requires grad, nothing else (ids, detached stats)
    assert torch.equal(training.default_loss((y, y.detach().sum(), torch.arange(3))), expected)
    assert torch.equal(training.default_loss({"hidden": y, "ids": torch.arange(3)}), expected)
    z = torch.randn(4, requires_grad=True)
    both = training.default_loss({"a": [y], "b": (z,)})
    assert torch.equal(both, torch.stack([expected, z.float().square().mean()]).sum())
    # a model that returns its loss: taken as it is
    loss = y.sum()
    assert training.default_loss({"loss": loss, "logits": y}) is loss
    assert training.default_loss(loss) is loss
    with pytest.raises(WorkloadError, match="no floating-point tensor that requires grad.*loss_fn"):
        training.default_loss({"ids": torch.arange(3), "frozen": torch.randn(2)})


def test_loss_fn_is_called_with_output_and_inputs(models, tmp_path):
    models.CALLS.clear()
    run = harness.run_capture({**TRAIN, "loss_fn": "train_models:sum_loss"}, SETTINGS, "cpu", None, None,
                              tmp_path / "run.json", profiler="none")
    # warm-up runs until steady (at least SETTINGS["warmup"] iterations): run.json says how many ran
    assert run["warmup"]["iterations"] >= SETTINGS["warmup"]
    assert models.CALLS == [("Tensor", 1)] * (run["warmup"]["iterations"] + SETTINGS["iterations"])
    assert run["train_step"] == {"optimizer": "sgd", "optimizer_class": "torch.optim.SGD", "lr": 0.1,
                                 "loss": "loss_fn train_models:sum_loss"}


def test_loss_fn_that_returns_no_scalar_is_one_line(models, tmp_path):
    with pytest.raises(WorkloadError, match=r"loss_fn 'train_models:not_scalar_loss' returned Tensor of shape "
                                            r"\[2, 4, 8\]; it must return a scalar tensor"):
        harness.run_capture({**TRAIN, "loss_fn": "train_models:not_scalar_loss"}, SETTINGS, "cpu", None, None,
                            tmp_path / "run.json", profiler="none")


def test_the_optimizer_steps(models):
    """One SGD step changes a parameter by exactly -lr * grad (independently: torch autograd here)."""
    model, inputs = models.build()
    before = [p.detach().clone() for p in model.parameters()]
    step = training.TrainStep(model, model, inputs, {"optimizer": "sgd", "lr": 0.1}, harness._RangeEmitter(False))
    expected_loss = model(*inputs).float().square().mean()
    grads = torch.autograd.grad(expected_loss, list(model.parameters()))
    step()
    for old, new, grad in zip(before, model.parameters(), grads):
        torch.testing.assert_close(new.detach(), old - 0.1 * grad)
        assert new.grad is None  # zero_grad(set_to_none=True) ran
    assert step.phase is None


# ------------------------------------------------------------------------------ phases


def test_each_measured_iteration_has_the_three_phases_in_order(train_run):
    _, ranges = stages.read_timeline(train_run / "timeline")
    iterations = ranges[ranges["iteration"].notna()].sort_values("start_ns")
    phases = _phase_ranges(ranges)
    assert len(iterations) == SETTINGS["iterations"]
    for it in iterations.itertuples():
        inside = phases[(phases["start_ns"] >= it.start_ns) & (phases["end_ns"] <= it.end_ns)]
        assert list(inside["phase"]) == list(PHASES)
        assert (inside["start_ns"].to_numpy()[1:] >= inside["end_ns"].to_numpy()[:-1]).all()  # one after the other


def test_every_kernel_carries_the_phase_open_at_its_launch(train_run):
    kernels, ranges = stages.read_timeline(train_run / "timeline")
    attribution = tables.read_table(train_run / "attribution.parquet").set_index("kernel_id")
    phases = _phase_ranges(ranges)
    expected = {}
    for k in kernels.itertuples():  # independent: a plain scan over the phase ranges of the process
        at = k.launch_start_ns if pd.notna(k.launch_start_ns) else k.start_ns
        hit = phases[(phases["pid"] == k.pid) & (phases["start_ns"] <= at) & (phases["end_ns"] > at)]
        expected[k.kernel_id] = hit["phase"].iloc[0] if len(hit) else None
    got = attribution["phase"].to_dict()
    assert got == expected
    assert set(got.values()) == set(PHASES)  # every kernel lies in a measured iteration's phase
    # autograd's kernels (those with a forward op) are backward; the optimizer's annotation holds optimizer kernels
    assert set(attribution.loc[attribution["forward_operator"].notna(), "phase"]) == {"backward"}
    step = ranges[ranges["name"].astype(str).str.startswith("Optimizer.step#SGD.step")]
    assert len(step) == SETTINGS["iterations"]
    for s in step.itertuples():
        inside = kernels[(kernels["launch_start_ns"] >= s.start_ns) & (kernels["launch_start_ns"] < s.end_ns)]
        assert len(inside) and set(attribution.loc[inside["kernel_id"], "phase"]) == {"optimizer"}


def test_time_per_phase_and_operators_per_phase(train_run):
    attribution = tables.read_table(train_run / "attribution.parquet")
    coverage = json.loads((train_run / "coverage.json").read_text())
    table = pd.read_parquet(train_run / "phases.parquet")
    assert [e["phase"] for e in coverage["phases"]] == list(PHASES)
    for entry in coverage["phases"]:
        mine = attribution[attribution["phase"] == entry["phase"]]
        assert entry["kernels"] == len(mine) and entry["time_ns"] == int(mine["duration_ns"].sum())
        per_iteration = sorted(int(mine.loc[mine["iteration"] == i, "duration_ns"].sum())
                               for i in range(SETTINGS["iterations"]))
        assert entry["iteration_median_ns"] == round(sum(per_iteration) / 2)  # 2 iterations: the mean of both
        rows = table[table["phase"] == entry["phase"]]
        assert int(rows["time_ns"].sum()) == entry["time_ns"] and int(rows["kernels"].sum()) == entry["kernels"]
        by_operator = mine.groupby(mine["operator"].fillna("(unattributed)"))["duration_ns"].sum()
        assert dict(zip(rows["operator"], rows["time_ns"])) == {k: int(v) for k, v in by_operator.items()}
        assert rows["phase_share"].sum() == pytest.approx(1.0)
    assert sum(e["time_ns"] for e in coverage["phases"]) == coverage["kernel_time_ns"]
    # the optimizer phase holds SGD's update, the backward phase the autograd ops
    assert "aten::add_" in set(table.loc[table["phase"] == "optimizer", "operator"])
    assert "aten::native_layer_norm_backward" in set(table.loc[table["phase"] == "backward", "operator"])


def test_reports_split_the_time_by_phase(train_run):
    coverage = json.loads((train_run / "coverage.json").read_text())
    table = pd.read_parquet(train_run / "phases.parquet")
    report = (train_run / "report.md").read_text()
    page = (train_run / "report.html").read_text()
    assert "## Time per train-step phase" in report and 'id="phases"' in page
    assert "`torch.optim.SGD` (lr 0.1)" in report
    for entry in coverage["phases"]:
        row = f"| {entry['phase']} | {entry['iteration_median_ns'] / 1e6:.3f} | {entry['time_ns'] / 1e6:.3f} |"
        assert row in report
        top = table[table["phase"] == entry["phase"]].iloc[0]
        assert f"### Top operators of `{entry['phase']}`" in report
        assert f"| {top['operator']} | {top['calls']} | {top['kernels']} |" in report
        assert f'id="phase-{entry["phase"]}-table"' in page and f'data-v="{top["operator"]}"' in page


def test_inference_has_no_phases(models, tmp_path):
    capture.capture_timeline("stack", {**TRAIN, "mode": "inference"}, SETTINGS, "cpu", "torch",
                             tmp_path / "trace.json.gz", tmp_path / "run.json", tmp_path / "layers.json",
                             tmp_path / "clocks.json")
    timeline = stages.export_timeline(tmp_path / "trace.json.gz", tmp_path / "timeline")
    assert _phase_ranges(timeline.ranges).empty
    result = stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "attribution.parquet")
    assert result["phase"].isna().all()
    from operator_profiler import aggregate

    assert aggregate.phase_summary(result) is None and aggregate.phases_table(result).empty
    assert json.loads((tmp_path / "run.json").read_text())["train_step"] is None


# ------------------------------------------------------------------------------ layer classes


def test_first_layer_whose_input_needs_no_grad_is_its_own_class_with_the_reason(train_run):
    layers = json.loads((train_run / "layers.json").read_text())
    # the probe: the model's input needs no gradient, the next blocks' inputs do
    assert [l["calls"][0]["input_requires_grad"] for l in layers] == [False, True, True]
    classes = json.loads((train_run / "classes.json").read_text())
    blocks = {name: c for name, c in classes.items() if name != "rest"}
    assert sorted(c["instances"] for c in blocks.values()) == [["blocks.0"], ["blocks.1", "blocks.2"]]
    first = next(c for c in blocks.values() if c["instances"] == ["blocks.0"])
    others = next(c for c in blocks.values() if c["instances"] != ["blocks.0"])
    assert first["split_reason"] == others["split_reason"] == "input_needs_no_grad"
    assert first["split_from"] == [others["class"]] and others["split_from"] == [first["class"]]
    # independent: the instances' kernels per phase in iteration 0, from kernel_layers + the attribution
    kl = pd.read_parquet(train_run / "kernel_layers.parquet")
    attribution = tables.read_table(train_run / "attribution.parquet")
    joined = attribution[attribution["iteration"] == 0].merge(kl[["kernel_id"]], on="kernel_id")
    counts = joined.groupby(["layer", "phase"]).size()
    assert counts["blocks.0", "forward"] == counts["blocks.1", "forward"]  # the forward is the same
    assert counts["blocks.0", "backward"] < counts["blocks.1", "backward"]  # no input gradient in blocks.0
    detail = first["split_detail"]
    assert detail.startswith("the input of blocks.0 needs no gradient")
    assert (f"{first['kernel_count']} kernels per instance against {others['kernel_count']} in {others['class']} "
            f"(backward {counts['blocks.0', 'backward']} vs {counts['blocks.1', 'backward']})") in detail
    lc = pd.read_parquet(train_run / "layer_classes.parquet").set_index("layer_class")
    assert lc.loc[first["class"], "split_reason"] == "input_needs_no_grad"
    assert pd.isna(lc.loc["rest", "split_reason"])
    report = (train_run / "report.md").read_text()
    assert f"- `{first['class']}` (`Block`): `input_needs_no_grad`: {detail}" in report
    assert 'id="layer-splits"' in (train_run / "report.html").read_text()


# ------------------------------------------------------------------------------ errors


def _failed_rule(tmp_path, workload) -> tuple[str, str]:
    """Run the capture as the capture rule does (rule_runner.run_rule); returns the log text and its last line."""
    log = tmp_path / "capture.log"
    with pytest.raises(SystemExit) as exit_:
        run_rule(str(log), capture.capture_timeline, "mine", workload, SETTINGS, "cpu", "torch",
                 tmp_path / "trace.json.gz", tmp_path / "run.json", tmp_path / "layers.json", tmp_path / "clocks.json")
    assert exit_.value.code == 1
    text = log.read_text()
    return text, text.strip().splitlines()[-1]


def test_model_that_raises_in_forward_keeps_its_traceback(models, tmp_path):
    text, last = _failed_rule(tmp_path, {**TRAIN, "factory": "train_models:build_bad_forward"})
    where = f"{models.__file__}:{line_of('forward')} (in forward)"
    assert last.startswith("FAILED: workload 'mine' raised RuntimeError during warm-up (forward)")  # no layers
    assert f"at {where}: mat1 and mat2 shapes cannot be multiplied" in last
    assert last.endswith(f"(traceback in {tmp_path / 'capture.log'})")
    # the traceback with the user's frame is in the log, above the FAILED line
    assert "Traceback (most recent call last)" in text
    assert f'File "{models.__file__}", line {line_of("forward")}, in forward' in text
    assert "return self.lin(x) @ torch.ones(3, 3)" in text


def test_model_that_raises_in_backward_names_the_phase(models, tmp_path):
    text, last = _failed_rule(tmp_path, {**TRAIN, "factory": "train_models:build_bad_backward"})
    assert last.startswith("FAILED: workload 'mine' raised ValueError during warm-up (backward) at "
                           f"{models.__file__}:{line_of('backward')} (in backward): the backward of my op failed")
    assert f'File "{models.__file__}", line {line_of("backward")}, in backward' in text


def test_factory_that_raises_names_its_line(models, tmp_path):
    text, last = _failed_rule(tmp_path, {**TRAIN, "factory": "train_models:build_raises"})
    assert last.startswith(f"FAILED: custom factory 'train_models:build_raises' raised KeyError at "
                           f"{models.__file__}:{line_of('factory')} (in build_raises): 'no such checkpoint'")
    assert f'line {line_of("factory")}, in build_raises' in text


def test_run_harness_prints_the_user_traceback_and_one_error_line(models, tmp_path, capsys):
    from operator_profiler.cli import main

    code = main(["run-harness", "--workload-json", json.dumps({**TRAIN, "factory": "train_models:build_bad_forward"}),
                 "--harness-json", json.dumps(SETTINGS), "--device", "cpu", "--profiler", "none",
                 "--out-run", str(tmp_path / "run.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("opprof run-harness: error: workload 'custom' raised RuntimeError")
    assert err[-1].endswith("(the traceback is above)")
    assert any(f'line {line_of("forward")}, in forward' in line for line in err[:-1])


def test_kernel_phase_is_taken_on_the_process_whatever_the_launching_thread():
    """On CUDA autograd launches backward kernels from its own device thread, which a CPU run has none of (its
    backward runs on the calling thread): these tables stand in for such a trace. Phases are per process
    (two ranks overlap in time); a launch outside every phase range has none; the end is exclusive."""
    from operator_profiler.timeline.model import kernel_phases

    ranges = pd.DataFrame({
        "pid": [1, 1, 1, 2, 1],
        "tid": [10, 10, 10, 20, 10],
        "name": ["opprof.phase:forward", "opprof.phase:backward", "opprof.phase:optimizer", "opprof.phase:forward",
                 "opprof.iteration:0"],
        "start_ns": [100, 200, 300, 150, 100],
        "end_ns": [200, 300, 400, 350, 400],
    })
    kernels = pd.DataFrame({
        "pid": [1, 1, 1, 1, 2, 1, 1],
        "launch_tid": [10, 11, 11, 10, 20, 10, 10],  # 11: the autograd device thread of process 1
        "launch_start_ns": pd.array([150, 210, 299, None, 250, 400, 50], dtype="Int64"),
        "start_ns": [160, 220, 310, 320, 260, 410, 60],  # kernel 3: no launch record, its start decides
    })
    assert list(kernel_phases(kernels, ranges)) == ["forward", "backward", "backward", "optimizer", "forward", None,
                                                    None]


def test_nsys_phase_ranges_in_the_default_domain_name_no_operator(tmp_path):
    """Without NVIDIA's ``nvtx`` package the harness's ranges go to NVTX's default domain (torch.cuda.nvtx),
    where emit_nvtx's operator ranges are: a phase range is never an operator, and the phases reach the
    backward kernel launched on the autograd thread (10:2). An nsys export in the real table layout."""
    from nsys_export import Nvtx, launch, rows, write_nsys_export

    db = write_nsys_export(tmp_path / "report.sqlite", nvtx=[
        Nvtx("opprof.iteration:0", 59, "10:1", 0, 10_000),
        Nvtx("opprof.phase:forward", 59, "10:1", 0, 1000),
        Nvtx("aten::mm, seq = 7, op_id = 3", 59, "10:1", 200, 400),
        Nvtx("opprof.phase:backward", 59, "10:1", 1000, 5000),
        Nvtx("MmBackward0, seq = 7, op_id = 40", 59, "10:2", 2000, 4000),
        Nvtx("aten::mm, seq = 9, op_id = 41", 59, "10:2", 2100, 3900),
        Nvtx("opprof.phase:optimizer", 59, "10:1", 5000, 6000),
    ], **rows(launch("gemm_fwd", "10:1", 250, 1), launch("gemm_bwd", "10:2", 2500, 2),
              launch("sgd_update", "10:1", 5500, 3)))
    stages.export_timeline(db, tmp_path / "timeline")
    result = stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "attribution.parquet")
    got = {r["name"]: r for r in result.to_dict("records")}
    assert {n: r["phase"] for n, r in got.items()} == {"gemm_fwd": "forward", "gemm_bwd": "backward",
                                                       "sgd_update": "optimizer"}
    assert got["gemm_bwd"]["operator"] == "aten::mm" and got["gemm_bwd"]["forward_operator"] == "aten::mm"
    assert pd.isna(got["sgd_update"]["operator"]) and got["sgd_update"]["path"] == "unattributed"
