"""Rule replay_ncu: one Nsight Compute replay per layer class (GPU)."""
from operator_profiler import capture
from operator_profiler.errors import run_rule


def needs_gpu():
    raise capture.GpuStageUnavailable(
        "replay_ncu needs a CUDA GPU with Nsight Compute and the replay stage (issue #6, not built yet); "
        "run with device: cpu"
    )


run_rule(snakemake.log[0], needs_gpu)
