"""Nsight Systems SQLite export (``nsys export --type sqlite``) -> the timeline tables (docs/DESIGN.md §3),
probing tables and columns by name (the schema drifts between nsys versions) and streaming large tables.
Details: docs/modules.md#timeline-nsys."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .. import tables
from ..files import write_json
from ..naming import ITERATION_PREFIX, LAYER_PREFIX
from ..progress import stage_done
from ..heap import release_free_memory, bulk_memory
from ..shared_setting import SharedSetting
from ..errors import NsysExportError
from .model import (ACTIVITY_COLUMNS, Timeline, all_null_ints, exact_repeats, finish_kernels, kernel_iterations,
                    take_rows)
from .nesting import nest_push_pop, nesting_order
from .process_lives import REFUSED, ProcessLives, find_lives, life_keys, life_of_calls, repeated_calls

log = logging.getLogger(__name__)

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TRACE_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
NVTX_TABLE = "NVTX_EVENTS"
# Node-creation events: CUDA_GRAPH_NODE_EVENTS since 2024; the 2022 exports used CUDA_GRAPH_EVENTS
# for the same rows (graphNodeId, originalGraphNodeId); recognised by their columns (formats.md#nsys-tables).
GRAPH_NODE_TABLES = ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")
DEFAULT_DOMAIN = "default"  # NVTX domain 0 (no domain): where torch emit_nvtx ranges go

# ENUM_NSYS_EVENT_TYPE ids (formats.md#nsys-nvtx-event-types), used when the export has no ENUM table.
EVENT_TYPE_DEFAULTS = {
    "NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxtPushPopRange": 70, "NvtxtStartEndRange": 71,
    "NvtxDomainCreate": 75, "NvtxMark": 34,
}
RUNTIME_EVENT_CLASSES = (0, 1)  # CUDA runtime, CUDA driver; 67 = backtrace duplicate
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}

# Columns the reader cannot work without, per table; anything else is optional (formats.md#nsys-export).
REQUIRED_COLUMNS = {
    KERNEL_TABLE: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
    RUNTIME_TABLE: ("start", "end", "globalTid", "correlationId", "nameId"),
    "NVTX": ("start", "end", "eventType", "globalTid"),
    MEMCPY_TABLE: ("start", "end", "deviceId", "streamId", "globalPid"),
    MEMSET_TABLE: ("start", "end", "deviceId", "streamId", "globalPid"),
    GRAPH_TRACE_TABLE: ("start", "end", "deviceId", "streamId", "correlationId", "graphId"),
}
SUPPORTED = "nsys 2021-2025 exports (schemas 2.9 to 3.20)"
TEXT_COLUMNS = frozenset({"text", "value", "name"})  # the string columns the reader selects

# torch emit_nvtx / record_function decorations (torch/csrc/profiler/util.cpp getNvtxStr):
# "aten::addmm, seq = 5, op_id = 7, sizes = [[4, 8], [8]], input_op_ids = [...]"; old releases
# wrote "stashed seq = N" on ops run by a backward node (formats.md#emit_nvtx-range-names, docs/field-cases.md C12). RE2 syntax (pyarrow).
_DECORATIONS = r", (?:stashed seq|seq|op_id|sizes|input_op_ids) = .*$"
_FIELDS = {  # column -> (the field's name in the text, the regex that defines what is read)
    "seq": ("seq", r"(?:^|, )seq = (?P<v>-?\d+)"),
    "stashed_seq": ("stashed seq", r"stashed seq = (?P<v>\d+)"),
    "op_id": ("op_id", r"op_id = (?P<v>\d+)"),
    "sizes": ("sizes", r"sizes = (?P<v>\[.*?\])(?:, input_op_ids = |$)"),
}
_DECORATION_FIELDS = ("seq", "stashed seq", "op_id", "sizes", "input_op_ids")  # as in _DECORATIONS
_PARSE_CHUNK = 1 << 18  # texts parsed at once
#: Rows per Arrow batch of an ADBC query (the driver's default is 1,024): fewer, larger chunks to fetch and combine
#: (1M kernels, 2M NVTX rows: ~0.2 s CPU less); the driver still infers each column's type from the first batch.
ARROW_BATCH_ROWS = 1 << 16
ARROW_BATCH_OPTION = "adbc.sqlite.query.batch_rows"
_MAX_FAST_DIGITS = 18  # |v| < 10**18 fits int64; longer numbers are read exactly (Python ints)

# What makes two kernel rows one (docs/field-cases.md C24): every field the reader keeps of a KERNEL (or GRAPH_TRACE)
# row. Two kernels of one stream never start in the same ns, and two nodes of one graph launch differ in graphNodeId.
KERNEL_RECORD_FIELDS = ["pid", "device", "stream", "name", "mangled_name", "start_ns", "end_ns", "correlation_id",
                        "grid", "block", "graph_id", "graph_node_id", "activity"]


@dataclass
class NsysTimeline(Timeline):
    activities: pd.DataFrame = field(default_factory=pd.DataFrame)  # memcpy / memset rows
    diagnostics: dict = field(default_factory=dict)


def decode_global_tid(gtid: np.ndarray | pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``globalTid`` -> (pid, tid) arrays (docs/formats.md#nsys-identifiers). Works for ``globalPid`` too (tid 0)."""
    values = np.asarray(gtid, dtype=np.int64)
    return (values >> 24) & 0xFFFFFF, values & 0xFFFFFF


def parse_range_texts(texts) -> pd.DataFrame:
    """Split emit_nvtx range texts into the operator name and its decorations (vectorized: pyarrow and numpy).

    ``"aten::mm, seq = 0, op_id = 3, sizes = [[64, 128], [128, 256]]"`` -> name ``aten::mm``, seq 0,
    op_id 3, sizes ``"[[64, 128], [128, 256]]"``, stashed_seq null. A text without decorations is its
    own name; a null text gives the name ``""``. The name ends where :data:`_DECORATIONS` begins; each
    number is what its :data:`_FIELDS` regex reads.

    Returns:
        DataFrame aligned with ``texts``: ``name`` (str), ``seq``, ``op_id``, ``stashed_seq`` (Int64;
        a negative seq, which torch writes for "none", is null; so is a number beyond int64, whose texts
        ``attrs["numbers_beyond_int64"]`` lists), ``sizes`` (str or None).
    """
    if isinstance(texts, pd.Series):
        arr = pa.array(texts.astype("str"), type=pa.string())
    else:
        arr = pa.array(np.asarray(texts, dtype=object), type=pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    numbers = {column: (np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)) for column in _FIELDS if column != "sizes"}
    names, sizes, too_big = [], [], []
    # In chunks: the searches' temporaries stay a few MB (this runs beside the kernels' read, the reader's peak).
    for begin in range(0, n, _PARSE_CHUNK):
        name, size = _parse_chunk(arr.slice(begin, _PARSE_CHUNK), {c: (v[begin:], m[begin:]) for c, (v, m) in
                                                                    numbers.items()}, too_big)
        names.append(name)
        sizes.append(size)
    out = pd.DataFrame({"name": pc.fill_null(pa.chunked_array(names, type=arr.type), "").to_pandas()
                        if names else pd.Series([], dtype="str")})
    for column in _FIELDS:
        out[column] = (pa.chunked_array(sizes, type=pa.string()).to_pandas() if sizes else pd.Series([], dtype="str")) \
            if column == "sizes" else pd.arrays.IntegerArray(*numbers[column])
    if too_big:  # each text once, in the order of the texts (not of the fields and chunks)
        listed = np.flatnonzero(pc.fill_null(pc.is_in(arr, value_set=pa.array(too_big, type=arr.type)), False)
                                .to_numpy(zero_copy_only=False))
        too_big = list(dict.fromkeys(arr.take(pa.array(listed)).to_pylist()))
    out.attrs["numbers_beyond_int64"] = too_big  # texts whose seq/op_id/stashed seq does not fit 64 bits
    return out


def _parse_chunk(arr: pa.Array, numbers: dict[str, tuple[np.ndarray, np.ndarray]], too_big: list[str]
                 ) -> tuple[pa.Array, pa.Array]:
    """:func:`parse_range_texts` of ``arr``: returns the names and sizes; the numbers go into ``numbers``
    (column -> (values, missing), views aligned with ``arr``), texts with a number beyond int64 to ``too_big``."""
    n = len(arr)
    # Only the decorated texts (every marker holds " = ") are searched, and the values put back in place.
    decorated = pc.fill_null(pc.match_substring(arr, " = "), False)
    decorated_rows = np.flatnonzero(decorated.to_numpy(zero_copy_only=False))
    texts_d = _RawTexts(arr.take(pa.array(decorated_rows)))
    names = pc.replace_with_mask(arr, decorated, texts_d.undecorated().cast(arr.type)) if len(decorated_rows) else arr
    sizes = pa.nulls(n, pa.string())
    for column, (field, pattern) in _FIELDS.items():
        if column == "sizes":
            present = texts_d.present(field)
            if len(present):
                matched = pc.extract_regex(texts_d.arr.take(pa.array(present)), pattern)
                found = pc.if_else(pc.is_valid(matched), pc.struct_field(matched, "v"), pa.scalar(None, pa.string()))
                at = np.full(n, -1, dtype=np.int64)
                at[decorated_rows[present]] = np.arange(len(present))
                sizes = found.take(pa.array(np.maximum(at, 0), mask=at < 0)).cast(pa.string())
            continue
        rows, values = texts_d.numbers(field, pattern, too_big, signed=column == "seq")
        ints, missing = numbers[column]
        at = decorated_rows[rows]
        ints[at] = values
        missing[at] = values < 0 if column == "seq" else False
    return names, sizes


class _RawTexts:
    """Non-null texts and the decorations in them, found on the bytes themselves (Arrow's offsets and data
    buffers as numpy arrays): every ``" = "`` inside a text, and which field name ends right before it.

    The same matches as the regexes of :data:`_DECORATIONS` and :data:`_FIELDS` (tests compare the two on
    random texts), in a fraction of their time on millions of ranges: the searches run once over all
    the bytes rather than once per text and field.
    """

    def __init__(self, arr: pa.Array):
        self.arr = arr.cast(pa.large_string()) if arr.type != pa.large_string() else arr
        _, offsets, data = self.arr.buffers()
        self.offsets = np.frombuffer(offsets, dtype=np.int64)[self.arr.offset:self.arr.offset + len(self.arr) + 1]
        self.data = np.frombuffer(data, dtype=np.uint8) if data is not None and data.size else np.zeros(0, np.uint8)
        first, last = (int(self.offsets[0]), int(self.offsets[-1])) if len(self.arr) else (0, 0)
        span = self.data[first:last]
        # Every " = " (its first byte's position) that lies within one text, and that text's row.
        equals = span[1:-1] == ord("=") if len(span) >= 3 else np.zeros(0, dtype=bool)
        equals &= span[:-2] == ord(" ")
        equals &= span[2:] == ord(" ")
        self.at = np.flatnonzero(equals) + first
        del equals
        self.row = np.searchsorted(self.offsets, self.at, side="right") - 1
        inside = self.at + 3 <= self.offsets[1:][self.row]
        if not inside.all():
            self.at, self.row = self.at[inside], self.row[inside]
        self._byte_before = self.data[np.maximum(self.at - 1, 0)]  # (compared first: it rules out most fields)
        self._fields: dict = {}

    def _preceded(self, candidates: np.ndarray, end: np.ndarray, text: bytes) -> np.ndarray:
        """The ``candidates`` (indices into :attr:`at`) whose text holds ``text`` ending at byte ``end``
        (an array aligned with :attr:`at`), within the same text."""
        for back, byte in enumerate(reversed(text), start=1):
            if len(candidates):
                candidates = candidates[self.data[np.maximum(end[candidates] - back, 0)] == byte]
        return candidates[end[candidates] - len(text) >= self.offsets[self.row[candidates]]]

    def field(self, name: str, after_comma: str | None = None) -> np.ndarray:
        """Ascending indices into :attr:`at` of the ``" = "`` that ``name`` directly precedes; ``after_comma``:
        ``"required"`` (``, name = ``) or ``"or_at_start"`` (``(?:^|, )name = ``)."""
        if (name, after_comma) in self._fields:
            return self._fields[name, after_comma]
        key = name.encode()
        if after_comma is None:
            found = self._preceded(np.flatnonzero(self._byte_before == key[-1]), self.at - 1, key[:-1])
        else:
            named = self.field(name)
            before = self.at - len(key)
            found = self._preceded(named, before, b", ")
            if after_comma == "or_at_start":
                hit = np.zeros(len(self.at), dtype=bool)
                hit[found] = True
                hit[named[before[named] == self.offsets[self.row[named]]]] = True
                found = np.flatnonzero(hit)
        self._fields[name, after_comma] = found
        return found

    def first_per_row(self, hits: np.ndarray) -> np.ndarray:
        """Of ``hits`` (ascending indices into :attr:`at`), the first in each text."""
        rows = self.row[hits]
        return hits[np.r_[True, rows[1:] != rows[:-1]]] if len(hits) else hits

    def undecorated(self) -> pa.Array:
        """The text before the first ``, <field> = `` (:data:`_DECORATIONS`). RE2's ``.*$`` does not cross a
        newline: texts holding one go through the regex, to cut exactly where it does."""
        lengths = np.diff(self.offsets)
        cut = lengths.copy()
        for name in _DECORATION_FIELDS:
            hits = self.first_per_row(self.field(name, "required"))
            position = self.at[hits] - len(name) - 2 - self.offsets[self.row[hits]]
            rows = self.row[hits]
            cut[rows] = np.minimum(cut[rows], position)
        kept = np.repeat(np.tile(np.array([True, False]), len(cut)), np.column_stack([cut, lengths - cut]).ravel())
        data = self.data[self.offsets[0]:self.offsets[-1]][kept] if len(cut) else np.zeros(0, np.uint8)
        names = pa.LargeStringArray.from_buffers(len(cut), pa.py_buffer(np.r_[0, np.cumsum(cut)]), pa.py_buffer(data))
        if len(cut) and (self.data[self.offsets[0]:self.offsets[-1]] == ord("\n")).any():
            multiline = pc.fill_null(pc.match_substring(self.arr, "\n"), False)
            names = pc.if_else(multiline, pc.replace_substring_regex(self.arr, _DECORATIONS, "", max_replacements=1),
                               names)
        return names

    def present(self, name: str) -> np.ndarray:
        """Rows whose text holds ``name = `` (the field's regex may still not match there)."""
        return np.unique(self.row[self.field(name)])

    def numbers(self, name: str, pattern: str, too_big: list[str], signed: bool) -> tuple[np.ndarray, np.ndarray]:
        """The integer ``pattern`` (the :data:`_FIELDS` regex of field ``name``) reads in each text: (rows that
        hold one, values). Read in place after the field's first ``name = `` (``seq``: at the start or after
        ``, ``; ``signed``: a leading ``-``); where no number follows that one (the regex then tries later ones)
        or it has more than 18 digits, the regex reads it (exactly, as Python ints: one beyond int64 is no
        value, and its text goes to ``too_big``)."""
        hits = self.first_per_row(self.field(name, "or_at_start" if name == "seq" else None))
        rows = self.row[hits]
        value, digits = _leading_integers(self.data, self.at[hits] + 3, self.offsets[1:][rows], signed=signed)
        fast = (digits > 0) & (digits <= _MAX_FAST_DIGITS)
        slow = rows[~fast]
        rows, value = rows[fast], value[fast]
        if len(slow):
            texts = self.arr.take(pa.array(slow))
            matched = pc.extract_regex(texts, pattern)
            valid = pc.is_valid(matched).to_numpy(zero_copy_only=False)
            exact = [int(v) for v in pc.struct_field(matched, "v").filter(pa.array(valid)).to_pylist()]
            fits = np.array([-(2 ** 63) <= v < 2 ** 63 for v in exact], dtype=bool)
            too_big += [t for t, ok in zip(texts.filter(pa.array(valid)).to_pylist(), fits) if not ok]
            rows = np.r_[rows, slow[valid][fits]]
            value = np.r_[value, np.array([v for v, ok in zip(exact, fits) if ok], dtype=np.int64)]
        return rows, value


def _leading_integers(data: np.ndarray, at: np.ndarray, stop: np.ndarray, signed: bool
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The integer written at byte ``at`` of ``data`` (ASCII digits, a leading ``-`` if ``signed``), reading
    no further than ``stop``: (value, number of digits: 0 where none; more than 18 counted as 19, with
    the value undefined). Up to 8 digits are read at once from each number's 8-byte window."""
    if signed:
        negative = (at < stop) & (data[np.minimum(at, len(data) - 1)] == ord("-")) if len(data) else at < 0
        at = at + negative
    value = np.zeros(len(at), dtype=np.int64)
    digits = np.zeros(len(at), dtype=np.int64)
    windowed = np.flatnonzero(at + 8 <= len(data))
    if len(windowed):
        window = np.lib.stride_tricks.sliding_window_view(data, 8)[at[windowed]] - np.uint8(ord("0"))
        is_digit = (window < 10) & (np.arange(8) < (stop - at)[windowed, None])
        count = np.where(is_digit.all(axis=1), 8, is_digit.argmin(axis=1))
        eight = np.zeros(len(windowed), dtype=np.int64)
        for j in range(8):  # the digits, and zeros after the last one: the value times 10 ** (8 - count)
            eight = eight * 10 + np.where(j < count, window[:, j], 0)
        value[windowed] = eight // 10 ** (8 - count)
        digits[windowed] = count
        longer = windowed[count == 8]  # the number may go on
        rest = np.setdiff1d(np.arange(len(at)), windowed, assume_unique=True)
        rest = np.union1d(rest, longer) if len(longer) else rest
    else:
        rest = np.arange(len(at))
    if len(rest):
        value[rest], digits[rest] = _leading_integers_bytewise(data, at[rest], stop[rest])
    return (np.where(negative, -value, value) if signed else value), digits


def _leading_integers_bytewise(data: np.ndarray, at: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_leading_integers` without a sign, one digit position at a time (numbers near the end of
    ``data`` or of 8 digits or more)."""
    last = len(data) - 1
    value = np.zeros(len(at), dtype=np.int64)
    digits = np.zeros(len(at), dtype=np.int64)
    live = np.arange(len(at))
    for i in range(_MAX_FAST_DIGITS + 1):
        where = at[live] + i
        digit = data[np.minimum(where, last)].astype(np.int64) - ord("0") if last >= 0 else np.zeros(len(live), np.int64)
        more = (where < stop[live]) & (digit >= 0) & (digit <= 9)
        live, digit = live[more], digit[more]
        if not len(live):
            break
        value[live] = value[live] * 10 + digit
        digits[live] += 1
    return value, digits


# --------------------------------------------------------------------------------------------------
# Opening and probing the export


class _Export:
    """A read-only connection plus the tables and columns the export actually has."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if self.path.is_dir():
            raise NsysExportError(f"{self.path}: is a directory; pass an nsys SQLite export file "
                                  "(nsys export --type sqlite REPORT.nsys-rep)")
        if not self.path.is_file():
            raise NsysExportError(f"{self.path}: no such file; pass an nsys SQLite export "
                                  "(nsys export --type sqlite REPORT.nsys-rep)")
        with open(self.path, "rb") as fh:
            header = fh.read(len(SQLITE_MAGIC))
        if header != SQLITE_MAGIC:
            raise NsysExportError(
                f"{self.path}: not an SQLite file (header {header[:15]!r}); export the report with "
                "'nsys export --type sqlite REPORT.nsys-rep' and pass the .sqlite file"
            )
        self.uri = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro&immutable=1"
        self.conn = sqlite3.connect(self.uri, uri=True)
        # Exports hold non-UTF-8 bytes (Windows host names, ...) (formats.md#nsys-export): decode tolerantly.
        self.conn.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            names = [r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
            self.columns = {
                name: [r[1] for r in self.conn.execute(f'PRAGMA table_info("{name}")')] for name in names
            }
        except sqlite3.DatabaseError as exc:
            raise NsysExportError(f"{self.path}: unreadable SQLite file ({exc}); the file is truncated or "
                                  "corrupt: export the report again") from None

        self._arrow = None  # ADBC connection, opened on first query

    def has(self, table: str) -> bool:
        return table in self.columns

    def _query_arrow(self, sql: str, private: bool = False) -> pd.DataFrame | None:
        """Run ``sql`` through the ADBC SQLite driver (Arrow columns, no Python object per value:
        several times faster than sqlite3 on million-row tables); None when the driver cannot read
        the result (it infers each column's type from the first rows, and a later value of another
        type is an error), so that sqlite3 reads it instead. ``private``: on a connection of its own,
        closed after (for a query run on another thread)."""
        connection = None
        try:
            import adbc_driver_sqlite.dbapi as adbc

            if private:
                connection = adbc.connect(self.uri)
            elif self._arrow is None:
                self._arrow = adbc.connect(self.uri)
            cursor = (connection or self._arrow).cursor()
            try:
                try:
                    cursor.adbc_statement.set_options(**{ARROW_BATCH_OPTION: str(ARROW_BATCH_ROWS)})
                except Exception as exc:  # noqa: BLE001  (a driver without the option: its default batches)
                    if _interrupted(exc):
                        raise KeyboardInterrupt from None
                    log.debug("%s: ADBC batch size not set (%s)", self.path, exc)
                cursor.execute(sql)
                table = cursor.fetch_arrow_table()
            finally:
                cursor.close()
            table = table.combine_chunks()  # (one chunk per ARROW_BATCH_ROWS rows: converting chunked strings is slow)
            table.validate(full=True)  # invalid UTF-8 (exports hold some): sqlite3 decodes it tolerantly
            for field in table.schema:
                if field.name not in TEXT_COLUMNS and not (pa.types.is_integer(field.type) or pa.types.is_null(field.type)):
                    return None  # a value of another type: sqlite3 reads it and names the culprit
            return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        except Exception as exc:  # noqa: BLE001  (ADBC's own errors, Arrow's, a missing driver: sqlite3 answers)
            if _interrupted(exc):
                raise KeyboardInterrupt from None
            log.debug("%s: ADBC could not read (%s); using sqlite3", self.path, exc)
            return None
        finally:
            if connection is not None:
                connection.close()

    def query(self, sql: str, params=()) -> pd.DataFrame:
        """A query's result as a DataFrame; integer columns with nulls are ``Int64``."""
        if not params:
            frame = self._query_arrow(sql)
            if frame is not None:
                return frame
        try:
            cur = self.conn.execute(sql, params)
            rows = cur.fetchall()
        except sqlite3.DatabaseError as exc:
            raise NsysExportError(f"{self.path}: cannot read ({exc}) while running: {sql.split(' FROM ')[-1][:80]}; "
                                  "the file is truncated or corrupt: export the report again") from None
        frame = pd.DataFrame.from_records(rows, columns=[d[0] for d in cur.description])
        self._check_numbers(frame, sql)
        for column in frame.columns:  # the same dtypes as the ADBC path
            if frame[column].dtype.kind in "if" and frame[column].isna().any():
                values = pd.to_numeric(frame[column], errors="coerce")
                if (values.dropna() % 1 == 0).all():
                    frame[column] = values.astype("Int64")
        return frame

    def _check_numbers(self, frame: pd.DataFrame, sql: str) -> None:
        """Columns other than names/text must hold integers (or NULL); a file edited by hand or
        by another tool may not. Raises NsysExportError naming the column and a bad value."""
        source = sql.split(" FROM ")[-1].split()[0].strip('"')
        for column in frame.columns:
            if column in TEXT_COLUMNS or pd.api.types.is_numeric_dtype(frame[column].dtype):
                continue
            values = frame[column].dropna()
            bad = values[pd.to_numeric(values, errors="coerce").isna() | values.map(lambda v: isinstance(v, float))]
            if len(bad):
                raise NsysExportError(
                    f"{self.path}: table {source} column {column} holds {bad.iloc[0]!r} (row {int(bad.index[0]) + 1} of "
                    f"the query), not an integer; the export was altered after 'nsys export' or is damaged: export "
                    "the report again"
                )

    def rows(self, sql: str) -> list[tuple]:
        """A small query's rows through sqlite3; a damaged file is an NsysExportError."""
        try:
            return self.conn.execute(sql).fetchall()
        except sqlite3.DatabaseError as exc:
            raise NsysExportError(f"{self.path}: cannot read ({exc}) while running: {sql.split(' FROM ')[-1][:80]}; "
                                  "the file is truncated or corrupt: export the report again") from None

    def require(self, table: str, required: tuple[str, ...], label: str | None = None) -> None:
        missing = [c for c in required if c not in self.columns[table]]
        if missing:
            raise NsysExportError(
                f"{self.path}: table {table} lacks column(s) {', '.join(missing)} (has: "
                f"{', '.join(self.columns[table])}); this export schema is not one the reader knows "
                f"({SUPPORTED}); re-export with a supported nsys version, or report the schema"
            )

    def optional_text(self, table: str, column: str) -> str:
        """A nullable text column as ``coalesce(column, '')`` (ADBC infers a column that starts with
        nulls as integer); callers treat '' as absent."""
        return f"coalesce(\"{column}\", '') AS \"{column}\"" if column in self.columns[table] else f"'' AS \"{column}\""

    def optional(self, table: str, column: str, alias: str | None = None, default: str = "NULL") -> str:
        """``"column" AS alias`` when the column exists, else ``default AS alias``."""
        alias = alias or column
        return f'"{column}" AS "{alias}"' if column in self.columns[table] else f'{default} AS "{alias}"'

    def close(self) -> None:
        self.conn.close()
        if self._arrow is not None:
            self._arrow.close()


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a Ctrl-C: during a query on the main thread ADBC handles SIGINT itself,
    tries to cancel the query (the SQLite driver cannot) and raises that failure ``from KeyboardInterrupt``,
    which would otherwise read as "ADBC cannot read this" and the query would run again with sqlite3."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _metadata(export: _Export) -> dict:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if export.has(table):
            rows = dict(export.rows(f"SELECT name, value FROM {table}"))
            return {
                "metadata_table": table,
                "product_version": rows.get("EXPORT_PRODUCT_VERSION"),
                "schema_version": rows.get("EXPORT_SCHEMA_VERSION"),
                "platform": rows.get("EXPORT_PLATFORM"),
            }
    return {"metadata_table": None, "product_version": None, "schema_version": None, "platform": None}


def _strings(export: _Export) -> pa.Array:
    """StringIds as an id-indexed Arrow string array (ids are small dense integers; gaps are null)."""
    if not export.has("StringIds"):
        return pa.array([], type=pa.string())
    df = export.query("SELECT id, value FROM StringIds")
    if df.empty:
        return pa.array([], type=pa.string())
    ids = df["id"].to_numpy(dtype=np.int64)
    position = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    position[ids] = np.arange(len(ids))
    values = pa.array(df["value"].astype(object).where(df["value"].notna(), None).to_numpy(dtype=object),
                      type=pa.string())
    return values.take(pa.array(np.maximum(position, 0), mask=position < 0))


def _lookup(strings: pa.Array, ids: pd.Series) -> pd.Series:
    """String ids -> a string Series aligned with ``ids`` (``str`` dtype); null or unknown ids -> NaN."""
    values = pd.to_numeric(ids, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    ok = ~np.isnan(values) & (values >= 0) & (values < len(strings))
    index = pa.array(np.where(ok, values, 0).astype(np.int64), mask=~ok)
    out = strings.take(index).to_pandas() if len(strings) else pd.Series([None] * len(values), dtype="str")
    out.index = ids.index
    return out


def _event_types(export: _Export) -> dict[str, int]:
    types = dict(EVENT_TYPE_DEFAULTS)
    if export.has("ENUM_NSYS_EVENT_TYPE") and {"id", "name"} <= set(export.columns["ENUM_NSYS_EVENT_TYPE"]):
        for type_id, name in export.rows("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE"):
            if name in types:
                types[name] = int(type_id)
    return types


def _nvtx_table(export: _Export, diagnostics: dict) -> str | None:
    """The NVTX events table: ``NVTX_EVENTS``, else a version-suffixed one (``NVTX_EVENTS_V2``; docs/field-cases.md C08)."""
    if export.has(NVTX_TABLE):
        return NVTX_TABLE
    candidates = sorted(t for t in export.columns if t.upper().startswith(NVTX_TABLE))
    if candidates:
        if len(candidates) > 1:
            diagnostics["warnings"].append(f"several NVTX tables {candidates}; reading {candidates[0]}")
        return candidates[0]
    return None


# --------------------------------------------------------------------------------------------------
# Tables


def _read_launches(export: _Export, strings: pa.Array, diagnostics: dict) -> pd.DataFrame:
    """The CUDA runtime/driver calls (eventClass 0/1, never chosen by API name) whose correlation id
    some GPU activity carries: the launches (LAUNCHES columns plus ``event_class``)."""
    columns = ["launch_id", "pid", "tid", "start_ns", "end_ns", "api", "correlation_id", "event_class"]
    if not export.has(RUNTIME_TABLE):
        return pd.DataFrame({c: pd.Series(dtype="Int64" if c not in ("api",) else object) for c in columns})
    export.require(RUNTIME_TABLE, REQUIRED_COLUMNS[RUNTIME_TABLE])
    has_class = "eventClass" in export.columns[RUNTIME_TABLE]
    conditions = [f"eventClass IN {RUNTIME_EVENT_CLASSES}"] if has_class else []
    # Only calls that launched GPU work (kernel, graph, memcpy, memset): a capture can hold ten
    # times more API calls (allocations, synchronizations, queries) than launches. Where it holds
    # hardly more calls than GPU activities, reading them all costs less than SQLite's IN set of a million
    # ids; _own_process_launches keeps the launches either way. (Without eventClass, backtrace copies of
    # every call would be read: those exports always take the IN set.)
    gpu_tables = [t for t in (KERNEL_TABLE, GRAPH_TRACE_TABLE, MEMCPY_TABLE, MEMSET_TABLE)
                  if export.has(t) and "correlationId" in export.columns[t]]
    read_all = gpu_tables and has_class and export.rows(f"SELECT count(*) FROM {RUNTIME_TABLE}")[0][0] <= 1.5 * sum(
        export.rows(f"SELECT count(*) FROM {t}")[0][0] for t in gpu_tables)
    if not read_all:
        launched = " UNION ALL ".join(f"SELECT correlationId FROM {t}" for t in gpu_tables)
        conditions.append(f"correlationId IN ({launched})" if launched else "0")  # (a set: no dedup pass)
    where = "WHERE " + " AND ".join(conditions) if conditions else ""
    # One scan of the table (often the export's largest) for the calls per process and its last end
    # (for the capture end: _capture_end).
    counted = f"coalesce(sum(eventClass IN {RUNTIME_EVENT_CLASSES}), 0)" if has_class else "count(*)"
    # Most captures hold one process: found so with min/max, its calls need no GROUP BY (whose sort costs
    # more than the scan). Rows without a thread count towards the last end only, as their group does below.
    one_pid = (f"coalesce(sum(eventClass IN {RUNTIME_EVENT_CLASSES} AND globalTid IS NOT NULL), 0)" if has_class
               else "count(globalTid)")
    (low, high, calls, end), = export.rows(
        f'SELECT min(globalTid >> 24), max(globalTid >> 24), {one_pid}, max("end") FROM {RUNTIME_TABLE}')
    per_pid = [(None if low is None else low & 0xFFFFFF, calls, end)]
    if low != high:
        per_pid = export.rows(
            f'SELECT (globalTid >> 24) & 16777215, {counted}, max("end") FROM {RUNTIME_TABLE} GROUP BY 1'
        )
    ends = [e for *_, e in per_pid if isinstance(e, (int, float))]
    diagnostics["runtime_end_ns"] = max(ends) if ends else None
    diagnostics["cuda_api_calls_per_pid"] = {int(pid): int(n) for pid, n, _ in per_pid if pid is not None and n}
    diagnostics["cuda_api_calls"] = sum(diagnostics["cuda_api_calls_per_pid"].values())
    df = export.query(
        f'SELECT start, "end", globalTid, correlationId, nameId, '
        f'{export.optional(RUNTIME_TABLE, "eventClass")} FROM {RUNTIME_TABLE} {where}'
    )
    pid, tid = decode_global_tid(df["globalTid"].fillna(0))
    launches = pd.DataFrame(
        {
            "pid": pid, "tid": tid, "start_ns": df["start"].astype("int64"), "end_ns": df["end"].astype("int64"),
            "api": _lookup(strings, df["nameId"]),
            "correlation_id": pd.array(df["correlationId"], dtype="Int64"),
            "event_class": pd.array(df["eventClass"], dtype="Int64"),
        },
        copy=False,
    )
    launches = launches.sort_values(["start_ns", "pid", "tid"], kind="stable").reset_index(drop=True)
    launches["launch_id"] = np.arange(len(launches), dtype=np.int64)
    return launches[columns]


def _launch_index(launches: pd.DataFrame, diagnostics: dict, lives: ProcessLives | None = None) -> pd.DataFrame:
    """One launch per (process life, correlation id > 0): the keys GPU activities join on (``proc``: the pid, or
    the process-life id of :mod:`.process_lives` in a pid several processes used; ``key``: the int64 join key).

    Schemas without eventClass keep the backtrace copies of each call (they overlap it in time): the first row of
    a key is used. Two calls of one life with one key that do not overlap (a reused pid whose lives could not be
    told apart) join nothing: ``lives.ambiguous`` lists those keys."""
    keyed = launches[(launches["correlation_id"].fillna(0) > 0).to_numpy(dtype=bool)]
    life = life_of_calls(keyed, lives)
    proc = ProcessLives.proc(keyed["pid"].to_numpy(dtype=np.int64), life)
    key = life_keys(proc, keyed["correlation_id"]) if len(keyed) else np.zeros(0, dtype=np.int64)
    copies, reuses = repeated_calls(key, keyed["start_ns"].to_numpy(dtype=np.int64),
                                    keyed["end_ns"].to_numpy(dtype=np.int64))
    if copies.any():
        diagnostics["info"].append(f"{int(copies.sum())} CUDA API rows repeat a (process, correlation id) "
                                   "already seen (backtrace duplicates); the first row of each is used")
    drop = copies | reuses
    if reuses.any():  # (only where the lives of a reused pid could not be separated: lives.ambiguous)
        drop |= pd.Series(key, copy=False).isin(key[reuses]).to_numpy(dtype=bool)
    index = keyed.rename(columns={"tid": "launch_tid", "start_ns": "launch_start_ns", "end_ns": "launch_end_ns",
                                  "api": "launch_api"})[
        ["pid", "correlation_id", "launch_tid", "launch_start_ns", "launch_end_ns", "launch_api"]]
    index["proc"] = proc
    index["key"] = key
    return index[~drop] if drop.any() else index


def _join_launch(frame: pd.DataFrame, launch_index: pd.DataFrame, lives: ProcessLives | None = None
                 ) -> pd.DataFrame:
    """Add launch_tid/launch_start_ns/launch_end_ns/launch_api by (pid, correlation id); ids <= 0 never join.

    One int64 key per (pid, correlation id) looked up in a hash index of the launches (a
    merge copied the whole kernel table and took seconds on a million kernels); ids beyond 32 bits
    (never written by CUPTI) take the merge, whose keys are exact. With ``lives`` (a pid several processes used,
    :mod:`.process_lives`) the key is the activity's process life's, by its start time; ``process_life`` and
    ``launch_refused`` (``pid_reused`` where the life cannot be told: no launch joined) are added."""
    corr = [pd.array(t["correlation_id"], dtype="Int64") for t in (frame, launch_index)]
    out = frame.copy(deep=False)
    proc = frame["pid"].to_numpy(dtype=np.int64)
    refused = None
    if lives is not None:
        position, life, refused = lives.join(pd.Index(launch_index["key"].to_numpy()), proc, corr[0],
                                             frame["start_ns"].to_numpy(dtype=np.int64))
        proc = ProcessLives.proc(proc, life)
        out["process_life"] = life
        out["launch_refused"] = pd.array(np.where(refused, REFUSED, None), dtype="str")
    if all(not len(c) or int(c.fillna(0).max()) <= 0xFFFFFFFF for c in corr):
        if lives is None:
            keys = life_keys(proc, corr[0])
            position = pd.Index(launch_index["key"].to_numpy()).get_indexer(keys)
            position[keys < 0] = -1
        missing = position < 0
        for column in ("launch_tid", "launch_start_ns", "launch_end_ns"):
            values = launch_index[column].to_numpy(dtype=np.int64)
            out[column] = pd.arrays.IntegerArray(values[np.maximum(position, 0)] if len(values) else
                                                 np.zeros(len(frame), dtype=np.int64), missing)
        out["launch_api"] = launch_index["launch_api"].array.take(position, allow_fill=True)
        return out
    key = out["correlation_id"].where(out["correlation_id"].fillna(0) > 0)
    if refused is not None:
        key = key.where(~refused)
    joined = out.assign(_corr=key.astype("Int64"), proc=proc).merge(
        launch_index.drop(columns=["pid", "key"]).rename(columns={"correlation_id": "_corr"}), on=["proc", "_corr"],
        how="left", sort=False)
    joined.index = frame.index
    return joined.drop(columns=["_corr", "proc"])


def _process_keys(pid, correlation_id) -> np.ndarray:
    """One int64 per (pid, correlation id): pid is 24-bit (formats.md#nsys-identifiers), CUPTI correlation ids 32-bit; -1 where the id is
    null or <= 0 (such a row never joins)."""
    return life_keys(pid, correlation_id)


def _isin(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``np.isin`` through pandas' hash table: 10x faster than numpy's on a million int64 keys."""
    return pd.Series(values, copy=False).isin(wanted).to_numpy(dtype=bool)


def _own_process_launches(launches: pd.DataFrame, kernels: pd.DataFrame, activities: pd.DataFrame,
                          diagnostics: dict) -> pd.DataFrame:
    """Keep the launch calls whose ``(pid, correlationId)`` a kernel, graph or memcpy/memset row *of the same
    process* carries; ``launch_id`` is renumbered in start order.

    The SQL pre-filter matches correlation ids alone (cheap on large tables), but correlation ids are unique per
    process only (formats.md#nsys-queries): in a multi-process capture a call of one process can share its id with a kernel of
    another and would be kept as a "launch" that launched nothing. Kernels left without a launch row whose id a
    call of another process carries are counted in ``diagnostics["cross_process_correlation_ids"]`` (never
    joined)."""
    call_keys = _process_keys(launches["pid"], launches["correlation_id"])
    gpu_keys = [_process_keys(t["pid"], t["correlation_id"]) for t in (kernels, activities) if len(t)]
    gpu_keys = np.concatenate(gpu_keys) if gpu_keys else np.zeros(0, dtype=np.int64)
    own = _isin(call_keys, gpu_keys[gpu_keys >= 0]) & (call_keys >= 0)
    crossed = 0
    if len(kernels):
        corr = kernels["correlation_id"].astype("Int64")
        dangling = (corr.fillna(0) > 0).to_numpy() & kernels["launch_tid"].isna().to_numpy()
        other = launches["correlation_id"].astype("Int64").dropna().to_numpy(dtype=np.int64)
        crossed = int(_isin(corr[dangling].to_numpy(dtype=np.int64), other).sum())
    diagnostics["cross_process_correlation_ids"] = crossed
    if own.all():
        return launches
    kept = launches[own].reset_index(drop=True)
    kept["launch_id"] = np.arange(len(kept), dtype=np.int64)
    if isinstance(kept["api"].dtype, pd.CategoricalDtype):
        kept["api"] = kept["api"].cat.remove_unused_categories()
    return kept


def _xyz(df: pd.DataFrame, prefix: str) -> pd.Series:
    """``gridX, gridY, gridZ`` -> ``"x,y,z"`` (built in Arrow); null when a column is absent or null."""
    cols = [f"{prefix}{axis}" for axis in "XYZ"]
    if not all(c in df for c in cols):
        return pd.Series([None] * len(df), index=df.index, dtype="str")
    dims = [df[c].astype("Int64") for c in cols]
    x, y, z = (d.to_numpy(dtype=np.int64, na_value=-1) for d in dims)
    if len(x) and min(x.min(), y.min(), z.min()) >= 0 and x.max() < 2**31 and max(y.max(), z.max()) < 2**16:
        # Within CUDA's limits (x < 2**31, y and z < 2**16) a triple packs into one int64: texts are built
        # for the distinct triples only (a capture has a few dozen of them over millions of kernels).
        codes, packed = pd.factorize((x << 32) | (y << 16) | z)
        parts = [pa.array(v) for v in (packed >> 32, (packed >> 16) & 0xFFFF, packed & 0xFFFF)]
        texts = pc.binary_join_element_wise(*(pc.cast(p, pa.string()) for p in parts), ",")
        out = texts.take(pa.array(codes)).to_pandas()
    else:
        parts = [pc.cast(pa.array(d), pa.string()) for d in dims]
        out = pc.binary_join_element_wise(*parts, ",").to_pandas()  # null if any part is null
    out.index = df.index
    return out


def _gpu_ids(export: _Export, pid: np.ndarray, device: np.ndarray) -> np.ndarray:
    """CUDA ordinal -> nsys GPU id (formats.md#nsys-identifiers): TARGET_INFO_CUDA_DEVICE maps (process, ordinal) where the export
    has it (2025+); otherwise, and for processes it does not list, TARGET_INFO_GPU.cuDevice; the ordinal
    itself when neither knows it."""
    mapping: dict[tuple[int, int], int] = {}
    if export.has("TARGET_INFO_GPU") and {"id", "cuDevice"} <= set(export.columns["TARGET_INFO_GPU"]):
        by_ordinal = {int(c): int(i) for i, c in export.rows("SELECT id, cuDevice FROM TARGET_INFO_GPU")
                      if c is not None and i is not None}
        mapping.update({(int(p), c): i for p in pd.unique(pid) for c, i in by_ordinal.items()})
    if export.has("TARGET_INFO_CUDA_DEVICE") and {"gpuId", "cudaId", "pid"} <= set(export.columns["TARGET_INFO_CUDA_DEVICE"]):
        mapping.update({(int(p), int(c)): int(g) for g, c, p in
                        export.rows("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE")
                        if g is not None and c is not None and p is not None})
    return _map_pairs(pid, device, mapping) if mapping else np.asarray(device, dtype=np.int64).copy()


def _map_pairs(pid: np.ndarray, device: np.ndarray, mapping: dict[tuple[int, int], int]) -> np.ndarray:
    """``mapping[(pid, device)]`` per row (the device itself when unmapped), one lookup per distinct pair."""
    key = np.asarray(pid, dtype=np.int64) << 32 | np.asarray(device, dtype=np.int64)
    pairs, inverse = np.unique(key, return_inverse=True)
    mapped = np.array([mapping.get((int(k >> 32), int(k & 0xFFFFFFFF)), int(k & 0xFFFFFFFF)) for k in pairs],
                      dtype=np.int64)
    return mapped[inverse] if len(pairs) else np.asarray(device, dtype=np.int64)


def _devices(export: _Export) -> list[dict]:
    if not export.has("TARGET_INFO_GPU"):
        return []
    cols = export.columns["TARGET_INFO_GPU"]
    wanted = [c for c in ("id", "deviceId", "cuDevice", "name", "busLocation", "smCount", "computeMajor",
                          "computeMinor") if c in cols]
    return [dict(zip(wanted, row)) for row in
            export.rows(f"SELECT {', '.join(wanted)} FROM TARGET_INFO_GPU")]


def _graph_captures(export: _Export, lives: ProcessLives | None = None) -> pd.DataFrame | None:
    """(proc, graphNodeId) -> the capture-time node-creation event (thread, start, end), following
    clones (instantiation) back to the original node through ``originalGraphNodeId`` within the same
    process (node ids repeat across processes). ``proc`` is the pid, or in a pid several processes used
    (``lives``) the process-life id of the life the event lies in (:mod:`.process_lives`). A clone whose
    original is not in the table has no capture context. None when the export has no node-event table."""
    table = next((t for t in GRAPH_NODE_TABLES if export.has(t)
                  and {"graphNodeId", "originalGraphNodeId", "globalTid", "start", "end"} <= set(export.columns[t])), None)
    if table is None:
        return None
    nodes = export.query(f'SELECT graphNodeId, originalGraphNodeId, globalTid, start, "end" FROM {table}')
    nodes = nodes[nodes["globalTid"].notna()]
    pid, tid = decode_global_tid(nodes["globalTid"])
    if lives is not None:
        pid = ProcessLives.proc(pid, lives.life_at(pid, nodes["start"].to_numpy(dtype=np.int64)))
    nodes = pd.DataFrame({"pid": pid, "tid": tid, "node": nodes["graphNodeId"].astype("int64").to_numpy(),
                          "original": nodes["originalGraphNodeId"].astype("Int64").array,
                          "start": nodes["start"].astype("int64").to_numpy(), "end": nodes["end"].astype("int64").to_numpy()})
    nodes = nodes.drop_duplicates(["pid", "node"], keep="first").reset_index(drop=True)
    row_of = pd.Series(np.arange(len(nodes)), index=pd.MultiIndex.from_arrays([nodes["pid"], nodes["node"]]))
    # Follow originals, all nodes at once (chains are short); -1: the original is not in the table.
    original = nodes["original"].to_numpy(dtype=np.float64, na_value=np.nan)
    pids = nodes["pid"].to_numpy()
    current = np.arange(len(nodes))
    for _ in range(len(nodes) + 1):
        live = np.flatnonzero(current >= 0)
        step = live[~np.isnan(original[current[live]])]
        if not len(step):
            break
        keys = pd.MultiIndex.from_arrays([pids[current[step]], original[current[step]].astype(np.int64)])
        found = row_of.reindex(keys).to_numpy(dtype=np.float64)
        current[step] = np.where(np.isnan(found), -1, np.nan_to_num(found)).astype(np.int64)
    else:  # a cycle of clones never reaches an original
        current[:] = np.where(np.isnan(original[np.maximum(current, 0)]), current, -1)
    known = current >= 0
    src = np.maximum(current, 0)
    out = pd.DataFrame({
        "proc": nodes["pid"].to_numpy(), "graph_node_id": nodes["node"].to_numpy(),
        "capture_pid": nodes["pid"].to_numpy() & 0xFFFFFF, "capture_tid": nodes["tid"].to_numpy()[src],
        "capture_start_ns": nodes["start"].to_numpy()[src], "capture_end_ns": nodes["end"].to_numpy()[src],
    })
    return out[known].reset_index(drop=True)


def _read_kernels(export: _Export, strings: pa.Array, launch_index: pd.DataFrame, diagnostics: dict,
                  lives: ProcessLives | None = None) -> pd.DataFrame:
    t = KERNEL_TABLE
    export.require(t, REQUIRED_COLUMNS[t])
    cols = export.columns[t]
    if "demangledName" not in cols and "shortName" not in cols:
        export.require(t, ("demangledName",))
    select = ", ".join(
        [
            'start', '"end"', "deviceId", "streamId", "correlationId", "globalPid",
            export.optional(t, "demangledName"), export.optional(t, "shortName"), export.optional(t, "mangledName"),
            *(export.optional(t, c) for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")),
            export.optional(t, "graphNodeId"), export.optional(t, "graphId"),
        ]
    )
    df = export.query(f"SELECT {select} FROM {t}")
    missing_geometry = [c for c in ("gridX", "blockX") if c not in cols]
    if missing_geometry:
        diagnostics["warnings"].append(f"{t} has no {'/'.join(missing_geometry)} column: grid/block left empty")
    pid, _ = decode_global_tid(df["globalPid"].fillna(0))
    demangled = _lookup(strings, df["demangledName"])
    short = _lookup(strings, df["shortName"])
    name = demangled.fillna(short)
    kernels = pd.DataFrame(
        {
            "pid": pid, "device": df["deviceId"].astype("int64"), "stream": df["streamId"].astype("int64"),
            "name": name, "short_name": short, "mangled_name": _lookup(strings, df["mangledName"]),
            "start_ns": df["start"].astype("int64"), "end_ns": df["end"].astype("int64"),
            "correlation_id": pd.array(df["correlationId"], dtype="Int64"),
            "grid": _xyz(df, "grid"), "block": _xyz(df, "block"),
            "graph_id": pd.array(df["graphId"], dtype="Int64"),
            "graph_node_id": pd.array(df["graphNodeId"], dtype="Int64"),
            "activity": "kernel",
        },
        copy=False,
    )
    kernels["gpu_id"] = _gpu_ids(export, kernels["pid"].to_numpy(), kernels["device"].to_numpy())
    return _join_launch(kernels, launch_index, lives)


def _read_graph_trace(export: _Export, launch_index: pd.DataFrame, diagnostics: dict,
                      lives: ProcessLives | None = None) -> pd.DataFrame | None:
    """Graph-level tracing: one row per graph launch, reported as one ``<cuda_graph N>`` kernel row."""
    t = GRAPH_TRACE_TABLE
    if not export.has(t):
        return None
    export.require(t, REQUIRED_COLUMNS[t])
    df = export.query(f'SELECT start, "end", deviceId, streamId, correlationId, graphId, '
                      f'{export.optional(t, "globalPid")} FROM {t}')
    if df.empty:
        return None
    pid, _ = decode_global_tid(df["globalPid"].fillna(0))
    graphs = pd.DataFrame(
        {
            "pid": pid, "device": df["deviceId"].astype("int64"), "stream": df["streamId"].astype("int64"),
            "name": [f"<cuda_graph {int(g)}>" for g in df["graphId"]], "short_name": None, "mangled_name": None,
            "start_ns": df["start"].astype("int64"), "end_ns": df["end"].astype("int64"),
            "correlation_id": pd.array(df["correlationId"], dtype="Int64"), "grid": None, "block": None,
            "graph_id": pd.array(df["graphId"], dtype="Int64"),
            "graph_node_id": all_null_ints(len(df)), "activity": "graph",
        }
    )
    graphs["gpu_id"] = _gpu_ids(export, graphs["pid"].to_numpy(), graphs["device"].to_numpy())
    for graph_id in sorted({int(g) for g in df["graphId"]}):
        diagnostics["warnings"].append(
            f"CUDA graph traced at graph granularity; per-kernel attribution and ncu matching impossible for "
            f"graph {graph_id}: recapture with --cuda-graph-trace=node"
        )
    return _join_launch(graphs, launch_index, lives)


def _read_activities(export: _Export, launch_index: pd.DataFrame, lives: ProcessLives | None = None) -> pd.DataFrame:
    """Memcpy and memset rows: GPU activities that are not kernels, kept for the GPU time totals."""
    frames = []
    for table, kind in ((MEMCPY_TABLE, "memcpy"), (MEMSET_TABLE, "memset")):
        if not export.has(table):
            continue
        export.require(table, REQUIRED_COLUMNS[table])
        df = export.query(
            f'SELECT start, "end", deviceId, streamId, globalPid, {export.optional(table, "correlationId")}, '
            f'{export.optional(table, "bytes")}, {export.optional(table, "copyKind")} FROM {table}'
        )
        pid, _ = decode_global_tid(df["globalPid"].fillna(0))
        copy_kind = [MEMCPY_KINDS.get(int(k), str(int(k))) if not pd.isna(k) else None for k in df["copyKind"]]
        frames.append(
            pd.DataFrame(
                {
                    "kind": kind, "copy_kind": copy_kind, "pid": pid, "device": df["deviceId"].astype("int64"),
                    "stream": df["streamId"].astype("int64"), "start_ns": df["start"].astype("int64"),
                    "end_ns": df["end"].astype("int64"), "bytes": pd.array(df["bytes"], dtype="Int64"),
                    "correlation_id": pd.array(df["correlationId"], dtype="Int64"),
                }
            )
        )
    columns = ACTIVITY_COLUMNS
    if not frames:
        return pd.DataFrame(columns=columns)
    acts = pd.concat(frames, ignore_index=True)
    acts["duration_ns"] = acts["end_ns"] - acts["start_ns"]
    acts = _join_launch(acts, launch_index, lives).sort_values("start_ns", kind="stable").reset_index(drop=True)
    return acts[columns]


def _range_query(export: _Export, diagnostics: dict) -> tuple[str, dict[str, int]] | None:
    """The query of the NVTX rows the reader uses (ranges and domain names) and the event type ids;
    None (with a warning) when the export has no NVTX table."""
    table = _nvtx_table(export, diagnostics)
    if table is None:
        diagnostics["warnings"].append("export has no NVTX table; NVTX attribution skipped (was the capture run "
                                       "with -t nvtx, and does the program emit NVTX ranges?)")
        diagnostics["nvtx_table"] = None
        return None
    diagnostics["nvtx_table"] = table
    export.require(table, REQUIRED_COLUMNS["NVTX"])
    cols = export.columns[table]
    if "text" not in cols and "textId" not in cols:
        export.require(table, ("text",))
    types = _event_types(export)
    wanted = (types["NvtxPushPopRange"], types["NvtxtPushPopRange"], types["NvtxStartEndRange"],
              types["NvtxtStartEndRange"], types["NvtxDomainCreate"])
    sql = (f'SELECT start, "end", eventType, globalTid, {export.optional(table, "endGlobalTid")}, '
           f'{export.optional_text(table, "text")}, {export.optional(table, "textId")}, '
           f'{export.optional(table, "domainId", default="0")} FROM "{table}" '
           f"WHERE eventType IN ({', '.join(str(t) for t in wanted)})")
    return sql, types


def _range_rows(export: _Export, sql: str, strings: pa.Array, private: bool = False
                ) -> tuple[pd.DataFrame, pd.Series] | None:
    """The NVTX rows of ``sql`` (query order) and each row's text (:func:`_range_texts`). ``private``: read
    on a connection of its own through ADBC only (for another thread; None when ADBC cannot read the rows:
    the caller reads them with sqlite3)."""
    df = export._query_arrow(sql, private=True) if private else export.query(sql)
    if df is None:
        return None
    text = _range_texts(df, strings)
    df = df.drop(columns=["text", "textId"])  # (in ``text`` now)
    return df, text


class _RangeReader:
    """:func:`_read_ranges` on a second thread, while the main one reads the launch calls and kernels: the
    SQLite scan, Arrow's compute functions and numpy release the GIL, so the two cores share the work.

    The rows are read at once; the ranges are finished when the main thread gives the capture end
    (:meth:`give_capture_end`, once the kernels are read). Warnings go to :attr:`notes`, for the
    main thread to add where the ranges' warnings belong. :meth:`result` waits and raises what the
    thread raised; None when ADBC could not read the rows there (the main thread reads them with
    sqlite3, whose connection is its own). :meth:`stop` ends the thread after an error elsewhere.
    """

    def __init__(self, export: _Export, strings: pa.Array, query: tuple[str, dict[str, int]]):
        self.notes: dict = {"warnings": []}
        self._capture_end: concurrent.futures.Future = concurrent.futures.Future()
        self._ranges: pd.DataFrame | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(export, strings, query), name="nsys-nvtx-ranges",
                                        daemon=True)
        self._thread.start()

    def _run(self, export: _Export, strings: pa.Array, query: tuple[str, dict[str, int]]) -> None:
        try:
            rows = _range_rows(export, query[0], strings, private=True)
            if rows is not None:
                capture_end = self._capture_end.result()
                self._ranges = _read_ranges(export, strings, capture_end, self.notes, query, rows)
        except concurrent.futures.CancelledError:
            pass  # stopped: the main thread failed
        except BaseException as exc:  # noqa: BLE001  (re-raised on the main thread by result())
            self._error = exc

    def give_capture_end(self, capture_end: int) -> None:
        self._capture_end.set_result(capture_end)

    def result(self) -> pd.DataFrame | None:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._ranges

    def stop(self) -> None:
        self._capture_end.cancel()
        self._thread.join()


def _read_ranges(export: _Export, strings: pa.Array, capture_end: int, diagnostics: dict,
                 query: tuple[str, dict[str, int]] | None, rows_read: tuple | None = None) -> pd.DataFrame:
    """The RANGES table (plus the reader's columns) from the NVTX rows of ``query`` (:func:`_range_query`),
    given as ``rows_read`` (:func:`_range_rows`) or read here; unclosed ranges end at ``capture_end``."""
    columns = list(tables.RANGES.names) + ["op_id", "sizes", "stashed_seq", "unclosed", "effective_end_ns",
                                           "event_type", "domain_id"]
    if query is None:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    sql, types = query
    push_pop = (types["NvtxPushPopRange"], types["NvtxtPushPopRange"])
    df, text_all = rows_read or _range_rows(export, sql, strings)
    pid, tid = decode_global_tid(df["globalTid"].fillna(0))
    df["pid"], df["tid"] = pid, tid
    df["domainId"] = df["domainId"].fillna(0).astype("int64")
    is_domain = (df["eventType"] == types["NvtxDomainCreate"]).to_numpy()
    domains = df[is_domain]
    domain_texts = text_all[is_domain]
    domain_names = {(int(p), int(d)): str(t) for p, d, t in zip(domains["pid"], domains["domainId"], domain_texts)
                    if not pd.isna(t)}

    # Sort once, on the raw columns: by thread, start, and longest first (parents before children).
    start = df["start"].to_numpy(dtype=np.int64)
    end = df["end"].astype("Int64")
    unclosed = end.isna().to_numpy()
    effective_end = end.fillna(capture_end).to_numpy(dtype=np.int64)
    bad = ~unclosed & (effective_end < start)
    keep = ~is_domain & ~bad
    if bad.any():
        names = ", ".join(repr(t) for t in text_all[bad][:5])
        diagnostics["warnings"].append(f"{int(bad.sum())} NVTX range(s) end before they start and were dropped: {names}")
    rows = np.flatnonzero(keep)
    rows = rows[nesting_order(df["pid"].to_numpy()[rows], df["tid"].to_numpy()[rows], start[rows], effective_end[rows])]
    # Column by column, each source column freed once taken (2M ranges: hundreds of MB at once otherwise).
    df = take_rows(df, rows)
    unclosed, effective_end = unclosed[rows], effective_end[rows]
    text = pd.Series(text_all.array.take(rows))
    del text_all
    parsed = parse_range_texts(text)  # (the ranges kept, in their order: nothing to reorder after)
    too_big = parsed.attrs.get("numbers_beyond_int64") or []
    if too_big:
        diagnostics["warnings"].append(
            f"{len(too_big)} NVTX range text(s) hold a seq/op_id/stashed seq beyond 64 bits, read as no value: "
            + ", ".join(repr(t[:120]) for t in too_big[:3]) + " (torch never writes such numbers: not an emit_nvtx "
            "range, or a damaged export)")
    if unclosed.any():
        names = ", ".join(repr(t) for t in text[unclosed][:5])
        diagnostics["warnings"].append(
            f"{int(unclosed.sum())} NVTX range(s) left open at end of capture: {names} (treated as ending at "
            f"{capture_end} ns, the end of the capture)"
        )

    nameless = int((text.fillna("") == "").sum())
    del text  # (parsed: its name and numbers are what the ranges keep)
    if nameless:
        diagnostics["warnings"].append(f"{nameless} NVTX range(s) have no name (no text and no registered string); "
                                       "they are kept, but never name an operator")
    ranges = pd.DataFrame(
        {
            "pid": df["pid"].to_numpy(), "tid": df["tid"].to_numpy(),
            "start_ns": df["start"].to_numpy(dtype=np.int64),
            "end_ns": df["end"].astype("Int64").array,
            "name": parsed["name"].array,
            "domain_id": df["domainId"].to_numpy(),
            "event_type": df["eventType"].to_numpy(dtype=np.int64),
            "seq": parsed["seq"].array,
            "op_id": parsed["op_id"].array,
            "sizes": parsed["sizes"].array,
            "stashed_seq": parsed["stashed_seq"].array,
            "unclosed": unclosed,
            "effective_end_ns": effective_end,
        },
        copy=False,
    )
    end_gtid = df["endGlobalTid"].astype("Int64")
    _end_pid, end_tid = decode_global_tid(end_gtid.fillna(0))
    ranges["end_tid"] = pd.array(end_tid, dtype="Int64")
    ranges.loc[end_gtid.isna().to_numpy(), "end_tid"] = pd.NA
    del df, parsed, end_gtid  # the query's columns are copied into ranges: free them before nesting
    release_free_memory()
    # Domain ids are per process (formats.md#nsys-nvtx-event-types): name each (pid, domain id) pair once.
    pair_key = ranges["pid"].to_numpy(dtype=np.int64) << 32 | ranges["domain_id"].to_numpy(dtype=np.int64)
    pair_of_row, pairs = pd.factorize(pair_key)
    pair_names = [DEFAULT_DOMAIN if (k & 0xFFFFFFFF) == 0 else
                  domain_names.get((int(k >> 32), int(k & 0xFFFFFFFF)), f"domain {int(k & 0xFFFFFFFF)}") for k in pairs]
    ranges["domain"] = _from_codes(pair_of_row, pair_names)
    ranges["kind"] = _from_codes(ranges["event_type"].isin(push_pop).to_numpy().astype(np.int64),
                                 ["nvtx_start_end", "nvtx_push_pop"])
    ranges["fwd_thread_id"] = all_null_ints(len(ranges))  # a Kineto notion; NVTX ranges have none
    is_layer = ranges["name"].str.startswith(LAYER_PREFIX).to_numpy(dtype=bool)
    ranges["layer"] = ranges["name"].where(is_layer).str.removeprefix(LAYER_PREFIX)
    iteration = all_null_ints(len(ranges))
    marked = np.flatnonzero(ranges["name"].str.startswith(ITERATION_PREFIX).to_numpy(dtype=bool))
    if len(marked):
        values = ranges["name"].iloc[marked].str.removeprefix(ITERATION_PREFIX)
        iteration[marked] = pd.to_numeric(values.where(values.str.isdigit()), errors="coerce").astype("Int64").array
    ranges["iteration"] = iteration

    ranges["range_id"] = np.arange(len(ranges), dtype=np.int64)
    depth, parent, partial = nest_push_pop(ranges)
    ranges["depth"] = depth
    ranges["parent_id"] = pd.array(np.where(parent >= 0, parent, 0), dtype="Int64")
    ranges.loc[parent < 0, "parent_id"] = pd.NA
    if partial:
        diagnostics["warnings"].append(f"{partial} NVTX push/pop range(s) overlap a range of the same thread and domain "
                                       "without nesting in it (unbalanced pushes/pops); each is placed under its "
                                       "nearest enclosing range")
    kinds = set(ranges["kind"].unique())
    if "nvtx_start_end" in kinds and "nvtx_push_pop" not in kinds:
        diagnostics["warnings"].append("only start/end ranges present: used as process-level regions; operator-level "
                                       "NVTX attribution unavailable")
    return ranges[columns]


def _range_texts(df: pd.DataFrame, strings: pa.Array) -> pd.Series:
    """``coalesce(text, StringIds[textId])`` (formats.md#nsys-tables) for NVTX rows; '' text (the null sentinel of the
    query) counts as absent. Only rows without inline text are looked up."""
    text = pa.array(df["text"].astype("str"), type=pa.string())
    missing = np.flatnonzero(pc.equal(pc.fill_null(text, ""), "").to_numpy(zero_copy_only=False))
    if len(missing):
        looked_up = _lookup(strings, df["textId"].iloc[missing].reset_index(drop=True))
        mask = np.zeros(len(text), dtype=bool)
        mask[missing] = True
        filled = np.zeros(len(text), dtype=np.int64)
        filled[missing] = np.arange(len(missing))
        replacement = pa.array(looked_up.astype(object).where(looked_up.notna(), None).to_numpy(), type=pa.string())
        text = pc.if_else(pa.array(mask), replacement.take(pa.array(filled)), text)
    return text.to_pandas()


def _from_codes(codes: np.ndarray, labels: list[str]) -> pd.Categorical:
    """A categorical column from integer codes into ``labels`` (which may repeat): a handful of
    distinct values over millions of rows (domain, kind) cost one byte or so per row in memory; the
    parquet writer stores them as plain strings (the table contract)."""
    uniques, remap = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
    return pd.Categorical.from_codes(remap[np.asarray(codes, dtype=np.int64)], categories=uniques)


# --------------------------------------------------------------------------------------------------
# The whole export


def _capture_end(export: _Export, nvtx_table: str | None, known: dict | None = None) -> int:
    """The last timestamp of the capture (where unclosed NVTX ranges end). ``known``: table -> its
    ``max("end")`` already read (None: the table has no end), not scanned again."""
    known = known or {}
    ends = list(known.values())
    if export.has("ANALYSIS_DETAILS") and "stopTime" in export.columns["ANALYSIS_DETAILS"]:
        ends += [r[0] for r in export.rows("SELECT max(stopTime) FROM ANALYSIS_DETAILS")]
    for table in (KERNEL_TABLE, RUNTIME_TABLE, MEMCPY_TABLE, MEMSET_TABLE, GRAPH_TRACE_TABLE):
        if table not in known and export.has(table) and "end" in export.columns[table]:
            ends += [r[0] for r in export.rows(f'SELECT max("end") FROM {table}')]
    if nvtx_table:
        ends += list(export.rows(f'SELECT max(start), max("end") FROM "{nvtx_table}"')[0])
    ends = [int(e) for e in ends if isinstance(e, (int, float))]
    return max(ends) if ends else 0


def _is_nsys_export(export: _Export) -> bool:
    markers = (KERNEL_TABLE, RUNTIME_TABLE, "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_GPU")
    return export.has("StringIds") and (any(export.has(t) for t in markers) or _nvtx_table(export, {"warnings": []}))


@bulk_memory(system_pool=True)
def read_nsys(path: Path) -> NsysTimeline:
    """Read an nsys SQLite export into the timeline tables.

    Returns:
        :class:`NsysTimeline` with ``kernels`` (KERNELS columns plus ``short_name``, ``gpu_id`` (nsys GPU
        id), ``activity`` (``kernel``, or ``graph`` for a graph-level ``<cuda_graph N>`` row), and
        ``capture_pid/capture_tid/capture_start_ns/capture_end_ns``: for a CUDA-graph node kernel, the
        node's creation at capture time), ``launches`` (LAUNCHES plus ``event_class``), ``ranges``
        (RANGES, ``name`` without emit_nvtx decorations, plus ``op_id``, ``sizes``,
        ``stashed_seq``, ``unclosed``, ``effective_end_ns`` (end, or the capture end when unclosed),
        ``event_type``, ``domain_id``), ``activities`` (memcpy/memset rows) and ``diagnostics``
        (versions, counts per process, launch APIs seen, warnings, info). Times in ns.

    Raises:
        NsysExportError: not an SQLite file, truncated/corrupt, not an nsys export, or a table lacks a
            column the reader needs (an unknown schema).
    """
    export = _Export(path)
    try:
        if not _is_nsys_export(export):
            found = ", ".join(sorted(export.columns)) or "none"
            absent = [t for t in ("StringIds", KERNEL_TABLE, RUNTIME_TABLE, NVTX_TABLE) if not export.has(t)]
            missing = f"it has no {', '.join(absent)} table" + (
                " (every nsys export has StringIds)" if "StringIds" in absent else "")
            raise NsysExportError(
                f"{export.path}: not an Nsight Systems export: {missing} (tables found: {found}); export the report "
                "with 'nsys export --type sqlite'"
            )
        return _read(export)
    finally:
        export.close()


def _read(export: _Export) -> NsysTimeline:
    diagnostics: dict = {"file": str(export.path), **_metadata(export), "warnings": [], "info": []}
    diagnostics["tables"] = {t: (t in export.columns) for t in
                             (KERNEL_TABLE, RUNTIME_TABLE, MEMCPY_TABLE, MEMSET_TABLE, GRAPH_TRACE_TABLE)}
    start = time.perf_counter()
    strings = _strings(export)
    range_notes: dict = {"warnings": []}
    query = _range_query(export, range_notes)
    reader = _RangeReader(export, strings, query) if query is not None else None
    try:
        with _GIL_SWITCH_INTERVAL.held(min(sys.getswitchinterval(), 0.001)):
            return _read_tables(export, diagnostics, strings, start, query, range_notes, reader)
    finally:
        if reader is not None:
            reader.stop()  # (after an error: the thread and its own connection end before the file is let go)


def _swap_switch_interval(seconds: float) -> float:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    return previous


# While the NVTX thread runs beside the main one, each hands the GIL over after 1 ms instead of 5: a thread waiting
# for it between two numpy or Arrow calls (which release it) would otherwise wait up to 5 ms each time. Process-wide:
# the first of concurrent reads saves it, the last one puts it back.
_GIL_SWITCH_INTERVAL = SharedSetting(_swap_switch_interval)


def _read_tables(export: _Export, diagnostics: dict, strings: pa.Array, start: float,
                 query: tuple[str, dict[str, int]] | None, range_notes: dict, reader: _RangeReader | None
                 ) -> NsysTimeline:
    """:func:`_read` after the strings: launch calls, kernels, then the NVTX ranges (read meanwhile by
    ``reader`` when given)."""
    launches = _read_launches(export, strings, diagnostics)
    runtime_end = diagnostics.pop("runtime_end_ns", None)
    capture_end = _capture_end(export, _nvtx_table(export, {"warnings": []}),
                               {RUNTIME_TABLE: runtime_end} if export.has(RUNTIME_TABLE) else {})
    diagnostics["capture_end_ns"] = capture_end
    lives = find_lives(launches)
    launch_index = _launch_index(launches, diagnostics, lives)
    release_free_memory()  # each table's SQLite fetch and joins leave hundreds of MB free but resident (heap.py)
    stage_done(f"{export.path.name}: read {len(strings):,} strings and {len(launches):,} launch calls", start)

    parts = []
    if export.has(KERNEL_TABLE):
        parts.append(_read_kernels(export, strings, launch_index, diagnostics, lives))
    graphs = _read_graph_trace(export, launch_index, diagnostics, lives)
    if graphs is not None:
        parts.append(graphs)
    kernel_columns = list(tables.KERNELS.names)
    if parts:
        raw = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    else:
        raw = pd.DataFrame(columns=[c for c in kernel_columns if c not in ("kernel_id", "duration_ns", "match_key",
                                                                            "occurrence", "source", "iteration",
                                                                            "range_id", "parent_kernel_id")]
                           + ["short_name", "gpu_id", "activity"])
    for col in ("launch_tid", "launch_start_ns", "launch_end_ns", "correlation_id", "graph_id", "graph_node_id"):
        raw[col] = pd.array(raw[col], dtype="Int64")
    raw["pid"] = raw["pid"].astype("int64")
    repeats = exact_repeats(raw, KERNEL_RECORD_FIELDS)
    diagnostics["duplicate_kernel_records"] = int(repeats.sum())
    if repeats.any():
        raw = raw[~repeats].reset_index(drop=True)

    captures = _graph_captures(export, lives)
    node_kernels = raw["graph_node_id"].notna()
    if node_kernels.any():
        if captures is None:
            diagnostics["warnings"].append(
                f"{int(node_kernels.sum())} kernel(s) replayed from CUDA graphs and the export has no graph node "
                "events: they stay unattributed (reason cuda_graph_replay)"
            )
        else:
            proc = raw["pid"].to_numpy(dtype=np.int64)
            if "process_life" in raw:  # (a kernel whose process cannot be told takes no capture either)
                proc = np.where(raw["launch_refused"].notna().to_numpy(dtype=bool), -1,
                                ProcessLives.proc(proc, raw["process_life"].to_numpy(dtype=np.int64)))
            raw = raw.assign(proc=proc).merge(captures, on=["proc", "graph_node_id"], how="left").drop(columns="proc")
            missing = int((node_kernels.to_numpy() & raw["capture_tid"].isna().to_numpy()).sum())
            if missing:
                diagnostics["warnings"].append(
                    f"{missing} kernel(s) replayed from CUDA graphs have no capture-time node event in their process: "
                    "they stay unattributed (reason cuda_graph_replay)"
                )
    for col in ("capture_pid", "capture_tid", "capture_start_ns", "capture_end_ns"):
        raw[col] = pd.array(raw[col], dtype="Int64") if col in raw else all_null_ints(len(raw))

    unnamed = raw["name"].isna().to_numpy()
    if unnamed.any():
        diagnostics["warnings"].append(f"{int(unnamed.sum())} kernel name(s) missing from StringIds; named "
                                       "'<unknown kernel>'")
        raw["name"] = raw["name"].fillna("<unknown kernel>")
    # Kernels are put in launch order before the NVTX ranges are read (the sort copies the table:
    # keeping the two peaks apart keeps memory down); the iteration needs the ranges, so it comes after.
    kernels = finish_kernels(raw, _no_ranges(), source="nsys")
    del raw, parts
    # Few distinct values over many rows: categorical in memory, plain strings in the parquet files.
    for column in ("activity", "source", "launch_api", "grid", "block"):
        kernels[column] = kernels[column].astype("category")
    launches["api"] = launches["api"].astype("category")
    release_free_memory()
    if reader is not None:
        # The NVTX thread fetched its rows meanwhile; it builds the ranges table only now, once the kernels' own
        # transients are freed (1M kernels, 2M ranges: peak RSS 1.53-1.57 -> 1.33-1.38 GB, same CPU time).
        reader.give_capture_end(capture_end)
    stage_done(f"{export.path.name}: read {len(kernels):,} kernels", start)
    # (Before the ranges: their thread may still be at work.)
    activities = _read_activities(export, launch_index, lives)
    launches = _own_process_launches(launches, kernels, activities, diagnostics)
    diagnostics["warnings"] += range_notes["warnings"]
    diagnostics["nvtx_table"] = range_notes.get("nvtx_table")
    ranges = reader.result() if reader is not None else None
    if ranges is not None:
        diagnostics["warnings"] += reader.notes["warnings"]
    else:
        ranges = _read_ranges(export, strings, capture_end, diagnostics, query)
    release_free_memory()
    if len(ranges):
        kernels["iteration"] = kernel_iterations(kernels, ranges)
    inverted = (kernels["duration_ns"] < 0).to_numpy()
    if inverted.any():
        # No negative time reaches the totals (docs/field-cases.md C04); the kernel itself stays visible.
        names = ", ".join(repr(n) for n in kernels.loc[inverted, "name"].head(3))
        diagnostics["warnings"].append(f"{int(inverted.sum())} kernel(s) end before they start ({names}); kept with "
                                       "duration 0")
        kernels.loc[inverted, "duration_ns"] = 0
    stage_done(f"{export.path.name}: read {len(ranges):,} NVTX ranges", start)
    _summarise(export, kernels, launches, ranges, activities, diagnostics, lives)
    release_free_memory()  # (and Arrow's pool: it keeps freed blocks)
    log.info("%s: nsys %s, export schema %s", export.path, diagnostics["product_version"] or "unknown",
             diagnostics["schema_version"] or "unknown (no export metadata table)")
    return NsysTimeline(kernels=kernels, launches=launches, ranges=ranges, activities=activities,
                        diagnostics=diagnostics)


def _no_ranges() -> pd.DataFrame:
    return pd.DataFrame({"iteration": pd.array([], dtype="Int64"), "start_ns": pd.array([], dtype="int64"),
                         "end_ns": pd.array([], dtype="Int64"), "pid": pd.array([], dtype="int64")})


def _summarise(export: _Export, kernels: pd.DataFrame, launches: pd.DataFrame, ranges: pd.DataFrame,
               activities: pd.DataFrame, diagnostics: dict, lives: ProcessLives | None = None) -> None:
    """Counts per process, launch APIs, and the findings a user must see (no kernels, skew, records written twice,
    pids several processes used, ...)."""
    diagnostics["devices"] = _devices(export)
    is_kernel = kernels["activity"] == "kernel" if len(kernels) else pd.Series(dtype=bool)
    refused = kernels["launch_refused"].notna().to_numpy(dtype=bool) if "launch_refused" in kernels \
        else np.zeros(len(kernels), dtype=bool)
    diagnostics["counts"] = {
        "duplicate_kernel_records": diagnostics.pop("duplicate_kernel_records", 0),
        "pid_reused_kernels": int(refused.sum()),
        "kernels": int(is_kernel.sum()) if len(kernels) else 0,
        "graph_launch_rows": int((~is_kernel).sum()) if len(kernels) else 0,
        "launches": len(launches),
        "ranges_push_pop": int((ranges["kind"] == "nvtx_push_pop").sum()) if len(ranges) else 0,
        "ranges_start_end": int((ranges["kind"] == "nvtx_start_end").sum()) if len(ranges) else 0,
        "memcpy": int((activities["kind"] == "memcpy").sum()) if len(activities) else 0,
        "memset": int((activities["kind"] == "memset").sum()) if len(activities) else 0,
    }
    api_calls = diagnostics.pop("cuda_api_calls_per_pid", {})
    pid_arrays = [np.asarray(t["pid"], dtype=np.int64) for t in (kernels, launches, ranges) if len(t)]
    pid_arrays.append(np.asarray(list(api_calls), dtype=np.int64))
    pids = np.sort(pd.unique(np.concatenate(pid_arrays))) if pid_arrays else []
    kernel_counts = kernels["pid"].value_counts() if len(kernels) else pd.Series(dtype="int64")
    launch_counts = launches["pid"].value_counts() if len(launches) else pd.Series(dtype="int64")
    range_counts = ranges["pid"].value_counts() if len(ranges) else pd.Series(dtype="int64")
    thread_counts = ranges.groupby("pid")["tid"].nunique() if len(ranges) else pd.Series(dtype="int64")
    per_process = {}
    for pid in pids:
        entry = {
            "kernels": int(kernel_counts.get(pid, 0)),
            "launches": int(launch_counts.get(pid, 0)),
            "ranges": int(range_counts.get(pid, 0)),
            "threads_with_ranges": int(thread_counts.get(pid, 0)),
            "cuda_api_calls": int(api_calls.get(int(pid), 0)),
        }
        per_process[str(int(pid))] = entry
        has_gpu = entry["kernels"] or (len(activities) and (activities["pid"] == pid).any())
        if not has_gpu:
            diagnostics["info"].append(f"no GPU activity captured for pid {int(pid)}")
    diagnostics["per_process"] = per_process
    joined = kernels[kernels["launch_api"].notna()] if len(kernels) else kernels
    diagnostics["launch_apis"] = {str(k): int(v) for k, v in joined["launch_api"].value_counts().items()} \
        if len(joined) else {}
    if not len(kernels):
        diagnostics["warnings"].insert(
            0,
            f"no kernels captured: the export has {'an empty' if export.has(KERNEL_TABLE) else 'no'} {KERNEL_TABLE} "
            f"table ({diagnostics.get('cuda_api_calls', 0)} CUDA API calls, {len(ranges)} NVTX ranges); the capture "
            "probably stopped before "
            "GPU work, or CUDA tracing (-t cuda) was off",
        )
    else:
        no_corr = kernels["correlation_id"].isna() | (kernels["correlation_id"].fillna(0) <= 0)
        dangling = ~no_corr & kernels["launch_tid"].isna() & ~refused
        if no_corr.any():
            diagnostics["warnings"].append(f"{int(no_corr.sum())} kernel(s) have no correlation id (NULL or <= 0): "
                                           "their launch is unknown")
        if dangling.any():
            crossed = diagnostics.get("cross_process_correlation_ids", 0)
            diagnostics["warnings"].append(
                f"{int(dangling.sum())} kernel(s) have a correlation id with no CUDA API row in the same process"
                + (f" ({crossed} of them share it with a call of another process; correlation ids are per process, "
                   "so those are not joined either)" if crossed else "")
                + "; their launch is unknown and they stay unattributed (reason no_launch_record); a capture or "
                "export window that starts after their launch calls leaves such kernels"
            )
        # One clock: a kernel may start before its launch call returns, but never before the call
        # begins; if it does, the export's clocks disagree (docs/field-cases.md C17). Attribution only uses the
        # launch call, so it is unaffected; say so rather than publish negative launch latencies.
        skew = (kernels["start_ns"] - kernels["launch_start_ns"]).astype("Float64")
        early = (skew < 0).fillna(False)
        if early.any():
            worst = float(-skew[early].min()) / 1000
            diagnostics["info"].append(f"{int(early.sum())} kernel(s) start before their launch call begins "
                                       f"(by up to {worst:.1f} µs; clock skew); attribution uses the launch call")
    if diagnostics["counts"]["duplicate_kernel_records"]:
        diagnostics["warnings"].append(
            f"{diagnostics['counts']['duplicate_kernel_records']} kernel row(s) repeat another row in every field (name, "
            "process, device, stream, start, end, correlation id, grid, block, graph node): the export holds them twice "
            "(corrupt, or merged from overlapping exports); each kernel is counted once "
            "(counts.duplicate_kernel_records)")
    if lives is not None:
        _lives_summary(lives, kernels, refused, diagnostics)
    if export.has("DIAGNOSTIC_EVENT") and "text" in export.columns["DIAGNOSTIC_EVENT"]:
        messages = [r[0] for r in export.rows("SELECT DISTINCT text FROM DIAGNOSTIC_EVENT LIMIT 20") if r[0]]
        diagnostics["nsys_messages"] = messages


def _lives_summary(lives: ProcessLives, kernels: pd.DataFrame, refused: np.ndarray, diagnostics: dict) -> None:
    """``process_lives`` (per pid several processes used: each life's first launch call, launch calls and kernels)
    and the warning that says so (docs/field-cases.md C25)."""
    pids = kernels["pid"].to_numpy(dtype=np.int64)
    life = kernels["process_life"].to_numpy(dtype=np.int64) if "process_life" in kernels else np.zeros(len(kernels),
                                                                                                          np.int64)
    entries = {}
    for pid, starts in sorted(lives.starts.items()):
        mine = pids == pid
        counts = np.bincount(life[mine], minlength=len(starts)) if mine.any() else np.zeros(len(starts), np.int64)
        entries[str(pid)] = [{"life": i, "first_launch_ns": int(s), "launch_calls": int(lives.calls[pid][i]),
                              "kernels": int(counts[i])} for i, s in enumerate(starts.tolist())]
    diagnostics["process_lives"] = entries
    reused = {p: len(s) for p, s in lives.starts.items() if len(s) > 1}
    unseparated = sorted(p for p, s in lives.starts.items() if len(s) == 1)
    parts = []
    if reused:
        parts.append(", ".join(f"pid {p} by {n} processes" for p, n in sorted(reused.items())) + " in turn (CUPTI "
                     "correlation ids restart in each process; told apart by each one's first launch call): each GPU "
                     "activity is joined to a launch call of its own process")
    if unseparated:
        parts.append(f"pid(s) {', '.join(map(str, unseparated))} hold launch calls that repeat a correlation id "
                     "without overlapping in time (several processes in turn?), but no restart of the ids could "
                     "separate them: kernels of those ids join no launch call")
    if refused.any():
        parts.append(f"{int(refused.sum())} kernel(s) whose process cannot be told stay unattributed (reason "
                     f"{REFUSED}, counts.pid_reused_kernels)")
    diagnostics["warnings"].append("; ".join(parts) + " (diagnostics process_lives)")


# --------------------------------------------------------------------------------------------------
# .nsys-rep -> .sqlite, and writing the tables


def export_sqlite(report: Path, out_dir: Path) -> Path:
    """Export an ``.nsys-rep`` (or ``.qdrep``) to SQLite with ``nsys export --type sqlite`` (docs/formats.md#nsys-export).

    Raises:
        NsysExportError: nsys is not on PATH, or the export failed (its message is included).
    """
    nsys = shutil.which("nsys")
    if nsys is None:
        raise NsysExportError(
            f"{report}: reading a .nsys-rep needs Nsight Systems' 'nsys' on PATH to export it; run "
            f"'nsys export --type sqlite --output REPORT.sqlite {report}' where nsys is installed and pass the .sqlite"
        )
    out = Path(out_dir) / (Path(report).stem + ".sqlite")
    proc = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(out),
                           str(report)], check=False, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise NsysExportError(f"{report}: 'nsys export --type sqlite' failed (exit {proc.returncode}): {' | '.join(detail)}")
    return out


def read_report(path: Path) -> NsysTimeline:
    """Read a ``.sqlite`` export, or export a ``.nsys-rep``/``.qdrep`` first (into a temporary folder)."""
    path = Path(path)
    if path.suffix in (".nsys-rep", ".qdrep"):
        if not path.is_file():
            raise NsysExportError(f"{path}: no such file")
        with tempfile.TemporaryDirectory(prefix="opprof-nsys-") as tmp:
            timeline = read_nsys(export_sqlite(path, Path(tmp)))
        timeline.diagnostics["file"] = str(path)
        timeline.diagnostics["sqlite_export"] = "exported with nsys export --type sqlite to a temporary file (deleted)"
        return timeline
    return read_nsys(path)


@bulk_memory(system_pool=True)
def write_nsys_timeline(timeline: NsysTimeline, out_dir: Path) -> None:
    """The timeline tables (with ``gpu_activities.parquet``) and ``diagnostics.json``."""
    from .model import write_timeline

    out_dir = Path(out_dir)
    write_timeline(timeline, out_dir)  # with gpu_activities.parquet
    write_json(out_dir / "diagnostics.json", json.loads(json.dumps(timeline.diagnostics, default=_json_default)))


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)
