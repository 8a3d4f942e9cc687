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


# Hugging Face transformers models (kind: transformers), tiny: 2 layers (ResNet: stages of 3, whose last two
# layers are alike), small widths, each family's own config keys. tests/test_transformers.py runs them once.
TINY_HF_MODELS = {
    "hf_gpt2": {"kind": "transformers", "model_type": "gpt2", "task": "causal-lm", "seq_len": 16,
                "config": {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}},
    "hf_llama": {"kind": "transformers", "model_type": "llama", "task": "causal-lm", "seq_len": 16,
                 "config": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 128,
                            "max_position_embeddings": 64}},
    "hf_bert": {"kind": "transformers", "model_type": "bert", "task": "masked-lm", "seq_len": 16,
                "config": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                           "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64}},
    "hf_vit": {"kind": "transformers", "model_type": "vit", "task": "image-classification",
               "config": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                          "intermediate_size": 64, "image_size": 32, "patch_size": 8}},
    "hf_resnet": {"kind": "transformers", "model_type": "resnet", "task": "image-classification", "image_size": 32,
                  "config": {"depths": [3, 3], "hidden_sizes": [16, 32], "embedding_size": 8}},
}
TINY_HF = {
    "device": "cpu",
    "harness": {"seed": 0, "warmup": 1, "iterations": ITERATIONS},
    "ceilings": TINY["ceilings"],
    "workloads": {
        **TINY_HF_MODELS,
        # compiled per layer (layer ranges around each compiled layer: one class per group of identical layers)
        "hf_llama_layers": {**TINY_HF_MODELS["hf_llama"], "compile": True, "compile_scope": "layers"},
        # HF's eager attention: the attention rule advises sdpa_rewrite (an SDPA model is left alone)
        # (128 tokens: the attention's score matrices dominate its time, so the share the rule reads stays far
        # above its 10 % threshold on a loaded machine too; at 16 tokens one slow GELU call on a busy machine took
        # 83 % of the time and the share read 3 %)
        "hf_bert_eager": {**TINY_HF_MODELS["hf_bert"], "attn_implementation": "eager", "seq_len": 128,
                          "config": {**TINY_HF_MODELS["hf_bert"]["config"], "max_position_embeddings": 160}},
    },
}
#: The advised variants the test run profiles beside (results/<workload>+<change>/): the rewrite of HF's eager
#: attention into SDPA, and conv-BN folding inside HF ResNet (which cannot be FX-traced whole).
TINY_HF_VARIANTS = ("hf_bert_eager+sdpa_rewrite", "hf_resnet+conv_bn_fold")


def analyse_compiled_capture(out: Path):
    """The analysis stages in process on a compiled capture under ``out`` (``inductor/`` from compile_artifacts,
    ``trace.json.gz`` and ``shapes.json.gz`` from capture_timeline): fusion map, timeline, attribution and work,
    written beside them. Returns (attribution, work)."""
    from operator_profiler import stages

    stages.build_fusion_map(out / "inductor", out / "fusion_map.parquet")
    stages.export_timeline(out / "trace.json.gz", out / "timeline")
    attribution = stages.attribute_files(out / "timeline", None, out / "fusion_map.parquet",
                                         out / "attribution.parquet")
    work = stages.work_files(out / "timeline", out / "attribution.parquet", out / "work.parquet",
                             fusion_map_path=out / "fusion_map.parquet", shapes_trace=out / "shapes.json.gz")
    return attribution, work
