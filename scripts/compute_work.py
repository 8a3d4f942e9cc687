"""Rule compute_work: FLOPs and ideal bytes of every kernel from recorded shapes and the fusion map."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from pathlib import Path

from operator_profiler import stages
from operator_profiler.rule_runner import exit_finished_job, run_rule

i = snakemake.input
run_rule(snakemake.log[0], stages.work_files, Path(i.kernels).parent, i.attribution, snakemake.output[0],
         fusion_map_path=i.fusion_map or None, kineto_dir=Path(i.kineto).parent if i.kineto else None,
         shapes_trace=i.shapes or None)
exit_finished_job()  # after torch: skip the interpreter's teardown (rule_runner.exit_finished_job)
