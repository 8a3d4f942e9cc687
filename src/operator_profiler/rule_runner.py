"""Run one Snakemake rule's work: its log, one ``FAILED:`` line for a user error, one ``interrupted:`` line for
Ctrl-C, the user's own traceback kept in the log."""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Callable

from .errors import USER_ERRORS, ClocksInterrupted
from .interrupts import interrupted, was_interrupted
from .job_phases import phases_line, work_started


def _fail(log, log_path: str, line: str) -> None:
    print(line, file=log)
    print(line if log_path in line else f"{line}\n  (log: {log_path})", file=sys.__stderr__)
    sys.exit(1)


def run_rule(log_path: str, func: Callable, *args, user_error_hint: str | None = None, **kwargs) -> None:
    """Run one Snakemake rule's work with its stderr and logging in ``log_path``.

    ``user_error_hint``: what to do in the workflow, appended to a user error's FAILED line (the errors name the
    fix for a file handed over by hand; a capture the workflow wrote is fixed by capturing again).

    A user error ends the log with one ``FAILED: <what>`` line and exits 1 (no traceback of ours); when
    the user's own code raised (a model or factory: :class:`WorkloadError` ``traceback_text``), its
    traceback goes into the log above that line, and the line names the user's file:line and the log.
    Any other exception keeps its traceback in the log (a bug to report) and also ends with a FAILED line.
    The FAILED line is also printed on the terminal (Snakemake itself only says "check log file").
    Ctrl-C (SIGINT) or SIGTERM ends the job with one ``interrupted:`` line instead, its outputs removed
    and exit status 130 or 143 (:mod:`operator_profiler.interrupts`).
    """
    with open(log_path, "w", buffering=1) as log:
        sys.stderr = log
        logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(message)s", force=True)
        work_started()
        try:
            func(*args, **kwargs)
            phases = phases_line()
            if phases:  # read by benchmarks/bench_workflow_jobs.py
                print(phases, file=log)
            if was_interrupted():  # the KeyboardInterrupt was swallowed: the outputs may be incomplete
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            sys.exit(interrupted())
        except ClocksInterrupted as exc:  # SIGTERM while clocks were locked (restored by now)
            sys.exit(interrupted(exc.signum))
        except USER_ERRORS as exc:
            if was_interrupted():  # a library turned the KeyboardInterrupt into another error
                sys.exit(interrupted())
            user_traceback = getattr(exc, "traceback_text", None)
            if user_traceback:
                print("The workload's own code raised (traceback, most recent call last):", file=log)
                print(user_traceback.rstrip(), file=log)
                _fail(log, log_path, f"FAILED: {exc} (traceback in {log_path})")
            _fail(log, log_path, f"FAILED: {exc}" + (f". In this workflow: {user_error_hint}" if user_error_hint else ""))
        except Exception as exc:  # a bug: keep the traceback for the report
            if was_interrupted():
                sys.exit(interrupted())
            traceback.print_exc(file=log)
            _fail(log, log_path, f"FAILED: internal error {type(exc).__name__}: {exc} (traceback in the log)")
        finally:
            sys.stderr = sys.__stderr__
            # The log file closes here: detach its handler, so later logging (another rule run in the
            # same process, as in tests) does not write to a closed file.
            root = logging.getLogger()
            for handler in list(root.handlers):
                if getattr(handler, "stream", None) is log:
                    root.removeHandler(handler)
