"""Internals of the nsys reader that must give the same answer on their fast and their plain path:
vectorized NVTX nesting vs an explicit stack, ADBC (Arrow) vs sqlite3 reads, vectorized emit_nvtx
name parsing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from operator_profiler.timeline import nsys
from operator_profiler.timeline.nsys import _nest_push_pop, _nest_with_stack, parse_range_texts


def _stack_reference(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """Nesting of every push/pop stack by the explicit stack only."""
    pp = np.flatnonzero((ranges["kind"] == "nvtx_push_pop").to_numpy())
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([ranges["pid"].to_numpy()[pp], ranges["tid"].to_numpy()[pp],
                                                       ranges["domain"].to_numpy()[pp]]))
    order = np.argsort(codes, kind="stable")
    rows = pp[order]
    local_parent, local_depth, partial = _nest_with_stack(codes[order], ranges["start_ns"].to_numpy()[rows],
                                                          ranges["effective_end_ns"].to_numpy()[rows])
    parent = np.full(len(ranges), -1)
    depth = np.zeros(len(ranges), dtype=np.int64)
    parent[rows] = np.where(local_parent >= 0, rows[np.maximum(local_parent, 0)], -1)
    depth[rows] = local_depth
    return depth, parent, partial


def _random_ranges(rng: np.random.Generator, n_threads: int, per_thread: int, noise: bool) -> pd.DataFrame:
    """Properly nested push/pop ranges per (thread, domain) from random push/pop sequences, plus
    (with ``noise``) some ranges that overlap without nesting and adjacent/zero-length ones."""
    rows = []
    for thread in range(n_threads):
        for domain in ("default", "opprof"):
            t, stack = 0, []
            for _ in range(per_thread):
                t += int(rng.integers(0, 3))  # equal timestamps happen
                if stack and rng.random() < 0.5:
                    s = stack.pop()
                    rows.append((thread, domain, s, t))
                else:
                    stack.append(t)
            while stack:
                t += 1
                rows.append((thread, domain, stack.pop(), t))
            if noise:
                for _ in range(3):
                    s = int(rng.integers(0, t))
                    rows.append((thread, domain, s, s + int(rng.integers(0, 20))))
    df = pd.DataFrame(rows, columns=["tid", "domain", "start_ns", "effective_end_ns"])
    df["pid"] = 7
    df["kind"] = np.where(rng.random(len(df)) < 0.05, "nvtx_start_end", "nvtx_push_pop")
    return df.sort_values(["pid", "tid", "start_ns", "effective_end_ns"], ascending=[True, True, True, False],
                          kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("noise", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_vectorized_nesting_equals_the_explicit_stack(seed, noise):
    ranges = _random_ranges(np.random.default_rng(seed), n_threads=3, per_thread=400, noise=noise)
    depth, parent, partial = _nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges)
    assert np.array_equal(parent, want_parent)
    assert np.array_equal(depth, want_depth)
    assert partial == want_partial
    if not noise:
        assert partial == 0


def test_nesting_of_every_real_export_equals_the_explicit_stack(real_nsys_files):
    for path in real_nsys_files:
        ranges = nsys.read_nsys(path).ranges
        if ranges.empty:
            continue
        depth, parent, _ = _nest_push_pop(ranges)
        want_depth, want_parent, _ = _stack_reference(ranges)
        assert np.array_equal(parent, want_parent), path.name
        assert np.array_equal(depth, want_depth), path.name
        # And the written parent ids are those rows' range ids (range_id = row number).
        got = ranges["parent_id"].fillna(-1).to_numpy(dtype=np.int64)
        assert np.array_equal(got, parent), path.name


def test_arrow_and_sqlite3_reads_give_the_same_timeline(real_nsys_files, monkeypatch):
    with_arrow = {p.name: nsys.read_nsys(p) for p in real_nsys_files}
    monkeypatch.setattr(nsys._Export, "_query_arrow", lambda self, sql: None)
    for path in real_nsys_files:
        plain = nsys.read_nsys(path)
        fast = with_arrow[path.name]
        for table in ("kernels", "launches", "ranges", "activities"):
            a, b = getattr(fast, table), getattr(plain, table)
            assert list(a.columns) == list(b.columns), (path.name, table)
            pd.testing.assert_frame_equal(a.astype(object).where(a.notna(), None).reset_index(drop=True),
                                          b.astype(object).where(b.notna(), None).reset_index(drop=True),
                                          check_dtype=False, obj=f"{path.name} {table}")
        assert fast.diagnostics == plain.diagnostics


def test_emit_nvtx_texts_parse():
    parsed = parse_range_texts([
        "aten::mm, seq = 0, op_id = 3, sizes = [[64, 128], [128, 256]]",
        "autograd::engine::evaluate_function: AddmmBackward0, op_id = 1718",
        "AddmmBackward0, stashed seq = 12",
        "aten::add, seq = -1",
        "aten::cat, seq = 4, sizes = [[2], [3]], input_op_ids = [(1, 0), (2, 0)]",
        "a, b = c",  # a comma and an equals sign, but no decoration
        None,
    ])
    assert parsed["name"].tolist() == ["aten::mm", "autograd::engine::evaluate_function: AddmmBackward0",
                                       "AddmmBackward0", "aten::add", "aten::cat", "a, b = c", ""]
    assert parsed["seq"].tolist() == [0, pd.NA, pd.NA, pd.NA, 4, pd.NA, pd.NA]
    assert parsed["op_id"].tolist() == [3, 1718, pd.NA, pd.NA, pd.NA, pd.NA, pd.NA]
    assert parsed["stashed_seq"].tolist() == [pd.NA, pd.NA, 12, pd.NA, pd.NA, pd.NA, pd.NA]
    assert [None if pd.isna(v) else v for v in parsed["sizes"]] == ["[[64, 128], [128, 256]]", None, None, None, "[[2], [3]]", None, None]
