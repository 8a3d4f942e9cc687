"""Rule report: the readable per-workload report."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

import json

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

i = snakemake.input
run_rule(snakemake.log[0], stages.report_files, snakemake.wildcards.workload, i.run, i.coverage, i.operators,
         i.modules, i.layer_classes, json.loads(snakemake.params.options), snakemake.output[0],
         diagnostics_path=i.diagnostics or None, match_diagnostics_path=i.matching or None,
         replay_paths=list(i.replays) or None, clocks_path=i.clocks, phases_path=i.phases)
