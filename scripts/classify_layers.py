"""Checkpoint classify_layers: layer instances -> classes (one canonical JSON per class)."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

out = snakemake.output
fusion = snakemake.input.fusion_map or None  # compiled workloads only
kineto = Path(snakemake.input.kineto).parent if snakemake.input.kineto else None  # nsys timeline of a compiled one
run_rule(snakemake.log[0], stages.classify, Path(snakemake.input.kernels).parent, snakemake.input.layers,
         out.instances, out.kernel_layers, out.summary, out.classes_dir, snakemake.params.verify, out.plans_dir,
         fusion, kineto)
