"""Rule select_clocks: write clocks/target.json (what a GPU job locks)."""
import json

from operator_profiler import clocks
from operator_profiler.errors import run_rule

run_rule(snakemake.log[0], clocks.select_clocks, json.loads(snakemake.params.clocks),
         snakemake.params.device, snakemake.output[0])
