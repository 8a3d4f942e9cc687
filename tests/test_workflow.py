"""The real workflow on a tiny config in a temporary directory (CPU, real torch.profiler captures).

One module-scoped run serves several tests; each checks tables against values recomputed from the
other artifacts of the same run (the trace, layers.json), not against hard-coded numbers.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from operator_profiler import tables
from operator_profiler.timeline.kineto import load_trace

ROOT = Path(__file__).resolve().parents[1]
N_LAYER = 3
ITERATIONS = 2

TINY = {
    "device": "cpu",
    "harness": {"seed": 0, "warmup": 1, "iterations": ITERATIONS},
    "workloads": {
        # gpt2 compiled per layer (layer ranges), sdpa_attention whole (layer membership from the FX nodes)
        "gpt2": {"kind": "gpt2", "compile": True, "compile_scope": "layers", "n_layer": N_LAYER, "n_embd": 32,
                 "n_head": 2, "vocab_size": 64, "n_positions": 32, "batch_size": 1, "seq_len": 16},
        "sdpa_attention": {"kind": "sdpa_attention", "compile": True, "d_model": 32, "n_head": 2,
                           "n_block": 2, "batch_size": 1, "seq_len": 16},
        "lstm": {"kind": "lstm", "input_size": 8, "hidden_size": 16, "num_layers": 2, "batch_size": 2,
                 "seq_len": 8},
        "mine": {"kind": "custom", "factory": "wf_models:build", "kwargs": {"width": 8}},
    },
}

CUSTOM_MODEL = """
import torch

def build(width):
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(3)])
    return model, (torch.randn(2, width),)
"""


def custom_env(workdir: Path) -> dict:
    """This checkout's src/ first (not another checkout's editable install), then ``workdir`` (custom models)."""
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(workdir)])
    return env


def snakemake(workdir: Path, config: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
           "--configfile", str(config), "--cores", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env or os.environ.copy(), timeout=900)


def job_counts(dry_run_output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    counts = {}
    block = dry_run_output.split("Job stats:", 1)[1] if "Job stats:" in dry_run_output else ""
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    counts.pop("total", None)
    return counts


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    (work / "wf_models.py").write_text(CUSTOM_MODEL)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(TINY))
    result = snakemake(work, config, env=custom_env(work))
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
    """Issue 14 item 2 in the workflow: sdpa_attention (compile_scope model by default) has no layer ranges, every
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
    from html_report import column, figure_ids, tables

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


@pytest.mark.workflow
def test_second_run_does_nothing(finished_run):
    work, config = finished_run
    result = snakemake(work, config, env=custom_env(work))
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.workflow
def test_aggregation_option_edit_reruns_only_aggregate_and_reports(finished_run, tmp_path):
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**TINY, "aggregate": {"per_iteration": False}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout)
    assert counts.pop("all") == 1
    assert counts == {"aggregate": 4, "report": 4, "report_html": 4}


@pytest.mark.workflow
def test_report_option_edit_reruns_only_the_reports(finished_run, tmp_path):
    """Issue #7 item 5(a), report side (the aggregation side is the test above)."""
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**TINY, "report": {"top_operators": 3}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    assert job_counts(result.stdout) == {"all": 1, "report": 4, "report_html": 4}


@pytest.mark.workflow
def test_new_workload_runs_only_its_own_jobs(finished_run, tmp_path):
    """Issue #7 item 5(c): one more (uncompiled) workload plans its own 9 jobs (with export_trace, report_html) and nothing of the others."""
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    extra = {"kind": "lstm", "input_size": 4, "hidden_size": 8, "num_layers": 1, "batch_size": 1, "seq_len": 4}
    edited.write_text(yaml.safe_dump({**TINY, "workloads": {**TINY["workloads"], "lstm_small": extra}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    assert job_counts(result.stdout) == {"all": 1, "select_clocks": 1, "capture_timeline": 1, "export_timeline": 1,
                                         "classify_layers": 1, "attribute": 1, "aggregate": 1, "report": 1,
                                         "report_html": 1, "export_trace": 1}
    jobs = re.findall(r"wildcards: workload=(\w+)", result.stdout)
    assert set(jobs) == {"lstm_small"}, jobs


@pytest.mark.workflow
def test_long_cpu_stages_log_their_progress(finished_run):
    """Issue #7 item 6: export_timeline, classify_layers and attribute log counts and elapsed seconds."""
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
def test_iteration_count_edit_recaptures_but_does_not_recompile(finished_run, tmp_path):
    work, _ = finished_run
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**TINY, "harness": {**TINY["harness"], "iterations": ITERATIONS + 1}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout)
    assert counts["capture_timeline"] == 4
    assert "compile_artifacts" not in counts and "build_fusion_map" not in counts and "select_clocks" not in counts


@pytest.mark.workflow
def test_touching_library_code_reruns_nothing_and_editing_a_custom_model_recaptures_it(finished_run, tmp_path):
    work, config = finished_run
    for module in ("harness.py", "stages.py", "attribution/merge.py"):
        (ROOT / "src" / "operator_profiler" / module).touch()
    result = snakemake(work, config, "-n", env=custom_env(work))
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-2000:]
    # Issue #7 item 5(d): a git checkout that leaves the GPU rules' code as it was but gives it a new
    # mtime (here: in the future, newer than every output) re-runs no capture. The GPU rules are shell:
    # rules running operator_profiler.gpu_jobs, a checksummed input (a script: rule would re-run: its
    # code trigger is the script's mtime).
    future = time.time() + 3600
    for module in ("gpu_jobs.py", "capture.py", "clocks.py", "workloads.py", "files.py"):
        os.utime(ROOT / "src" / "operator_profiler" / module, (future, future))
    result = snakemake(work, config, "-n", env=custom_env(work))
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-2000:]
    now = time.time()
    for module in ("gpu_jobs.py", "capture.py", "clocks.py", "workloads.py", "files.py"):
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
    for rule in ("select_clocks", "capture_timeline", "capture_kineto", "compile_artifacts"):
        assert counts.get(rule) == (2 if rule == "compile_artifacts" else 4), (rule, counts)


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


def test_missing_custom_factory_is_a_one_line_failure(tmp_path):
    last = _failing_run(tmp_path, {"kind": "custom", "factory": "usermodels:nope"}, "x = 1\n")
    assert last.startswith("FAILED: custom factory 'usermodels:nope'") and "no callable 'nope'" in last


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
