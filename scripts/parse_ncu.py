"""Rule parse_ncu: ncu CSV -> per-kernel counters parquet."""
from operator_profiler import capture
from operator_profiler.errors import run_rule


def not_built():
    raise capture.GpuStageUnavailable(
        f"parse_ncu ({snakemake.input.csv}): the Nsight Compute parser is not built yet (issue #4)"
    )


run_rule(snakemake.log[0], not_built)
