"""heap.small_pages: numpy's huge-page advice is off while a reader or an attribution runs, and back as it
was after, also after an error and when calls overlap on two threads."""

from __future__ import annotations

import threading

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


@pytest.mark.parametrize("before", [True, False])
def test_small_pages_turns_the_advice_off_and_restores_it(before):
    saved = switch(before)
    try:
        with heap.small_pages():
            assert advice() is False
            with heap.small_pages():
                assert advice() is False
            assert advice() is False  # the outer call still runs
        assert advice() is before
    finally:
        switch(saved)


def test_a_reader_restores_the_advice_after_an_error(tmp_path):
    saved = switch(True)
    try:
        with pytest.raises(NsysExportError):
            read_nsys(tmp_path / "missing.sqlite")
        assert advice() is True
    finally:
        switch(saved)


def test_overlapping_calls_on_two_threads_restore_it_once_both_end():
    saved = switch(True)
    first_in, second_done = threading.Event(), threading.Event()
    seen = {}

    def first():
        with heap.small_pages():
            first_in.set()
            second_done.wait(5)
            seen["first, after the second ended"] = advice()

    def second():
        first_in.wait(5)
        with heap.small_pages():
            seen["second"] = advice()
        second_done.set()

    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == {"second": False, "first, after the second ended": False}
        assert advice() is True
    finally:
        switch(saved)
