"""Rule match_invocations: ncu rows <-> timeline kernels by (match_key, occurrence)."""
from operator_profiler import capture
from operator_profiler.errors import run_rule


def not_built():
    raise capture.GpuStageUnavailable("match_invocations is not built yet (issue #4); run with device: cpu")


run_rule(snakemake.log[0], not_built)
