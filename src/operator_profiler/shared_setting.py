"""A process-wide setting changed for the duration of some calls that may overlap (threads, nested calls)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable


class SharedSetting:
    """A process-wide setting that overlapping users share: the first one in saves the setting and puts its
    own value in place, the last one out puts the saved setting back (a later user's value is not applied).
    ``swap(value)`` sets the setting and returns the one it replaced."""

    def __init__(self, swap: Callable[[Any], Any]):
        self._swap = swap
        self._lock = threading.Lock()
        self._users = 0
        self.saved: Any = None  # the setting before the first user, while one is in; None otherwise

    @contextlib.contextmanager
    def held(self, value: Any):
        with self._lock:
            if self._users == 0:
                self.saved = self._swap(value)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    saved, self.saved = self.saved, None  # (cleared even when putting it back fails)
                    self._swap(saved)
