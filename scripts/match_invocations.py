"""Rule match_invocations: ncu rows <-> timeline kernels by (match_key, occurrence)."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

run_rule(snakemake.log[0], stages.match_files, Path(snakemake.input.kernels).parent,
         [Path(p) for p in snakemake.input.ncu], Path(snakemake.output.metrics), Path(snakemake.output.diagnostics),
         stages.replay_window(snakemake.input.replays) if snakemake.input.replays else None,
         Path(snakemake.input.kernel_layers))
