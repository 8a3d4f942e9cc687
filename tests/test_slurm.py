"""The workflow through SLURM with the shipped profile (profiles/slurm), on a real one-node cluster.

The fixture sets up a throw-away SLURM cluster on this machine (tests/slurm_cluster.py: Debian
``slurm-wlm`` + ``munge``, installed when missing; a minimal ``/etc/slurm/slurm.conf``; slurmctld and
slurmd started here and stopped by PID at teardown, also when a test fails). A tiny CPU config (one
compiled workload with layer classes, one eager) then runs twice: locally with ``--cores 2``, and
with ``--profile profiles/slurm``, every job an ``sbatch`` job on this node.

What must be equal is what is deterministic: the operators with their call and kernel counts and
attribution paths, the layer classes (names, instances, kernels per instance, the canonical class
JSON files byte for byte), the coverage counts, the attribution of every kernel (kernel id, name,
iteration, operator, module, layer, layer class, path, fused ops, source nodes, reason), the capture
records (run.json less its wall times, layers.json) and the report's headings. Kernel durations (and
so time shares, the operators' order, the report's figures) are not compared: two CPU captures never
time alike.

It is slow (minutes: every job waits for SLURM's scheduler and for the status polls) but it runs in
CI: there a setup failure fails the test, elsewhere it skips with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from slurm_cluster import SetupError, SingleNodeSlurm
from workflow_runs import TINY, custom_env

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "slurm"
CONFIG = {**TINY, "workloads": {k: TINY["workloads"][k] for k in ("gpt2", "lstm")}}
WORKLOADS = sorted(CONFIG["workloads"])


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"single-node SLURM setup failed in a CI run: {reason}")
    pytest.skip(f"no single-node SLURM cluster here: {reason}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        _unavailable("snakemake-executor-plugin-slurm is not installed (pip install -e .)")
    slurm = SingleNodeSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        try:
            slurm.start()
        except (SetupError, OSError, subprocess.SubprocessError) as exc:
            _unavailable(f"{exc}\n{slurm.logs()}")
        yield slurm
    finally:
        # Jobs still queued or running (a failed or timed-out run) go first, then the daemons.
        if slurm.procs:
            subprocess.run(["scancel", "--partition=opprof"], capture_output=True, timeout=30, check=False)
        slurm.stop()


def _snakemake(work: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--configfile", "config.yaml", *args]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=custom_env(work), timeout=timeout)


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """(local workdir, SLURM workdir, SLURM run output) of the same config."""
    dirs = {}
    for name in ("local", "slurm"):
        dirs[name] = tmp_path_factory.mktemp(f"wf_{name}")
        (dirs[name] / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    local = _snakemake(dirs["local"], "--cores", "2")  # jobs side by side, each torch still 1 thread
    assert local.returncode == 0, local.stderr[-4000:]
    # The profile as shipped, but the status polls come sooner (2 s, not 20 s, after a finished job).
    on_slurm = _snakemake(dirs["slurm"], "--profile", str(PROFILE), "--slurm-init-seconds-before-status-checks", "2",
                          "--verbose")  # the sbatch calls and the status command used
    assert on_slurm.returncode == 0, on_slurm.stderr[-6000:] + cluster.logs()
    return dirs["local"], dirs["slurm"], on_slurm.stdout + on_slurm.stderr


def _job_count(output: str) -> int:
    """Jobs of a finished run ("N of N steps (100%) done"), the local rule `all` included."""
    done = re.findall(r"(\d+) of (\d+) steps \(100%\) done", output)
    assert done, output[-3000:]
    return int(done[-1][1])


@pytest.mark.workflow
@pytest.mark.slurm
def test_every_job_ran_as_a_slurm_job_without_gpu_or_exclusive_request(runs):
    local, work, output = runs
    local_log = sorted((local / ".snakemake" / "log").glob("*.snakemake.log"))[-1].read_text()
    job_ids = re.findall(r"has been submitted with SLURM jobid (\d+)", output)
    # every job but the local target rule `all`, as many as the local run ran
    assert len(job_ids) == len(set(job_ids)) == _job_count(local_log) - 1 == _job_count(output) - 1, output[-3000:]
    logs = sorted((work / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert sorted(p.stem for p in logs) == sorted(job_ids)  # one sbatch log per job (kept by the profile)
    # slurmctld knows them all as completed (squeue: the profile's status command; MinJobAge keeps them)
    queue = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%i|%T"], capture_output=True,
                           text=True, timeout=30, check=True).stdout
    states = dict(line.split("|") for line in queue.split())
    assert {j: states.get(j) for j in job_ids} == {j: "COMPLETED" for j in job_ids}
    # the status came from squeue (the profile's slurm-status-command; no accounting here)
    polls = re.findall(r"Status query timing \(cycle\): command=(\w+)", output)
    assert polls and set(polls) == {"squeue"}, output[-3000:]
    # device cpu: the capture rules asked for no GPU and did not take the node whole
    calls = re.findall(r"sbatch call: (.*)", output)
    assert len(calls) == len(job_ids) and not [c for c in calls if "--gpus" in c or "--exclusive" in c], calls
    for job in job_ids:
        info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True,
                              timeout=30, check=True).stdout
        fields = dict(re.findall(r"\b(TRES|TresPerJob|TresPerNode|OverSubscribe|NumCPUs)=(\S+)", info))
        assert "gpu" not in fields.get("TRES", "") + fields.get("TresPerJob", "") + fields.get("TresPerNode", "")
        assert fields["OverSubscribe"] != "NO" and fields["NumCPUs"] == "1", info
    captures = [p for p in logs if p.parts[-3] == "rule_capture_timeline"]
    assert len(captures) == len(WORKLOADS)


def _operators(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    keep = ["operator", "calls", "kernels", "paths", "bottleneck", "kernels_without_time"]
    return table[keep].sort_values("operator").reset_index(drop=True)


def _attribution(path: Path) -> pd.DataFrame:
    table = pd.read_parquet(path)
    keep = ["kernel_id", "name", "iteration", "operator", "forward_operator", "module", "layer", "layer_class",
            "path", "reason", "valid_time"]
    out = table[keep].copy()
    for col in ("fused_ops", "source_nodes"):
        out[col] = table[col].map(lambda v: json.dumps(list(v)))
    return out.sort_values("kernel_id").reset_index(drop=True)


def _coverage_counts(path: Path) -> dict:
    cov = json.loads(path.read_text())
    return {
        "kernel_count": cov["kernel_count"],
        "attributed_count": cov["attributed_count"],
        "valid_timed_kernels": cov["valid_timed_kernels"],
        "path_count_share": {p: v["count"] for p, v in cov["path_coverage"].items()},
        "path_agreement_counts": cov["path_agreement_counts"],
        "unattributed_reasons": cov["unattributed_reasons"],
        "unattributed": sorted(json.dumps(u, sort_keys=True) for u in cov["unattributed"]),
        "iterations": sorted(cov["iteration_time_ns"]),
    }


@pytest.mark.workflow
@pytest.mark.slurm
@pytest.mark.parametrize("workload", WORKLOADS)
def test_slurm_run_gives_the_local_runs_deterministic_tables(runs, workload):
    local, slurm = (d / "results" / workload for d in runs[:2])
    pd.testing.assert_frame_equal(_operators(slurm / "operators.csv"), _operators(local / "operators.csv"))
    pd.testing.assert_frame_equal(_attribution(slurm / "attribution" / "kernels.parquet"),
                                  _attribution(local / "attribution" / "kernels.parquet"))
    assert _coverage_counts(slurm / "coverage.json") == _coverage_counts(local / "coverage.json")

    keep = ["layer_class", "module_class", "instances", "kernels_per_instance", "representative",
            "replays_without_dedup", "replays_with_dedup"]
    pd.testing.assert_frame_equal(pd.read_parquet(slurm / "layer_classes.parquet")[keep],
                                  pd.read_parquet(local / "layer_classes.parquet")[keep])
    classes = {p.name: p.read_bytes() for p in (local / "layers" / "classes").glob("*.json")}
    assert classes and {p.name: p.read_bytes() for p in (slurm / "layers" / "classes").glob("*.json")} == classes

    # the capture records (versions, harness, thread count, deterministic settings, measured kernels), less
    # the wall times of warm-up and measured window, the machine's load meanwhile, and the warm-up's timed record
    # (warm-up runs until the iteration times settle: how many iterations that takes is a timing too), whose rule
    # must agree
    rule = ("minimum", "maximum", "window", "tolerance")
    for name in ("run.json", "layers.json"):
        records = [json.loads((d / "capture" / name).read_text()) for d in (local, slurm)]
        if name == "run.json":
            assert [{k: r["warmup"][k] for k in rule} for r in records][0] == {k: records[1]["warmup"][k] for k in rule}
            assert all(set(r["machine_load"]) >= {"other_cpu_load", "busy", "window_s"} for r in records)
            records = [{k: v for k, v in r.items() if k not in ("warmup_s", "measured_s", "warmup", "machine_load")}
                       for r in records]
        assert records[0] == records[1], name
    # the same report sections, whatever the times in them
    headings = [[line for line in (d / "report.md").read_text().splitlines() if line.startswith("#")]
                for d in (local, slurm)]
    assert headings[0] == headings[1]


# ------------------------------------------------------------------------------ the GPU request


def _dry_run_resources(tmp_path: Path, device: str, profile: Path = PROFILE) -> dict[str, dict]:
    """{rule: resources} of a dry run with the profile (one job per rule: one workload); the job's
    threads under the key ``threads``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**CONFIG, "workloads": {"gpt2": CONFIG["workloads"]["gpt2"]}}))
    result = _snakemake(tmp_path, "--profile", str(profile), "-n", "--config", f"device={device}", "timeline=torch",
                        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rules = {}
    for block in re.split(r"\n(?:rule|checkpoint|localrule) ", result.stdout)[1:]:
        found = re.search(r"^    resources: (.*)$", block, re.M)
        if found:
            pairs = (item.split("=", 1) for item in found.group(1).split(", "))
            resources = {k: int(v) if v.isdigit() else v for k, v in pairs}
            threads = re.search(r"^    threads: (\d+)$", block, re.M)
            resources["threads"] = int(threads.group(1)) if threads else 1
            rules[block.split(":", 1)[0]] = resources
    return rules


def _sbatch_call(resources: dict) -> str:
    """The sbatch command line the SLURM executor plugin builds from a job's resources, after the checks
    it makes before submitting (validate_slurm_extra refuses options it sets itself, e.g. --constraint)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    class Resources(SimpleNamespace):
        def get(self, key, default=None):
            return getattr(self, key, default)

    resources = dict(resources)
    job = SimpleNamespace(threads=resources.pop("threads", 1), resources=Resources(**resources))
    validate_slurm_extra(job)
    params = {"run_uuid": "run", "slurm_logfile": "job.log", "comment_str": "rule", "account": "", "partition": "",
              "workdir": "/work"}
    return get_submit_command(job, params) + set_gres_string(job)


GPU_RULES = ("select_clocks", "capture_timeline", "measure_ceilings")


@pytest.mark.workflow
def test_gpu_rules_ask_slurm_for_a_gpu_and_the_whole_node_only_on_cuda(tmp_path):
    """The profile's resources through the plugin's own sbatch builder (replay_ncu, behind the checkpoint,
    is checked in tests/test_ncu_replay.py): on CUDA --gpus=1 --exclusive for the GPU rules only; with
    device cpu no rule asks for either, or the one-node CPU cluster of test_slurm could never run it."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    for device in ("cuda", "cpu"):
        rules = _dry_run_resources(tmp_path / device, device)
        assert set(GPU_RULES) < set(rules) and {"export_timeline", "attribute", "report"} < set(rules), rules
        for rule, resources in rules.items():
            call = _sbatch_call(resources).split()
            gpu = device == "cuda" and rule in GPU_RULES
            assert ("--gpus=1" in call, "--exclusive" in call) == (gpu, gpu), (rule, call)
            assert not any("gres" in arg for arg in call), call
            # the profile's defaults: 4000 MB, 60 min, one CPU per job
            assert call[call.index("--mem") + 1] == "4000" and call[call.index("-t") + 1] == "60", call
            assert "--cpus-per-task=1" in call, call


@pytest.mark.workflow
def test_the_profiles_gpu_cluster_example_pins_every_gpu_rule(tmp_path):
    """The commented GPU-cluster example of profiles/slurm/config.yaml ("#| " lines), switched on as the
    docs/cluster.md says: every GPU rule gets the partition, the node constraint with --exclusive kept, the
    memory; the captures 8 CPUs (sbatch --cpus-per-task and the job's threads); CPU rules keep the defaults."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    text = (PROFILE / "config.yaml").read_text()
    assert "\n#| " in text
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text(re.sub(r"^#\| ?", "", text, flags=re.M))
    rules = _dry_run_resources(tmp_path / "run", "cuda", profile)
    for rule in GPU_RULES:
        resources = rules[rule]
        call = _sbatch_call(resources).split()
        assert resources["slurm_partition"] == "gpu", (rule, resources)
        assert {"--exclusive", "--gpus=1"} <= set(call) and call[call.index("-C") + 1] in ("a100", "'a100'"), call
        assert call[call.index("--mem") + 1] == "32000", call
        threads = 8 if rule != "select_clocks" else 1
        if rule == "measure_ceilings":  # alone in a local run (every core: the profile's 256), 8 CPUs from SLURM
            assert resources["threads"] == 256 and resources["cpus_per_task"] == 8, resources
        else:
            assert resources["threads"] == threads, (rule, resources)
        assert f"--cpus-per-task={threads}" in call, (rule, call)
    for rule in ("export_timeline", "attribute", "report"):
        call = _sbatch_call(rules[rule]).split()
        assert "--exclusive" not in call and "slurm_partition" not in rules[rule], (rule, call)
        assert call[call.index("--mem") + 1] == "4000" and "--cpus-per-task=1" in call, call
