"""Ctrl-C in a workflow job: one line, a non-zero exit and no partial output, never a traceback.

A terminal's Ctrl-C sends SIGINT to Snakemake and to the job it runs; SIGTERM is how Snakemake or a batch
system (``scancel``) stops a job. :func:`watch_job` (the first call of every job, before the slow imports)
makes either signal a :class:`KeyboardInterrupt`, so ``finally`` blocks run and ``subprocess.run`` kills its
child; :func:`interrupted` (called by ``rule_runner.run_rule``, or by the exception hook when the signal comes
during the imports) then removes the job's declared outputs and prints
``interrupted: <rule> <wildcards>; re-run snakemake to redo it`` on the terminal and in the job's log; the
job exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM).

Kept free of heavy imports (no pandas, no torch) so that it is installed within milliseconds of the start.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Iterable, Mapping

from .job_phases import script_started

_job: dict | None = None  # this process's job: label, outputs, log path
# The last signal received (a KeyboardInterrupt raised by code counts as SIGINT), and whether one came: a
# library's bare ``except:`` may swallow the KeyboardInterrupt, and the job must not then end as if complete.
_signal = {"number": signal.SIGINT, "received": False}


def watch_job(rule: str, wildcards: Mapping[str, str], outputs: Iterable[str], log_path: str | None) -> None:
    """Install the one-line handling of SIGINT and SIGTERM for the job ``rule`` with ``wildcards``.

    ``outputs`` (files or directories) are removed on an interrupt; ``log_path`` gets the line too.
    """
    global _job
    script_started()  # the job's start-up ends here (job_phases: where a job's wall time goes)
    label = " ".join([rule, "/".join(str(v) for v in dict(wildcards).values())]).strip()
    _job = {"label": label, "outputs": [str(o) for o in outputs], "log": log_path}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupt)
    sys.excepthook = _excepthook


def watch_snakemake_job(smk) -> None:
    """:func:`watch_job` for a ``script:`` rule, from its ``snakemake`` object."""
    watch_job(smk.rule, dict(smk.wildcards.items()), list(smk.output), smk.log[0] if smk.log else None)


def _raise_interrupt(number, frame):
    _signal["number"], _signal["received"] = number, True
    raise KeyboardInterrupt


def was_interrupted() -> bool:
    """Whether SIGINT or SIGTERM came since :func:`watch_job` (even if something swallowed the exception)."""
    return bool(_signal["received"])


def _excepthook(kind, value, tb):
    if issubclass(kind, KeyboardInterrupt):  # the signal came before rule_runner.run_rule took over
        code = interrupted()
        sys.stdout.flush()
        os._exit(code)  # the interpreter is already exiting: SystemExit would not be honoured here
    sys.__excepthook__(kind, value, tb)


def interrupted(number: int | None = None) -> int:
    """Remove the job's outputs and print the one line (terminal and log); the exit status to use:
    128 + the signal number (``number``, else the last signal received)."""
    # A second Ctrl-C must not stop the clean-up (in a watched job process only: not in a test's process).
    if _job is not None and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    job = _job or {"label": "job", "outputs": [], "log": None}
    for out in job["outputs"]:
        path = Path(out)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
    line = f"interrupted: {job['label']}; re-run snakemake to redo it"
    if job["log"]:
        try:
            with open(job["log"], "a") as log:
                print(line, file=log)
        except OSError:
            pass  # the terminal line still says it
    # One write of the whole line: print() writes the text and the newline separately, and Snakemake's own
    # "Terminating processes..." (the same terminal) could land between the two, on our line.
    sys.__stderr__.write(line + "\n")
    sys.__stderr__.flush()
    return 128 + int(_signal["number"] if number is None else number)
