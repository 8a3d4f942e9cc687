"""Rule optimize_report: the advice, the verified variants and the before/after profiles -> optimize/report.html."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

i = snakemake.input
run_rule(snakemake.log[0], stages.optimize_report_files, snakemake.wildcards.workload, Path(i.base_report).parent,
         Path(i.variant_report).parent, i.advice, i.verification, snakemake.output.report)
