"""Rule export_trace: the timeline as a Chrome/Perfetto trace.json with each kernel's attribution."""
from pathlib import Path

from operator_profiler import stages
from operator_profiler.errors import run_rule

i = snakemake.input
run_rule(snakemake.log[0], stages.trace_files, Path(i.kernels).parent, i.attribution, snakemake.output[0],
         counters_path=i.counters or None)
