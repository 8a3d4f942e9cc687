"""The Kineto reader's range nesting (timeline.kineto._stack_nesting, computed for all ranges at once) against
the explicit stack it stands for, written out here: the same depth and parent on every input, including the
integer-µs cases (a child ending after its parent, zero-length events at a parent's end or start, equal
timestamps), rows in any order and ranges that end before they start."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from operator_profiler.timeline import kineto
from operator_profiler.timeline.kineto import _nest, _stack_nesting


def _explicit_stack(new_thread, starts, ends):
    """The reader's rule, one range at a time: pop the tops that end before this range starts (or exactly at its
    start, unless it is zero-length), then the top is its parent and its depth is the stack's size."""
    depth, parent, stack = [], [], []
    for new, start, end in zip(new_thread.tolist(), starts.tolist(), ends.tolist()):
        if new:
            stack = []
        while stack and (stack[-1][1] < start or (stack[-1][1] == start and end != start)):
            stack.pop()
        depth.append(len(stack))
        parent.append(stack[-1][0] if stack else -1)
        stack.append((len(depth) - 1, end))
    return np.array(depth, dtype=np.int64), np.array(parent, dtype=np.int64)


def _random_case(rng, n, threads, resolution, shuffle):
    tid = np.sort(rng.integers(0, threads, n))
    start = np.sort(rng.integers(0, 3 * n, n)) * resolution
    # many zero lengths and short ranges: equal timestamps, children overrunning their parent's end
    dur = (rng.geometric(0.25, n) - 1) * resolution * rng.integers(0, 3, n) + rng.integers(0, 2, n) * (resolution // 3)
    end = start + dur
    order = np.lexsort((-end, start, tid))
    tid, start, end = tid[order], start[order], end[order]
    if shuffle:  # any row order (the late-parent reordering leaves starts out of order)
        perm = rng.permutation(n)
        start, end = start[perm], end[perm]
    return np.r_[True, tid[1:] != tid[:-1]], start, end


@pytest.mark.parametrize("resolution", [1, 1000])
@pytest.mark.parametrize("shuffle", [False, True])
def test_nesting_equals_the_explicit_stack_on_random_ranges(resolution, shuffle):
    rng = np.random.default_rng(resolution + shuffle)
    for _ in range(400):
        new_thread, start, end = _random_case(rng, int(rng.integers(1, 120)), int(rng.integers(1, 4)), resolution,
                                              shuffle)
        depth, parent = _stack_nesting(new_thread, start, end)
        want_depth, want_parent = _explicit_stack(new_thread, start, end)
        assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth)


def test_nesting_of_integer_us_overruns_and_zero_length_ranges():
    """A child ending 1 µs after its parent stays its child (and the next range nests in the child, the top);
    a zero-length range at its parent's end is inside it; a positive-length one starting there is a sibling; a
    zero-length range sharing a start with longer ones is the child of the last of them."""
    start = np.array([0, 1, 5, 6, 10, 10, 20, 20, 20, 22], dtype=np.int64) * 1000
    end = np.array([5, 6, 6, 6, 12, 10, 22, 21, 20, 23], dtype=np.int64) * 1000
    new_thread = np.zeros(len(start), dtype=bool)
    new_thread[0] = True
    depth, parent = _stack_nesting(new_thread, start, end)
    assert parent.tolist() == [-1, 0, 1, 2, -1, 4, -1, 6, 7, -1]
    assert depth.tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2, 0]
    want_depth, want_parent = _explicit_stack(new_thread, start, end)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth)


def test_nesting_of_long_sibling_runs_and_deep_chains():
    """Thousands of siblings under one parent and a chain thousands deep (pointer jumping and list ranking walk
    them in a few rounds): the explicit stack's depths and parents."""
    n = 5000
    start = np.r_[0, 1 + np.arange(n) * 10, 10 * n + 10 + np.arange(n)]
    end = np.r_[10 * n + 5, 6 + np.arange(n) * 10, np.full(n, 20 * n)]
    new_thread = np.r_[True, np.zeros(n, dtype=bool), True, np.zeros(n - 1, dtype=bool)]
    depth, parent = _stack_nesting(new_thread, start, end)
    want_depth, want_parent = _explicit_stack(new_thread, start, end)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth)
    assert depth.max() == n - 1


def test_nesting_of_ranges_that_end_before_they_start_is_the_explicit_stack():
    """``end < start`` (the reader makes such a range zero-length first; a caller may not) breaks the rule the
    computation rests on: the explicit stack reads them."""
    start = np.array([0, 2, 3, 8, 9], dtype=np.int64)
    end = np.array([10, 1, 9, 2, 9], dtype=np.int64)
    new_thread = np.array([True, False, False, False, False])
    depth, parent = _stack_nesting(new_thread, start, end)
    want_depth, want_parent = _explicit_stack(new_thread, start, end)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth)


def test_nesting_spanning_the_whole_int64_range():
    """Times near both ends of int64 (no packed key fits): the same nesting, without overflow."""
    lo, hi = -(2**63) + 10, 2**63 - 10
    start = np.array([lo, lo + 1, 0, hi - 5, hi - 5], dtype=np.int64)
    end = np.array([hi - 1, 0, 0, hi - 1, hi - 5], dtype=np.int64)
    new_thread = np.array([True, False, False, True, False])
    depth, parent = _stack_nesting(new_thread, start, end)
    want_depth, want_parent = _explicit_stack(new_thread, start, end)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth)


def test_nest_frame_keeps_rows_parents_and_late_parents():
    """_nest on a frame: rows in nesting order with range_id their position, parent_id a nullable range id; a
    parent recorded up to the tolerance after its child comes first and encloses it."""
    tol = kineto.NEST_TOLERANCE_NS
    ranges = pd.DataFrame({"pid": [1, 1, 1, 1, 2], "tid": [1, 1, 1, 1, 1],
                           "start_ns": [100, 0, 10_000 + tol // 2, 10_000, 5],
                           "end_ns": [150, 1_000, 30_000, 20_000, 6], "order": [0, 1, 2, 3, 4]})
    out = _nest(ranges)
    assert out["start_ns"].tolist() == [0, 100, 10_000 + tol // 2, 10_000, 5]
    assert out["range_id"].tolist() == list(range(5))
    assert out["depth"].tolist() == [0, 1, 0, 1, 0]
    assert out["parent_id"].tolist() == [pd.NA, 0, pd.NA, 2, pd.NA]
    assert str(out["parent_id"].dtype) == "Int64" and out["depth"].dtype == np.int64
