# Operator Profiler: per-operator GPU kernel times and hardware counters for PyTorch models.
# Wiring only: the stages live in workflow/*.smk, the logic in src/operator_profiler/.
from snakemake.utils import min_version

min_version("9.27")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/common.smk"
include: "workflow/clocks.smk"
include: "workflow/capture.smk"
include: "workflow/ceilings.smk"
include: "workflow/timeline.smk"
include: "workflow/layers.smk"
include: "workflow/ncu.smk"
include: "workflow/match.smk"
include: "workflow/attribute.smk"
include: "workflow/work.smk"
include: "workflow/aggregate.smk"
include: "workflow/report.smk"
include: "workflow/trace.smk"
include: "workflow/optimize.smk"


rule all:
    default_target: True
    input:
        final_outputs_after_sweep,


# A failed or interrupted run leaves no result made from what it removed (workflow/common.smk).
onerror:
    sweep_stale_results("error")


onsuccess:
    sweep_stale_results("success")
