"""Rule export_kineto_timeline: the torch.profiler run beside an nsys capture -> timeline tables."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

run_rule(snakemake.log[0], stages.export_timeline, snakemake.input.trace,
         Path(snakemake.output.kernels).parent, "kineto",
         snakemake.params.expect_gpu,
         user_error_hint=f"delete {snakemake.input.trace} (or run snakemake with --forcerun capture_kineto) "
         "to capture it again")
