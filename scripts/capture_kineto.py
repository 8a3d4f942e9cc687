"""Rule capture_kineto: the torch.profiler run for path (a) when the timeline comes from nsys."""
import json

from operator_profiler import capture
from operator_profiler.errors import run_rule

out = snakemake.output
run_rule(
    snakemake.log[0],
    capture.capture_kineto,
    snakemake.wildcards.workload,
    json.loads(snakemake.params.workload),
    json.loads(snakemake.params.harness),
    snakemake.params.device,
    out.trace,
    out.run,
    out.clocks,
    snakemake.input.clocks,
)
