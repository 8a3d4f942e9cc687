"""Giving freed heap memory back to the operating system (glibc), so that a reader's RSS is what it holds.

glibc keeps freed memory in its heap, and once a large block has been freed it raises its mmap threshold
(up to 32 MiB), so later arrays of a few MB come from the heap too: a reader that builds and drops columns of
millions of rows is left with a hundred MB or more free but resident, on top of which the next stage
allocates. ``release_free_memory`` returns the free pages (``malloc_trim``, and Arrow's pool's). (Fixing the mmap threshold
instead, ``mallopt(M_MMAP_THRESHOLD)``, was measured: -30 MB of peak RSS but +2 s on the 10x Kineto trace,
every fresh mapping paying its page faults.) Does nothing without glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> None:
    """Return the heap's free pages to the OS (glibc ``malloc_trim(0)``), and Arrow's (its allocator keeps
    freed blocks for reuse); milliseconds."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    arrow = sys.modules.get("pyarrow")  # (never imported for this)
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
