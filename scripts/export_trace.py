"""Rule export_trace: the timeline as a Chrome/Perfetto trace.json with each kernel's attribution."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

i = snakemake.input
run_rule(snakemake.log[0], stages.trace_files, Path(i.kernels).parent, i.attribution, snakemake.output[0],
         counters_path=i.counters or None)
