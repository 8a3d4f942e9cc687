"""Running the workflow in tests: Snakemake in a child process on a copy or on this checkout, and its dry-run
output read back; the tiny CPU config that tests/test_workflow.py runs for real (tests/test_slurm.py runs it
through SLURM). The nsys set-up with placed captures is tests/nsys_workflow.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_LAYER = 3
ITERATIONS = 2

TINY = {
    "device": "cpu",
    "harness": {"seed": 0, "warmup": 1, "iterations": ITERATIONS},
    # the machine's ceilings at tiny sizes (the real sizes take ~10 s; tests/test_ceilings.py checks them)
    "ceilings": {"gemm_n": 64, "stream_mib": 0.25, "runs": 2, "warmup": 1, "min_run_s": 0},
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


def snakemake(workdir: Path, config: Path, *args: str, env: dict | None = None, cores: int = 1) -> subprocess.CompletedProcess:
    """``cores`` > 1 runs jobs side by side (each job's torch keeps its own 1 thread: the tables are the same)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
           "--configfile", str(config), "--cores", str(cores), *args]
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


def dry_run_jobs(stdout: str) -> list[dict]:
    """The dry run's job blocks as {rule, wildcards, resources}."""
    jobs = []
    for block in re.split(r"\n(?:rule|checkpoint|localrule) ", stdout)[1:]:
        rule = block.split(":", 1)[0].strip()
        fields = dict(line.strip().split(": ", 1) for line in block.splitlines()[1:] if ": " in line)
        jobs.append({"rule": rule, "wildcards": fields.get("wildcards"), "resources": fields.get("resources", "")})
    return jobs


def copy_repo(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("workflow", "scripts", "envs", "config", "src"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore)
    shutil.copy2(ROOT / "Snakefile", dest / "Snakefile")
    return dest
