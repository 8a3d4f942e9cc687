"""Rule attribute: one attribution record per kernel (paths a and c on Kineto; b on nsys, plus a and c
from the separate torch.profiler run when there is one)."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

import json
from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule


def attribute():
    # imported here, in the job's work: the NVTX module pulls in pandas and pyarrow (operator_profiler.stages)
    from operator_profiler.attribution.nvtx import NvtxOptions

    fusion = snakemake.input.fusion_map or None
    kineto = Path(snakemake.input.kineto).parent if snakemake.input.kineto else None
    stages.attribute_files(Path(snakemake.input.kernels).parent, snakemake.input.kernel_layers, fusion,
                           snakemake.output.kernels, NvtxOptions.from_config(snakemake.params.nvtx), kineto,
                           list(snakemake.input.runs), json.loads(snakemake.params.workload))


run_rule(snakemake.log[0], attribute)
