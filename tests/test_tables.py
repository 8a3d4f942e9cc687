"""tables.write_table: a table of several row groups is converted one row group at a time into the file that
``pq.write_table`` writes of the whole table."""

import pandas as pd
import pytest
import pyarrow.parquet as pq

from operator_profiler import tables


def test_row_groups_written_one_at_a_time_match_one_write(tmp_path, monkeypatch):
    n = 10
    ranges = pd.DataFrame({name: range(n) for name in ("range_id", "pid", "tid", "start_ns", "end_ns", "depth")})
    for name in ("end_tid", "parent_id", "seq", "fwd_thread_id", "iteration"):
        ranges[name] = pd.array([None] * 5 + list(range(5)), dtype="Int64")
    ranges["name"] = [f"op{i % 3}" for i in range(n)]
    ranges["domain"] = pd.Categorical(["d"] * n)
    ranges["kind"] = pd.Categorical(["nvtx_push_pop"] * n)
    ranges["layer"] = [None] * n
    ranges["sizes"] = [None] * 4 + ["[1]"] * 6  # an extra column, all null in the first row group
    ranges["unclosed"] = [False] * n
    whole = tmp_path / "whole.parquet"
    pq.write_table(tables.to_arrow(ranges, tables.RANGES), whole)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 4)
    parts = tmp_path / "parts.parquet"
    tables.write_table(ranges, tables.RANGES, parts)
    assert pq.ParquetFile(parts).metadata.num_row_groups == 3
    written, expected = pq.read_table(parts), pq.read_table(whole)
    assert written.schema.equals(expected.schema, check_metadata=True)
    assert written.equals(expected)


def test_categorical_columns_convert_as_from_pandas_does():
    """to_arrow converts categorical contract columns from their codes: the same table (values, types, pandas
    metadata with each categorical's number of categories) as ``pa.Table.from_pandas`` of the whole frame."""
    import pyarrow as pa

    n = 7
    launches = pd.DataFrame({name: range(n) for name in ("launch_id", "pid", "tid", "start_ns", "end_ns")})
    launches["api"] = pd.Categorical(["cudaLaunchKernel", None, "cuLaunchKernel", "cudaLaunchKernel", None, "é", "x"])
    launches["correlation_id"] = pd.array([1, None, 3, 4, 5, 6, 7], dtype="Int64")
    frames = {
        "with nulls": launches,
        "all null, no categories": launches.assign(api=pd.Categorical([None] * n, categories=pd.Index([], dtype=str))),
        "unused categories": launches.assign(api=pd.Categorical(["a"] * n, categories=["a", "b", "c"])),
        "no rows": launches.iloc[:0],
    }
    for label, frame in frames.items():
        expected = pa.Table.from_pandas(frame[tables.LAUNCHES.names], schema=tables.LAUNCHES, preserve_index=False)
        got = tables.to_arrow(frame, tables.LAUNCHES)
        assert got.equals(expected, check_metadata=True), label
        assert got.schema.equals(expected.schema, check_metadata=True), label
    numbers = launches.assign(api=pd.Categorical([1, 2, None, 1, 2, 1, 1]))  # not strings: refused, as from_pandas
    with pytest.raises(pa.ArrowTypeError):
        pa.Table.from_pandas(numbers[tables.LAUNCHES.names], schema=tables.LAUNCHES, preserve_index=False)
    with pytest.raises(pa.ArrowTypeError):
        tables.to_arrow(numbers, tables.LAUNCHES)


def test_ids_and_timestamps_are_delta_encoded(tmp_path, monkeypatch):
    """Ids and timestamps (files.DELTA_ENCODED, int64) are written with DELTA_BINARY_PACKED, the other columns
    dictionary-encoded, by write_table (one row group or several) and write_parquet_atomic; the values read back
    are those of the default write."""
    from operator_profiler import files

    n = 10
    launches = pd.DataFrame({"launch_id": range(n), "pid": [7] * n, "tid": [8] * n, "start_ns": range(0, 20 * n, 20),
                             "end_ns": range(5, 20 * n, 20)})
    launches["api"] = pd.Categorical(["cudaLaunchKernel"] * n)
    launches["correlation_id"] = pd.array([None] + list(range(2, n + 1)), dtype="Int64")
    launches["seq"] = [0.5] * n  # a name of the set, not int64: dictionary-encoded (delta is for integers)

    def encodings(path):
        meta = pq.ParquetFile(path).metadata
        return {meta.schema.column(i).name: set().union(*(meta.row_group(g).column(i).encodings
                                                         for g in range(meta.num_row_groups)))
                for i in range(meta.num_columns)}

    delta = {"launch_id", "start_ns", "end_ns", "correlation_id"}
    default = tmp_path / "default.parquet"
    pq.write_table(tables.to_arrow(launches, tables.LAUNCHES), default)
    one = tmp_path / "one.parquet"
    tables.write_table(launches, tables.LAUNCHES, one)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 4)
    several = tmp_path / "several.parquet"
    tables.write_table(launches, tables.LAUNCHES, several)
    frame = tmp_path / "frame.parquet"
    files.write_parquet_atomic(launches, frame)
    for path in (one, several, frame):
        for column, used in encodings(path).items():
            assert ("DELTA_BINARY_PACKED" in used) == (column in delta), (path.name, column, used)
            assert ("RLE_DICTIONARY" in used) == (column not in delta), (path.name, column, used)
    assert pq.read_table(one).equals(pq.read_table(default), check_metadata=True)
    assert pq.read_table(several).equals(pq.read_table(default), check_metadata=True)
    default_frame = tmp_path / "default_frame.parquet"
    launches.to_parquet(default_frame, index=False)
    assert pq.read_table(frame).equals(pq.read_table(default_frame), check_metadata=True)
    assert delta | {"seq"} <= files.DELTA_ENCODED and not {"pid", "tid", "api"} & files.DELTA_ENCODED


def test_extra_columns_read_back_with_their_pandas_dtypes(tmp_path, monkeypatch):
    """A reader's columns beyond the contract (Kineto's launches ``external_id``, nullable Int64) read back as they
    were written: with nulls they would otherwise come back as float64, the nulls NaN. Also across row groups
    written one at a time, and for an extra categorical (written as plain strings)."""
    import pyarrow as pa

    n = 10
    launches = pd.DataFrame({name: range(n) for name in ("launch_id", "pid", "tid", "start_ns", "end_ns")})
    launches["api"] = ["cudaLaunchKernel"] * n
    launches["correlation_id"] = pd.array(range(n), dtype="Int64")
    launches["external_id"] = pd.array([None, 7, 8, None, 9, 10, 11, None, 12, 13], dtype="Int64")
    launches["kind"] = pd.Categorical(["a", "b"] * 5)
    for rows_per_group, groups in ((1024, 1), (4, 3)):
        monkeypatch.setattr(tables, "ROW_GROUP_ROWS", rows_per_group)
        path = tmp_path / f"launches{groups}.parquet"
        tables.write_table(launches, tables.LAUNCHES, path)
        assert pq.ParquetFile(path).metadata.num_row_groups == groups
        back = pd.read_parquet(path)
        assert str(back["external_id"].dtype) == "Int64"
        assert back["external_id"].isna().tolist() == launches["external_id"].isna().tolist()
        assert back["external_id"].dropna().tolist() == [7, 8, 9, 10, 11, 12, 13]
        assert pa.types.is_string(pq.read_schema(path).field("kind").type) or pa.types.is_large_string(
            pq.read_schema(path).field("kind").type)
        assert back["kind"].astype(str).tolist() == ["a", "b"] * 5


def test_a_list_column_empty_in_the_first_row_group_takes_its_type_from_the_whole_column(tmp_path, monkeypatch):
    """The attribution's ``layers_spanned``: empty lists for most kernels, so a first row group of only empty lists
    is typed ``list<null>``; a later row group's lists of strings must still be written (the cast from string to
    null failed), and the file reads back the lists as they were."""
    import pyarrow as pa

    n = 10
    launches = pd.DataFrame({name: range(n) for name in ("launch_id", "pid", "tid", "start_ns", "end_ns")})
    launches["api"] = ["cudaLaunchKernel"] * n
    launches["correlation_id"] = pd.array(range(n), dtype="Int64")
    spans = [[] for _ in range(n)]
    spans[6] = ["h.0", "h.1"]
    launches["layers_spanned"] = spans
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 4)
    path = tmp_path / "launches.parquet"
    tables.write_table(launches, tables.LAUNCHES, path)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    field = pq.read_schema(path).field("layers_spanned")
    assert pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
    assert pa.types.is_string(field.type.value_type) or pa.types.is_large_string(field.type.value_type)
    back = pq.read_table(path).column("layers_spanned").to_pylist()
    assert back == spans
