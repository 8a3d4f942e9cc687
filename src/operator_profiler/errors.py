"""User errors: reported as one paragraph and a non-zero exit, never a traceback."""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Callable

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
    """A workload cannot be built: bad factory path, factory raised, wrong return shape, forward raised."""


class DeviceUnavailable(RuntimeError):
    """The configured device is not usable on this machine."""


USER_ERRORS = (ConfigError, TimelineError, WorkloadError, InductorArtifactError, GpuStageUnavailable,
               DeviceUnavailable, InputError, FileNotFoundError, ClockError, CaptureError)


def _fail(log, log_path: str, line: str) -> None:
    print(line, file=log)
    print(f"{line}\n  (log: {log_path})", file=sys.__stderr__)
    sys.exit(1)


def run_rule(log_path: str, func: Callable, *args, **kwargs) -> None:
    """Run one Snakemake rule's work with its stderr and logging in ``log_path``.

    A user error ends the log with one ``FAILED: <what>`` line and exits 1 (no traceback); any other
    exception keeps its traceback in the log (a bug to report) and also ends with a FAILED line.
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
            _fail(log, log_path, f"FAILED: {exc}")
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
