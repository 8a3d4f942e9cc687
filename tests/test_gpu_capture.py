"""GPU capture (nsys / torch timelines, capture_kineto, cudaProfilerApi range) on a machine without a GPU.

There is no GPU, no Nsight Systems and no nvidia-smi here. These tests use **test doubles** put first on ``PATH``:

* ``nvidia-smi``: the FAKE of tests/fake_tools.py (logs its argv, answers clock queries from a state file).
* ``nsys``: a FAKE written below. It appends ``["nsys", *argv]`` to the same call log as the fake nvidia-smi
  (so the order of clock locking, capture and restore is visible), and for ``nsys profile`` it *does not run the
  target*: it writes a placeholder ``<--output>.nsys-rep`` and the run.json / layers.json the harness would have
  written (paths taken from the target's ``run-harness`` argv). A real nsys would launch the harness, which
  needs a CUDA GPU, and run for seconds: the fake waits until the fake nvidia-smi's read-back loop printed two
  more samples, so the clock lock has read-backs during the job. It can also be told to fail (exit status and
  output given by the test).

So these tests prove the exact commands we send, their order relative to clock locking, quoting of paths
with spaces (argv lists, no shell), the error paths and the DAG; not that nsys records what we expect: that
needs a GPU machine (scripts/gpu-check runs the torch timeline there). The harness's cudaProfilerApi bracketing
is tested on CPU with ``torch.cuda.profiler.start/stop`` monkeypatched to record their calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import torch_flags_kept
from fake_tools import H100, RESTORE, WAIT_FOR_SMI_SAMPLES, clock_target, lock_calls, write_tool
from workflow_runs import ROOT, dry_run_jobs, job_counts

from operator_profiler import cli, stages
from operator_profiler.capture import harness
from operator_profiler.capture import jobs as capture
from operator_profiler.capture.jobs import NSYS_PROFILE_OPTIONS, CaptureError
from operator_profiler.files import InputError

FAKE_NSYS = WAIT_FOR_SMI_SAMPLES + textwrap.dedent('''\
    import json, os, sys
    argv = sys.argv[1:]
    with open(os.environ["FAKE_NVSMI_LOG"], "a") as f:
        f.write(json.dumps(["nsys", *argv]) + "\\n")
    fail = os.environ.get("FAKE_NSYS_FAIL")
    if fail:
        print(os.environ.get("FAKE_NSYS_OUTPUT", "fake nsys: failing as asked"))
        sys.exit(int(fail))
    if argv[:1] != ["profile"]:
        sys.exit("fake nsys: unexpected call " + " ".join(argv))
    base = argv[argv.index("--output") + 1]
    target = argv[argv.index("--output") + 2:]
    def value(flag):
        return target[target.index(flag) + 1] if flag in target else None
    wait_for_smi_samples()
    with open(base + ".nsys-rep", "wb") as f:
        f.write(b"placeholder report of the fake nsys")
    run = {"measured_s": 0.25, "profiler": value("--profiler"), "measured_kernels": None,
           **json.loads(value("--record-json") or "{}")}
    with open(value("--out-run"), "w") as f:
        json.dump(run, f)
    if value("--out-layers"):
        with open(value("--out-layers"), "w") as f:
            f.write("[]\\n")
    print("fake nsys: capture range ended, report written")
''')


@pytest.fixture
def smi(smi, monkeypatch):
    """conftest's fake nvidia-smi, and no FAKE_NSYS_FAIL from the environment."""
    monkeypatch.delenv("FAKE_NSYS_FAIL", raising=False)
    return smi


@pytest.fixture
def nsys(smi) -> Path:
    return write_tool(smi.bin, "nsys", FAKE_NSYS)


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "clocks dir" / "target.json"
    path.parent.mkdir()
    path.write_text(json.dumps(clock_target("base", 1755, 2619)))
    return path


WORKLOAD = {"kind": "lstm", "compile": False, "input_size": 4, "hidden_size": 8, "num_layers": 1,
            "batch_size": 1, "seq_len": 2, "mode": "inference"}
HARNESS = {"seed": 0, "warmup": 2, "warmup_max": 2, "iterations": 3}  # a fixed warm-up


def _outs(tmp_path: Path) -> dict:
    cap = tmp_path / "results dir" / "my work" / "capture"
    cap.mkdir(parents=True)
    return {"trace": cap / "timeline.nsys-rep", "run": cap / "run.json", "layers": cap / "layers.json",
            "clocks": cap / "clocks_applied.json"}


def _capture_nsys(outs: dict, target: Path, requested: str = "nsys") -> None:
    capture.capture_timeline("my work", WORKLOAD, HARNESS, "cuda", "nsys", outs["trace"], outs["run"],
                             outs["layers"], outs["clocks"], target, requested)


# --- timeline: auto -----------------------------------------------------------------------------------------


def test_resolve_timeline(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys
    assert capture.resolve_timeline("auto", "cuda") == "torch"
    assert capture.resolve_timeline("nsys", "cuda") == "nsys"  # asked for: capture_timeline says if it is missing
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert capture.resolve_timeline("auto", "cuda") == "nsys"
    assert capture.resolve_timeline("torch", "cuda") == "torch"
    for requested in ("auto", "nsys", "torch"):
        assert capture.resolve_timeline(requested, "cpu") == "torch"
    with pytest.raises(ValueError):
        capture.resolve_timeline("perfetto", "cuda")


# --- the nsys command ---------------------------------------------------------------------------------------


def test_nsys_argv_is_exact_and_keeps_paths_with_spaces_whole(tmp_path):
    run = tmp_path / "results dir" / "run.json"
    argv = capture.harness_argv("my work", {"kind": "lstm"}, {"seed": 0}, "cuda", "cuda_profiler_api", run,
                                tmp_path / "a b" / "layers.json", record={"timeline": "nsys"}, python="/py thon")
    assert argv == ["/py thon", "-m", "operator_profiler.cli", "run-harness",
                    "--workload-json", '{"kind": "lstm"}', "--harness-json", '{"seed": 0}',
                    "--device", "cuda", "--profiler", "cuda_profiler_api", "--out-run", str(run),
                    "--workload-name", "my work", "--out-layers", str(tmp_path / "a b" / "layers.json"),
                    "--record-json", '{"timeline": "nsys"}']
    cmd = capture.nsys_command(tmp_path / "results dir" / "timeline.partial", ["python", "x"], nsys="/opt/n sys")
    assert cmd == ["/opt/n sys", "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
                   "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--cuda-graph-trace=node",
                   "--force-overwrite=true", "--output", str(tmp_path / "results dir" / "timeline.partial"), "python",
                   "x"]
    assert tuple(cmd[2:9]) == NSYS_PROFILE_OPTIONS


def test_capture_timeline_nsys_runs_the_exact_command_inside_locked_clocks(smi, nsys, target, tmp_path):
    outs = _outs(tmp_path)
    _capture_nsys(outs, target, requested="auto")
    calls = smi.calls()
    nsys_at = [i for i, c in enumerate(calls) if c[0] == "nsys"]
    assert len(nsys_at) == 1
    i = nsys_at[0]
    # clocks locked (the read-back loop started first) before nsys, restored after it
    assert calls[:i] == lock_calls(1755, 2619)
    assert calls[i + 1:] == RESTORE
    base = outs["trace"].with_name("timeline.partial")
    partial_run = outs["run"].with_name("run.json.nsys-partial")
    record = {"timeline": "nsys", "timeline_requested": "auto"}
    assert calls[i] == ["nsys", "profile", *NSYS_PROFILE_OPTIONS, "--output", str(base),
                        *capture.harness_argv("my work", WORKLOAD, HARNESS, "cuda", "cuda_profiler_api", partial_run,
                                              outs["layers"], record=record)]
    assert calls[i][calls[i].index("--output") + 2] == sys.executable  # the same Python, no shell in between
    # the report and the harness's files end up at the rule's outputs; nothing partial is left
    assert outs["trace"].read_bytes() == b"placeholder report of the fake nsys"
    run = json.loads(outs["run"].read_text())
    assert run["profiler"] == "cuda_profiler_api" and run["timeline"] == "nsys" and run["timeline_requested"] == "auto"
    assert run["measured_kernels"] is None  # counted later by the timeline reader
    assert json.loads(outs["layers"].read_text()) == []
    assert sorted(p.name for p in outs["trace"].parent.iterdir()) == [
        "clocks_applied.json", "layers.json", "run.json", "timeline.nsys-rep"]
    applied = json.loads(outs["clocks"].read_text())
    assert applied["locked"] is True and applied["restored"] is True and applied["outcome"] == "completed"
    assert applied["readback_during_job"]["samples"] >= 1  # the loop's samples while nsys ran
    assert applied["tool"] == "nsys" and applied["workload"] == "my work" and applied["measured_s"] == 0.25


def test_clocks_restored_after_nsys_fails(smi, nsys, target, tmp_path, monkeypatch):
    outs = _outs(tmp_path)
    monkeypatch.setenv("FAKE_NSYS_FAIL", "1")
    monkeypatch.setenv("FAKE_NSYS_OUTPUT", "opprof run-harness: error: workload 'my work' raised RuntimeError "
                                           "during warm-up: boom")
    with pytest.raises(CaptureError, match=r"^nsys profile of workload 'my work' failed: workload 'my work' raised "
                                           r"RuntimeError during warm-up: boom$"):
        _capture_nsys(outs, target)
    calls = smi.calls()
    assert [c[0] for c in calls].count("nsys") == 1
    assert calls[-2:] == RESTORE
    assert calls.index(["-i", "0", "-lgc", "1755,1755"]) < [c[0] for c in calls].index("nsys")
    applied = json.loads(outs["clocks"].read_text())
    assert applied["restored"] is True and applied["outcome"].startswith("failed: CaptureError")
    assert not outs["trace"].exists() and not outs["run"].exists()


def test_nsys_failing_without_a_harness_line_names_the_exit_status(smi, nsys, target, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NSYS_FAIL", "7")
    with pytest.raises(CaptureError, match="failed: exit status 7; its output is in the log"):
        _capture_nsys(_outs(tmp_path), target)
    assert smi.calls()[-2:] == RESTORE


def test_nsys_not_on_path_is_a_one_line_error_and_clocks_are_restored(smi, target, tmp_path):
    outs = _outs(tmp_path)
    with pytest.raises(CaptureError, match="no nsys executable is on PATH; install Nsight Systems .* or set "
                                           "timeline: torch"):
        _capture_nsys(outs, target)
    assert smi.calls()[-2:] == RESTORE


def test_capture_rule_reports_nsys_failure_in_one_failed_line(smi, nsys, target, tmp_path, monkeypatch, capsys):
    from operator_profiler.rule_runner import run_rule

    monkeypatch.setenv("FAKE_NSYS_FAIL", "2")
    log = tmp_path / "logs dir" / "capture_timeline.log"
    log.parent.mkdir()
    outs = _outs(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_rule(str(log), capture.capture_timeline, "my work", WORKLOAD, HARNESS, "cuda", "nsys", outs["trace"],
                 outs["run"], outs["layers"], outs["clocks"], target, "nsys")
    assert exit_info.value.code == 1
    lines = log.read_text().splitlines()
    assert lines[-1] == "FAILED: nsys profile of workload 'my work' failed: exit status 2; its output is in the log"
    assert "fake nsys: failing as asked" in lines  # nsys's own output goes to the rule's log
    assert "Traceback" not in log.read_text()


def test_capture_kineto_runs_torch_profiler_inside_locked_clocks(smi, target, tmp_path, monkeypatch):
    seen = {}

    def fake_run_capture(workload, harness_cfg, device, trace, layers, run, workload_name=None, **kw):
        seen.update(calls=smi.calls(), layers=layers, profiler=kw.get("profiler", "torch"), record=kw["record"])
        Path(trace).write_bytes(b"gz")
        Path(run).write_text("{}")
        return {"measured_s": 0.5}

    monkeypatch.setattr(harness, "run_capture", fake_run_capture)
    cap = tmp_path / "cap ture"
    cap.mkdir()
    capture.capture_kineto("w", WORKLOAD, HARNESS, "cuda", cap / "kineto.json.gz", cap / "kineto_run.json",
                           cap / "kineto_clocks_applied.json", target)
    assert seen["calls"] == lock_calls(1755, 2619) and seen["layers"] is None and seen["profiler"] == "torch"
    assert seen["record"]["timeline"] == "torch"
    assert (cap / "kineto.json.gz").read_bytes() == b"gz"
    assert smi.calls()[-2:] == RESTORE
    applied = json.loads((cap / "kineto_clocks_applied.json").read_text())
    assert applied["locked"] and applied["restored"] and applied["measured_s"] == 0.5
    assert sorted(p.name for p in cap.iterdir()) == ["kineto.json.gz", "kineto_clocks_applied.json", "kineto_run.json"]


def test_the_kineto_run_beside_nsys_writes_its_compiles_debug_output_inside_locked_clocks(smi, target, tmp_path,
                                                                                          monkeypatch):
    """Beside an nsys timeline the Kineto run's compile gives the debug output (one compile, under the lock its
    autotuning must see); it is renamed into place only after the run."""
    def fake_run_capture(workload, harness_cfg, device, trace, layers, run, inductor_dir=None, **kw):
        assert smi.read()["gpus"]["0"]["locked_sm"] == 1755
        assert Path(inductor_dir).name == "debug.partial"
        (Path(inductor_dir) / "g").mkdir()
        (Path(inductor_dir) / "g" / "output_code.py").write_text("")
        Path(trace).write_bytes(b"gz")
        Path(run).write_text("{}")
        return {"measured_s": 0.5}

    monkeypatch.setattr(harness, "run_capture", fake_run_capture)
    cap, out = tmp_path / "capture", tmp_path / "inductor" / "debug"
    cap.mkdir()
    capture.capture_kineto("w", {**WORKLOAD, "compile": True}, HARNESS, "cuda", cap / "kineto.json.gz",
                           cap / "kineto_run.json", cap / "kineto_clocks_applied.json", target, out_debug=out)
    assert (out / "g" / "output_code.py").is_file() and not (tmp_path / "inductor" / "debug.partial").exists()
    assert smi.calls()[-2:] == RESTORE


def test_compile_artifacts_on_cuda_locks_clocks(smi, target, tmp_path, monkeypatch):
    def fake_run_capture(workload, harness_cfg, device, trace, layers, run, inductor_dir=None, **kw):
        assert smi.read()["gpus"]["0"]["locked_sm"] == 1755
        (Path(inductor_dir) / "g").mkdir()
        (Path(inductor_dir) / "g" / "output_code.py").write_text("")
        return {}

    monkeypatch.setattr(harness, "run_capture", fake_run_capture)
    out = tmp_path / "inductor" / "debug"
    capture.compile_artifacts({**WORKLOAD, "compile": True}, {"seed": 0}, "cuda", out, target,
                              tmp_path / "inductor" / "clocks_applied.json")
    assert (out / "g" / "output_code.py").is_file()
    assert smi.calls()[-2:] == RESTORE
    assert json.loads((tmp_path / "inductor" / "clocks_applied.json").read_text())["restored"] is True


# --- the harness: cudaProfilerApi bracketing (CPU, start/stop monkeypatched) --------------------------------

MODEL = """
import torch

EVENTS = []

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)

class Net(torch.nn.Module):
    def __init__(self, fail_at=None):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.calls = 0
        self.fail_at = fail_at

    def forward(self, x):
        self.calls += 1
        EVENTS.append("forward")
        if self.fail_at == self.calls:
            raise RuntimeError("boom")
        for b in self.blocks:
            x = b(x)
        return x

def build(fail_at=None):
    return Net(fail_at), (torch.randn(2, 4),)
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "gpu_capture_toy.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("gpu_capture_toy", None)
    import gpu_capture_toy

    gpu_capture_toy.EVENTS.clear()
    monkeypatch.setattr("torch.cuda.profiler.start", lambda: gpu_capture_toy.EVENTS.append("cudaProfilerStart"))
    monkeypatch.setattr("torch.cuda.profiler.stop", lambda: gpu_capture_toy.EVENTS.append("cudaProfilerStop"))
    import nvtx

    def start_range(message, domain=None):
        gpu_capture_toy.EVENTS.append(f"nvtxRangeStart {domain}@{message}")
        return ("handle", message)

    monkeypatch.setattr(nvtx, "start_range", start_range)
    monkeypatch.setattr(nvtx, "end_range", lambda handle: gpu_capture_toy.EVENTS.append(f"nvtxRangeEnd {handle[1]}"))
    return gpu_capture_toy


def test_harness_brackets_exactly_the_measured_iterations(toy, tmp_path):
    run = harness.run_capture({"kind": "custom", "factory": "gpu_capture_toy:build"}, HARNESS, "cpu", None,
                              tmp_path / "layers.json", tmp_path / "run.json", profiler="cuda_profiler_api")
    # one forward probing the layers' inputs (workloads.probe_layer_inputs), 2 warm-up, then the 3 measured ones
    # inside them, the process-wide NVTX start/end range the ncu replay's include filter selects
    assert toy.EVENTS == ["forward"] * 3 + ["cudaProfilerStart", "nvtxRangeStart opprof@opprof.measured"] + \
        ["forward"] * 3 + ["nvtxRangeEnd opprof.measured", "cudaProfilerStop"]
    assert run["measured_range"] == {"name": "opprof.measured", "domain": "opprof", "kind": "start/end",
                                     "ncu_include": "opprof@opprof.measured"}
    assert run == json.loads((tmp_path / "run.json").read_text())
    assert run["profiler"] == "cuda_profiler_api" and run["measured_kernels"] is None
    assert run["settings"]["cudnn_benchmark"] is False and run["settings"]["deterministic_requested"] is False
    assert [layer["path"] for layer in json.loads((tmp_path / "layers.json").read_text())] == ["blocks.0", "blocks.1"]


@pytest.mark.parametrize("before", [False, True])
def test_harness_leaves_the_processes_determinism_by_default_and_records_it(toy, tmp_path, before):
    """harness.deterministic false (the default): deterministic algorithms and cudnn.deterministic stay what the
    process had (here set by the test, as a model's own settings would), run.json records that state, and
    cudnn.benchmark is off all the same."""
    import torch

    with torch_flags_kept():
        torch.use_deterministic_algorithms(before)
        torch.backends.cudnn.deterministic = before
        torch.backends.cudnn.benchmark = True
        run = harness.run_capture({"kind": "custom", "factory": "gpu_capture_toy:build"}, HARNESS, "cpu", None,
                                  tmp_path / "layers.json", tmp_path / "run.json", profiler="cuda_profiler_api")
        assert torch.are_deterministic_algorithms_enabled() is before
        assert torch.backends.cudnn.deterministic is before and torch.backends.cudnn.benchmark is False
    settings = run["settings"]
    assert settings["deterministic_requested"] is False
    assert settings["deterministic_algorithms"] is before and settings["cudnn_deterministic"] is before
    assert settings["cudnn_benchmark"] is False and settings["cudnn_benchmark_set_by_model"] is False


def test_harness_deterministic_true_forces_deterministic_algorithms(toy, tmp_path):
    import torch

    with torch_flags_kept():
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        run = harness.run_capture({"kind": "custom", "factory": "gpu_capture_toy:build"},
                                  {**HARNESS, "deterministic": True}, "cpu", None, tmp_path / "layers.json",
                                  tmp_path / "run.json", profiler="cuda_profiler_api")
        assert torch.are_deterministic_algorithms_enabled() is True
        assert torch.is_deterministic_algorithms_warn_only_enabled() is True
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    settings = run["settings"]
    assert settings["deterministic_requested"] is True and settings["deterministic_algorithms"] is True
    assert settings["deterministic_warn_only"] is True and settings["cudnn_deterministic"] is True
    assert settings["cudnn_benchmark"] is False
    assert run["harness"]["deterministic"] is True  # as given


def test_harness_turns_off_cudnn_benchmark_a_factory_turned_on(toy, tmp_path):
    import torch

    (tmp_path / "benchmark_toy.py").write_text(
        "import torch\nimport gpu_capture_toy\n\n"
        "def build():\n    torch.backends.cudnn.benchmark = True\n    return gpu_capture_toy.build()\n")
    sys.modules.pop("benchmark_toy", None)
    with torch_flags_kept():
        run = harness.run_capture({"kind": "custom", "factory": "benchmark_toy:build"}, HARNESS, "cpu", None,
                                  tmp_path / "layers.json", tmp_path / "run.json", profiler="cuda_profiler_api")
        assert torch.backends.cudnn.benchmark is False
    assert run["settings"]["cudnn_benchmark"] is False and run["settings"]["cudnn_benchmark_set_by_model"] is True


def test_nsys_window_runs_emit_nvtx_without_shapes(toy, monkeypatch):
    """Recording shapes in emit_nvtx would add CPU time to every op call inside the window nsys times; the work
    per call takes its shapes from the Kineto run (test_work.py::test_nsys_work_takes_its_shapes_from_...)."""
    import contextlib

    import torch

    calls = []

    @contextlib.contextmanager
    def emit_nvtx(**kwargs):
        calls.append(kwargs)
        yield

    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", emit_nvtx)
    with harness.cuda_profiler_range(nvtx_ops=True):
        toy.EVENTS.append("measured")
    assert calls == [{"record_shapes": False}]
    assert toy.EVENTS == ["cudaProfilerStart", "nvtxRangeStart opprof@opprof.measured", "measured",
                          "nvtxRangeEnd opprof.measured", "cudaProfilerStop"]


@pytest.mark.parametrize("deterministic", [False, True])
def test_cublas_workspace_is_set_on_cuda_only_when_determinism_is_forced(monkeypatch, deterministic):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with torch_flags_kept():
        harness._seed_everything(0, "cuda", deterministic)
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == (":4096:8" if deterministic else None)


def test_harness_stops_the_profiler_range_when_an_iteration_raises(toy, tmp_path):
    from operator_profiler.errors import WorkloadError

    # calls: 1 the layer-input probe, 2-3 warm-up, 4 measured iteration 0, 5 measured iteration 1
    with pytest.raises(WorkloadError, match=r"during measured iteration 1 at .*gpu_capture_toy.py:\d+ \(in forward\): boom"):
        harness.run_capture({"kind": "custom", "factory": "gpu_capture_toy:build", "kwargs": {"fail_at": 5}},
                            HARNESS, "cpu", None, tmp_path / "layers.json", tmp_path / "run.json",
                            profiler="cuda_profiler_api")
    assert toy.EVENTS[-3:] == ["forward", "nvtxRangeEnd opprof.measured", "cudaProfilerStop"]
    assert toy.EVENTS.count("cudaProfilerStart") == 1
    assert not (tmp_path / "run.json").exists()


def test_harness_rejects_an_unknown_profiler(tmp_path):
    with pytest.raises(ValueError, match="unknown profiler 'ncu'"):
        harness.run_capture(WORKLOAD, HARNESS, "cpu", None, None, tmp_path / "run.json", profiler="ncu")


# --- opprof run-harness (the argv contract) -----------------------------------------------------------------


def test_run_harness_cli_torch_profiler_on_cpu(tmp_path, capsys):
    out = tmp_path / "out dir"
    workload_file = tmp_path / "w.json"
    workload_file.write_text(json.dumps(WORKLOAD))
    rc = cli.main(["run-harness", "--workload-json", str(workload_file), "--harness-json", json.dumps(HARNESS),
                   "--device", "cpu", "--profiler", "torch", "--out-run", str(out / "run.json"),
                   "--out-trace", str(out / "t.json.gz"), "--record-json", '{"timeline": "torch"}'])
    assert rc == 0, capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    assert run["profiler"] == "torch" and run["timeline"] == "torch" and run["workload"] == WORKLOAD
    assert run["measured_kernels"] is None  # CPU: compute calls, not kernel launches
    assert (out / "t.json.gz").stat().st_size > 0 and not (out / "layers.json").exists()


def test_run_harness_cli_user_errors_are_one_line(tmp_path, capsys):
    rc = cli.main(["run-harness", "--workload-json", "{nope", "--harness-json", json.dumps(HARNESS), "--device",
                   "cpu", "--out-run", str(tmp_path / "run.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("opprof run-harness: error: --workload-json: not valid JSON")
    rc = cli.main(["run-harness", "--workload-json", json.dumps(WORKLOAD), "--harness-json", json.dumps(HARNESS),
                   "--device", "cuda", "--out-run", str(tmp_path / "run.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "device 'cuda' needs a CUDA GPU" in err[0]


# --- kernel counts of the runs of one workload --------------------------------------------------------------


def test_kernel_counts_must_agree():
    stages.check_kernel_counts({"a/run.json": 12, "a/kineto_run.json": 12, "ncu": None})
    with pytest.raises(InputError, match=r"different numbers of kernels in the measured window \(a/run.json: 12, "
                                         r"a/kineto_run.json: 13\)"):
        stages.check_kernel_counts({"a/run.json": 12, "a/kineto_run.json": 13})


def test_run_counts_use_the_timeline_reader_for_nsys_and_skip_cpu_runs(tmp_path):
    import pandas as pd

    kernels = pd.DataFrame({"activity": ["kernel"] * 5 + ["graph"]})
    nsys_run, kineto_run, cpu_run = tmp_path / "run.json", tmp_path / "kineto_run.json", tmp_path / "cpu.json"
    nsys_run.write_text(json.dumps({"versions": {"device": "cuda"}, "measured_kernels": None}))
    kineto_run.write_text(json.dumps({"versions": {"device": "cuda"}, "measured_kernels": 5}))
    cpu_run.write_text(json.dumps({"versions": {"device": "cpu"}, "measured_kernels": None}))
    counts = stages._check_run_counts([nsys_run, kineto_run], kernels)
    assert sorted(v for v in counts.values() if v is not None) == [5, 5]
    assert stages._check_run_counts([cpu_run], kernels) == {}
    kineto_run.write_text(json.dumps({"versions": {"device": "cuda"}, "measured_kernels": 6}))
    with pytest.raises(InputError, match="counted in its timeline\\): 5, .*kineto_run.json \\(recorded by the harness\\): 6"):
        stages._check_run_counts([nsys_run, kineto_run], kernels)


# --- the CUDA DAG (dry run) ---------------------------------------------------------------------------------

DRY_CONFIG = {
    "device": "cpu",
    "harness": {"seed": 0, "warmup": 1, "iterations": 1},
    "workloads": {
        "gpt2": {"kind": "gpt2", "compile": True, "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64,
                 "n_positions": 32, "batch_size": 1, "seq_len": 8},
        "lstm": {"kind": "lstm", "input_size": 8, "hidden_size": 16, "num_layers": 1, "batch_size": 1, "seq_len": 4},
    },
}
GPU_RULES = ("select_clocks", "capture_timeline", "capture_kineto", "measure_ceilings")


def _job_block(stdout: str, rule: str) -> str:
    """The text of the dry run's job blocks of ``rule`` (its input, output, wildcards ... lines), joined."""
    import re

    blocks = re.split(r"\n(?:rule|checkpoint|localrule) ", stdout)[1:]
    return "\n".join(b for b in blocks if b.split(":", 1)[0].strip() == rule)


def _dry_run(tmp_path: Path, path_dirs: list[Path], *config: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(DRY_CONFIG))
    env = os.environ.copy()
    env["PYTHONPATH"] = str(ROOT / "src")
    env["PATH"] = os.pathsep.join([*map(str, path_dirs), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"),
           "--configfile", str(cfg), "--cores", "1", "-n", "--config", *config]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.workflow
def test_cuda_dry_run_lists_gpu_rules_with_their_gpu_resource(tmp_path, nsys):
    result = _dry_run(tmp_path, [nsys.parent], "device=cuda", "timeline=auto")  # auto: the fake nsys is on PATH
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert {rule: counts.get(rule) for rule in GPU_RULES} == {
        "select_clocks": 2, "capture_timeline": 2, "capture_kineto": 2, "measure_ceilings": 1}
    # one compile per workload: the Kineto run beside nsys writes the compiled workload's debug output
    assert "compile_artifacts" not in counts, counts
    for rule in ("export_timeline", "export_kineto_timeline", "classify_layers", "build_fusion_map"):
        assert counts.get(rule) == (1 if rule == "build_fusion_map" else 2), (rule, counts)
    assert "inductor/debug" in _job_block(result.stdout, "capture_kineto")
    assert "inductor/debug" not in _job_block(result.stdout, "capture_timeline")
    jobs = dry_run_jobs(result.stdout)
    for job in jobs:
        resources = job["resources"].replace(" ", "").split(",")
        gpu = "gpu=1" in resources
        assert gpu == (job["rule"] in GPU_RULES), job
        # under the SLURM executor a GPU job takes its node whole (tests/test_slurm.py)
        assert ("slurm_extra=--exclusive" in resources) == gpu, job
    assert {j["rule"] for j in jobs} >= {*GPU_RULES, "classify_layers", "attribute"}
    # classify_layers is a checkpoint: the per-class replay_ncu/parse_ncu jobs appear once it has run
    assert "classify_layers" in counts and "replay_ncu" not in counts


@pytest.mark.workflow
@pytest.mark.parametrize("deterministic", [None, True])
def test_every_harness_run_of_a_workload_gets_the_same_determinism(tmp_path, nsys, deterministic):
    """The nsys capture and the Kineto run beside it (whose compile also gives the debug output; the ncu re-run:
    test_ncu_replay) take harness.deterministic from the one harness config: the default (false) or the value
    given."""
    import shlex

    extra = ["harness={seed: 0, warmup: 1, iterations: 1, deterministic: true}"] if deterministic else []
    result = _dry_run(tmp_path, [nsys.parent], "device=cuda", "timeline=nsys", *extra, "-p")
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {}
    for line in result.stdout.splitlines():
        if "-m operator_profiler.gpu_jobs " not in line:
            continue
        argv = shlex.split(line.strip())
        rule = argv[argv.index("operator_profiler.gpu_jobs") + 1]
        params = json.loads(argv[argv.index("operator_profiler.gpu_jobs") + 2])
        if "harness" in params:
            seen.setdefault(rule, []).append(json.loads(params["harness"])["deterministic"])
    assert seen == {"capture_timeline": [bool(deterministic)] * 2, "capture_kineto": [bool(deterministic)] * 2}


@pytest.mark.workflow
def test_cuda_dry_run_auto_without_nsys_is_the_torch_timeline(tmp_path, smi):
    result = _dry_run(tmp_path, [smi.bin], "device=cuda", "timeline=auto")  # fake nvidia-smi only, no nsys
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts.get("capture_timeline") == 2 and "capture_kineto" not in counts, counts
    assert "timeline.kineto.json.gz" in result.stdout and "timeline.nsys-rep" not in result.stdout


def test_gpu_check_script_is_executable_and_documented():
    script = ROOT / "scripts" / "gpu-check"
    assert os.access(script, os.X_OK)
    assert "scripts/gpu-check" in (ROOT / "README.md").read_text()
    assert H100  # the fake GPU model the clock tests use
