"""heap.bulk_memory: numpy's huge-page advice is off (and, where asked, Arrow allocates with the system allocator)
while a reader or an attribution runs; both are back as they were after, also after an error and when calls
overlap on two threads."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from operator_profiler import heap
from operator_profiler.errors import NsysExportError
from operator_profiler.timeline.nsys import read_nsys

switch = heap._numpy_huge_page_switch()
pytestmark = pytest.mark.skipif(switch is None, reason="this numpy has no huge-page switch")


def advice() -> bool:
    """numpy's current setting (the switch returns the previous one)."""
    current = switch(True)
    switch(current)
    return bool(current)


def pool() -> str:
    return pa.default_memory_pool().backend_name


@pytest.mark.parametrize("before", [True, False])
def test_bulk_memory_sets_both_and_restores_them(before):
    saved = switch(before)
    pool_before = pool()
    try:
        with heap.bulk_memory(system_pool=True):
            assert (advice(), pool()) == (False, "system")
            with heap.bulk_memory():
                assert (advice(), pool()) == (False, "system")
            assert (advice(), pool()) == (False, "system")  # the outer call still runs
        assert (advice(), pool()) == (before, pool_before)
        with heap.bulk_memory():
            assert (advice(), pool()) == (False, pool_before)  # Arrow's pool only where asked
            with heap.bulk_memory(system_pool=True):
                assert (advice(), pool()) == (False, "system")
            assert (advice(), pool()) == (False, pool_before)
        assert (advice(), pool()) == (before, pool_before)
    finally:
        switch(saved)


def test_a_reader_restores_both_after_an_error(tmp_path):
    saved = switch(True)
    pool_before = pool()
    try:
        with pytest.raises(NsysExportError):
            read_nsys(tmp_path / "missing.sqlite")
        assert (advice(), pool()) == (True, pool_before)
    finally:
        switch(saved)


def test_overlapping_calls_on_two_threads_restore_both_once_both_end():
    saved = switch(True)
    pool_before = pool()
    first_in, second_done = threading.Event(), threading.Event()
    seen = {}

    def first():
        with heap.bulk_memory(system_pool=True):
            first_in.set()
            second_done.wait(5)
            seen["first, after the second ended"] = advice(), pool()

    def second():
        first_in.wait(5)
        with heap.bulk_memory(system_pool=True):
            seen["second"] = advice(), pool()
        second_done.set()

    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == {"second": (False, "system"), "first, after the second ended": (False, "system")}
        assert (advice(), pool()) == (True, pool_before)
    finally:
        switch(saved)


def test_a_setting_that_cannot_be_put_back_leaves_nothing_saved():
    """QA: a swap that failed while restoring left its saved value behind, though ``saved`` is None while no user
    is in (release_free_memory would release a pool no longer set aside); the next user saves and restores the
    setting it finds."""
    from operator_profiler.shared_setting import SharedSetting

    state = {"value": 0}

    def swap(value):
        if value == 0 and state["value"] != 0:
            raise RuntimeError("cannot go back to 0")
        state["value"], previous = value, state["value"]
        return previous

    setting = SharedSetting(swap)
    with pytest.raises(RuntimeError):
        with setting.held(7):
            assert state["value"] == 7
    assert setting.saved is None and state["value"] == 7
    with setting.held(8):
        assert state["value"] == 8
    assert state["value"] == 7 and setting.saved is None
