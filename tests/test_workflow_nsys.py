"""The workflow's CPU rules on an Nsight Systems timeline, on a machine without a GPU.

With ``--config device=cuda timeline=nsys`` the workflow expects GPU captures (``clocks/target.json``,
``capture/timeline.nsys-rep``, ``run.json``, ``layers.json``, ``clocks_applied.json``, ``kineto.json.gz``,
``kineto_run.json``, ``kineto_clocks_applied.json``)
that this machine cannot make (no GPU, no real nsys). The tests place those
files themselves, as if captured on a GPU node and copied here, and ask Snakemake only for the CPU outputs:
``timeline/*`` (export_timeline), ``layers/*`` (classify_layers) and ``attribution/kernels.parquet`` (attribute).

The set-up (a copy of the repository, a fake ``nsys``, a synthetic export and the placed captures) is
tests/nsys_workflow.py's; its finished run is the session fixture ``nsys_finished_run`` (tests/conftest.py),
which tests/test_incremental.py uses too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from nsys_export import (
    DEFAULT_META,
)
from nsys_workflow import (
    CAPTURE_OUTPUTS,
    CPU_RULES,
    CUDA_NSYS,
    IGNORE_RELU,
    ITERATIONS,
    LAYERS,
    OPS,
    STREAM,
    TARGETS,
    W,
    make_setup,
    nsys_calls,
    snakemake,
)
from workflow_runs import job_counts

from operator_profiler import aggregate as agg


def read(setup: dict, relative: str) -> pd.DataFrame:
    return pd.read_parquet(setup["work"] / "results" / W / relative)


# ------------------------------------------------------------------------------ tests


@pytest.mark.workflow
def test_placed_captures_are_not_rerun(nsys_finished_run):
    setup, dry = nsys_finished_run
    assert job_counts(dry.stdout) == CPU_RULES, dry.stdout[-3000:]
    # The capture rules' placed outputs are untouched and no capture log was written.
    assert not (setup["work"] / "logs" / "capture_timeline").exists()
    assert not (setup["work"] / "logs" / "select_clocks").exists()
    # export_timeline exported the .nsys-rep once with the (fake) nsys from PATH.
    (args,) = nsys_calls(setup)
    assert args[:3] == ["export", "--type", "sqlite"] and args[-1] == f"results/{W}/capture/timeline.nsys-rep"
    assert Path(args[args.index("--output") + 1]).suffix == ".sqlite"


@pytest.mark.workflow
def test_attribution_names_the_placed_ops_layers_and_iterations(nsys_finished_run):
    setup, _ = nsys_finished_run
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
    # the harness's measured-window range (start/end, domain opprof) encloses every kernel, yet is no region
    assert not any("regions" in e["nvtx"] for e in evidence)
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
def test_identical_blocks_form_one_layer_class(nsys_finished_run):
    setup, _ = nsys_finished_run
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
def test_timeline_diagnostics_and_gpu_projection(nsys_finished_run):
    setup, _ = nsys_finished_run
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
def test_second_run_does_nothing(nsys_finished_run):
    setup, _ = nsys_finished_run
    result = snakemake(setup, *TARGETS, *CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Nothing to be done" in result.stdout + result.stderr
    assert len(nsys_calls(setup)) == 1


@pytest.mark.workflow
def test_ignore_ranges_edit_reruns_only_attribute_and_unattributes_relu(nsys_finished_run):
    setup, _ = nsys_finished_run
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
