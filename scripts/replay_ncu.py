"""Rule replay_ncu: one Nsight Compute replay per layer class (GPU; operator_profiler.ncu.replay)."""
import json

from operator_profiler.errors import run_rule
from operator_profiler.ncu.replay import replay_files

i, o, p = snakemake.input, snakemake.output, snakemake.params
run_rule(snakemake.log[0], replay_files, i.plan, i.clocks, json.loads(p.workload), json.loads(p.harness),
         snakemake.wildcards.workload, p.device, o.csv, o.replay, o.clocks)
