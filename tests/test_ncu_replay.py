"""The ncu replay per layer class (:mod:`operator_profiler.ncu.replay`, rule ``replay_ncu``), on a machine
without a GPU or Nsight Compute.

Test doubles and synthetic data (nothing here is a real GPU run):

* ``ncu`` is a FAKE Python script put first on PATH. It appends its argv (one JSON list a line) to a log.
  A collection call (``--launch-skip N --launch-count M ... --export REPORT program...``) does not run the
  program: it takes launches N..N+M-1 of a launch sequence the test wrote (kernel names in the order the
  re-run would launch them after ``cudaProfilerStart``) and writes them into REPORT (JSON, not a real
  ``.ncu-rep``). An import call (``-i REPORT --csv --page raw ...``) prints a raw-page CSV (header, units row,
  one row per result) whose metric names, units and values are those of the first results of the REAL
  recorded CSV ``../shared/data/real/ncu/a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv``
  (read at test time, never copied into the repository), under the kernel names of the sequence.
  ``FAKE_NCU_FAIL=perm`` makes a collection fail as ncu does without counter permission (ERR_NVGPUCTRPERM).
  The raw-page layout is the documented one (docs/formats.md#ncu-pages, itself UNVERIFIED against a real raw page).
* ``nvidia-smi`` is the FAKE of tests/fake_tools.py, as is the ``ncu`` above (clock locking; no ``compute_cap``
  answer, so the replay asks for every architecture's metric names).
* The GPT-2-like timeline is synthetic: 3 embedding kernels, 12 identical blocks of 6 kernels, 2 head kernels
  per iteration, two iterations. The expected launch windows are written out by hand below.
* The workflow tests reuse tests/nsys_workflow.py (placed GPU captures, fake ``nsys``) and add the fake
  ``ncu`` and ``nvidia-smi``: they prove that a finished run re-runs no replay, and that a class that appears
  later runs exactly one.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
from pathlib import Path

import nsys_workflow as wf
import pandas as pd
import pytest
from fake_tools import FakeNcu, FakeSmi
from workflow_runs import dry_run_jobs, job_counts

from operator_profiler import stages
from operator_profiler.ncu import plan as replay_plan
from operator_profiler.ncu import replay
from operator_profiler.ncu.catalog import load_catalog

# ------------------------------------------------------------------------------ a GPT-2-like timeline

PID = 321
BLOCK_CLASS = "GPT2Block-0123abcd"
HEAD = [("embedding_kernel", "(8,1,1)"), ("embedding_kernel", "(8,1,1)"), ("add_kernel", "(16,1,1)")]
BLOCK = [("layer_norm_kernel", "(4,1,1)"), ("ampere_sgemm_128x64_tn", "(24,4,1)"), ("fmha_kernel", "(12,1,1)"),
         ("ampere_sgemm_128x64_tn", "(8,4,1)"), ("layer_norm_kernel", "(4,1,1)"), ("gelu_kernel", "(32,1,1)")]
TAIL = [("layer_norm_kernel", "(4,1,1)"), ("ampere_sgemm_128x64_nn", "(393,1,1)")]
N_LAYERS = 12


def gpt2_timeline(iterations: int = 2) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, dict]]:
    """kernels, kernel_layers and class JSONs of a 12-block GPT-2-like forward (CUDA, one process)."""
    kernels, layers = [], []
    for it in range(iterations):
        parts = [(None, HEAD)] + [(f"transformer.h.{j}", BLOCK) for j in range(N_LAYERS)] + [(None, TAIL)]
        rest_pos = 0
        for layer, seq in parts:
            for pos, (name, grid) in enumerate(seq):
                kid = len(kernels)
                kernels.append({"kernel_id": kid, "pid": PID, "iteration": it, "name": name, "match_key": name,
                                "grid": grid.strip("()"), "block": "128,1,1", "activity": "kernel"})
                layers.append({"kernel_id": kid, "layer": layer, "module": layer,
                               "layer_class": BLOCK_CLASS if layer else "rest",
                               "position": pos if layer else rest_pos})
                rest_pos += 0 if layer else 1
    instances = [f"transformer.h.{j}" for j in range(N_LAYERS)]
    classes = {
        BLOCK_CLASS: {"class": BLOCK_CLASS, "instances": instances, "replay_instances": instances[:1],
                      "representative": instances[0], "kernel_count": len(BLOCK)},
        "rest": {"class": "rest", "instances": ["rest"], "replay_instances": ["rest"], "representative": "rest",
                 "kernel_count": len(HEAD) + len(TAIL)},
    }
    return pd.DataFrame(kernels), pd.DataFrame(layers), classes


def launch_sequence(kernels: pd.DataFrame) -> list[list[str]]:
    """What the re-run launches after cudaProfilerStart: the timeline's kernels in launch order, as
    [name, grid, block] in ncu's "(x, y, z)" spelling."""
    def dims(s):
        return "(" + ", ".join(str(s).split(",")) + ")"
    ordered = kernels.sort_values("kernel_id")
    return [[n, dims(g), dims(b)] for n, g, b in zip(ordered["name"], ordered["grid"], ordered["block"])]


# ------------------------------------------------------------------------------ plan


def test_plan_gpt2_launch_windows_per_class():
    kernels, kl, classes = gpt2_timeline()
    block = replay_plan.plan_replay(kernels, kl, classes[BLOCK_CLASS])
    # Launch order after cudaProfilerStart: 3 embedding kernels, then h.0's 6 kernels.
    assert block["segments"] == [{"launch_skip": 3, "launch_count": 6, "first_kernel_id": 3, "last_kernel_id": 8}]
    assert block["window"] == {"kernel_ids": [3, 4, 5, 6, 7, 8], "pid": PID}
    assert block["kernel_count"] == 6 and block["iteration"] == 0 and block["pid"] == PID
    assert block["instances"] == [f"transformer.h.{j}" for j in range(12)]
    # rest: the 3 head kernels (launches 0-2) and the 2 tail kernels after 12 x 6 block kernels (75, 76):
    # two segments, two ncu runs; the second iteration is never replayed.
    rest = replay_plan.plan_replay(kernels, kl, classes["rest"])
    assert [(s["launch_skip"], s["launch_count"]) for s in rest["segments"]] == [(0, 3), (3 + 12 * 6, 2)]
    assert rest["window"] == {"kernel_ids": [0, 1, 2, 75, 76], "pid": PID}
    # dedup.verify: two replay instances, adjacent blocks -> one window of 12 launches.
    verify = replay_plan.plan_replay(kernels, kl, dict(classes[BLOCK_CLASS],
                                                  replay_instances=["transformer.h.0", "transformer.h.1"]))
    assert [(s["launch_skip"], s["launch_count"]) for s in verify["segments"]] == [(3, 12)]
    assert block["warnings"] == rest["warnings"] == []


def test_plan_counts_launches_of_the_process_only_and_flags_nccl():
    kernels, kl, classes = gpt2_timeline(iterations=1)
    # A kernel of another process launched first does not shift this process's launch positions.
    other = pd.DataFrame([{"kernel_id": -1, "pid": 999, "iteration": 0, "name": "x", "match_key": "x",
                           "grid": "1,1,1", "block": "1,1,1", "activity": "kernel"}])
    kernels = pd.concat([other, kernels], ignore_index=True)
    kl = pd.concat([pd.DataFrame([{"kernel_id": -1, "layer": None, "module": None, "layer_class": "rest",
                                   "position": 0}]), kl], ignore_index=True)
    kernels.loc[kernels["kernel_id"] == 5, "name"] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    plan = replay_plan.plan_replay(kernels[kernels["pid"] == PID], kl[kl["kernel_id"] >= 0], classes[BLOCK_CLASS])
    assert plan["segments"][0]["launch_skip"] == 3
    assert any("communication" in w and "C16" in w for w in plan["warnings"])
    with pytest.raises(replay.NcuReplayError, match="2 processes"):
        replay_plan.plan_replay(kernels, kl, classes["rest"])


# ------------------------------------------------------------------------------ command


def test_replay_command_exact_argv_with_spaces():
    kernels, kl, classes = gpt2_timeline()
    plan = replay_plan.plan_replay(kernels, kl, classes[BLOCK_CLASS])
    catalog = load_catalog()
    report = Path("/data/my results/gpt 2/ncu") / f"{BLOCK_CLASS}.ncu-rep"
    # the capture's harness config, determinism included (the re-run must run the capture's kernels)
    target = replay.target_argv({"kind": "gpt2"}, {"seed": 0, "warmup": 2, "iterations": 5, "deterministic": True},
                                Path("/data/my results/gpt 2/ncu/run dir"), "gpt 2", iterations=1)
    assert target == [sys.executable, "-m", "operator_profiler.cli", "run-harness",
                      "--workload-json", '{"kind": "gpt2"}',
                      "--harness-json", '{"deterministic": true, "iterations": 1, "seed": 0, "warmup": 2}',
                      "--device", "cuda", "--profiler", "cuda_profiler_api",
                      "--out-run", "/data/my results/gpt 2/ncu/run dir/run.json", "--workload-name", "gpt 2",
                      "--out-layers", "/data/my results/gpt 2/ncu/run dir/layers.json"]
    metrics = catalog.replay_metrics("hopper")
    cmd = replay.replay_command(plan, metrics, report, {"locked": True}, target)
    assert cmd == ["ncu", "--profile-from-start", "off", "--nvtx", "--nvtx-include", "opprof@opprof.measured",
                   "--launch-skip", "3", "--launch-count", "6",
                   "--metrics", catalog.metrics_argument("hopper"), "--replay-mode", "kernel",
                   "--cache-control", "all", "--clock-control", "none", "--print-kernel-base", "mangled",
                   "--export", "/data/my results/gpt 2/ncu/GPT2Block-0123abcd.ncu-rep", "--force-overwrite",
                   *target]
    # Clocks not locked by us: ncu's own --clock-control default applies, except on MIG (ncu cannot lock there).
    assert "--clock-control" not in replay.replay_command(plan, metrics, report, {"locked": False}, target)
    mig = replay.replay_command(plan, metrics, report, {"locked": False}, target, mig=True)
    assert mig[mig.index("--clock-control") + 1] == "none"
    # The fallback window (config ncu.window: profiler_api) and warm caches (ncu.cache_control: none).
    fallback = replay.replay_command(plan, metrics, report, {"locked": True}, target,
                                     options={"window": "profiler_api", "cache_control": "none"})
    assert "--nvtx" not in fallback and "--nvtx-include" not in fallback
    assert fallback[:3] == ["ncu", "--profile-from-start", "off"]
    assert fallback[fallback.index("--cache-control") + 1] == "none"
    # The shell form in replay.json round-trips to the same argv (paths with spaces stay one argument).
    assert shlex.split(shlex.join(cmd)) == cmd


# ------------------------------------------------------------------------------ run


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    kernels, kl, classes = gpt2_timeline()
    fake = FakeNcu(tmp_path, launch_sequence(kernels))
    for k, v in fake.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    return fake, kernels, kl, classes


def test_run_replay_writes_csv_and_record_and_the_csv_matches_the_plan(fake_ncu, tmp_path):
    fake, kernels, kl, classes = fake_ncu
    out = tmp_path / "results dir" / "gpt 2" / "ncu"
    target = ["python", "-c", "print('the harness')", "an arg with spaces"]
    catalog = load_catalog()
    records = {}
    for cls in (BLOCK_CLASS, "rest"):
        plan = replay_plan.plan_replay(kernels, kl, classes[cls])
        records[cls] = replay.run_replay(plan, catalog.replay_metrics(), out / f"{cls}.csv", out / f"{cls}.replay.json",
                                         {"locked": False}, target)
    collections = fake.collections()
    # One ncu run for the block class, two for rest (head and tail segments); the exact argv is replay_command's.
    assert [(c[c.index("--launch-skip") + 1], c[c.index("--launch-count") + 1]) for c in collections] == [
        ("3", "6"), ("0", "3"), ("75", "2")]
    assert collections[0][-4:] == target
    assert collections[0][collections[0].index("--export") + 1] == str(out / f"{BLOCK_CLASS}.ncu-rep")
    assert [c[c.index("--export") + 1] for c in collections[1:]] == [str(out / "rest.part0.ncu-rep"),
                                                                    str(out / "rest.part1.ncu-rep")]
    imports = [c for c in fake.calls() if "-i" in c]
    assert imports[0] == ["-i", str(out / f"{BLOCK_CLASS}.ncu-rep"), "--csv", "--page", "raw", "--print-units",
                          "base", "--print-kernel-base", "mangled", "--rename-kernels", "off"]

    record = json.loads((out / "rest.replay.json").read_text())
    assert record["class"] == "rest" and record["kernels_planned"] == 5 and len(record["segments"]) == 2
    assert record["segments"][0]["command"] == ["ncu", *collections[1]]  # the fake logs argv[1:]
    assert shlex.split(record["segments"][0]["command_text"]) == record["segments"][0]["command"]
    assert record["wall_s"] == pytest.approx(sum(s["wall_s"] for s in record["segments"]), abs=2e-3)
    assert record["window"] == {"kernel_ids": [0, 1, 2, 75, 76], "pid": PID}
    assert record["ncu_version"] == "2025.1.1.0"  # the fake's `ncu --version` last line
    block = records[BLOCK_CLASS]
    assert block["estimate_all_instances_s"] == pytest.approx(12 * block["wall_s"], abs=0.01)
    assert not list(out.glob("*.raw.csv"))  # the per-segment exports were merged and removed

    # The merged CSV reads as one run in launch order; matched with the replay windows, every planned
    # kernel gets its row, and nothing is left over.
    for cls in records:
        table = stages.parse_ncu_files([out / f"{cls}.csv"], out / f"{cls}.parquet")
        assert table["ncu_id"].tolist() == list(range(records[cls]["kernels_planned"]))
        assert table["pid"].nunique() == 1
        assert "dram__bytes.sum" in table.columns and table["dram__bytes.sum"].notna().all()
    timeline = tmp_path / "timeline"
    timeline.mkdir()
    kernels.assign(occurrence=kernels.groupby("match_key").cumcount()).to_parquet(timeline / "kernels.parquet")
    window = stages.replay_window([out / f"{cls}.replay.json" for cls in records])
    matched, diag = stages.match_files(timeline, [out / f"{cls}.parquet" for cls in records],
                                       tmp_path / "m" / "kernel_metrics.parquet", tmp_path / "m" / "diag.json", window)
    assert sorted(matched["kernel_id"]) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 75, 76]
    assert diag["ncu_only"] == 0 and diag["timeline_only"] == 0 and diag["name_disagreements"] == []


def test_ncu_without_counter_permission_is_one_line_with_the_fix(fake_ncu, tmp_path, monkeypatch):
    fake, kernels, kl, classes = fake_ncu
    monkeypatch.setenv("FAKE_NCU_FAIL", "perm")
    plan = replay_plan.plan_replay(kernels, kl, classes[BLOCK_CLASS])
    with pytest.raises(replay.NcuReplayError) as e:
        replay.run_replay(plan, load_catalog().replay_metrics(), tmp_path / "ncu" / "c.csv", tmp_path / "ncu" / "c.replay.json",
                          {"locked": False}, ["python", "x.py"])
    msg = str(e.value)
    assert "\n" not in msg and "ERR_NVGPUCTRPERM" in msg and BLOCK_CLASS in msg
    assert "--cap-add=SYS_ADMIN" in msg and "NVreg_RestrictProfilingToAdminUsers=0" in msg  # the option name of https://developer.nvidia.com/ERR_NVGPUCTRPERM
    assert not (tmp_path / "ncu" / "c.replay.json").exists()


def test_ncu_missing_and_nothing_profiled(fake_ncu, tmp_path, monkeypatch):
    fake, kernels, kl, classes = fake_ncu
    plan = replay_plan.plan_replay(kernels, kl, classes[BLOCK_CLASS])
    fake.set_sequence([])  # the re-run launches fewer kernels than planned
    with pytest.raises(replay.NcuReplayError, match="profiled no kernels"):
        replay.run_replay(plan, load_catalog().replay_metrics(), tmp_path / "c.csv", tmp_path / "c.json", {"locked": False}, ["p"])
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(replay.NcuReplayError, match="not on PATH"):
        replay.run_replay(plan, load_catalog().replay_metrics(), tmp_path / "c.csv", tmp_path / "c.json", {"locked": False}, ["p"])


def test_replay_estimate_and_report_lines():
    from operator_profiler.report.markdown import _replay_lines

    records = [{"class": BLOCK_CLASS, "instances": [f"h.{j}" for j in range(12)], "replay_instances": ["h.0"],
                "kernels_planned": 6, "segments": [{}], "wall_s": 10.0},
               {"class": "rest", "instances": ["rest"], "replay_instances": ["rest"], "kernels_planned": 5,
                "segments": [{}, {}], "wall_s": 4.0}]
    est = replay_plan.replay_estimate(records)
    assert est["wall_s"] == 14.0 and est["estimate_all_s"] == 12 * 10.0 + 4.0
    text = "\n".join(_replay_lines(records))
    assert f"| {BLOCK_CLASS} | 12 | 1 | 6 | 1 | 10.0 | 120.0 |" in text
    assert "| rest | 1 | 1 | 5 | 2 | 4.0 | 4.0 |" in text
    assert "took 14.0 s" in text and "about 124.0 s (8.9x)" in text


# ------------------------------------------------------------------------------ workflow


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    pytest.importorskip("snakemake")
    base = tmp_path_factory.mktemp("wf replay")
    setup = wf.make_setup(base)
    smi = FakeSmi(base / "smi")
    run_json = setup["work"] / "results" / wf.W / "capture" / "run.json"  # as a CUDA capture writes it
    run = json.loads(run_json.read_text())
    run["versions"] = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.13", "cuda_runtime": "13.0",
                       "driver": "580.00"}
    run_json.write_text(json.dumps(run, indent=1))
    nvtx, runtime, kernels, expected = wf.synthetic_capture()
    ncu = FakeNcu(base, [[e["name"], "(1, 1, 1)", "(128, 1, 1)"] for e in expected])
    env = setup["env"]
    env.update({k: v for k, v in smi.env().items() if k != "PATH"}, **ncu.env())
    env["PATH"] = f"{ncu.bin}{os.pathsep}{smi.bin}{os.pathsep}{env['PATH']}"
    target = (f"results/{wf.W}/report.md",)
    result = wf.snakemake(setup, *target, *wf.CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-4000:]
    return setup, ncu, smi, base, target


@pytest.mark.workflow
def test_workflow_replays_each_class_once_and_reports_it(replay_run):
    setup, ncu, smi, _, target = replay_run
    out = setup["work"] / "results" / wf.W
    (cls,) = [p.stem for p in (out / "layers" / "classes").glob("*.json")]
    (call,) = ncu.collections()
    # blocks.0 is launches 0-1 after cudaProfilerStart; the clocks were locked by us (fake nvidia-smi).
    assert call[:9] == ["--profile-from-start", "off", "--nvtx", "--nvtx-include", "opprof@opprof.measured",
                        "--launch-skip", "0", "--launch-count", "2"]  # argv[1:]
    # The chip's metrics were asked of ncu once (the real gh100 answer), cached, and only its names requested.
    (query,) = ncu.queries()
    assert query[:2] == ["--query-metrics-mode", "suffix"] and query[-2:] == ["--devices", "0"]
    collected = call[call.index("--metrics") + 1].split(",")
    from operator_profiler.ncu.catalog import load_catalog

    assert collected == load_catalog().replay_metrics("hopper")  # the fake nvidia-smi's compute_cap: 9.0
    cached = json.loads((setup["work"] / "results" / "ncu_metrics" / "gh100.ncu-2025.1.1.0.json").read_text())
    assert cached["chip"] == "gh100" and "dram__bytes.sum" in cached["names"]
    assert call[call.index("--clock-control") + 1] == "none"
    assert call[call.index("--export") + 1] == f"results/{wf.W}/ncu/{cls}.ncu-rep"
    program = call[call.index("--force-overwrite") + 1:]
    assert program[1:4] == ["-m", "operator_profiler.cli", "run-harness"]
    assert program[program.index("--profiler") + 1] == "cuda_profiler_api"
    assert json.loads(program[program.index("--harness-json") + 1])["iterations"] == 1
    assert ["-i", "0", "-lgc", "1755,1755"] in smi.calls() and ["-i", "0", "-rgc"] in smi.calls()
    record = json.loads((out / "ncu" / f"{cls}.replay.json").read_text())
    timeline_pids = set(pd.read_parquet(out / "timeline" / "kernels.parquet")["pid"])
    assert record["window"]["kernel_ids"] == [0, 1] and {record["window"]["pid"]} == timeline_pids
    # replay.json holds the lock's verdict (read-backs during the replay), as the class's clocks_applied.json
    applied = json.loads((out / "ncu" / f"{cls}.clocks_applied.json").read_text())
    assert record["clocks"] == applied and applied["locked"] is True and applied["lock_set"] is True
    diag = json.loads((out / "matched" / "diagnostics.json").read_text())
    assert diag["matched"] == 2 and diag["name_disagreements"] == [] and diag["ncu_only"] == 0
    assert diag["broadcast"][cls]["filled"] == 2 * wf.ITERATIONS * len(wf.LAYERS) - 2
    report = (out / "report.md").read_text()
    assert "ncu replay time" in report and f"| {cls} | 2 | 1 | 2 | 1 |" in report
    # the counters' DRAM bytes are cold-cache values (ncu --cache-control all): said beside them
    assert "**cold-cache** values" in report and "--cache-control all" in report
    assert record["cache_control"] == "all" and record["ncu_window"] == "nvtx"
    assert record["metrics"]["dropped"] == [] and record["metrics"]["query"]["chip"] == "gh100"
    assert "not collected** (missing counters" not in report  # every hopper name exists on gh100

    # A finished run: nothing to do, no replay.
    dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]


@pytest.mark.workflow
def test_workflow_report_html_shows_counters_sol_points_and_the_replay(replay_run):
    """report.html of the CUDA run (fake ncu with the real CSV's metric values): one SOL point per operator
    with both SOL figures in operators.parquet, the counters' share, and the measured replay per class."""
    from html_report import column, figure, tables

    setup, _, _, _, _ = replay_run
    result = wf.snakemake(setup, f"results/{wf.W}/report.html", *wf.CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-4000:]
    out = setup["work"] / "results" / wf.W
    text = (out / "report.html").read_text()
    operators = pd.read_parquet(out / "operators.parquet")
    with_sol = operators.dropna(subset=["sm_sol", "memory_sol"])
    assert len(with_sol) > 0
    traces = [t for t in figure(text, "fig-sol") if t["type"] == "scatter"]
    assert sorted((x, y) for t in traces for x, y in zip(t["x"], t["y"])) == sorted(
        zip(with_sol["memory_sol"], with_sol["sm_sol"]))
    table = tables(text)["operator-table"]
    assert [int(v) for v in column(table, "time (ms)")] == list(operators["time_ns"])
    assert [float(v) for v in column(table, "SM SOL %")] == pytest.approx(list(operators["sm_sol"]))
    for header, name in (("median / iteration (ms)", "iteration_median_ns"), ("min – max / iteration (ms)", "iteration_max_ns")):
        assert [float(v) for v in column(table, header)] == pytest.approx(list(operators[name] / 1e6))
    coverage = json.loads((out / "coverage.json").read_text())
    median = statistics.median(coverage["iteration_time_ns"].values())
    assert f'kernel time / iteration (median)</div><div class="v">{median / 1e6:.3f} ms' in text
    assert f"hardware counters (ncu) for {coverage['counters_coverage'] * 100:.1f}% of kernels" in text
    assert "NVIDIA H100 80GB HBM3" in text
    (cls,) = [p.stem for p in (out / "layers" / "classes").glob("*.json")]
    record = json.loads((out / "ncu" / f"{cls}.replay.json").read_text())
    layer_rows = {r[0]["text"]: r for r in tables(text)["layer-class-table"]["rows"]}
    headers = tables(text)["layer-class-table"]["headers"]
    row = dict(zip(headers, layer_rows[cls]))
    assert row["instances N"]["v"] == "2" and row["replayed K"]["v"] == "1"
    assert float(row["replay measured (s)"]["v"]) == pytest.approx(record["wall_s"])
    assert float(row["every instance (s)"]["v"]) == pytest.approx(2 * record["wall_s"])
    assert f"Nsight Compute {record['ncu_version']} (1 replay;" in text
    assert f"ncu replay time (Nsight Compute {record['ncu_version']};" in (out / "report.md").read_text()


@pytest.mark.workflow
def test_workflow_metric_catalog_edit_reruns_replay_and_what_follows_never_the_capture(replay_run):
    """The catalog is an input of replay_ncu (and aggregate), not of any capture rule."""
    setup, ncu, _, _, target = replay_run
    catalog = setup["repo"] / "src" / "operator_profiler" / "ncu" / "metrics.yaml"
    original = catalog.read_bytes()
    try:
        catalog.write_bytes(original + b"# an edit of the metric catalog\n")
        dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert job_counts(dry.stdout) == {"replay_ncu": 1, "parse_ncu": 1, "match_invocations": 1,
                                             "aggregate": 1, "advise": 1, "report": 1}, dry.stdout[-3000:]
    finally:
        catalog.write_bytes(original)
    # The same bytes again (newer mtime, same checksum): nothing to do.
    dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    # For the replay: a touch / git checkout of the replay's code re-runs nothing
    # (replay_ncu is a shell: rule; its modules are checksummed inputs).
    for module in ("ncu/replay.py", "ncu/catalog.py"):
        (setup["repo"] / "src" / "operator_profiler" / module).touch()
    dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]


@pytest.mark.workflow
def test_workflow_recapture_with_identical_classes_reruns_no_replay(replay_run):
    """A new capture whose layer classes are the same rewrites byte-identical class
    JSONs and replay plans (checksummed inputs of replay_ncu): no replay runs again."""
    setup, ncu, _, _, target = replay_run
    out = setup["work"] / "results" / wf.W
    (out / "capture" / "timeline.nsys-rep").write_bytes(b"\x00a recapture of the same program\x00")
    dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    # Planned before the checkpoint re-runs: the CPU stages that read the timeline, no capture, no replay.
    assert job_counts(dry.stdout) == {"export_timeline": 1, "classify_layers": 1, "attribute": 1, "compute_work": 1,
                                         "match_invocations": 1, "aggregate": 1, "advise": 1, "report": 1}, dry.stdout[-3000:]

    # The checkpoint decides the classes: run the CPU stages up to it, then plan the rest.
    step = wf.snakemake(setup, f"results/{wf.W}/layers/classes.json", *wf.CUDA_NSYS)
    assert step.returncode == 0, step.stderr[-4000:]
    dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert job_counts(dry.stdout) == {}, dry.stdout[-3000:]
    before = len(ncu.collections())
    result = wf.snakemake(setup, *target, *wf.CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-4000:]
    assert len(ncu.collections()) == before


@pytest.mark.workflow
def test_workflow_new_class_runs_exactly_one_replay(replay_run):
    from nsys_export import Kernel, Nvtx, Runtime, write_nsys_export

    setup, ncu, _, base, target = replay_run
    out = setup["work"] / "results" / wf.W
    (block_cls,) = [p.stem for p in (out / "layers" / "classes").glob("*.json")]
    block_files = {p: p.read_bytes() for p in (out / "layers" / "classes" / f"{block_cls}.json",
                                               out / "layers" / "replay" / f"{block_cls}.json")}
    # A new capture: the same blocks, then one kernel after the blocks in each iteration (outside every
    # layer): a new class `rest`; the block class and its launch window are unchanged.
    nvtx, runtime, kernels, expected = wf.synthetic_capture()
    sequence, extra = [], 10_000
    by_iteration: dict[int, list] = {}
    for e in expected:
        by_iteration.setdefault(e["iteration"], []).append(e)
    for it, rows in by_iteration.items():
        sequence += [[e["name"], "(1, 1, 1)", "(128, 1, 1)"] for e in rows]
        t = 1_000_000 + it * 100_000 + 85_000
        extra += 1
        nvtx.append(Nvtx(f"aten::add, seq = {extra}, op_id = {extra}", 59, wf.THREAD, t, t + 2_000))
        runtime.append(Runtime("cudaLaunchKernel_v7000", wf.THREAD, t + 100, t + 200, extra))
        kernels.append(Kernel("add_kernel", wf.PID, wf.STREAM, t + 300, t + 800, extra))
        sequence.append(["add_kernel", "(1, 1, 1)", "(128, 1, 1)"])
    kernels.sort(key=lambda k: k.start)
    fixture = base / "synthetic_export.sqlite"  # what the fake nsys copies
    fixture.unlink()
    write_nsys_export(fixture, nvtx=nvtx, runtime=runtime, kernels=kernels,
                      domains={(wf.PID, wf.OPPROF_DOMAIN): "opprof"})
    ncu.set_sequence(sequence)
    (out / "capture" / "timeline.nsys-rep").write_bytes(b"\x00a new placeholder capture\x00")
    # The recapture's torch.profiler run counted the same kernels (attribute checks the counts agree;
    # its placed trace keeps the old kernels, so pairing warns and NVTX names the new one).
    kineto_run = json.loads((out / "capture" / "kineto_run.json").read_text())
    kineto_run["measured_kernels"] = len(kernels)
    (out / "capture" / "kineto_run.json").write_text(json.dumps(kineto_run))

    # The checkpoint decides the classes: run the CPU stages up to it, then plan the rest.
    step = wf.snakemake(setup, f"results/{wf.W}/layers/classes.json", *wf.CUDA_NSYS)
    assert step.returncode == 0, step.stderr[-4000:]
    assert sorted(p.stem for p in (out / "layers" / "classes").glob("*.json")) == sorted([block_cls, "rest"])
    assert {p: p.read_bytes() for p in block_files} == block_files
    dry = wf.snakemake(setup, "-n", *target, *wf.CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = job_counts(dry.stdout)
    assert counts.get("replay_ncu") == 1 and counts.get("parse_ncu") == 1, dry.stdout[-3000:]
    assert "cls=rest" in dry.stdout and f"cls={block_cls}" not in dry.stdout
    # On a cluster (profiles/slurm) the replay asks for a GPU and its node whole (sbatch --gpus=1 --exclusive,
    # tests/test_slurm.py), its parser for neither.
    resources = {j["rule"]: set(j["resources"].split(", ")) for j in dry_run_jobs(dry.stdout)}
    assert {"gpu=1", "slurm_extra=--exclusive", "runtime=240"} <= resources["replay_ncu"], resources
    assert not {r for r in resources["parse_ncu"] if r.startswith(("gpu=", "slurm_extra="))}, resources

    before = len(ncu.collections())
    result = wf.snakemake(setup, *target, *wf.CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-4000:]
    (new,) = ncu.collections()[before:]
    # rest = the add kernel after blocks.0 and blocks.1 (launches 0-3) of the first iteration.
    assert new[new.index("--launch-skip") + 1: new.index("--launch-skip") + 4] == ["4", "--launch-count", "1"]
    diag = json.loads((out / "matched" / "diagnostics.json").read_text())
    assert diag["matched"] == 3 and diag["name_disagreements"] == []


def test_a_shifted_launch_window_fails_instead_of_attaching_a_neighbours_counters():
    """QA: one launch more before the window made ncu profile the kernel *before* the planned one; the
    match stage attached its counters and exited 0. Unplanned rows or planned kernels left without
    counters in a replay now fail with the class and the counts."""
    import pandas as pd

    from operator_profiler import stages
    from operator_profiler.files import InputError

    matched = pd.DataFrame({"kernel_id": [3]})
    diagnostics = {"ncu_only_rows": [{"ncu_id": 0, "source": "results/w/ncu/Block-1.parquet"},
                                     {"ncu_id": 2, "source": "results/w/ncu/Block-1.parquet"}],
                   "name_disagreements": [{"key": "gemm", "position": 0}]}
    with pytest.raises(InputError, match=r"ncu file Block-1: 1 of 2 planned kernels matched, 2 profiled kernel\(s\) "
                                         r"not planned.*first disagreement.*launch window is shifted"):
        stages._replay_windows_checked({"Block-1": {"kernel_ids": [3, 4]}}, matched, diagnostics)
    stages._replay_windows_checked({"Block-1": {"kernel_ids": [3]}}, matched, {"ncu_only_rows": []})  # all good
