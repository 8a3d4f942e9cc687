"""Where one workflow job's wall time goes: interpreter start-up, imports, work.

:func:`script_started` (called by ``interrupts.watch_job``, the first line of every job) notes the time and
how long the process had lived by then (start-up: the interpreter and Snakemake's script preamble);
:func:`work_started` (``rule_runner.run_rule``) ends the imports; :func:`phases_line` is the one line
``run_rule`` writes at the end of the job's log, which ``benchmarks/bench_workflow_jobs.py`` reads::

    job phases: start-up 0.21 s, imports 0.93 s, work 0.40 s; imported during the work: torch

The process's age comes from ``/proc/self/stat`` (start time in clock ticks since boot) and
``/proc/uptime`` (10 ms resolution); where they are absent (not Linux) start-up is not known and
the line says ``start-up ?``. Standard library only: it runs before the slow imports.
"""

from __future__ import annotations

import os
import sys
import time

PHASES_PREFIX = "job phases: "
_marks: dict = {}


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), or None where /proc does not tell."""
    try:
        with open("/proc/self/stat") as fh:
            stat = fh.read()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        # Field 22 (starttime); the command name (field 2) may hold spaces: count after its ')'.
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def script_started() -> None:
    """The job's own code begins: what came before is start-up."""
    _marks.clear()
    _marks["script"] = time.perf_counter()
    _marks["startup_s"] = process_age_s()


def work_started() -> None:
    """The imports are done and the work begins (a no-op when :func:`script_started` was not called,
    e.g. a rule function run in a test's process)."""
    if "script" in _marks:
        _marks["work"] = time.perf_counter()
        _marks["modules"] = set(sys.modules)


def _installed(name: str) -> bool:
    """An installed package (under site-packages), not the standard library or generated code
    (torch.compile's cache modules)."""
    path = getattr(sys.modules.get(name), "__file__", None) or ""
    return not name.startswith("_") and "-packages" in path


def phases_line() -> str | None:
    """``job phases: start-up S s, imports I s, work W s[; imported during the work: a, b]``, or None
    when the marks are missing. "imported during the work" names the installed top-level packages (site-packages) first imported
    after :func:`work_started` (lazy imports inside the work: their import time counts as work)."""
    if "work" not in _marks:
        return None
    end = time.perf_counter()
    startup = "?" if _marks["startup_s"] is None else f"{_marks['startup_s']:.2f}"
    line = (f"{PHASES_PREFIX}start-up {startup} s, imports {_marks['work'] - _marks['script']:.2f} s, "
            f"work {end - _marks['work']:.2f} s")
    late = sorted({m.split(".")[0] for m in set(sys.modules) - _marks["modules"]} - {m.split(".")[0] for m in _marks["modules"]})
    late = [m for m in late if _installed(m)]
    return line + (f"; imported during the work: {', '.join(late)}" if late else "")
