"""Path (a)'s evidence is written once per distinct text (``stack_json_column``, ``group_codes``): on every
real Kineto trace of ../shared/data/real/kineto/ the column equals the per-kernel construction (each
kernel's stack from its own ancestors, ``json.dumps`` of their names), and the backward ops' forward op
found by a join equals the per-kernel lookup it replaced.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import REAL_DATA

from operator_profiler.attribution.correlation import RangeNames, _name_paths, find_ops
from operator_profiler.attribution.merge import attribute
from operator_profiler.attribution.row_groups import group_codes
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

# every Kineto trace of the folder (the execution-trace file beside them is not one)
TRACES = sorted(p.name for p in (REAL_DATA / "kineto").glob("*.json*") if not p.name.endswith("_et.json.gz"))
FORWARD_CHECKED: dict[str, int] = {}


@pytest.mark.parametrize("name", TRACES)
def test_stack_column_equals_each_kernels_own_stack(name):
    timeline = read_kineto(REAL_DATA / "kineto" / name)
    ops = find_ops(timeline.kernels, timeline.ranges)
    at, texts = ops.stack_json_column()
    position = {int(r): i for i, r in enumerate(ops.range_ids)}
    checked = 0
    for i in range(len(at)):
        expected = json.dumps([ops.names[position[r]] for r in ops.stack(i)])
        if at[i] >= 0:
            assert texts[at[i]] == expected, (name, i)
            checked += 1
        else:  # not exact: the stack leaves out an ancestor that does not enclose the launch
            assert not ops.exact[i] and ops.innermost[i] >= 0
            assert ops.stack_json(i, {}) == expected
    assert checked == int(((ops.innermost < 0) | ops.exact).sum())


@pytest.mark.parametrize("name", TRACES)
def test_evidence_and_forward_ops_equal_the_per_kernel_construction(name):
    timeline = read_kineto(REAL_DATA / "kineto" / name)
    kernels, ranges = timeline.kernels, timeline.ranges
    result = attribute(kernels, ranges, classify_layers(kernels, ranges, [])[0], None)
    ops = find_ops(kernels, ranges)
    names = ops.names
    cache: dict = {}
    for i in range(len(result)):
        evidence = json.loads(result["evidence"].iloc[i])["correlation"]
        assert evidence["stack"] == json.loads(ops.stack_json(i, cache))
        op = ops.operator[i]
        assert evidence["operator"] == (names[op] if op >= 0 else None)
        assert evidence.get("reason") == ops.reason[i]
    # Without fwdbwd flows, a backward kernel's forward op is the deepest forward op (last of equal depth)
    # carrying the Sequence number of the innermost autograd node (fwd_thread_id 1) around the launch.
    if "forward_range_id" in ranges and ranges["forward_range_id"].notna().any():
        FORWARD_CHECKED[name] = 0  # flows decide (tested in test_kineto_cases)
        return
    fwd = ranges[ranges["seq"].notna() & (ranges["fwd_thread_id"].fillna(0) == 0)]
    fwd = fwd[~fwd["name"].str.contains("Backward", regex=False)].sort_values(["depth"], kind="stable")
    by_seq = {}
    for p, s, n in zip(fwd["pid"], fwd["seq"], fwd["name"]):
        by_seq[(int(p), int(s))] = n
    row = {int(r): i for i, r in enumerate(ranges["range_id"])}
    seq, fwd_tid = ranges["seq"].tolist(), ranges["fwd_thread_id"].tolist()
    found = 0
    for i in range(len(result)):
        node = next((row[r] for r in reversed(ops.stack(i))
                     if not pd.isna(seq[row[r]]) and not pd.isna(fwd_tid[row[r]]) and fwd_tid[row[r]] == 1), None)
        expected = None if node is None else by_seq.get((int(kernels["pid"].iloc[i]), int(seq[node])))
        got = result["forward_operator"].iloc[i]
        assert (None if pd.isna(got) else got) == expected, (name, i)
        found += expected is not None
    FORWARD_CHECKED[name] = found


def test_forward_ops_were_checked_on_real_backward_kernels():
    """The comparison above is not vacuous: real traces have backward kernels with forward ops by seq."""
    if len(FORWARD_CHECKED) < len(TRACES):
        pytest.skip("runs after the per-trace tests")
    assert sum(FORWARD_CHECKED.values()) > 1000, FORWARD_CHECKED


def test_name_paths_share_equal_lists_and_spell_them_as_json():
    # two roots "a"; children "b" under both, "é" under the second; a grandchild "b" under "a/b"
    parent = np.array([-1, 0, -1, 2, 2, 1])
    names = ["a", "b", "a", "b", "é", "b"]
    path, texts = _name_paths(parent, RangeNames(pd.Series(names, dtype="str")))
    assert path[0] == path[2] and path[1] == path[3] and path[4] != path[3]
    assert [texts[p] for p in path] == [json.dumps(["a"]), json.dumps(["a", "b"]), json.dumps(["a"]),
                                        json.dumps(["a", "b"]), json.dumps(["a", "é"]), json.dumps(["a", "b", "b"])]
    assert len(texts) == 4
    with pytest.raises(ValueError, match="cycle"):
        _name_paths(np.array([1, 0]), RangeNames(pd.Series(["x", "y"], dtype="str")))


def test_range_names_index_and_take_like_the_list_of_names():
    names = RangeNames(pd.Series(["b", "a", "b", "c"], dtype="str"))
    assert [names[i] for i in range(len(names))] == ["b", "a", "b", "c"] and names[1:3] == ["a", "b"]
    assert names.take(np.array([2, -1, 3])).tolist() == ["b", None, "c"]


def test_group_codes_treat_none_as_a_value_and_number_by_first_appearance():
    ops = np.array(["mm", None, "mm", None, "add"], dtype=object)
    kinds = np.array(["d", "c", "d", "c", "d"], dtype=object)
    stacks = np.array([1, 1, 1, 2, 1])
    assert group_codes([ops, kinds, stacks]).tolist() == [0, 1, 0, 2, 3]
    assert pd.Series(group_codes([])).empty


def test_group_codes_equal_a_tuple_numbering_on_random_columns():
    """Integer columns (narrow, negative, spanning all of int64), object columns with None, and enough
    columns for the key to be renumbered on the way: the codes number the distinct row tuples by first
    appearance."""
    rng = np.random.default_rng(3)
    n = 5_000
    columns = [rng.integers(-2, 3, n), rng.integers(0, 2**40, n) * rng.integers(0, 2, n),
               np.where(rng.random(n) < 0.5, np.iinfo(np.int64).min, np.iinfo(np.int64).max),
               np.array([None if v == 0 else f"t{v}" for v in rng.integers(0, 4, n)], dtype=object),
               np.zeros(n, dtype=np.int64)] + [rng.integers(0, 7, n) for _ in range(25)]
    seen: dict = {}
    expected = [seen.setdefault(row, len(seen)) for row in zip(*(c.tolist() for c in columns))]
    assert group_codes(columns).tolist() == expected


def test_range_name_tests_run_once_per_distinct_name_equal_the_per_row_test():
    """``RangeNames.test`` (a string test per distinct name, spread by the codes) gives the per-row answer."""
    names = pd.Series(["aten::mm", "CompiledFunction", "aten::mm", "ProfilerStep#3", "", "aten::add_"] * 3,
                      dtype="str")
    codes = RangeNames(names)
    for test in (lambda s: s.str.match(r"^aten::").to_numpy(dtype=bool),
                 lambda s: s.str.startswith("Compiled").to_numpy(dtype=bool)):
        assert np.array_equal(codes.test(names.dtype, test), test(names))
    assert codes.test(names.dtype, lambda s: s.str.match("x").to_numpy(dtype=bool)).dtype == bool
    assert RangeNames(pd.Series([], dtype="str")).test("str", lambda s: s.str.match("x").to_numpy(dtype=bool)).size == 0


@pytest.mark.parametrize("categorical", [False, True])
def test_range_kind_test_equals_the_text_comparison(categorical):
    """``_is_kind`` reads a categorical kind column from its codes: the answer of ``astype(str) == kind``."""
    from operator_profiler.attribution.correlation import _is_kind

    kind = pd.Series(["cpu_op", "user_annotation", None, "cpu_op", "python_function"], dtype="str")
    if categorical:
        kind = kind.astype("category")
    for value in ("cpu_op", "user_annotation", "nvtx_push_pop", "nan"):
        assert np.array_equal(_is_kind(kind, value), (kind.astype(str) == value).to_numpy(dtype=bool))
