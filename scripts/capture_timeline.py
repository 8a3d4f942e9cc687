"""Rule capture_timeline: run the harness once under the timeline tool."""
import json

from operator_profiler import capture
from operator_profiler.errors import run_rule

out = snakemake.output
run_rule(
    snakemake.log[0],
    capture.capture_timeline,
    snakemake.wildcards.workload,
    json.loads(snakemake.params.workload),
    json.loads(snakemake.params.harness),
    snakemake.params.device,
    snakemake.params.timeline,
    out.trace,
    out.run,
    out.layers,
    out.clocks,
    snakemake.input.clocks,
    snakemake.params.timeline_requested,
)
