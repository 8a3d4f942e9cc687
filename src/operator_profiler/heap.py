"""Giving freed heap memory back to the operating system (glibc), so that a reader's RSS is what it holds.

glibc keeps freed memory in its heap, and once a large block has been freed it raises its mmap threshold
(up to 32 MiB), so later arrays of a few MB come from the heap too: a reader that builds and drops columns of
millions of rows is left with a hundred MB or more free but resident, on top of which the next stage
allocates. ``release_free_memory`` returns the free pages (``malloc_trim``, and Arrow's pool's). (Fixing the mmap threshold
instead, ``mallopt(M_MMAP_THRESHOLD)``, was measured: -30 MB of peak RSS but +2 s on the 10x Kineto trace,
every fresh mapping paying its page faults.) Does nothing without glibc.

``small_pages`` stops numpy from asking for transparent huge pages while a reader or an attribution runs: numpy
advises huge pages (``madvise``) for every array of 4 MiB or more, and where the kernel's THP defrag setting is
``madvise`` (its default) each such fresh array may wait for the kernel to compact memory into a 2 MiB page.
Measured on a 1M-kernel nsys export: ``read_nsys`` 9.3 -> 7.0 s of CPU, ``attribute_nvtx`` 1.9 -> 1.5 s; a
second call on the same arrays (no fresh memory) is as fast either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
import threading


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


_pages_lock = threading.Lock()
_pages_users = [0, None]  # calls in progress, numpy's setting before the first of them


def _numpy_huge_page_switch():
    """numpy's own switch of its huge-page advice (what its NUMPY_MADVISE_HUGEPAGE variable sets at import):
    called with a bool, it returns the previous setting; None where this numpy has none."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return None
    return _set_madvise_hugepage


@contextlib.contextmanager
def small_pages():
    """numpy asks for no transparent huge pages while this runs (a context manager, or a decorator:
    ``@small_pages()``). The setting is process-wide: the first of concurrent users saves it, the last
    one puts it back. Does nothing where numpy has no such switch."""
    switch = _numpy_huge_page_switch()
    if switch is None:
        yield
        return
    with _pages_lock:
        if _pages_users[0] == 0:
            _pages_users[1] = switch(False)
        _pages_users[0] += 1
    try:
        yield
    finally:
        with _pages_lock:
            _pages_users[0] -= 1
            if _pages_users[0] == 0:
                switch(_pages_users[1])
