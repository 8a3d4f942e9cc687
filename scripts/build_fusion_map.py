"""Rule build_fusion_map: Inductor debug directories -> fusion map table (path c)."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

from operator_profiler import stages
from operator_profiler.rule_runner import exit_finished_job, run_rule

run_rule(snakemake.log[0], stages.build_fusion_map, snakemake.input.debug, snakemake.output[0])
exit_finished_job()  # after torch: skip the interpreter's teardown (rule_runner.exit_finished_job)
