"""The workflow's CPU rules on an Nsight Systems timeline, on a machine without a GPU.

With ``--config device=cuda timeline=nsys`` the workflow expects GPU captures (``clocks/target.json``,
``capture/timeline.nsys-rep``, ``run.json``, ``layers.json``, ``clocks_applied.json``, ``kineto.json.gz``,
``kineto_run.json``, ``kineto_clocks_applied.json``)
that this machine cannot make (no GPU, no real nsys). The tests place those
files themselves, as if captured on a GPU node and copied here, and ask Snakemake only for the CPU outputs:
``timeline/*`` (export_timeline), ``layers/*`` (classify_layers) and ``attribution/kernels.parquet`` (attribute).

Test doubles and synthetic data (nothing here is a real capture):

* ``nsys`` is a FAKE script put first on PATH: real Nsight Systems is not installed and cannot run here.
  export_timeline runs ``nsys export --type sqlite ... --output OUT REPORT`` on the ``.nsys-rep``; the fake
  logs its arguments and copies a synthetic SQLite export to OUT. The placed ``.nsys-rep`` is a placeholder.
* The synthetic export (tests/nsys_export.py, the real table layout of nsys 2025.1.1) looks like our
  harness's capture with torch ``emit_nvtx``: domain 1 named ``opprof`` with ``opprof.iteration:<i>`` and
  ``opprof.layer:blocks.<j>`` push/pop ranges on thread 100:100, default-domain op ranges
  ``aten::mm, seq = N, op_id = M`` / ``aten::relu, ...`` inside each layer, one launch + one kernel per op.
* ``layers.json`` is what the harness writes for the custom model below (``workloads.find_layers``); the
  model is never run. ``kineto.json.gz`` is a synthetic torch.profiler run of the same program
  (another process and clock): attribute pairs its kernels with the nsys ones by invocation order.

The repository's Snakefile, workflow/, scripts/ and src/ are copied to a temporary folder and the copy's
src/ is put first on PYTHONPATH: the library modules are declared inputs of the rules, so an edit or a
``touch`` of the checkout while this module runs (tests/test_workflow.py touches harness.py, stages.py and
merge.py) cannot make Snakemake plan re-runs here.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from nsys_export import (
    DEFAULT_META,
    Kernel,
    Nvtx,
    Runtime,
    fake_nsys,
    write_nsys_export,
)
from test_workflow import job_counts

from operator_profiler import aggregate as agg

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


def copy_repo(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("workflow", "scripts", "envs", "config", "src"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore)
    shutil.copy2(ROOT / "Snakefile", dest / "Snakefile")
    return dest


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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    setup = make_setup(tmp_path_factory.mktemp("wf_nsys"))
    # Placed captures have no Snakemake metadata: only the mtime trigger can fire for them, and it does
    # not, as they are newer than their inputs. So the plan holds the three CPU rules and no capture rule.
    dry = snakemake(setup, "-n", *TARGETS, *CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-4000:]
    result = snakemake(setup, *TARGETS, *CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-4000:]
    return setup, dry


def read(setup: dict, relative: str) -> pd.DataFrame:
    return pd.read_parquet(setup["work"] / "results" / W / relative)


# ------------------------------------------------------------------------------ tests


@pytest.mark.workflow
def test_placed_captures_are_not_rerun(finished_run):
    setup, dry = finished_run
    assert job_counts(dry.stdout) == CPU_RULES, dry.stdout[-3000:]
    # The capture rules' placed outputs are untouched and no capture log was written.
    assert not (setup["work"] / "logs" / "capture_timeline").exists()
    assert not (setup["work"] / "logs" / "select_clocks").exists()
    # export_timeline exported the .nsys-rep once with the (fake) nsys from PATH.
    (args,) = nsys_calls(setup)
    assert args[:3] == ["export", "--type", "sqlite"] and args[-1] == f"results/{W}/capture/timeline.nsys-rep"
    assert Path(args[args.index("--output") + 1]).suffix == ".sqlite"


@pytest.mark.workflow
def test_attribution_names_the_placed_ops_layers_and_iterations(finished_run):
    setup, _ = finished_run
    expected = pd.DataFrame(setup["expected"])
    attribution = read(setup, "attribution/kernels.parquet")
    timeline = read(setup, "timeline/kernels.parquet")
    assert len(attribution) == len(timeline) == len(expected) == ITERATIONS * len(LAYERS) * len(OPS)
    assert attribution["kernel_id"].is_unique
    got = attribution.merge(timeline[["kernel_id", "correlation_id"]], on="kernel_id", validate="one_to_one")
    got = got.sort_values("correlation_id").reset_index(drop=True)
    assert got["correlation_id"].astype(int).tolist() == expected["correlation_id"].tolist()
    assert got["operator"].tolist() == expected["operator"].tolist()
    assert got["layer"].tolist() == expected["layer"].tolist()
    assert got["module"].tolist() == expected["layer"].tolist()
    assert got["iteration"].astype(int).tolist() == expected["iteration"].tolist()
    assert got["name"].tolist() == expected["name"].tolist()
    assert got["duration_ns"].tolist() == expected["duration_ns"].tolist()
    # Path (a) from the torch.profiler run (paired by invocation order) names the operator; NVTX agrees.
    assert (got["path"] == "correlation").all() and got["reason"].isna().all()
    # emit_nvtx decorations are stripped from the operator; the range is still the evidence.
    evidence = got["evidence"].map(json.loads)
    assert [e["nvtx"]["operator"] for e in evidence] == expected["operator"].tolist()
    assert [e["correlation"]["operator"] for e in evidence] == expected["operator"].tolist()
    assert [e["correlation"]["stack"][-1] for e in evidence] == expected["operator"].tolist()
    pairing = json.loads((setup["work"] / "results" / W / "attribution" / "pairing.json").read_text())
    n = len(expected)
    assert pairing == {"target_kernels": n, "source_kernels": n, "paired": n, "keyed_by": "iteration",
                       "mismatched_iterations": [], "first_difference": None, "named_by_kineto_run": n}
    coverage = agg.coverage(attribution, counters_collected=False)
    assert coverage["path_coverage"] == {"correlation": {"count": 1.0, "time": 1.0}, "nvtx": {"count": 1.0, "time": 1.0}}
    assert coverage["path_agreement_counts"] == {"correlation/nvtx": {"both": n, "agree": n}}


@pytest.mark.workflow
def test_identical_blocks_form_one_layer_class(finished_run):
    setup, _ = finished_run
    layer_entries = setup["layers"]
    assert [l["path"] for l in layer_entries] == list(LAYERS) and {l["class"] for l in layer_entries} == {"Block"}
    classes = json.loads((setup["work"] / "results" / W / "layers" / "classes.json").read_text())
    assert len(classes) == 1, classes
    (name, cls), = classes.items()
    assert cls["module_class"] == "Block" and cls["instances"] == list(LAYERS)
    assert cls["representative"] == LAYERS[0] and cls["kernel_count"] == len(OPS)
    assert [s[0] for s in cls["signature"]] == [k for _, k in OPS]
    assert [p.stem for p in (setup["work"] / "results" / W / "layers" / "classes").glob("*.json")] == [name]
    attribution = read(setup, "attribution/kernels.parquet")
    assert set(attribution["layer_class"]) == {name}


@pytest.mark.workflow
def test_timeline_diagnostics_and_gpu_projection(finished_run):
    setup, _ = finished_run
    diagnostics = json.loads((setup["work"] / "results" / W / "timeline" / "diagnostics.json").read_text())
    assert diagnostics["schema_version"] == DEFAULT_META["EXPORT_SCHEMA_VERSION"] == "3.17.1"
    assert diagnostics["product_version"] == DEFAULT_META["EXPORT_PRODUCT_VERSION"]
    n = ITERATIONS * len(LAYERS) * len(OPS)
    assert diagnostics["counts"]["kernels"] == diagnostics["counts"]["launches"] == n
    assert diagnostics["counts"]["ranges_push_pop"] == ITERATIONS * (1 + len(LAYERS) * (1 + len(OPS)))
    assert diagnostics["warnings"] == []

    projection = read(setup, "timeline/nvtx_gpu_projection.parquet")
    layer_rows = projection[projection["name"].str.startswith("opprof.layer:")]
    assert len(layer_rows) == ITERATIONS * len(LAYERS)
    assert sorted(layer_rows["name"].unique()) == [f"opprof.layer:{l}" for l in LAYERS]
    assert (layer_rows["domain"] == "opprof").all() and (layer_rows["stream"] == STREAM).all()
    assert (layer_rows["kernel_count"] == len(OPS)).all()
    durations = [1_000 + 100 * k for k in range(len(OPS))]
    assert (layer_rows["gpu_time_ns"] == sum(durations)).all()
    iteration_rows = projection[projection["name"].str.startswith("opprof.iteration:")]
    assert sorted(iteration_rows["name"]) == [f"opprof.iteration:{i}" for i in range(ITERATIONS)]
    assert (iteration_rows["kernel_count"] == len(LAYERS) * len(OPS)).all()
    ops = projection[projection["domain"] == "default"]
    assert len(ops) == n and (ops["kernel_count"] == 1).all()


@pytest.mark.workflow
def test_second_run_does_nothing(finished_run):
    setup, _ = finished_run
    result = snakemake(setup, *TARGETS, *CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Nothing to be done" in result.stdout + result.stderr
    assert len(nsys_calls(setup)) == 1


@pytest.mark.workflow
def test_ignore_ranges_edit_reruns_only_attribute_and_unattributes_relu(finished_run):
    setup, _ = finished_run
    edited = (*CUDA_NSYS, IGNORE_RELU)
    dry = snakemake(setup, "-n", *TARGETS, *edited)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert job_counts(dry.stdout) == {"attribute": 1}, dry.stdout[-3000:]  # params trigger of attribute only

    try:
        result = snakemake(setup, *TARGETS, *edited)
        assert result.returncode == 0, result.stderr[-4000:]
        assert len(nsys_calls(setup)) == 1  # the timeline was not exported again
        attribution = read(setup, "attribution/kernels.parquet")
        relu = attribution[attribution["name"] == OPS[1][1]]
        mm = attribution[attribution["name"] == OPS[0][1]]
        assert len(relu) == len(mm) == ITERATIONS * len(LAYERS)
        assert (mm["operator"] == "aten::mm").all() and (mm["path"] == "correlation").all()
        for evidence in mm["evidence"].map(json.loads):
            assert evidence["nvtx"]["operator"] == "aten::mm"
        # The ignored relu range is skipped and nothing in an operator domain encloses the launch: NVTX
        # stacks are per (thread, domain), so the default-domain relu range has no parent (the layer and
        # iteration ranges are on the opprof domain's stack, and are markers, never operators). A range of
        # another domain does enclose it, hence no_operator_range rather than no_enclosing_range. Path (a)
        # from the torch.profiler run still names the operator (correlation > NVTX).
        assert (relu["operator"] == "aten::relu").all() and (relu["path"] == "correlation").all()
        assert sorted(relu["layer"]) == sorted(list(LAYERS) * ITERATIONS)  # the layer does not come from the op
        for evidence in relu["evidence"].map(json.loads):
            assert evidence["nvtx"]["operator"] is None and evidence["nvtx"]["reason"] == "no_operator_range"
            assert len(evidence["nvtx"]["stack"]) == 1 and evidence["nvtx"]["stack"][0].startswith("aten::relu")
            assert evidence["correlation"]["operator"] == "aten::relu"
    finally:
        # Back to the unedited config for any test that runs after this one (re-runs attribute only).
        restore = snakemake(setup, *TARGETS, *CUDA_NSYS)
        assert restore.returncode == 0, restore.stderr[-2000:]


@pytest.mark.workflow
def test_captures_copied_in_the_wrong_order_are_marked_up_to_date_with_touch(tmp_path):
    """A copy from the GPU node may leave clocks/target.json newer than the captures (e.g. copied last).
    Snakemake then plans the capture rules again (mtime trigger), which cannot run here. The documented
    remedy is ``snakemake --touch`` on the capture outputs: it marks the jobs that would run as done (the
    outputs' mtimes are set in DAG order, nothing is executed) and records their metadata.
    ``--rerun-triggers mtime`` does not help: mtime is the trigger that fires here (placed files have no
    metadata, so the params/input/code triggers never fire for them anyway)."""
    setup = make_setup(tmp_path)
    work = setup["work"]
    contents = {p: (work / p).read_bytes() for p in CAPTURE_OUTPUTS}
    stamp = (work / CAPTURE_OUTPUTS[1]).stat().st_mtime_ns
    os.utime(work / f"results/{W}/clocks/target.json", ns=(stamp + 10**9, stamp + 10**9))

    dry = snakemake(setup, "-n", *TARGETS, *CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert job_counts(dry.stdout) == {"capture_timeline": 1, "capture_kineto": 1, **CPU_RULES}, dry.stdout[-3000:]

    touch = snakemake(setup, "--touch", f"results/{W}/capture/timeline.nsys-rep", f"results/{W}/capture/kineto.json.gz",
                      *CUDA_NSYS)
    assert touch.returncode == 0, touch.stderr[-2000:]
    assert {p: (work / p).read_bytes() for p in CAPTURE_OUTPUTS} == contents  # only mtimes changed
    # --touch also touches the jobs' log files (creating them empty); a capture that ran would have
    # written its FAILED line there (no GPU here).
    for rule in ("capture_timeline", "capture_kineto"):
        assert (work / "logs" / rule / f"{W}.log").read_text() == ""
    assert nsys_calls(setup) == []

    dry = snakemake(setup, "-n", *TARGETS, *CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert job_counts(dry.stdout) == CPU_RULES, dry.stdout[-3000:]
