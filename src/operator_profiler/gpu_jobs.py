"""Entry point of the GPU rules (``select_clocks``, ``capture_timeline``, ``capture_kineto``,
``replay_ncu``, ``measure_ceilings``, ``verify_variants``): ``python -m operator_profiler.gpu_jobs RULE PARAMS_JSON FILES_JSON LOG``.

These rules use ``shell:`` rather than ``script:`` on purpose. Snakemake's ``code`` rerun trigger for a
``script:`` rule is the script file's mtime, so a ``touch`` or a ``git checkout`` of the script re-runs every
job of the rule, here a GPU capture or an ncu replay. For a ``shell:`` rule it is the command text, which is
the same for all six rules (``"$OPPROF_PYTHON" -m operator_profiler.gpu_jobs RULE {params.job:q} {params.files:q} {log:q}``), and
this module is a declared, checksummed input of each of them: an edit re-runs them, a touch does not.

``PARAMS_JSON`` holds the rule's params (workflow/common.smk ``gpu_job``: compared by the params trigger),
``FILES_JSON`` ``{"wildcards": {...}, "input": {...}, "output": {...}}`` with the named inputs and outputs as
paths (``gpu_files``).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from .interrupts import watch_job


def _select_clocks(j):
    from .capture import clocks

    return clocks.select_clocks, (json.loads(j.params.clocks), j.params.device, j.output.target)


def _capture_timeline(j):
    from .capture import jobs as capture

    o = j.output
    return capture.capture_timeline, (
        j.wildcards.workload, json.loads(j.params.workload), json.loads(j.params.harness), j.params.device,
        j.params.timeline, o.trace, o.run, o.layers, o.clocks, j.input.clocks, j.params.timeline_requested,
        getattr(o, "shapes", None), getattr(o, "debug", None))


def _capture_kineto(j):
    from .capture import jobs as capture

    o = j.output
    return capture.capture_kineto, (
        j.wildcards.workload, json.loads(j.params.workload), json.loads(j.params.harness), j.params.device,
        o.trace, o.run, o.clocks, j.input.clocks, getattr(o, "debug", None))


def _replay_ncu(j):
    from .ncu.replay import replay_files

    i, o, p = j.input, j.output, j.params
    return replay_files, (i.plan, i.clocks, json.loads(p.workload), json.loads(p.harness), j.wildcards.workload,
                          p.device, o.csv, o.replay, o.clocks, getattr(p, "ncu", None), getattr(p, "metrics_cache", None))


def _measure_ceilings(j):
    from .capture import ceilings

    p = j.params
    return ceilings.measure_ceilings_job, (p.device, p.ceilings, p.clocks, p.machine, j.output.ceilings,
                                           j.output.clocks, p.threads)


def _verify_variants(j):
    from .optimize.verify import verify_variants_job

    return verify_variants_job, (j.wildcards.workload, j.params.workload, j.params.optimize, j.params.device,
                                 j.input.advice, j.output.verification, getattr(j.params, "threads", None))


RULES = {
    "select_clocks": _select_clocks,
    "capture_timeline": _capture_timeline,
    "capture_kineto": _capture_kineto,
    "replay_ncu": _replay_ncu,
    "measure_ceilings": _measure_ceilings,
    "verify_variants": _verify_variants,
}


def parse_job(params_text: str, files_text: str) -> SimpleNamespace:
    spec = {**json.loads(files_text), "params": json.loads(params_text)}
    return SimpleNamespace(**{k: SimpleNamespace(**spec.get(k, {})) for k in ("wildcards", "input", "output", "params")})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4 or argv[0] not in RULES:
        sys.exit(f"usage: python -m operator_profiler.gpu_jobs {{{','.join(RULES)}}} PARAMS_JSON FILES_JSON LOG")
    rule, params_text, files_text, log_path = argv
    # First, before the slow imports: Ctrl-C from here on is one line, not a traceback, and removes the
    # job's outputs. (A FILES_JSON that does not parse fails below, in run_rule, with one line.)
    try:
        files = json.loads(files_text)
        outputs = [p for v in files["output"].values() for p in ([v] if isinstance(v, str) else v)]
        watch_job(rule, files["wildcards"], outputs, log_path)
    except (ValueError, KeyError, TypeError, AttributeError):
        watch_job(rule, {}, [], log_path)
    from .rule_runner import run_rule

    def job():
        func, args = RULES[rule](parse_job(params_text, files_text))
        func(*args)

    run_rule(log_path, job)


if __name__ == "__main__":
    main()
    from .rule_runner import exit_finished_job

    exit_finished_job()  # only after a successful job: a failed one exited in main with its status
