# Config validation, device/tool resolution and input functions shared by every stage.
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from operator_profiler import stale
from operator_profiler.capture.jobs import resolve_timeline
from operator_profiler.capture.machine import machine_identity
from operator_profiler.config import ConfigError, check_callables, validate_config
from operator_profiler.workflow_inputs import module_sources, rule_inputs

try:
    _SOURCE = " + ".join(map(str, workflow.configfiles)) + " (and --config overrides)"
    config = validate_config(config, _SOURCE, overrides=workflow.config_settings.config)
    # A custom factory or loss_fn not found on the path, not parsable or not defined fails here, in one
    # line, not in its capture job (the module's source is parsed; imported only when that cannot tell).
    check_callables(config, _SOURCE, import_modules=False)
except ConfigError as exc:
    sys.exit(f"Error: {exc}")

# The library files each rule runs are declared as its `lib` input (Snakemake does not track what a
# script imports): checksummed, so a touch does nothing and an edit re-runs the rule. Derived from the
# package's import graph (operator_profiler.workflow_inputs), never kept by hand; anchored at the Snakefile,
# not the working directory.
LIB = Path(workflow.basedir) / "src" / "operator_profiler"


def lib_inputs(rule):
    """The package files ``rule`` runs: its script's (or gpu_jobs rule's) imports, followed to the end."""
    return rule_inputs(rule, LIB, Path(workflow.basedir) / "scripts")


def _cuda_visible():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    probe = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return probe.returncode == 0 and "GPU" in probe.stdout


DEVICE = (
    config["device"]
    if config["device"] != "auto"
    else ("cuda" if _cuda_visible() else "cpu")
)
# Resolved once, here, when the DAG is built (auto: nsys when on PATH); run.json records it.
TIMELINE = resolve_timeline(config["timeline"], DEVICE)
# Say now, not after the captures, that a GPU tool the DAG needs is missing on this machine.
if DEVICE == "cuda":
    for tool, needed_for in (
        ("ncu", "the per-class ncu replays"),
        ("nsys", "the nsys timeline"),
    ):
        if (tool == "ncu" or TIMELINE == "nsys") and shutil.which(tool) is None:
            print(
                f"warning: {tool} is not on PATH here: {needed_for} will fail on this machine "
                "(fine when the jobs run on GPU nodes that have it)",
                file=sys.stderr,
            )
GPU = 1 if DEVICE == "cuda" else 0
# The GPU rules' resources: gpu=GPU, slurm_extra=GPU_SLURM_EXTRA. Under the SLURM executor
# (profiles/slurm) gpu=1 becomes `sbatch --gpus=1`, and a GPU job takes its node whole (--exclusive), so
# no other job changes the clocks it locked; on a CPU run the same rules are plain CPU jobs (neither).
GPU_SLURM_EXTRA = "--exclusive" if GPU else ""
TRACE_EXT = "nsys-rep" if TIMELINE == "nsys" else "kineto.json.gz"
# Both readers write the memcpy/memset rows (gpu_activities) and diagnostics; nsys also the NVTX GPU projection.
TIMELINE_OUTPUTS = {
    "kernels": "results/{workload}/timeline/kernels.parquet",
    "launches": "results/{workload}/timeline/launches.parquet",
    "ranges": "results/{workload}/timeline/ranges.parquet",
    "activities": "results/{workload}/timeline/gpu_activities.parquet",
    "diagnostics": "results/{workload}/timeline/diagnostics.json",
}
if TIMELINE == "nsys":
    TIMELINE_OUTPUTS.update(
        projection="results/{workload}/timeline/nvtx_gpu_projection.parquet",
    )
WORKLOADS = sorted(config["workloads"])
# A variant of a workload (the optimize workflow, workflow/optimize.smk) is named <workload>+<change>+...: the
# workload's config with those changes added (workload_config); any workload's results folder can be one.
from operator_profiler.config import load_schema
from operator_profiler.errors import WorkloadError
from operator_profiler.transforms.vocabulary import force_int8

try:
    force_int8()  # OPPROF_FORCE_INT8 neither on nor off: one line now, not a traceback per rule
except WorkloadError as exc:
    sys.exit(f"Error: {exc}")
from operator_profiler.transforms.variants import (
    advised_variant,
    split_name,
    variant_name,
    variant_workload,
)

CHANGE_IDS = load_schema()["$defs"]["workload"]["properties"]["changes"]["items"][
    "enum"
]


def workload_config(name):
    """The config slice of workload ``name``: a workload of the config, or <workload>+<change>+... (its
    changes added after the workload's own: operator_profiler.transforms.variants)."""
    base, changes = split_name(name)
    unknown = [c for c in changes if c not in CHANGE_IDS]
    if unknown:
        raise ValueError(f"{name}: unknown change(s) {unknown}; known: {CHANGE_IDS}")
    return variant_workload(config["workloads"][base], changes)


wildcard_constraints:
    workload="("
    + ("|".join(WORKLOADS) or "none")
    + ")"
    + "(\\+("
    + "|".join(CHANGE_IDS)
    + "))*",
    cls="[A-Za-z0-9_.-]+",


# The GPU rules are shell: rules running operator_profiler.gpu_jobs (a declared input, in lib_inputs):
# for a script: rule Snakemake's code trigger is the script's mtime, so a touch or git checkout of a
# script would re-run GPU captures; for a shell: rule it is the command text (gpu_shell), which never
# changes. The interpreter comes from the environment, not from params (a venv path is no rerun
# reason): "python" inside a conda environment (--sdm conda), else this interpreter.
try:
    from snakemake.settings.enums import DeploymentMethod

    _CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
except (ImportError, AttributeError):
    _CONDA = False
os.environ.update(OPPROF_PYTHON="python" if _CONDA else sys.executable)


def gpu_shell(rule):
    return (
        f'"$OPPROF_PYTHON" -m operator_profiler.gpu_jobs {rule} '
        "{params.job:q} {params.files:q} {log:q}"
    )


def gpu_job(**params):
    """A GPU rule's params as one JSON string (callables evaluated with the wildcards; a callable's None
    leaves its key out). It depends on the wildcards only, so Snakemake's params trigger compares it (a
    params function of input or output is "derived" and not compared): a config edit re-runs the
    rule."""

    def spec(wildcards):
        values = {k: (v(wildcards) if callable(v) else v) for k, v in params.items()}
        return json.dumps(
            {
                k: v
                for k, v in values.items()
                if v is not None or not callable(params[k])
            },
            sort_keys=True,
        )

    return spec


def _named(items):
    return {
        name: (
            str(value) if isinstance(value, (str, Path)) else [str(v) for v in value]
        )
        for name, value in items
    }


def gpu_files(wildcards, input, output):
    """The wildcards and named inputs and outputs of a GPU job as JSON (files are tracked as files)."""
    return json.dumps(
        {
            "wildcards": dict(wildcards.items()),
            "input": _named(input.items()),
            "output": _named(output.items()),
        },
        sort_keys=True,
    )


@functools.cache
def _module_sources(module):
    return module_sources(module)


def custom_model_source(wildcards):
    """The source files of a workload's custom factory and loss_fn modules and of the user's modules they
    import, followed to the end (operator_profiler.workflow_inputs.module_sources: read, never imported), so
    that editing the model, a module it imports or its loss re-runs its capture (Snakemake does not track
    what a script imports), and a file the model never imports does not."""
    workload = workload_config(wildcards.workload)
    sources = []
    for spec in (workload.get("factory"), workload.get("loss_fn")):
        if spec:
            sources += [
                p for p in _module_sources(spec.partition(":")[0]) if p not in sources
            ]
    return sources


def workload_params(wildcards):
    """The workload's config slice as a deterministic string (a params change reruns the capture)."""
    return json.dumps(workload_config(wildcards.workload), sort_keys=True)


def int8_forced(wildcards):
    """True while OPPROF_FORCE_INT8 is on (it forces int8_dynamic where it is not offered) and the workload
    has int8_dynamic among its changes, else None (left out of the params): forcing it, or no longer
    forcing it, re-runs the workload's captures. A value neither on nor off fails here.
    """
    changes = workload_config(wildcards.workload).get("changes") or []
    return True if "int8_dynamic" in changes and force_int8() else None


def int8_forced_anywhere(wildcards):
    """True while OPPROF_FORCE_INT8 forces int8 (it decides what the advice offers and what the verification
    measures), else None (left out of the params)."""
    return True if force_int8() else None


def is_compiled(workload):
    return bool(workload_config(workload)["compile"])


def fusion_map_input(wildcards):
    if is_compiled(wildcards.workload):
        return f"results/{wildcards.workload}/inductor/fusion_map.parquet"
    return []


def layer_classes(wildcards):
    """Class names decided by the classify_layers checkpoint."""
    classes_dir = checkpoints.classify_layers.get(
        workload=wildcards.workload
    ).output.classes_dir
    return sorted(p.stem for p in Path(classes_dir).glob("*.json"))


def ncu_tables(wildcards):
    return [
        f"results/{wildcards.workload}/ncu/{cls}.parquet"
        for cls in layer_classes(wildcards)
    ]


def replay_records(wildcards):
    """The classes' ncu replay records (window for matching, wall time for the report); CUDA only."""
    if DEVICE != "cuda":
        return []
    return [
        f"results/{wildcards.workload}/ncu/{cls}.replay.json"
        for cls in layer_classes(wildcards)
    ]


def counters_input(wildcards):
    if DEVICE == "cuda":
        return f"results/{wildcards.workload}/matched/kernel_metrics.parquet"
    return []


def counters_time_inputs(wildcards):
    """On CUDA the HTML report states the share of kernel time with counters (attribution + matched counters)."""
    if DEVICE != "cuda":
        return {}
    return {
        "attribution": f"results/{wildcards.workload}/attribution/kernels.parquet",
        "counters": counters_input(wildcards),
    }


def matching_input(wildcards):
    """On CUDA the report shows the counters per layer class (and the dedup.verify check)."""
    if DEVICE == "cuda":
        return f"results/{wildcards.workload}/matched/diagnostics.json"
    return []


def diagnostics_input(wildcards):
    """The timeline reader's findings go into the report."""
    return f"results/{wildcards.workload}/timeline/diagnostics.json"


def kineto_input(wildcards):
    """With an nsys timeline, path (a) reads the separate torch.profiler run."""
    if TIMELINE == "nsys":
        return f"results/{wildcards.workload}/timeline_kineto/kernels.parquet"
    return []


def shapes_input(wildcards):
    """The capture's shapes iteration (torch.profiler timelines; nsys ones use the Kineto run's shapes)."""
    if TIMELINE == "nsys":
        return []
    return f"results/{wildcards.workload}/capture/shapes.kineto.json.gz"


def runs_input(wildcards):
    """The run.json of every capture of the workload whose kernel counts must agree (attribute checks)."""
    runs = [f"results/{wildcards.workload}/capture/run.json"]
    if TIMELINE == "nsys":
        runs.append(f"results/{wildcards.workload}/capture/kineto_run.json")
    return runs


def run_cores():
    """This run's --cores, or None where the command gives none (--report, --summary, --list-*: no job runs)."""
    try:
        return workflow.cores
    except WorkflowError:
        return None


def all_cores(wildcards):
    """The threads of a job that must run alone (measure_ceilings, verify_variants): every core of the run.
    A function, evaluated when a job is made, so that commands that run no job work without --cores
    (`snakemake --report report.html`, as docs/outputs.md shows it)."""
    return workflow.cores


#: harness.threads (docs/config.md): the captures' and the verification's torch threads; None: the defaults (a
#: capture's job threads, every usable CPU for verify_variants). Absent from the harness params when not given, so
#: that a config without it keeps its cached captures.
HARNESS_THREADS = config["harness"].get("threads")


def capture_threads():
    """The captures' threads: harness.threads when set (the harness sets torch's count itself), else
    capture_timeline's threads (1 unless --set-threads or a profile's set-threads give it more), for
    measure_ceilings (workflow/ceilings.smk, included after capture.smk): the ceilings are measured with the threads
    the captures run with (Snakemake sets OMP_NUM_THREADS, which torch follows)."""
    if HARNESS_THREADS:
        return HARNESS_THREADS
    cores = rules.capture_timeline.rule.resources["_cores"]
    value = getattr(cores, "value", cores)
    if isinstance(value, int):
        return value
    print(
        f"warning: capture_timeline's threads ({value!r}) are not a number: measure_ceilings runs with 1 thread "
        "(ceilings.json records the count)",
        file=sys.stderr,
    )
    return 1


CATALOG = config["optimize"]["catalog"] or str(LIB / "optimize" / "catalog.yaml")


def optimize_report_inputs(wildcards):
    """The advised variant's profile (results/<workload>+<changes>/), named by advice.json (checkpoint advise)."""
    with open(checkpoints.advise.get(workload=wildcards.workload).output[0]) as f:
        advised = json.load(f)["advised_changes"]
    name, _ = advised_variant(
        wildcards.workload, workload_config(wildcards.workload), advised
    )
    folder = f"results/{name}"
    return {
        "variant_report": f"{folder}/report.md",
        "variant_html": f"{folder}/report.html",
        "variant_operators": f"{folder}/operators.parquet",
        "variant_coverage": f"{folder}/coverage.json",
        "base_report": f"results/{wildcards.workload}/report.md",
    }


def final_outputs():
    # Every run has the machine's ceilings (workflow/ceilings.smk): measured once per machine and device.
    return (
        [f"results/ceilings/{DEVICE}.json"]
        + [
            f"results/{w}/{name}"
            for w in WORKLOADS
            for name in (
                "operators.csv",
                "coverage.json",
                "report.md",
                "report.html",
                "trace.json",
                "advice.json",
            )
        ]
        + [f"results/{w}/optimize/report.html" for w in config["optimize"]["workloads"]]
    )


# ---------------------------------------------------------------- stale results
# Snakemake re-runs a job whose output is missing only when a job after it has to run: after a job failed
# (Snakemake removed its outputs) or was interrupted, the next run would say "Nothing to be done" over the
# old reports. Every output made, directly or not, from a missing or changed workflow output is removed
# (operator_profiler.stale, from Snakemake's records of what each output was made from), with one line per
# cause: when the default target's DAG is built (so this run rebuilds them; a dry run only says so), and
# after a failed or successful run (Snakefile onerror/onsuccess: none is left behind). Main process only:
# cluster jobs re-parse this file but never build the default target and run without hooks.
_STALE_SWEPT = False


def _output_roots():
    """The top-level folders the rules write into (the part of each output before its first wildcard)."""
    roots = set()
    for producer in workflow.rules:
        for out in producer.output:
            # (an output in the working directory itself has no folder)
            before_wildcards = str(out).split("{", 1)[0]
            if "/" in before_wildcards:
                roots.add(before_wildcards.split("/", 1)[0])
    return sorted(roots)


@functools.lru_cache(maxsize=None)
def _made_by_a_rule(path):
    """Whether a rule makes ``path`` or a directory output holding it."""
    candidates = [path, *map(str, Path(path).parents)][:-1]
    return any(r.is_producer(p) for r in workflow.rules for p in candidates)


def _recorded_outputs():
    """{existing output: what Snakemake recorded it was made from} under the rules' output folders."""
    from snakemake.io import IOFile

    made = {}
    for root in _output_roots():
        for folder, dirs, files in os.walk(root):
            for name, is_dir in [(d, True) for d in dirs] + [(f, False) for f in files]:
                path = os.path.join(folder, name)
                record = workflow.persistence.metadata(IOFile(path))
                if record is None or record.input is None:
                    continue
                made[path] = stale.Made(
                    tuple(record.input), dict(record.input_checksums or {})
                )
                if is_dir:  # a directory output: the files in it have no records
                    dirs.remove(name)
    return made


def _folder_locked():
    """Whether a Snakemake lock is held on this folder (Snakemake's persistence; unknown counts as not)."""
    try:
        return any(True for _ in workflow.persistence._read_locks())
    except Exception:  # a Snakemake without this internal: fall back to the lock folder
        return any((Path(".snakemake") / "locks").glob("*"))


def sweep_stale_results(when):
    """Find the stale results and remove them (``when``: "start", "error" or "success").

    A dry run, a --touch run (after touching) and the other DAG commands (--report, --summary, ...) only
    say what a run would remove.
    """
    global _STALE_SWEPT
    if not workflow.is_main_process or (when == "start" and _STALE_SWEPT):
        return
    # --touch may make them current: look after it
    if when == "start" and workflow.touch:
        return
    _STALE_SWEPT = True
    from snakemake.settings.enums import RerunTrigger

    found = stale.find_stale(
        _recorded_outputs(),
        _made_by_a_rule,
        check_changed=RerunTrigger.MTIME in workflow.rerun_triggers,
    )
    if not found:
        return
    # Another Snakemake holds the folder (or a killed one left its lock): removing now would pull files from
    # under that run; say so and leave them (Snakemake refuses to run here until --unlock anyway).
    # At "start" this run has not locked yet: any lock is another's.
    locked = when == "start" and _folder_locked()
    executing = (
        workflow.executor_plugin is not None
        and not (workflow.dryrun or workflow.touch)
        and not locked
    )
    if locked and when == "start":
        action = (
            "not removed: another Snakemake holds this folder (.snakemake/locks; after a killed run: "
            "snakemake --unlock), a run after it removes and rebuilds them"
        )
    elif not executing:
        action = "a run (without -n or --touch) removes and rebuilds them"
    else:
        stale.remove(found)
        rebuilt_by = "this run" if when == "start" else "the next run"
        action = f"removed them; {rebuilt_by} rebuilds them"
    print(stale.describe(found, action), file=sys.stderr)


def final_outputs_after_sweep(wildcards):
    """The default target's files, evaluated when its DAG is built: stale results are removed first."""
    sweep_stale_results("start")
    return final_outputs()
