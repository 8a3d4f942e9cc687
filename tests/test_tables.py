"""tables.write_table: a table of several row groups is converted one row group at a time into the file that
``pq.write_table`` writes of the whole table."""

import pandas as pd
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
