"""Rule aggregate: operators, modules, layer classes, coverage."""
from operator_profiler.interrupts import watch_snakemake_job

watch_snakemake_job(snakemake)  # first: Ctrl-C from here on is one line, not a traceback

import json

from operator_profiler import stages
from operator_profiler.rule_runner import run_rule

i, o = snakemake.input, snakemake.output
run_rule(snakemake.log[0], stages.aggregate_files, i.attribution, i.instances, i.classes,
         json.loads(snakemake.params.options), o.operators, o.operators_csv, o.modules, o.layer_classes,
         o.coverage, counters_path=i.counters or None, matching_path=i.matching or None, out_phases=o.phases,
         work_path=i.work, ceilings_path=i.ceilings)
