"""Rule capture_kineto: the torch.profiler run for path (a) when the timeline comes from nsys."""
from operator_profiler import capture
from operator_profiler.errors import run_rule


def needs_gpu():
    raise capture.GpuStageUnavailable(
        "capture_kineto runs beside an nsys capture on a CUDA GPU (issue #6, not built yet); "
        "set timeline: torch or device: cpu"
    )


run_rule(snakemake.log[0], needs_gpu)
