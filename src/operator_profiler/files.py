"""File I/O of the stages: atomic writers (a temp file renamed into place, so a failing stage leaves
no partial output) and checked readers (a missing, unreadable or wrong file is an :class:`InputError`
naming the file, what was expected and how to make it)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from .errors import InputError


def replace_atomic(path: Path, write) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place; on any
    failure the temporary file is removed, so no partial output is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp.is_file():
            tmp.unlink()
        if isinstance(exc, OSError):  # name the path the caller asked for, not the temporary file
            for attr in ("filename", "filename2"):
                if getattr(exc, attr) is not None and os.fspath(getattr(exc, attr)) == os.fspath(tmp):
                    setattr(exc, attr, os.fspath(path))
        raise


@contextlib.contextmanager
def writes_in_background():
    """Yields ``submit(write, *args)``: each ``write`` (a writer of output files) runs on one background thread, in
    the order submitted, while the caller goes on computing. Parquet encoding and compression release the GIL, so on
    two cores the writing overlaps the caller's work (1M kernels, 2M ranges: the nsys timeline tables are written
    while the GPU projection is computed).

    On leaving, every write has ended, even when the caller failed or was interrupted meanwhile (a write must not land
    after the caller's cleanup removed the outputs); the writes not started after a failure are not run. Then the
    first write's error is raised, unless the caller's own is on its way.

    Raises:
        whatever a write raised."""
    from concurrent.futures import ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(1, thread_name_prefix="opprof-writer")
    futures = []
    failed = True
    try:
        yield lambda write, *args: futures.append(pool.submit(write, *args))
        failed = False
    finally:
        if failed:
            for future in futures:
                future.cancel()
        # Waited on through the futures, not by joining the thread: on Python 3.11 a join that a Ctrl-C interrupts
        # marks the still-running thread as stopped, and every later join returns at once.
        interrupted = None
        while True:
            try:
                wait(futures)
                break
            except KeyboardInterrupt as exc:  # wait on: the outputs are removed only after the last write
                interrupted = exc
        pool.shutdown(wait=False)  # (the worker is idle: every write has ended)
        if interrupted is not None and not failed:
            raise interrupted
    for future in futures:
        future.result()


def write_text_atomic(path: Path, text: str) -> None:
    replace_atomic(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj) -> None:
    """Indented JSON with sorted keys (byte-identical for equal content)."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


#: int64 columns whose values hardly repeat (ids, timestamps): written with parquet's delta encoding
#: (``DELTA_BINARY_PACKED``) instead of its dictionary encoding, which near-unique values only grow until the writer
#: falls back to plain encoding (past 1 MB). Ids and times mostly ascend, so their deltas are small: 1M kernels, 2M
#: ranges, 1.6M projection rows: ~0.7 s CPU less to write, ~0.6 s less to read back than the default, files a fraction
#: of the size. Only the encoding in the file changes: the values read back are the same.
DELTA_ENCODED = frozenset({
    "kernel_id", "launch_id", "range_id", "parent_id", "parent_kernel_id", "correlation_id", "seq", "op_id",
    "stashed_seq", "start_ns", "end_ns", "launch_start_ns", "launch_end_ns", "effective_end_ns", "capture_start_ns",
    "capture_end_ns", "cpu_start_ns", "cpu_end_ns", "gpu_start_ns", "gpu_end_ns",
})


def parquet_encodings(schema) -> dict:
    """``pyarrow.parquet.write_table`` keyword arguments for a table of ``schema`` (a ``pyarrow.Schema``): its int64
    columns named in :data:`DELTA_ENCODED` delta-encoded, every other column dictionary-encoded (the default)."""
    import pyarrow as pa

    return _encodings(schema.names, [f.name for f in schema if f.name in DELTA_ENCODED and pa.types.is_int64(f.type)])


def _encodings(names: list[str], delta: list[str]) -> dict:
    return {"use_dictionary": [n for n in names if n not in delta],
            "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED") or None}


def write_parquet_atomic(df, path: Path) -> None:
    """A pandas DataFrame as parquet (no index); its int64 ids and timestamps delta-encoded (:func:`parquet_encodings`)."""
    delta = [str(c) for c in df.columns if c in DELTA_ENCODED and str(df[c].dtype) in ("int64", "Int64")]
    kwargs = _encodings([str(c) for c in df.columns], delta)
    replace_atomic(path, lambda tmp: df.to_parquet(tmp, index=False, **kwargs))


def _missing(path: Path, what: str, hint: str) -> InputError:
    return InputError(f"missing input {path} ({what}); {hint}")


def read_json_file(path: Path, what: str, hint: str, expect: type | None = None):
    """Parse a JSON file; ``expect`` (``list``/``dict``) checks the top-level type.

    Raises:
        InputError: missing file, invalid JSON (with line and column), wrong top-level type.
    """
    path = Path(path)
    if not path.is_file():
        raise _missing(path, what, hint)
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path} ({what}) is not valid JSON: {exc}; {hint}") from None
    if expect is not None and not isinstance(value, expect):
        raise InputError(f"{path} ({what}) holds a JSON {type(value).__name__}, expected a {expect.__name__}; {hint}")
    return value


def read_parquet_file(path: Path, what: str, hint: str, columns: tuple[str, ...] = (), nullable_ints: bool = False,
                      omit: tuple[str, ...] = (), categorical: tuple[str, ...] = ()):
    """Read a parquet table and check that it has ``columns``; the columns named in ``omit`` are not read (a stage
    that never uses them: they are still required where ``columns`` names them); the string columns named in
    ``categorical`` are read as categoricals (few distinct values over many rows, as the readers hold them).

    Raises:
        InputError: missing file, not a parquet file, or a required column absent (the wrong table).
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise _missing(path, what, hint)
    try:
        if omit or categorical:
            schema = pq.read_schema(path)
            names = schema.names
            dictionary = [c for c in categorical if c in names and pa.types.is_string(schema.field(c).type)]
            table = pq.read_table(path, columns=[c for c in names if c not in omit], read_dictionary=dictionary or None)
            table_names = names
        else:
            table = pq.read_table(path)
            table_names = table.column_names
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path} ({what}) is not a readable parquet file ({exc}); {hint}") from None
    absent = [c for c in columns if c not in table_names]
    if absent:
        raise InputError(f"{path} is not {what}: columns {absent} are missing; {hint}")
    if nullable_ints:
        return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    return table.to_pandas()
