"""Run one Snakemake rule's work: its log, one ``FAILED:`` line for a user error, one ``interrupted:`` line for
Ctrl-C, the user's own traceback kept in the log."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
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


def exit_finished_job() -> None:
    """End a job's process once :func:`run_rule` has returned (the work done, its outputs and log written and
    closed): as on a normal exit the non-daemon threads are joined, the ``atexit`` handlers run and the streams
    are flushed; then the process exits with status 0 without the interpreter's teardown, which frees every module
    and object one by one: after torch and torch.compile, 1.2-1.9 s of CPU time per job (2 cores, load 2). Only a
    job's entry point calls it (``python -m operator_profiler.gpu_jobs``, the scripts of compute_work and
    build_fusion_map), never a function a test runs in its own process.

    The threads are ended as a normal exit ends them (CPython's ``threading._shutdown``): first the callbacks
    registered with ``threading._register_atexit`` run, which is how ``concurrent.futures`` tells the idle workers
    of a thread pool nobody shut down to stop (Inductor's C++ compile leaves one after a kernel-cache miss), then the
    non-daemon threads are joined. Joining them without that first step waited on those workers forever."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    else:  # (an interpreter without it: join what can end by itself)
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)
