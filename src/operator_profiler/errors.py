"""The user-error hierarchy: every error a user can cause, reported as one line and a non-zero exit, never a
traceback of ours. Imports nothing of the package (every module raises these; the rule runner,
:mod:`operator_profiler.rule_runner`, catches them), so it is no import circle and no heavy import."""

from __future__ import annotations

import os
import sysconfig
import traceback
from typing import Sequence


class UserError(Exception):
    """Base of the errors a user can fix (bad input, config, environment); the message names the file or key and
    the fix. Each subclass also derives from the builtin it always was (ValueError, RuntimeError)."""


class ConfigError(UserError, ValueError):
    """The config is invalid; the message names the key and how to fix it."""


class InputError(UserError, ValueError):
    """An input file is missing, unreadable, or not the table/JSON the stage expects."""


class TimelineError(UserError, ValueError):
    """The trace file is not a readable Kineto trace; the message names the file and the field."""


class NsysExportError(InputError):
    """The nsys SQLite export is unreadable or not an nsys export; the message names the file and the table."""


class NcuCsvError(InputError):
    """An ncu CSV is unreadable or not an ncu export; the message names the file and the row."""


class NcuReplayError(InputError):
    """The ncu replay could not run or its output is unusable; the message names the class and the fix."""


class InductorArtifactError(UserError, ValueError):
    """A TorchInductor debug artifact is missing, unreadable or not in a known format."""


class WorkloadError(UserError, ValueError):
    """A workload cannot be built or run: bad factory path, factory raised, wrong return shape, the model or
    its loss raised. ``traceback_text``: the traceback of the user's exception behind it (the model's own
    frames), which the rule runner writes to the job's log; None when there is no user exception."""

    def __init__(self, message: str, traceback_text: str | None = None):
        super().__init__(message)
        self.traceback_text = traceback_text


class DeviceUnavailable(UserError, RuntimeError):
    """The configured device is not usable on this machine."""


class GpuStageUnavailable(UserError, RuntimeError):
    """A GPU stage that this version cannot run yet (or cannot run on this machine)."""


class CaptureError(UserError, RuntimeError):
    """A capture tool (nsys) is missing, failed, or wrote no report."""


class ClockError(UserError, RuntimeError):
    """nvidia-smi is missing, failed, or the GPU cannot give the clocks asked for."""


class ClockPermissionError(ClockError):
    """nvidia-smi refused to lock clocks: no permission, or not supported on this GPU."""


class ClocksInterrupted(SystemExit):
    """SIGTERM arrived while clocks were locked. A :class:`SystemExit` (exit status 143 = 128 + SIGTERM),
    so ``finally`` blocks run, clocks are restored, and the process ends without a traceback."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


#: What the rule runner and the CLI report as one line (a missing file named by the OS counts too).
USER_ERRORS = (UserError, FileNotFoundError)


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


