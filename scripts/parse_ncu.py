"""Rule parse_ncu: ncu CSV -> per-kernel counters parquet."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

run_rule(snakemake.log[0], stages.parse_ncu_files, [snakemake.input.csv], snakemake.output[0])
