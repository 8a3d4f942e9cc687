"""The table contract of ``docs/DESIGN.md`` §3 as explicit pyarrow schemas.

Every stage writes its parquet tables through :func:`write_table`, so a column missing or of the
wrong type fails at the writer, not three stages later. Times are integer ns, sizes bytes.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

KERNELS = pa.schema(
    [
        ("kernel_id", pa.int64()),
        ("pid", pa.int64()),
        ("device", pa.int64()),  # CUDA ordinal; -1 for CPU kernels
        ("stream", pa.int64()),  # CUDA stream id; -1 for CPU kernels
        ("name", pa.string()),
        ("mangled_name", pa.string()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("duration_ns", pa.int64()),
        ("correlation_id", pa.int64()),
        ("launch_tid", pa.int64()),
        ("launch_start_ns", pa.int64()),
        ("launch_end_ns", pa.int64()),
        ("launch_api", pa.string()),
        ("grid", pa.string()),
        ("block", pa.string()),
        ("graph_id", pa.int64()),
        ("graph_node_id", pa.int64()),
        ("match_key", pa.string()),
        ("occurrence", pa.int64()),
        ("source", pa.string()),
        ("iteration", pa.int64()),  # measured iteration whose range encloses the launch, null if none
        ("range_id", pa.int64()),  # CPU kernels: the op's range in ranges.parquet (null for GPU)
        ("parent_kernel_id", pa.int64()),  # CPU kernels: nearest enclosing CPU kernel (null for GPU)
    ]
)

LAUNCHES = pa.schema(
    [
        ("launch_id", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("api", pa.string()),
        ("correlation_id", pa.int64()),
    ]
)

RANGES = pa.schema(
    [
        ("range_id", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("end_tid", pa.int64()),
        ("name", pa.string()),
        ("domain", pa.string()),
        ("kind", pa.string()),
        ("depth", pa.int64()),
        ("parent_id", pa.int64()),
        ("seq", pa.int64()),
        ("fwd_thread_id", pa.int64()),  # Kineto "Fwd thread id": 0 forward op, 1 backward node
        ("layer", pa.string()),
        ("iteration", pa.int64()),  # index when this is one of our iteration ranges
    ]
)

ATTRIBUTION = pa.schema(
    [
        ("kernel_id", pa.int64()),
        ("operator", pa.string()),
        ("forward_operator", pa.string()),
        ("module", pa.string()),
        ("layer", pa.string()),
        ("layer_class", pa.string()),
        ("path", pa.string()),
        ("fused_ops", pa.list_(pa.string())),
        ("source_nodes", pa.list_(pa.string())),
        ("listed_not_computed", pa.list_(pa.string())),  # ops a fused kernel's provenance lists, run by another call
        ("reason", pa.string()),
        ("evidence", pa.string()),  # JSON object: {path: what that path said}
    ]
)


def empty_frame(schema: pa.Schema) -> pd.DataFrame:
    return schema.empty_table().to_pandas()


def to_arrow(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """Select and cast the contract columns of ``df``; extra columns are kept after them.

    Raises:
        KeyError: a contract column is missing (a bug in the stage that built ``df``).
    """
    missing = [f.name for f in schema if f.name not in df.columns]
    if missing:
        raise KeyError(f"table is missing contract columns {missing}")
    extra = [c for c in df.columns if c not in schema.names]
    table = _contract_columns(df, schema)
    if not extra:
        return table
    for col in extra:
        column = pa.Array.from_pandas(df[col])
        if pa.types.is_dictionary(column.type):  # (a categorical in memory: plain values in the file, as above)
            column = column.cast(column.type.value_type)
        table = table.append_column(col, column)
    # The pandas metadata names the extra columns' dtypes too, so that they read back as they were written: a
    # nullable Int64 column (Kineto's external_id) would otherwise come back as float64, its nulls NaN.
    described = pa.Table.from_pandas(df[list(table.column_names)].iloc[:0], schema=table.schema, preserve_index=False)
    return table.replace_schema_metadata(described.schema.metadata)


def _contract_columns(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pandas(df[schema.names], schema=schema, preserve_index=False)``, the same table (values,
    types, the ``pandas`` schema metadata), with categorical columns converted from their codes.

    ``from_pandas`` turns a categorical column that the schema gives a plain type (``string``) into a Python object
    per row first (``np.asarray`` of the categorical): 0.15 s per column per million rows, a third of writing the
    timeline tables. Here such a column becomes an Arrow dictionary array (codes and categories, no object per row)
    cast to the schema's type, which decodes it in Arrow; the other columns still go through ``from_pandas``. The
    metadata is ``from_pandas``' own, of the frame's first zero rows (it names each column's dtype and, for a
    categorical, its number of categories, never row values)."""
    names = schema.names
    categorical = [c for c in names if _string_categorical(df[c], schema.field(c).type)]
    if not categorical:
        return pa.Table.from_pandas(df[names], schema=schema, preserve_index=False)
    metadata = pa.Table.from_pandas(df[names].iloc[:0], schema=schema, preserve_index=False).schema.metadata
    plain = [c for c in names if c not in categorical]
    rest = pa.Table.from_pandas(df[plain], schema=pa.schema([schema.field(c) for c in plain]), preserve_index=False)
    columns = []
    for field in schema:
        if field.name in categorical:
            # pa.array of a categorical: DictionaryArray (codes -1 -> null) of strings; the cast decodes it.
            columns.append(pa.array(df[field.name]).cast(field.type))
        else:
            columns.append(rest.column(field.name))
    return pa.Table.from_arrays(columns, schema=schema.with_metadata(metadata))


def _string_categorical(column: pd.Series, arrow_type: pa.DataType) -> bool:
    """Whether ``column`` is a categorical of strings written as a string column (:func:`_contract_columns`' fast
    case); other categoricals (numbers written as strings, which ``from_pandas`` refuses) go through ``from_pandas``."""
    return (isinstance(column.dtype, pd.CategoricalDtype) and pa.types.is_string(arrow_type)
            and pd.api.types.is_string_dtype(column.cat.categories))


#: Rows per parquet row group, the size :func:`write_table` converts at a time: a quarter of pyarrow's default (1M rows).
#: Measured on a 1M-kernel nsys timeline, 2 cores: the Arrow copy being written is a quarter as large (the nsys
#: timeline's tables are written beside the GPU projection, ``stages._export_timeline``: that phase's peak RSS
#: 1.44-1.47 -> 1.35-1.36 GB) and reading the files back takes as long (``opprof attribute`` alternated with 1M-row
#: groups: 3.7-4.4 s either way).
ROW_GROUP_ROWS = 256 * 1024


def write_table(df: pd.DataFrame, schema: pa.Schema, path: Path) -> None:
    """Write ``df`` as parquet with ``schema``; atomic (temp file + rename), so no partial output.

    A table of more than :data:`ROW_GROUP_ROWS` rows is converted one row group at a time (the file is the one
    ``pq.write_table(..., row_group_size=ROW_GROUP_ROWS)`` writes): a second Arrow copy of 2M NVTX ranges cost 0.4 GB
    at once.
    Ids and timestamps are delta-encoded (``files.parquet_encodings``)."""
    from .files import parquet_encodings, replace_atomic

    if len(df) <= ROW_GROUP_ROWS:
        table = to_arrow(df, schema)
        replace_atomic(path, lambda tmp: pq.write_table(table, tmp, **parquet_encodings(table.schema)))
        return
    first = to_arrow(df.iloc[:ROW_GROUP_ROWS], schema)
    target = first.schema
    for i, field in enumerate(target):
        # an extra column all null (or all empty lists) in the first rows: its type from the whole column
        if _holds_null_type(field.type):
            whole = pa.Array.from_pandas(df[field.name])
            if pa.types.is_dictionary(whole.type):
                whole = whole.cast(whole.type.value_type)
            target = target.set(i, pa.field(field.name, whole.type))
            del whole
    if not first.schema.equals(target):
        first = first.cast(target)

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, target, **parquet_encodings(target)) as writer:
            writer.write_table(first)
            for at in range(ROW_GROUP_ROWS, len(df), ROW_GROUP_ROWS):
                part = to_arrow(df.iloc[at:at + ROW_GROUP_ROWS], schema)
                writer.write_table(part if part.schema.equals(target) else part.cast(target))
                del part

    replace_atomic(path, write)


def _holds_null_type(arrow_type: pa.DataType) -> bool:
    """Whether ``arrow_type`` is Arrow's ``null`` or holds it (``list<null>``: a list column whose first rows hold
    only empty lists, such as the attribution's ``layers_spanned``): a type read from some rows, not the column's."""
    if pa.types.is_null(arrow_type):
        return True
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return _holds_null_type(arrow_type.value_type)
    if pa.types.is_struct(arrow_type):
        return any(_holds_null_type(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    return False


def read_table(path: Path) -> pd.DataFrame:
    """Read a parquet table with nullable integer columns (``Int64``) kept nullable."""
    return pq.read_table(path).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
