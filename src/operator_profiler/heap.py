"""Giving freed heap memory back to the operating system (glibc), so that a reader's RSS is what it holds.

glibc keeps freed memory in its heap, and once a large block has been freed it raises its mmap threshold
(up to 32 MiB), so later arrays of a few MB come from the heap too: a reader that builds and drops columns of
millions of rows is left with a hundred MB or more free but resident, on top of which the next stage
allocates. ``release_free_memory`` returns the free pages (``malloc_trim``, and Arrow's pool's). (Fixing the mmap threshold
instead, ``mallopt(M_MMAP_THRESHOLD)``, was measured: -30 MB of peak RSS but +2 s on the 10x Kineto trace,
every fresh mapping paying its page faults.) Does nothing without glibc.

``bulk_memory`` sets two allocators' behaviour while a reader or an attribution runs (both measured on a 1M-kernel
nsys export, 2 cores): numpy asks for no transparent huge pages (it advises them, ``madvise``, for every array of
4 MiB or more, and where the kernel's THP defrag setting is ``madvise``, its default, each fresh array may wait for
the kernel to compact memory into a 2 MiB page: ``read_nsys`` 9.3 -> 7.0 s of CPU, ``attribute_nvtx`` 1.9 ->
1.5 s), and for the nsys reader and NVTX attribution Arrow allocates with the system allocator rather than its
default mimalloc (``read_nsys`` 7.2-7.6 -> 6.1-6.4 s of CPU, ``attribute_nvtx`` 1.9 -> 1.45 s, same peak RSS).
Not on the Kineto path: there it saved 0.2-0.4 s of 5.9 s on the 10x trace but raised the peak RSS by 65 MB
(590 -> 655 MB).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys

from .shared_setting import SharedSetting


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
        # Under bulk_memory, the pool of what came before too (read once: another thread may put it back meanwhile).
        set_aside = _ARROW_POOL.saved
        if set_aside is not None:
            set_aside.release_unused()


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


def _swap_huge_page_advice(value):
    switch = _numpy_huge_page_switch()
    return switch(value) if switch is not None else None


def _swap_arrow_pool(pool):
    import pyarrow

    previous = pyarrow.default_memory_pool()
    pyarrow.set_memory_pool(pool)
    return previous


_HUGE_PAGE_ADVICE = SharedSetting(_swap_huge_page_advice)
_ARROW_POOL = SharedSetting(_swap_arrow_pool)


@contextlib.contextmanager
def bulk_memory(system_pool: bool = False):
    """The allocator settings for building and dropping columns of millions of rows (see the module's
    docstring) while this runs: a context manager, or a decorator (``@bulk_memory()``). ``system_pool``:
    Arrow allocates with the system allocator too. The settings are process-wide, each shared apart
    (:class:`SharedSetting`: the first of concurrent users of one saves it, the last one puts it back)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_HUGE_PAGE_ADVICE.held(False))
        if system_pool:
            import pyarrow

            stack.enter_context(_ARROW_POOL.held(pyarrow.system_memory_pool()))
        yield
