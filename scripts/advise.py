"""Rule advise: the rule catalog over a workload's attributed profile -> advice.json."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

i = snakemake.input
run_rule(snakemake.log[0], stages.advise_files, Path(i.operators).parent, snakemake.output[0], i.catalog,
         i.shapes or None, snakemake.wildcards.workload)
