"""User errors: reported as one paragraph and a non-zero exit, never a traceback."""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import traceback
from typing import Callable, Sequence

from .attribution.inductor import InductorArtifactError
from .capture import CaptureError, GpuStageUnavailable
from .clocks import ClockError, ClocksInterrupted
from .config import ConfigError
from .files import InputError
from .interrupts import interrupted, was_interrupted
from .timeline.kineto import TimelineError


# Defined here rather than in workloads/harness so that this module (imported by every rule
# script) does not import torch.
class WorkloadError(ValueError):
    """A workload cannot be built or run: bad factory path, factory raised, wrong return shape, the model or
    its loss raised. ``traceback_text``: the traceback of the user's exception behind it (the model's own
    frames), which :func:`run_rule` writes to the job's log; None when there is no user exception."""

    def __init__(self, message: str, traceback_text: str | None = None):
        super().__init__(message)
        self.traceback_text = traceback_text


class DeviceUnavailable(RuntimeError):
    """The configured device is not usable on this machine."""


USER_ERRORS = (ConfigError, TimelineError, WorkloadError, InductorArtifactError, GpuStageUnavailable,
               DeviceUnavailable, InputError, FileNotFoundError, ClockError, CaptureError)


_STDLIB = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"],
                                                       sysconfig.get_paths()["platstdlib"]})
_PACKAGE = os.path.realpath(os.path.dirname(__file__)) + os.sep


def user_frame(exc: BaseException, library_dirs: Sequence[str] = ()) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback that is the user's code: not in this package, not in
    ``library_dirs`` (e.g. torch's folder), not in the standard library, not generated code (``<...>``).
    The exception's cause/context chain is searched when its own traceback has no such frame (an error
    re-raised by a library). None when no frame qualifies."""
    skip = tuple(os.path.realpath(d) + os.sep for d in library_dirs) + _STDLIB + (_PACKAGE,)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            name = frame.filename
            if name.startswith("<") or os.path.realpath(name).startswith(skip):
                continue
            return frame
        exc = exc.__cause__ or exc.__context__
    return None


def from_user_exception(exc: BaseException, who: str, library_dirs: Sequence[str] = (),
                        during: str | None = None) -> WorkloadError:
    """A one-line :class:`WorkloadError` for an exception the user's code raised: ``<who> raised <Type>
    [during <during>] at <file>:<line> (in <function>): <first line of the message>``, carrying the full
    traceback (``traceback_text``) for the log."""
    frame = user_frame(exc, library_dirs)
    where = f" at {frame.filename}:{frame.lineno} (in {frame.name})" if frame else ""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    message = (lines[0] + (" ..." if len(lines) > 1 else "")) if lines else "(no message)"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    when = f" during {during}" if during else ""
    return WorkloadError(f"{who} raised {type(exc).__name__}{when}{where}: {message}", text)


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
        try:
            func(*args, **kwargs)
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
