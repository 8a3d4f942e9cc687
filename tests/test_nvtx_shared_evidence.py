"""Path (b)'s evidence is written once per distinct text: kernels whose pieces agree (head keys, operator
name, the list of stack names, tag names, reason and regions) share one JSON text, taken for each. Checked
against the same function with sharing turned off (every kernel its own text, as before sharing existed),
on a synthetic export with repeated operators, backward links, tags of another domain, start/end regions
and unattributed kernels, and on the eight real exports (../shared/data/real/nsys/)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from nsys_export import Nvtx, launch, rows, write_nsys_export

from operator_profiler.attribution import nvtx
from operator_profiler.attribution.row_groups import group_codes, path_codes
from operator_profiler.layers import kernel_layer_classes
from operator_profiler.timeline.nesting import stack_keys, unpack_stack_key
from operator_profiler.timeline.nsys import read_nsys


def _export(path):
    ranges, launches = [], []
    corr = 0
    for i in range(6):
        base = i * 10_000
        ranges += [Nvtx("model", 59, "10:1", base + 100, base + 5000),
                   Nvtx(f"aten::linear, seq = {i}, op_id = {2 * i}", 59, "10:1", base + 200, base + 400),
                   Nvtx(f"MmBackward0, stashed seq = {i}", 59, "10:2", base + 1000, base + 2000)]
        if i % 2 == 0:
            ranges.append(Nvtx("hook", 59, "10:1", base + 150, base + 450, domain=7))
        if i < 3:
            ranges.append(Nvtx("warmup", 60, "10:1", base + 50, base + 3000))
        for thread, t in (("10:1", base + 250), ("10:2", base + 1500), ("10:1", base + 6000)):
            corr += 1
            launches.append(launch(f"k{corr}", thread, t, corr))
    return write_nsys_export(path, nvtx=ranges, domains={(10, 7): "deepspeed"}, **rows(*launches))


def _both_ways(path, monkeypatch):
    timeline = read_nsys(path)
    layers = kernel_layer_classes(timeline.kernels, timeline.ranges, [])
    built = []
    real_texts = nvtx._evidence_texts

    def counting(*args):
        out = real_texts(*args)
        built.append(len(out))
        return out

    monkeypatch.setattr(nvtx, "_evidence_texts", counting)
    shared = nvtx.attribute_nvtx(timeline.kernels, timeline.ranges, layers)
    monkeypatch.setattr(nvtx, "group_codes", lambda columns: np.arange(len(columns[0]), dtype=np.int64))
    alone = nvtx.attribute_nvtx(timeline.kernels, timeline.ranges, layers)
    return shared, alone, built


def test_shared_evidence_is_the_per_kernel_evidence(tmp_path, monkeypatch):
    shared, alone, built = _both_ways(_export(tmp_path / "report.sqlite"), monkeypatch)
    pd.testing.assert_frame_equal(shared, alone)
    # 11 distinct texts: the forward kernels' four (tag x region), the backward kernels' six (each links
    # its own sequence number), and the one of the kernels outside every range; then one per kernel.
    assert len(shared) == 18 and built == [11, 18]
    assert shared["evidence"].nunique() == 11
    ev = {name: json.loads(text)["nvtx"] for name, text in zip(shared["name"], shared["evidence"])}
    forward = {"operator": "aten::linear", "stack": ["model", "aten::linear"]}
    assert ev["k1"] == ev["k7"] == {**forward, "tags": {"deepspeed": "hook"}, "regions": ["warmup"]}
    assert ev["k4"] == {**forward, "regions": ["warmup"]}
    assert ev["k13"] == {**forward, "tags": {"deepspeed": "hook"}}
    assert ev["k10"] == ev["k16"] == forward
    assert ev["k2"] == {"backward_seq": 0, "operator": "MmBackward0", "regions": ["warmup"], "stack": ["MmBackward0"]}
    assert ev["k17"] == {"backward_seq": 5, "operator": "MmBackward0", "stack": ["MmBackward0"]}
    assert ev["k3"] == ev["k18"] == {"operator": None, "reason": "no_enclosing_range", "stack": []}
    assert shared.set_index("name").loc["k17", "forward_operator"] == "aten::linear"


def test_shared_evidence_on_the_real_exports(real_nsys_files, monkeypatch):
    for path in real_nsys_files:
        shared, alone, _ = _both_ways(path, monkeypatch)
        pd.testing.assert_frame_equal(shared, alone, obj=path.name)
        monkeypatch.undo()


def test_path_codes_are_equal_for_equal_name_lists():
    # Ranges: 0 "a" (root), 1 "b" under 0, 2 "a" (root), 3 "b" under 2, 4 "c" under 3, 5 "b" (root).
    parent = np.array([-1, 0, -1, 2, 3, -1])
    names = np.array([0, 1, 0, 1, 2, 1])
    codes = path_codes(parent, names, np.array([1, 3, 4, 5, -1, 0, 2]))
    assert codes[0] == codes[1]  # [a, b] twice
    assert codes[5] == codes[6]  # [a] twice
    assert len({codes[0], codes[2], codes[3], codes[5]}) == 4  # [a, b], [a, b, c], [b], [a]
    assert codes[4] == -1
    with pytest.raises(ValueError, match="cycle"):
        path_codes(np.array([1, 0]), np.array([0, 0]), np.array([0]))


def test_group_codes_of_no_columns_and_none_values():
    assert group_codes([np.array([None, "x", None], dtype=object), np.array([1, 1, 1])]).tolist() == [0, 1, 0]


def test_stack_keys_take_categorical_domains_and_keep_a_missing_one_apart():
    domain = pd.Categorical(["default", None, "nccl", None])
    keys = stack_keys(np.array([10, 10, 11, 12]), np.array([1, 1, 2, 3]), domain)
    assert [unpack_stack_key(k)[:2] for k in keys] == [(10, 1), (10, 1), (11, 2), (12, 3)]
    assert len(set(keys.tolist())) == 4
    assert keys[0] == stack_keys(np.array([10]), np.array([1]), np.array([domain.codes[0]]))[0]


def test_attribution_of_ranges_read_back_in_several_chunks(tmp_path):
    """Ranges read from parquet come as one Arrow chunk per row group (131,072 rows each by default): the
    names must be one array (concatenating stack blocks failed with "Iterable should contain Array objects")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    timeline = read_nsys(_export(tmp_path / "report.sqlite"))
    path = tmp_path / "ranges.parquet"
    pq.write_table(pa.Table.from_pandas(timeline.ranges, preserve_index=False), path, row_group_size=4)
    chunked = pq.read_table(path).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    chunked["depth"] = chunked["depth"].astype("int64")
    names = pa.array(chunked["name"].astype("str"))
    assert isinstance(names, pa.ChunkedArray) and names.num_chunks > 1  # the case under test
    layers = kernel_layer_classes(timeline.kernels, timeline.ranges, [])
    expected = nvtx.attribute_nvtx(timeline.kernels, timeline.ranges, layers)
    got = nvtx.attribute_nvtx(timeline.kernels, chunked, layers)
    assert got["evidence"].tolist() == expected["evidence"].tolist()
    assert got["operator"].tolist() == expected["operator"].tolist() and got["operator"].notna().sum() == 12


def _regions_starting_together(path):
    """Start/end regions that start at the same time around push/pop operators: their order in the evidence
    (by start, then by range id) must not follow the table's row order."""
    ranges = [Nvtx(f"region{j}", 60, "10:1", 100, 9000 - j) for j in range(4)]
    ranges += [Nvtx(f"aten::op{i}", 59, "10:1", 1000 * i + 200, 1000 * i + 800) for i in range(1, 6)]
    launches = [launch(f"k{i}", "10:1", 1000 * i + 500, i) for i in range(1, 6)]
    return write_nsys_export(path, nvtx=ranges, **rows(*launches))


def test_attribution_of_ranges_in_any_row_order(tmp_path, real_nsys_files):
    """Path (b) does not rely on the reader's row order or on range ids being row numbers (its fast paths
    take them when they are): the ranges shuffled, or renumbered, give the same kernels' operators and
    evidence."""
    paths = [_export(tmp_path / "shared.sqlite"), _regions_starting_together(tmp_path / "regions.sqlite")]
    paths += [p for p in real_nsys_files if "mfu" in p.name or "extrap_conc" in p.name]
    for path in paths:
        timeline = read_nsys(path)
        kernels, ranges = timeline.kernels, timeline.ranges
        layers = kernel_layer_classes(kernels, ranges, [])
        # every domain names operators here (the Extra-P capture has only its own domain)
        options = nvtx.NvtxOptions(operator_domains=tuple(sorted({"default", *ranges["domain"].astype(str)})))
        want = nvtx.attribute_nvtx(kernels, ranges, layers, options)
        assert want["operator"].notna().any(), path.name
        shuffled = ranges.sample(frac=1.0, random_state=5).reset_index(drop=True)
        got = nvtx.attribute_nvtx(kernels, shuffled, layers, options)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        renumbered = ranges.assign(range_id=ranges["range_id"] + 1000, parent_id=ranges["parent_id"] + 1000)
        got = nvtx.attribute_nvtx(kernels, renumbered, layers, options)
        assert (got["operator_range_id"] - 1000).equals(want["operator_range_id"]), path.name
        pd.testing.assert_frame_equal(got.drop(columns="operator_range_id"), want.drop(columns="operator_range_id"),
                                      check_exact=True)
