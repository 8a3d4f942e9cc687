"""The real workflow on a tiny config in a temporary directory (CPU, real torch.profiler captures).

One module-scoped run serves several tests; each checks tables against values recomputed from the
other artifacts of the same run (the trace, layers.json), not against hard-coded numbers.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from workflow_runs import (
    CUSTOM_MODEL,
    ITERATIONS,
    N_LAYER,
    ROOT,
    TINY,
    copy_repo,
    custom_env,
    job_counts,
    snakemake,
)

from operator_profiler import tables
from operator_profiler.timeline.kineto import load_trace


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    (work / "wf_models.py").write_text(CUSTOM_MODEL)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(TINY))
    result = snakemake(work, config, env=custom_env(work), cores=2)  # both cores: the suite's longest set-up
    assert result.returncode == 0, result.stderr[-4000:]
    return work, config


@pytest.mark.workflow
def test_every_workload_has_operators_coverage_and_report(finished_run):
    work, _ = finished_run
    for name in TINY["workloads"]:
        out = work / "results" / name
        operators = pd.read_csv(out / "operators.csv")
        assert len(operators) > 0
        real = operators[operators["operator"] != "(unattributed)"]["operator"]
        assert real.str.contains("aten::").all(), real.tolist()
        coverage = json.loads((out / "coverage.json").read_text())
        assert coverage["coverage_time"] >= 0.95
        assert coverage["counters_coverage"] is None and "not collected on CPU" in coverage["counters_note"]
        # the per-operator times add up to the kernel time of the timeline
        kernels = tables.read_table(out / "timeline" / "kernels.parquet")
        assert operators["time_ns"].sum() == kernels["duration_ns"].sum() == coverage["kernel_time_ns"]
        report = (out / "report.md").read_text()
        assert f"# Operator profile: `{name}`" in report and "not collected on CPU" in report
        assert "Kernel time per iteration" in report
        # every kernel of the measured window lies in one of the iteration ranges
        assert len(coverage["iteration_time_ns"]) == ITERATIONS
        assert sum(coverage["iteration_time_ns"].values()) == coverage["kernel_time_ns"]


@pytest.mark.workflow
def test_gpt2_blocks_form_one_layer_class(finished_run):
    work, _ = finished_run
    out = work / "results" / "gpt2"
    layers = json.loads((out / "capture" / "layers.json").read_text())
    assert [l["path"] for l in layers] == [f"transformer.h.{i}" for i in range(N_LAYER)]
    classes = pd.read_parquet(out / "layer_classes.parquet")
    blocks = classes[classes["module_class"] == "Block"]
    assert len(blocks) == 1 and blocks["instances"].iloc[0] == N_LAYER
    assert sorted(p.stem for p in (out / "layers" / "classes").glob("*.json")) == sorted(classes["layer_class"])
    modules = pd.read_parquet(out / "modules.parquet")
    assert {f"transformer.h.{i}" for i in range(N_LAYER)} <= set(modules["module"])

    # Independent check against the raw trace: the layer ranges of the trace, per iteration.
    events = load_trace(out / "capture" / "timeline.kineto.json.gz")["traceEvents"]
    layer_ranges = [e["name"] for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("opprof.layer:")]
    assert len(layer_ranges) == N_LAYER * ITERATIONS


@pytest.mark.workflow
def test_whole_model_compile_places_kernels_by_their_fx_nodes_and_says_so(finished_run):
    """Whole-model compile in the workflow: sdpa_attention (compile_scope model by default) has no layer ranges, every
    layer instance gets kernels from the fusion map's module paths, the others are cross-layer or outside, and the
    reports state the compile scope; gpt2 (compile_scope layers) keeps its layer ranges."""
    work, _ = finished_run
    out = work / "results" / "sdpa_attention"
    run = json.loads((out / "capture" / "run.json").read_text())
    assert run["compile_scope"] == "model" and run["layer_ranges"] is False
    ranges = tables.read_table(out / "timeline" / "ranges.parquet")
    assert ranges["layer"].isna().all() and (ranges["name"] == "opprof.model").sum() == ITERATIONS
    kl = pd.read_parquet(out / "layers" / "kernel_layers.parquet")
    assert set(kl["membership"]) <= {"fx_nodes", "cross_layer", "outside_layers"}
    layers = [entry["path"] for entry in json.loads((out / "capture" / "layers.json").read_text())]
    assert layers == ["blocks.0", "blocks.1"] and set(kl["layer"].dropna()) == set(layers)
    fusion = pd.read_parquet(out / "inductor" / "fusion_map.parquet")
    assert (fusion["module_paths_scope"] == "model").all()
    # a kernel's layer is the one all its call site's module paths lie in
    attribution = tables.read_table(out / "attribution" / "kernels.parquet")
    for row in attribution[attribution["membership"] == "fx_nodes"].itertuples():
        site = json.loads(row.evidence)["inductor"]
        paths = fusion[(fusion["graph"] == site["graph"]) & (fusion["call_index"] == site["call_index"])]
        assert all(p == row.layer or p.startswith(row.layer + ".") for p in paths["module_paths"].iloc[0])
    coverage = json.loads((out / "coverage.json").read_text())
    assert coverage["coverage_time"] >= 0.99
    cross = coverage["layer_membership"]["cross_layer"]
    assert sum(c["count"] for c in cross) == int((kl["membership"] == "cross_layer").sum())
    from html_report import column
    from html_report import tables as html_tables

    page = html_tables((out / "report.html").read_text())
    if cross:  # the page lists each cross-layer kernel with the instances it spans
        listed = page["layer-membership-table"]
        assert column(listed, "kernel", "text") == [c["name"] for c in cross]
        assert column(listed, "spans", "text") == [" + ".join(c["layers_spanned"]) for c in cross]
    for name, scope in (("sdpa_attention", "model"), ("gpt2", "layers")):
        assert f"compile scope **{scope}**" in (work / "results" / name / "report.md").read_text()
        assert f"compile scope <strong>{scope}</strong>" in (work / "results" / name / "report.html").read_text()


@pytest.mark.workflow
def test_compiled_gpt2_kernels_are_inductor_cpp_kernels_and_extern_ops(finished_run):
    work, _ = finished_run
    attribution = tables.read_table(work / "results" / "gpt2" / "attribution" / "kernels.parquet")
    kernels = tables.read_table(work / "results" / "gpt2" / "timeline" / "kernels.parquet")
    inside_blocks = attribution[attribution["layer"].notna()]
    names = kernels.set_index("kernel_id").loc[inside_blocks["kernel_id"], "name"]
    cpp = names.str.match(r"^graph_\d+_cpp_fused_")
    assert cpp.any() and (~cpp).any()
    fused = inside_blocks[cpp.to_numpy()]
    assert (fused["path"] == "inductor").all()
    assert fused["fused_ops"].map(len).gt(0).all()
    # The other call sites are extern GEMMs; CPU work nested in them (the bias copy of addmm) is a
    # kernel of its own that shares its call site's source nodes.
    top_level = kernels.set_index("kernel_id").loc[inside_blocks["kernel_id"], "parent_kernel_id"].isna().to_numpy()
    extern = inside_blocks[(~cpp).to_numpy() & top_level]
    assert set(extern["operator"]) <= {"aten::addmm", "aten::bmm", "aten::mm"} and len(extern) > 0
    nested = inside_blocks[~top_level]
    assert nested["source_nodes"].map(len).gt(0).all()


@pytest.mark.workflow
@pytest.mark.parametrize("workload", ["gpt2", "sdpa_attention"])
def test_flops_per_iteration_agree_with_flop_counter_mode_and_every_operator_has_work(finished_run, workload):
    """Compiled GPT-2 (per layer) and whole-model-compiled SDPA: the FLOPs the work stage read from the trace's
    shapes and the fusion map, against PyTorch's FlopCounterMode running the same model (CPU flash attention
    mapped to the registry's SDPA formula)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from operator_profiler.capture.workloads import build_workload
    from operator_profiler.config import validate_config
    from operator_profiler.work.op_calls import EXTRA_FORMULAS

    work, config = finished_run
    folder = work / "results" / workload
    summary = json.loads((folder / "coverage.json").read_text())["work"]
    cfg = validate_config(yaml.safe_load(config.read_text()), str(config))
    torch.manual_seed(0)
    model, inputs = build_workload(cfg["workloads"][workload], "cpu")
    mapping = {getattr(torch.ops.aten, k.split("::")[1]): f() for k, f in EXTRA_FORMULAS.items()}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model(*inputs)
    expected = counter.get_total_flops()
    assert expected > 0
    assert abs(summary["flops_by_pytorch_formulas_per_iteration"] - expected) / expected < 0.01
    assert summary["known_time_share"] == 1.0 and summary["kernels_without_work"] == 0
    operators = pd.read_parquet(folder / "operators.parquet")
    assert operators["work_known"].all()
    with_work = operators[(operators["flops"] > 0) | (operators["bytes"] > 0)]
    assert with_work["bound"].isin(["compute", "memory"]).all()
    assert with_work["roofline"].str.contains("% of ").all()
    ceilings = json.loads((work / "results" / "ceilings" / "cpu.json").read_text())
    gemm = operators[operators["operator"].isin(["aten::addmm", "aten::mm", "aten::bmm"]) & (operators["flops"] > 0)]
    assert len(gemm) and (gemm["ceiling_flops_per_s"] == ceilings["compute_flops_per_s"]["float32"]).all()


@pytest.mark.workflow
def test_trace_json_holds_every_kernel_with_its_operator(finished_run):
    work, _ = finished_run
    out = work / "results" / "gpt2"
    trace = json.loads((out / "trace.json").read_text())
    kernels = tables.read_table(out / "timeline" / "kernels.parquet")
    attribution = tables.read_table(out / "attribution" / "kernels.parquet").set_index("kernel_id")
    events = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_kernel"]
    assert len(events) == len(kernels) == trace["otherData"]["kernels"]
    for e in events:
        operator = attribution.loc[e["args"]["kernel_id"], "operator"]
        assert e["args"]["operator"] == (None if pd.isna(operator) else operator)


@pytest.mark.workflow
def test_report_html_holds_every_operator_module_and_the_cpu_note(finished_run):
    from html_report import column, figure, figure_ids, tables

    work, _ = finished_run
    for name in TINY["workloads"]:
        out = work / "results" / name
        text = (out / "report.html").read_text()
        operators = pd.read_parquet(out / "operators.parquet")
        page = tables(text)
        # the whole name in data-v (and the title); the text shown is the name, or cut in the middle when long
        assert column(page["operator-table"], "operator") == list(operators["operator"])
        assert all(shown == name or (len(shown) <= 120 and "…" in shown) for shown, name in
                   zip(column(page["operator-table"], "operator", "text"), operators["operator"]))
        assert [int(v) for v in column(page["operator-table"], "time (ms)")] == list(operators["time_ns"])
        assert [int(v) for v in column(page["operator-table"], "calls")] == list(operators["calls"])
        modules = pd.read_parquet(out / "modules.parquet")
        assert [int(v) for v in column(page["module-table"], "total (ms)")] == list(modules["time_ns"])
        assert "fig-sol" not in figure_ids(text) and "not collected on CPU" in text
        # the roofline instead: one point per operator with known work that moves bytes in measured time
        drawn = [op for t in figure(text, "fig-roofline") if t.get("mode") == "markers" for op in t["customdata"]]
        placed = operators["work_known"] & (operators["bytes"] > 0) & (operators["time_ns"] > 0)
        assert sorted(drawn) == sorted(operators.loc[placed, "operator"]) and drawn
        # plotly.js once (in the head), one data script per figure, the sort script
        assert text.count("<script") == len(figure_ids(text)) + 2 and text.count("plotly.js v") <= 2
        assert "http://" not in text.split("<main>")[1] and "https://" not in text.split("<main>")[1]


@pytest.mark.workflow
def test_snakemake_report_shows_every_workload(finished_run, tmp_path):
    work, config = finished_run
    html = tmp_path / "report.html"
    result = snakemake(work, config, "--report", str(html), env=custom_env(work))
    assert result.returncode == 0, result.stderr[-3000:]
    text = html.read_text()
    for name in TINY["workloads"]:
        assert name in text
    for caption in ("Per-operator kernel time of workload", "Attribution coverage of workload",
                    "as a Chrome/Perfetto trace", "ui.perfetto.dev", "is not in this report"):
        assert caption in text, caption
    # Each embedded file is a base64 data: URL named by its file. report.html (plotly.js inlined, ~5 MB)
    # is not one of them: Chromium blanks data: iframes over 2 MB, so the page stays beside the results.
    embedded = {}
    for name, data in re.findall(r"data:[\w/.+-]+;charset=[\w-]+;filename=([^;\"']+);base64,([A-Za-z0-9+/=]+)", text):
        embedded.setdefault(name, []).append(base64.b64decode(data))
    assert len(embedded["report.md"]) == len(embedded["trace.json"]) == len(TINY["workloads"])
    assert "report.html" not in embedded
    assert not any(b"plotly.js v" in blob for blobs in embedded.values() for blob in blobs)
    page_size = min((work / "results" / name / "report.html").stat().st_size for name in TINY["workloads"])
    assert html.stat().st_size < page_size


def test_the_documented_report_command_works_as_written(tmp_path):
    """`snakemake --report report.html`, as docs/outputs.md shows it (the command is read from there), in a
    checkout with finished results: it gives no --cores, and rules whose threads are every core of the run
    (measure_ceilings, verify_variants) made it fail with "Workflow requires a total number of cores to be
    defined". Results are placed: the report only collects the files flagged report() in the
    workflow (per workload operators.csv, coverage.json, report.md, trace.json), each with known content."""
    section = (ROOT / "docs" / "outputs.md").read_text().split("## The Snakemake report", 1)[1]
    command = re.search(r"`(snakemake --report [^`]+)`", section).group(1)
    assert command == "snakemake --report report.html"  # what users are told to type; the test runs it as is
    repo = copy_repo(tmp_path / "repo")
    shutil.copytree(ROOT / "profiles", repo / "profiles")  # Snakemake reads profiles/default by itself
    workloads = sorted(yaml.safe_load((repo / "config" / "config.yaml").read_text())["workloads"])
    placed = {}
    for name in workloads:
        out = repo / "results" / name
        out.mkdir(parents=True)
        placed[name] = f"operator,time_ns\naten::mm_{name},{len(name)}\n"
        (out / "operators.csv").write_text(placed[name])
        (out / "coverage.json").write_text("{}")
        (out / "report.md").write_text(f"# Operator profile: `{name}`\n")
        (out / "trace.json").write_text("{}")
    snakemake_exe = Path(sys.executable).with_name("snakemake")
    argv = shlex.split(command)
    argv = [str(snakemake_exe), *argv[1:]] if snakemake_exe.exists() else [sys.executable, "-m", *argv]
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    result = subprocess.run(argv, cwd=repo, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "requires a total number of cores" not in result.stderr
    text = (repo / "report.html").read_text()
    embedded = {}
    for name, data in re.findall(r"data:[\w/.+-]+;charset=[\w-]+;filename=([^;\"']+);base64,([A-Za-z0-9+/=]+)", text):
        embedded.setdefault(name, []).append(base64.b64decode(data).decode())
    assert sorted(embedded["operators.csv"]) == sorted(placed.values())
    assert len(embedded["report.md"]) == len(workloads)


@pytest.mark.workflow
def test_second_run_does_nothing(finished_run):
    work, config = finished_run
    result = snakemake(work, config, env=custom_env(work))
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr
    # the GPU-only sections: on a CPU run an edit of them re-runs nothing (clocks locks nothing, ncu replays nothing)
    for edit in ("clocks={policy: max, sudo: true}", "ncu={window: profiler_api, cache_control: none}"):
        result = snakemake(work, config, "-n", "--config", edit, env=custom_env(work))
        assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr, (edit, result.stdout[-2000:])


@pytest.mark.workflow
def test_aggregation_option_edit_reruns_only_aggregate_and_reports(finished_run, tmp_path):
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**TINY, "aggregate": {"per_iteration": False}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout)
    assert counts.pop("all") == 1
    assert counts == {"aggregate": 4, "advise": 4, "report": 4, "report_html": 4}


@pytest.mark.workflow
def test_report_option_edit_reruns_only_the_reports(finished_run, tmp_path):
    """A presentation option re-runs only what follows it: the report side (the aggregation side is the test above)."""
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**TINY, "report": {"top_operators": 3}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    assert job_counts(result.stdout) == {"all": 1, "report": 4, "report_html": 4}


@pytest.mark.workflow
def test_new_workload_runs_only_its_own_jobs(finished_run, tmp_path):
    """One more (uncompiled) workload plans its own 11 jobs (with export_trace, report_html, advise) and nothing of the
    others."""
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    extra = {"kind": "lstm", "input_size": 4, "hidden_size": 8, "num_layers": 1, "batch_size": 1, "seq_len": 4}
    edited.write_text(yaml.safe_dump({**TINY, "workloads": {**TINY["workloads"], "lstm_small": extra}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    assert job_counts(result.stdout) == {"all": 1, "select_clocks": 1, "capture_timeline": 1, "export_timeline": 1,
                                         "classify_layers": 1, "attribute": 1, "compute_work": 1, "aggregate": 1,
                                         "advise": 1, "report": 1, "report_html": 1, "export_trace": 1}
    jobs = re.findall(r"wildcards: workload=(\w+)", result.stdout)
    assert set(jobs) == {"lstm_small"}, jobs


@pytest.mark.workflow
def test_long_cpu_stages_log_their_progress(finished_run):
    """export_timeline, classify_layers and attribute log counts and elapsed seconds."""
    work, _ = finished_run
    kernels = len(tables.read_table(work / "results" / "lstm" / "timeline" / "kernels.parquet"))
    logs = {rule: (work / "logs" / rule / "lstm.log").read_text()
            for rule in ("export_timeline", "classify_layers", "attribute")}
    secs = r"in \d+\.\d s"
    assert re.search(rf"read [\d,]+ events, {kernels:,} kernels, [\d,]+ launches, [\d,]+ ranges {secs}",
                     logs["export_timeline"]), logs["export_timeline"]
    assert re.search(rf"wrote the timeline tables to \S+ {secs}", logs["export_timeline"])
    assert re.search(rf"classified {kernels:,} kernels into \d+ layer classes \(\d+ instances\) {secs}",
                     logs["classify_layers"]), logs["classify_layers"]
    assert re.search(rf"read {kernels:,} kernels and [\d,]+ ranges {secs}", logs["attribute"]), logs["attribute"]
    assert re.search(rf"attributed {kernels:,} kernels \([\d,]+ to an operator\) {secs}", logs["attribute"])
    assert not any("FAILED" in text for text in logs.values())


@pytest.mark.workflow
def test_iteration_count_edit_recaptures_with_the_debug_output_of_its_compile(finished_run, tmp_path):
    """One compile per workload: the capture writes the Inductor debug output of the compile it profiles, so an
    edit that re-captures also rebuilds the compiled workloads' fusion maps (from the new compile), and no separate
    compile job exists."""
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**TINY, "harness": {**TINY["harness"], "iterations": ITERATIONS + 1}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout)
    compiled = sum(1 for w in TINY["workloads"].values() if w.get("compile"))
    assert counts["capture_timeline"] == len(TINY["workloads"]) == 4
    assert counts.get("build_fusion_map") == compiled == 2, counts
    assert "compile_artifacts" not in counts and "select_clocks" not in counts


@pytest.mark.workflow
def test_touching_library_code_reruns_nothing_and_editing_a_custom_model_recaptures_it(finished_run, tmp_path):
    work, config = finished_run
    for module in ("capture/harness.py", "stages.py", "attribution/merge.py"):
        assert (ROOT / "src" / "operator_profiler" / module).is_file(), module  # touch() would create it
        (ROOT / "src" / "operator_profiler" / module).touch()
    result = snakemake(work, config, "-n", env=custom_env(work))
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-2000:]
    # A git checkout that leaves the GPU rules' code as it was but gives it a new
    # mtime (here: in the future, newer than every output) re-runs no capture. The GPU rules are shell:
    # rules running operator_profiler.gpu_jobs, a checksummed input (a script: rule would re-run: its
    # code trigger is the script's mtime).
    future = time.time() + 3600
    for module in ("gpu_jobs.py", "capture/jobs.py", "capture/clocks.py", "capture/workloads.py", "files.py"):
        os.utime(ROOT / "src" / "operator_profiler" / module, (future, future))
    result = snakemake(work, config, "-n", env=custom_env(work))
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-2000:]
    now = time.time()
    for module in ("gpu_jobs.py", "capture/jobs.py", "capture/clocks.py", "capture/workloads.py", "files.py"):
        os.utime(ROOT / "src" / "operator_profiler" / module, (now, now))

    model = work / "wf_models.py"
    model.write_text(CUSTOM_MODEL.replace("range(3)", "range(4)"))
    result = snakemake(work, config, "-n", env=custom_env(work))
    counts = job_counts(result.stdout)
    assert counts.get("capture_timeline") == 1, counts  # only the custom workload
    model.write_text(CUSTOM_MODEL)


@pytest.mark.workflow
def test_cuda_dry_run_lists_gpu_rules(finished_run):
    work, config = finished_run
    result = snakemake(work, config, "-n", "--config", "device=cuda", "timeline=nsys", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout)
    for rule in ("select_clocks", "capture_timeline", "capture_kineto"):
        assert counts.get(rule) == 4, (rule, counts)
    assert "compile_artifacts" not in counts, counts  # the Kineto run beside nsys writes the debug output


# ------------------------------------------------------------------------------ bad input


def test_unknown_config_key_fails_with_one_paragraph(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**TINY, "workloads": {"g": {"kind": "gpt2", "n_layr": 2}}}))
    result = snakemake(tmp_path, config, "-n")
    assert result.returncode != 0
    assert "workloads.g" in result.stderr and "n_layr" in result.stderr
    assert "Traceback" not in result.stderr


def _failing_run(tmp_path, workload: dict, module_source: str | None = None):
    if module_source is not None:
        (tmp_path / "usermodels.py").write_text(textwrap.dedent(module_source))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**TINY, "workloads": {"mine": workload}}))
    result = snakemake(tmp_path, config, env=custom_env(tmp_path))
    assert result.returncode != 0
    log = (tmp_path / "logs" / "capture_timeline" / "mine.log").read_text()
    # No half-written capture is left behind.
    assert not (tmp_path / "results" / "mine" / "capture").exists() or not any(
        (tmp_path / "results" / "mine" / "capture").iterdir()
    )
    return log.strip().splitlines()[-1]


def test_missing_custom_factory_fails_when_the_dag_is_built(tmp_path):
    (tmp_path / "usermodels.py").write_text("x = 1\n\ndef build():\n    pass\n")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**TINY, "workloads": {"mine": {"kind": "custom", "factory": "usermodels:nope"}}}))
    result = snakemake(tmp_path, config, "-n", env=custom_env(tmp_path))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if "workloads.mine.factory" in line]
    assert len(error) == 1 and "factory 'usermodels:nope': module 'usermodels'" in error[0]
    assert "has no 'nope'" in error[0]
    # a module that is not on the path: the error says PYTHONPATH
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # this checkout, without the models' folder
    result = snakemake(tmp_path, config, "-n", env=env)
    assert result.returncode != 0 and "no module 'usermodels' on the Python path" in result.stderr
    assert "PYTHONPATH" in result.stderr and not (tmp_path / "logs").exists()


def test_workload_that_raises_is_a_one_line_failure(tmp_path):
    source = """
        import torch

        class Broken(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("shape mismatch in my model")

        def build():
            return Broken(), (torch.randn(2),)
    """
    last = _failing_run(tmp_path, {"kind": "custom", "factory": "usermodels:build"}, source)
    assert last.startswith("FAILED: workload 'mine' raised RuntimeError") and "shape mismatch" in last
    # the user's file and line (the raise is line 6 of the dedented source), and where the traceback is
    assert f"at {tmp_path / 'usermodels.py'}:6 (in forward)" in last
    assert last.endswith(f"(traceback in {Path('logs') / 'capture_timeline' / 'mine.log'})")
    log = (tmp_path / "logs" / "capture_timeline" / "mine.log").read_text()
    assert f'File "{tmp_path / "usermodels.py"}", line 6, in forward' in log


# ------------------------------------------------------------------------------ failed and interrupted runs
# After a failed or interrupted job the next run redoes the work or fails again, and never
# exits 0 over reports made from what the failure removed. Each test works on a copy of the finished run's
# results (and of Snakemake's records of them), so the analysis half runs on a prepared capture.

BROKEN_MODEL = """
import torch

class Broken(torch.nn.Sequential):
    def forward(self, x):
        raise RuntimeError("shape mismatch in my model")

def build(width):
    return Broken(*[torch.nn.Linear(width, width) for _ in range(3)]), (torch.randn(2, width),)
"""
REPORTS = ("operators.csv", "coverage.json", "report.md", "report.html")


def copy_finished_run(work: Path, dest: Path, workloads: tuple[str, ...]) -> Path:
    """``dest`` holding the finished run's results of ``workloads`` and Snakemake's records of them (files
    copied with their modification times), and a config of those workloads only; returns the config."""
    for name in workloads:
        shutil.copytree(work / "results" / name, dest / "results" / name)
    shutil.copytree(work / "results" / "ceilings", dest / "results" / "ceilings")  # the machine's, of every workload
    shutil.copytree(work / ".snakemake" / "metadata", dest / ".snakemake" / "metadata")
    shutil.copy2(work / "wf_models.py", dest / "wf_models.py")
    config = dest / "config.yaml"
    config.write_text(yaml.safe_dump({**TINY, "workloads": {n: TINY["workloads"][n] for n in workloads}}))
    return config


def _session_processes(session: int):
    """(pid, command line, mapped files) of the live processes of a session (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        try:
            pid = int(entry.name)
            if os.getsid(pid) != session:
                continue
            yield pid, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(), (entry / "maps").read_text()
        except (ValueError, OSError):
            continue


def interrupt_job(workdir: Path, config: Path, rule: str, ctrl_c: bool, *args: str) -> subprocess.CompletedProcess:
    """Run Snakemake and, once the job of ``rule`` is running this project's code (it has loaded pandas, which
    every script job imports after installing its interrupt handling, or torch, which a GPU-rule job imports after
    it and which loads no pandas), send SIGINT: to the whole process group as a terminal's Ctrl-C does
    (``ctrl_c``), else to the job's process only (``kill -INT``)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
           "--configfile", str(config), "--cores", "1", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=custom_env(workdir), start_new_session=True)
    marks = (f"operator_profiler.gpu_jobs {rule} ", f".{rule}.py")
    deadline = time.time() + 300
    job = None
    while job is None and time.time() < deadline and proc.poll() is None:
        job = next((pid for pid, cmd, maps in _session_processes(proc.pid)
                    if cmd.split(" ", 1)[0].endswith(("python", "python3")) and any(m in cmd for m in marks)
                    and ("pandas/_libs" in maps or "libtorch" in maps)), None)
        time.sleep(0.05)
    assert job is not None, f"the {rule} job never ran"
    if ctrl_c:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(job, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.workflow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="finds the job's process in /proc (Linux)")
def test_a_corrupt_capture_and_a_model_that_starts_raising_never_leave_reports_as_current(finished_run, tmp_path):
    work, _ = finished_run
    config = copy_finished_run(work, tmp_path, ("lstm", "mine"))
    (tmp_path / "results" / "lstm" / "capture" / "timeline.kineto.json.gz").write_bytes(b"not a gzip file")
    (tmp_path / "wf_models.py").write_text(BROKEN_MODEL)  # the capture re-runs: the model is an input
    env = custom_env(tmp_path)

    # Without hooks (as a run killed before its end): the failures leave mine's reports behind.
    first = snakemake(tmp_path, config, "--keep-going", "--no-hooks", env=env)
    assert first.returncode != 0
    assert "FAILED: results/lstm/capture/timeline.kineto.json.gz: neither a JSON object with a 'traceEvents' list " \
           "nor a bare event array at byte offset 0 (named .gz, it is not gzip-compressed)" in first.stderr
    # the fix in the workflow's terms, not only the file's (re-exporting a trace by hand is not how a run fixes it)
    assert ("In this workflow: delete results/lstm/capture/timeline.kineto.json.gz (or run snakemake with "
            "--forcerun capture_timeline) to capture it again") in first.stderr
    assert "FAILED: workload 'mine' raised RuntimeError" in first.stderr and "Traceback" not in first.stderr
    # lstm's reports were removed before the run: made from a capture that changed since
    assert re.search(r"stale results: \d+ output\(s\) were made from results/lstm/capture/timeline.kineto.json.gz, "
                     r"changed since: .*results/lstm/report\.md.*; removed them; this run rebuilds them", first.stderr)
    assert not any((tmp_path / "results" / "lstm" / name).exists() for name in REPORTS)
    assert all((tmp_path / "results" / "mine" / name).exists() for name in REPORTS)
    assert not (tmp_path / "results" / "mine" / "capture" / "run.json").exists()

    # The next run (before the fix: "Nothing to be done", exit 0) finds mine's reports made from a capture that
    # is gone, removes them before it starts, and fails again (at the first of the two failing jobs).
    again = snakemake(tmp_path, config, env=env)
    out = again.stdout + again.stderr
    assert again.returncode != 0 and "Nothing to be done" not in out
    assert re.search(r"stale results: \d+ output\(s\) were made from results/mine/capture/clocks_applied.json, "
                     r"results/mine/capture/layers.json, results/mine/capture/run.json, "
                     r"results/mine/capture/shapes.kineto.json.gz, "
                     r"results/mine/capture/timeline.kineto.json.gz, now missing .*results/mine/report\.md.*; "
                     r"removed them; this run rebuilds them", again.stderr)
    failed = [line for line in again.stderr.splitlines() if line.startswith("FAILED: ")]
    assert len(failed) == 1 and failed[0].startswith(("FAILED: results/lstm/capture/timeline.kineto.json.gz",
                                                      "FAILED: workload 'mine' raised RuntimeError")), failed
    assert "Traceback" not in out
    for name in ("lstm", "mine"):
        assert not any((tmp_path / "results" / name / report).exists() for report in REPORTS)


@pytest.mark.workflow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="finds the job's process in /proc (Linux)")
def test_ctrl_c_in_a_capture_or_a_script_job_is_one_line_and_the_next_run_redoes_the_work(finished_run, tmp_path):
    work, _ = finished_run
    line = "interrupted: {}; re-run snakemake to redo it"

    # kill -INT to the capture job (a GPU-rule entry, operator_profiler.gpu_jobs under shell:)
    capture_dir = tmp_path / "capture"
    config = copy_finished_run(work, capture_dir, ("lstm",))
    result = interrupt_job(capture_dir, config, "capture_timeline", False, "--forcerun", "capture_timeline")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert [l for l in out.splitlines() if l.startswith("interrupted:")] == [line.format("capture_timeline lstm")]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    capture = capture_dir / "results" / "lstm" / "capture"
    assert not capture.exists() or list(capture.iterdir()) == []  # no partial capture
    log = (capture_dir / "logs" / "capture_timeline" / "lstm.log").read_text().strip().splitlines()
    assert log[-1] == line.format("capture_timeline lstm")
    # Snakemake's onerror removed what was made from the capture; the next run plans the whole chain again.
    assert "the next run rebuilds them" in result.stderr
    assert not any((capture_dir / "results" / "lstm" / name).exists() for name in REPORTS)
    plan = snakemake(capture_dir, config, "-n", env=custom_env(capture_dir))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert job_counts(plan.stdout) == {"capture_timeline": 1, "export_timeline": 1, "classify_layers": 1,
                                       "attribute": 1, "compute_work": 1, "aggregate": 1, "export_trace": 1,
                                       "advise": 1, "report": 1, "report_html": 1, "all": 1}

    # Ctrl-C (SIGINT to Snakemake and its job) in aggregate (a script: rule)
    aggregate_dir = tmp_path / "aggregate"
    config = copy_finished_run(work, aggregate_dir, ("lstm",))
    result = interrupt_job(aggregate_dir, config, "aggregate", True, "--forcerun", "aggregate")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert [l for l in out.splitlines() if l.startswith("interrupted:")] == [line.format("aggregate lstm")]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    results = aggregate_dir / "results" / "lstm"
    assert not any((results / name).exists() for name in REPORTS)  # aggregate's outputs and the reports
    # An output that a killed job (or a killed Snakemake) left marked incomplete: Snakemake's own marker
    # (.snakemake/incomplete/<urlsafe base64 of the path>); the workflow profile's rerun-incomplete redoes it.
    incomplete = aggregate_dir / ".snakemake" / "incomplete"
    incomplete.mkdir(parents=True, exist_ok=True)
    (incomplete / base64.urlsafe_b64encode(b"results/lstm/trace.json").decode()).write_text('{"external_jobid": null}')
    again = snakemake(aggregate_dir, config, env=custom_env(aggregate_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    assert job_counts(again.stdout + again.stderr) == {"aggregate": 1, "advise": 1, "report": 1, "report_html": 1,
                                                       "export_trace": 1, "all": 1}
    # The reports are newer than every table they were made from.
    made_from = [results / p for p in ("attribution/kernels.parquet", "layers/instances.parquet", "operators.parquet",
                                       "modules.parquet", "layer_classes.parquet", "coverage.json")]
    for report in ("report.md", "report.html"):
        assert (results / report).stat().st_mtime >= max(p.stat().st_mtime for p in made_from)


@pytest.mark.workflow
def test_a_module_the_factory_imports_reruns_its_capture_and_an_unrelated_one_does_not(tmp_path):
    """A model class that the factory imports from a sibling file is the user's code too: an
    edit of it re-runs the custom workload's capture. A module added beside the factory that nothing imports
    (another experiment in the same folder) re-runs nothing: the capture's inputs are the factory module's
    import closure (operator_profiler.workflow_inputs.module_sources), not the folder."""
    layers = "import torch\n\n\ndef stack(width, depth):\n" \
             "    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])\n"
    (tmp_path / "wf_layers.py").write_text(layers)
    (tmp_path / "wf_models.py").write_text(
        "import torch\nfrom wf_layers import stack\n\n\ndef build(width):\n"
        "    return stack(width, 2), (torch.randn(2, width),)\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**TINY, "workloads": {"mine": TINY["workloads"]["mine"]}}))
    target = "results/mine/capture/run.json"
    done = snakemake(tmp_path, config, target, env=custom_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    plan = snakemake(tmp_path, config, "-n", target, env=custom_env(tmp_path))
    assert plan.returncode == 0 and "capture_timeline" not in job_counts(plan.stdout), plan.stdout[-3000:]
    (tmp_path / "wf_unrelated.py").write_text("import torch\n\n\nclass Other(torch.nn.Linear):\n    pass\n")
    plan = snakemake(tmp_path, config, "-n", target, env=custom_env(tmp_path))
    assert plan.returncode == 0 and "capture_timeline" not in job_counts(plan.stdout), plan.stdout[-3000:]
    (tmp_path / "wf_layers.py").write_text(layers.replace("Linear(width, width)", "Linear(width, width, bias=False)"))
    plan = snakemake(tmp_path, config, "-n", target, env=custom_env(tmp_path))
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert job_counts(plan.stdout).get("capture_timeline") == 1, plan.stdout[-3000:]


@pytest.mark.workflow
def test_stale_results_are_left_alone_while_another_snakemake_holds_the_folder(finished_run, tmp_path):
    """A second Snakemake started while one runs (or after a killed one left its lock) must not pull files from
    under the first: the stale results are named, not removed, and Snakemake's own lock check then refuses."""
    work, _ = finished_run
    config = copy_finished_run(work, tmp_path, ("lstm",))
    (tmp_path / "results" / "lstm" / "timeline" / "kernels.parquet").unlink()
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.output.lock").write_text("results/lstm/report.md\n")  # Snakemake's file lock: one path per line
    result = snakemake(tmp_path, config, env=custom_env(tmp_path))
    assert result.returncode != 0
    assert "not removed: another Snakemake holds this folder" in result.stderr, result.stderr[-2000:]
    assert all((tmp_path / "results" / "lstm" / name).exists() for name in REPORTS)


@pytest.mark.workflow
def test_a_capture_of_another_workload_copied_in_is_refused(finished_run, tmp_path):
    """QA: sdpa_attention's capture copied into results/lstm/capture/ (as captures are copied back from a GPU
    node) gave exit 0 and a report titled lstm, eager, listing sdpa's operators. The capture's run.json records
    the workload it captured; the attribute stage now refuses a capture of another workload than the config's."""
    work, _ = finished_run
    config = copy_finished_run(work, tmp_path, ("lstm", "sdpa_attention"))
    lstm, sdpa = tmp_path / "results" / "lstm" / "capture", tmp_path / "results" / "sdpa_attention" / "capture"
    for name in ("timeline.kineto.json.gz", "run.json", "layers.json"):
        shutil.copy(sdpa / name, lstm / name)  # as cp does: a new modification time
    result = snakemake(tmp_path, config, env=custom_env(tmp_path))
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in out
    failed = [line for line in result.stderr.splitlines() if line.startswith("FAILED: ")]
    assert len(failed) == 1 and failed[0].startswith(
        "FAILED: results/lstm/capture/run.json is a capture of another workload than the config's"), failed
    assert "kind" in failed[0] and "'sdpa_attention'" in failed[0] and "'lstm'" in failed[0]
    assert not (tmp_path / "results" / "lstm" / "report.md").exists()
