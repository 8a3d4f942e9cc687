"""Rule report: the readable per-workload report."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

import json

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule


def report():
    # imported here, in the job's work: operator_profiler.results pulls in pandas and pyarrow
    from operator_profiler.results import ReportPaths

    i = snakemake.input
    paths = ReportPaths(i.coverage, i.operators, i.modules, i.layer_classes, run=i.run,
                        diagnostics=i.diagnostics or None, matching=i.matching or None, replays=list(i.replays),
                        clocks=i.clocks, phases=i.phases, advice=i.advice)
    stages.report_files(snakemake.wildcards.workload, paths, json.loads(snakemake.params.options), snakemake.output[0])


run_rule(snakemake.log[0], report)
