"""Progress lines for long CPU stages (reading millions of trace events or export rows).

They go to the ``operator_profiler.progress`` logger: a rule's log gets them (the rule's log handler,
:mod:`.errors`), the ``opprof`` command line silences them so a terminal error stays one line.
"""

from __future__ import annotations

import logging
import time

progress_log = logging.getLogger("operator_profiler.progress")

#: Seconds between two progress lines of one loop: often enough to see a stuck read, rarely enough
#: that a million-event read writes a handful of lines.
INTERVAL_S = 5.0


def stage_done(what: str, start: float) -> None:
    """One line at the end of a stage step: ``what`` (counts) and the seconds since ``start``
    (a ``time.perf_counter()`` value)."""
    progress_log.info("%s in %.1f s", what, time.perf_counter() - start)


class Ticker:
    """Periodic progress of one loop: call :meth:`tick` as often as convenient (per chunk); a line
    is logged at most every ``interval_s`` seconds, e.g.
    ``reading trace.json.gz: 1,200,000 events, 41% of the file, 12.3 s``."""

    def __init__(self, what: str, interval_s: float | None = None):
        self.what = what
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.start = self._last = time.perf_counter()
        self.lines = 0

    def tick(self, done: int, unit: str, fraction: float | None = None) -> None:
        """``done``: items so far (``unit``: their plural name); ``fraction``: the share of the input read
        (0..1) when known."""
        now = time.perf_counter()
        if now - self._last < self.interval_s:
            return
        self._last = now
        self.lines += 1
        share = f", {fraction:.0%} of the file" if fraction is not None else ""
        progress_log.info("%s: %s %s%s, %.1f s", self.what, f"{done:,}", unit, share, now - self.start)
