"""Rule compile_artifacts: Inductor debug directories (output_code.py, FX graphs, provenance)."""
import json

from operator_profiler import capture
from operator_profiler.errors import run_rule

run_rule(snakemake.log[0], capture.compile_artifacts, json.loads(snakemake.params.workload),
         json.loads(snakemake.params.harness), snakemake.params.device, snakemake.output.debug,
         snakemake.input.clocks, snakemake.output.clocks)
