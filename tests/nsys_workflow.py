"""The workflow's CPU rules on an Nsight Systems timeline, on a machine without a GPU: a copy of the repository
and a work folder holding the GPU node's outputs, placed as if captured there and copied here (the set-up of
tests/test_workflow_nsys.py, test_incremental.py and the replay tests of test_ncu_replay.py).

Test doubles and synthetic data (nothing here is a real capture):

* ``nsys`` is a FAKE script put first on PATH: real Nsight Systems is not installed and cannot run here.
  export_timeline runs ``nsys export --type sqlite ... --output OUT REPORT`` on the ``.nsys-rep``; the fake
  logs its arguments and copies a synthetic SQLite export to OUT. The placed ``.nsys-rep`` is a placeholder.
* The synthetic export (tests/nsys_export.py, the real table layout of nsys 2025.1.1) looks like our
  harness's capture with torch ``emit_nvtx``: domain 1 named ``opprof`` with the start/end range
  ``opprof.measured`` around the measured iterations, ``opprof.iteration:<i>`` and
  ``opprof.layer:blocks.<j>`` push/pop ranges on thread 100:100, default-domain op ranges
  ``aten::mm, seq = N, op_id = M`` / ``aten::relu, ...`` inside each layer, one launch + one kernel per op.
* ``layers.json`` is what the harness writes for the custom model below (``workloads.find_layers``); the
  model is never run. ``kineto.json.gz`` is a synthetic torch.profiler run of the same program
  (another process and clock): attribute pairs its kernels with the nsys ones by invocation order.

The repository's Snakefile, workflow/, scripts/ and src/ are copied to a temporary folder and the copy's
src/ is put first on PYTHONPATH: the library modules are declared inputs of the rules, so an edit or a
``touch`` of the checkout while a test runs (tests/test_workflow.py touches harness.py, stages.py and
merge.py) cannot make Snakemake plan re-runs here.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nsys_export import Kernel, Nvtx, Runtime, fake_nsys, write_nsys_export
from workflow_runs import copy_repo

ROOT = Path(__file__).resolve().parents[1]
W = "toy"
ITERATIONS = 2
LAYERS = ("blocks.0", "blocks.1")
OPS = (("aten::mm", "ampere_sgemm_32x32_sliced1x4_tn"),
       ("aten::relu", "void at::native::vectorized_elementwise_kernel<4, relu_functor>"))
THREAD = "100:100"  # pid:tid of the (synthetic) captured process
PID = 100
STREAM = 7
OPPROF_DOMAIN = 1
CUDA_NSYS = ("--config", "device=cuda", "timeline=nsys")
IGNORE_RELU = 'nvtx={ignore_ranges: ["^aten::relu$"]}'

TARGETS = tuple(f"results/{W}/{p}" for p in ("attribution/kernels.parquet", "timeline/nvtx_gpu_projection.parquet",
                                             "timeline/diagnostics.json"))
# What the GPU node would have written (select_clocks, capture_timeline, capture_kineto).
CAPTURE_OUTPUTS = tuple(f"results/{W}/{p}" for p in (
    "clocks/target.json", "capture/timeline.nsys-rep", "capture/run.json", "capture/layers.json",
    "capture/clocks_applied.json", "capture/kineto.json.gz", "capture/kineto_run.json",
    "capture/kineto_clocks_applied.json"))
CPU_RULES = {"export_timeline": 1, "export_kineto_timeline": 1, "classify_layers": 1, "attribute": 1}

CONFIG = {
    "harness": {"seed": 0, "warmup": 1, "iterations": ITERATIONS},
    "workloads": {W: {"kind": "custom", "factory": "nsys_models:build", "kwargs": {"width": 8}}},
}

MODEL = """
import torch


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        return torch.relu(self.lin(x))  # aten::mm + aten::relu on CUDA


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build(width):
    return Net(width), (torch.randn(2, width),)
"""

# ------------------------------------------------------------------------------ the synthetic capture


def synthetic_capture() -> tuple[list[Nvtx], list[Runtime], list[Kernel], list[dict]]:
    """NVTX rows, launches and kernels of ITERATIONS x LAYERS x OPS, and per kernel what it must be
    attributed to (correlation id, operator, layer, iteration, duration)."""
    nvtx, runtime, kernels, expected = [], [], [], []
    corr = seq = 0
    # the harness's process-wide start/end range around the measured iterations (what ncu's include filter
    # selects); never an operator nor a region in the attribution
    nvtx.append(Nvtx("opprof.measured", 60, THREAD, 999_000, 1_000_000 + ITERATIONS * 100_000, domain=OPPROF_DOMAIN))
    for it in range(ITERATIONS):
        t_it = 1_000_000 + it * 100_000
        nvtx.append(Nvtx(f"opprof.iteration:{it}", 59, THREAD, t_it, t_it + 90_000, domain=OPPROF_DOMAIN))
        for j, layer in enumerate(LAYERS):
            t_layer = t_it + 1_000 + j * 40_000
            nvtx.append(Nvtx(f"opprof.layer:{layer}", 59, THREAD, t_layer, t_layer + 30_000, domain=OPPROF_DOMAIN))
            for k, (op, kernel_name) in enumerate(OPS):
                t_op = t_layer + 1_000 + k * 10_000
                corr += 1
                seq += 1
                # torch emit_nvtx: default domain, "name, seq = N, op_id = M"
                nvtx.append(Nvtx(f"{op}, seq = {seq}, op_id = {seq + 100}", 59, THREAD, t_op, t_op + 5_000))
                runtime.append(Runtime("cudaLaunchKernel_v7000", THREAD, t_op + 1_000, t_op + 2_000, corr))
                duration = 1_000 + 100 * k
                kernels.append(Kernel(kernel_name, PID, STREAM, t_op + 3_000, t_op + 3_000 + duration, corr))
                expected.append({"correlation_id": corr, "operator": op, "layer": layer, "iteration": it,
                                 "duration_ns": duration, "name": kernel_name})
    return nvtx, runtime, kernels, expected


def layers_json(model_file: Path) -> list[dict]:
    """layers.json as capture writes it (harness.run_capture) for the model in ``model_file`` (built, never run)."""
    pytest.importorskip("torch")
    from operator_profiler.capture import workloads

    spec = importlib.util.spec_from_file_location("nsys_models_for_layers", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, _ = module.build(**CONFIG["workloads"][W]["kwargs"])
    return [{"path": l.path, "class": l.cls, "param_shapes": l.param_shapes} for l in workloads.find_layers(model)]


def place_captures(work: Path, layers: list[dict]) -> None:
    """Write the GPU node's outputs into ``work`` (clocks first, then the capture, as the rules would)."""
    out = work / "results" / W
    (out / "clocks").mkdir(parents=True)
    (out / "capture").mkdir(parents=True)
    (out / "clocks" / "target.json").write_text(json.dumps(
        {"policy": "base", "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "sm_mhz": 1755, "mem_mhz": 2619}))
    (out / "capture" / "timeline.nsys-rep").write_bytes(b"\x00placeholder .nsys-rep: the fake nsys ignores it\x00")
    (out / "capture" / "run.json").write_text(json.dumps(
        {"workload": CONFIG["workloads"][W], "harness": CONFIG["harness"], "compiled": False, "mode": "inference",
         "layers": len(layers), "nvtx": "torch.cuda.nvtx", "profiler": "cuda_profiler_api"}, indent=1))
    (out / "capture" / "layers.json").write_text(json.dumps(layers, indent=1) + "\n")
    (out / "capture" / "clocks_applied.json").write_text(json.dumps({"locked": True, "device": "cuda"}))
    with gzip.open(out / "capture" / "kineto.json.gz", "wt") as fh:
        json.dump(synthetic_kineto_run(), fh)
    # The harness's count of the kineto run's kernels (attribute checks it against the nsys timeline's count).
    (out / "capture" / "kineto_run.json").write_text(json.dumps(
        {"workload": CONFIG["workloads"][W], "harness": CONFIG["harness"], "profiler": "torch",
         "versions": {"device": "cuda"}, "measured_kernels": ITERATIONS * len(LAYERS) * len(OPS)}, indent=1))
    (out / "capture" / "kineto_clocks_applied.json").write_text(json.dumps({"locked": True, "device": "cuda"}))
    # The GPU node's measured ceilings (rule measure_ceilings; synthetic figures, the contract's keys).
    ceilings = work / "results" / "ceilings"
    ceilings.mkdir(parents=True, exist_ok=True)
    (ceilings / "cuda.json").write_text(json.dumps(
        {"schema": 1, "device": "cuda", "threads": 1, "machine": {"gpu": "NVIDIA H100 80GB HBM3"},
         "compute_flops_per_s": {"float32": 5.0e13, "tf32": 4.0e14, "bfloat16": 7.0e14, "float16": 7.0e14},
         "memory_bytes_per_s": {"copy": 2.8e12, "triad": 2.9e12, "best": 2.9e12}, "nominal": None}))
    (ceilings / "cuda.clocks_applied.json").write_text(json.dumps({"locked": True, "device": "cuda"}))


KINETO_PID = 4242  # the torch.profiler run is another process, on another clock


def synthetic_kineto_run() -> dict:
    """The capture_kineto run of the same program: same iterations, layers and kernel order as
    synthetic_capture, another pid, clock and correlation ids; ops as torch.profiler records them
    (aten::linear > aten::mm), kernel names as Kineto demangles them (with the parameter list)."""
    events = []
    corr = 5000

    def x(cat, name, ts, dur, pid=KINETO_PID, tid=1, **args):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                       "args": args})

    for it in range(ITERATIONS):
        t_it = 10.0 + it * 300.0
        x("user_annotation", f"opprof.iteration:{it}", t_it, 250.0)
        for j, layer in enumerate(LAYERS):
            t_layer = t_it + 5 + j * 120
            x("user_annotation", f"opprof.layer:{layer}", t_layer, 100.0)
            for k, (op, kernel_name) in enumerate(OPS):
                t_op = t_layer + 5 + k * 40
                corr += 1
                if op == "aten::mm":
                    x("cpu_op", "aten::linear", t_op - 1, 30.0)
                x("cpu_op", op, t_op, 20.0)
                x("cuda_runtime", "cudaLaunchKernel", t_op + 5, 3.0, correlation=corr)
                x("kernel", kernel_name + "(int, float*)", t_op + 10, 1.0 + 0.1 * k, pid=0, tid=STREAM,
                  correlation=corr, device=0, stream=STREAM)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "baseTimeNanoseconds": 1_790_000_000_000_000_000, "traceEvents": events}


# ------------------------------------------------------------------------------ running snakemake


def snakemake(setup: dict, *args: str) -> subprocess.CompletedProcess:
    """``snakemake ARGS`` in the work folder; ``--config`` must come last in ARGS (it takes all that follows)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(setup["repo"] / "Snakefile"), "-d", str(setup["work"]),
           "--configfile", str(setup["config"]), "--cores", "1", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=setup["env"], timeout=300)


def nsys_calls(setup: dict) -> list[list[str]]:
    log = setup["nsys_log"]
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def make_setup(base: Path) -> dict:
    repo = copy_repo(base / "repo")
    work = base / "work"
    work.mkdir()
    (work / "nsys_models.py").write_text(MODEL)  # the custom model: an input of the capture rules
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))

    nvtx, runtime, kernels, expected = synthetic_capture()
    fixture = write_nsys_export(base / "synthetic_export.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels,
                                domains={(PID, OPPROF_DOMAIN): "opprof"})
    bin_dir = base / "bin"
    log = base / "nsys_calls.jsonl"
    fake_nsys(bin_dir, log, fixture)

    env = os.environ.copy()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    # The copy's library first (what runs is what the rules declare as inputs); the work folder for the
    # custom model's module, so that Snakemake finds its source (an input of the capture rules).
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "src"), str(work)])
    layers = layers_json(work / "nsys_models.py")
    place_captures(work, layers)  # last: newer than every input of the capture rules
    return {"repo": repo, "work": work, "config": config, "env": env, "nsys_log": log, "expected": expected,
            "layers": layers}
