"""Rule attribute: one attribution record per kernel (paths a and c on Kineto, b on nsys)."""
from pathlib import Path

from operator_profiler import stages
from operator_profiler.attribution.nvtx import NvtxOptions
from operator_profiler.errors import run_rule

fusion = snakemake.input.fusion_map or None
run_rule(snakemake.log[0], stages.attribute_files, Path(snakemake.input.kernels).parent,
         snakemake.input.kernel_layers, fusion, snakemake.output[0], NvtxOptions.from_config(snakemake.params.nvtx))
