"""The Kineto loader's read-ahead thread (trace_json._Reader(prefetch=True)) inflates a .gz with zlib
directly: it must hand out exactly the bytes gzip gives, and refuse what gzip refuses (as a TimelineError
naming the file)."""

from __future__ import annotations

import gzip
import os

import pandas as pd
import pytest
from conftest import REAL_DATA

from operator_profiler.errors import TimelineError
from operator_profiler.timeline import trace_json
from operator_profiler.timeline.kineto import read_kineto

DATA = os.urandom(2000).hex().encode() * 3000  # 12 MB: more than one block


def _read_all(path, prefetch: bool) -> bytes:
    reader = trace_json._Reader(path, prefetch=prefetch)
    try:
        while not reader.eof:
            reader.fill(len(reader.buf) + trace_json.BLOCK)
        return reader.buf
    finally:
        reader.close()


GOOD = {
    "one_member": gzip.compress(DATA),
    "two_members": gzip.compress(DATA[:5_000_000]) + gzip.compress(DATA[5_000_000:]),
    "zero_padding": gzip.compress(DATA) + b"\0" * 512,
}
BAD = {
    "truncated": gzip.compress(DATA)[:-4000],
    "garbage_after_member": gzip.compress(DATA) + b"PK\x03\x04",
    "bad_crc": gzip.compress(DATA)[:-8] + b"\0\0\0\0" + gzip.compress(DATA)[-4:],
}


@pytest.mark.parametrize("case", sorted(GOOD))
def test_prefetch_gives_the_bytes_gzip_gives(tmp_path, case):
    path = tmp_path / f"{case}.json.gz"
    path.write_bytes(GOOD[case])
    assert _read_all(path, prefetch=True) == gzip.decompress(GOOD[case]) == _read_all(path, prefetch=False)


@pytest.mark.parametrize("case", sorted(BAD))
def test_prefetch_refuses_what_gzip_refuses(tmp_path, case):
    path = tmp_path / f"{case}.json.gz"
    path.write_bytes(BAD[case])
    with pytest.raises((OSError, EOFError, gzip.zlib.error)):
        gzip.decompress(BAD[case])
    for prefetch in (False, True):
        with pytest.raises(TimelineError, match=f"{case}.json.gz: the file cannot be read past byte offset "
                                                r"\d+ .*truncated or corrupt"):
            _read_all(path, prefetch=prefetch)


def test_prefetch_stops_when_the_reader_is_closed_early(tmp_path):
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(DATA * 4))
    reader = trace_json._Reader(path, prefetch=True)
    reader.fill(10)
    reader.close()  # must not hang on the full queue
    assert reader._thread is None


def test_a_multi_member_gzip_trace_reads_as_its_single_member_copy(tmp_path):
    data = gzip.decompress((REAL_DATA / "kineto" / "hta_df_index_resolver.json.gz").read_bytes())
    one, two = tmp_path / "one.json.gz", tmp_path / "two.json.gz"
    one.write_bytes(gzip.compress(data))
    half = len(data) // 2
    two.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    a, b = read_kineto(one), read_kineto(two)
    assert len(a.kernels) == 19370
    pd.testing.assert_frame_equal(a.kernels, b.kernels)
    pd.testing.assert_frame_equal(a.ranges, b.ranges)


@pytest.mark.parametrize("prefetch", [False, True])
def test_the_content_decides_gzip_not_the_name(tmp_path, prefetch):
    plain = b'{"traceEvents": []}' * 10
    named_gz = tmp_path / "plain.json.gz"
    named_gz.write_bytes(plain)
    assert _read_all(named_gz, prefetch) == plain
    named_json = tmp_path / "packed.json"
    named_json.write_bytes(gzip.compress(DATA))
    assert _read_all(named_json, prefetch) == DATA


def test_a_real_trace_reads_the_same_whatever_its_name(tmp_path):
    packed = (REAL_DATA / "kineto" / "hta_critical_path_alexnet__trace.json.gz").read_bytes()
    misnamed = tmp_path / "alexnet.json"
    misnamed.write_bytes(packed)
    plain_gz = tmp_path / "alexnet_plain.json.gz"
    plain_gz.write_bytes(gzip.decompress(packed))
    a = read_kineto(REAL_DATA / "kineto" / "hta_critical_path_alexnet__trace.json.gz")
    for other in (read_kineto(misnamed), read_kineto(plain_gz)):
        pd.testing.assert_frame_equal(a.kernels, other.kernels)
        pd.testing.assert_frame_equal(a.ranges, other.ranges)


def test_close_returns_while_the_read_ahead_thread_waits_on_an_open_pipe(tmp_path):
    """The read-ahead thread blocked on a pipe whose writer stays open holds the file's lock: close() must
    not wait for it (Ctrl-C on `opprof timeline` fed by a pipe hung there)."""
    import os
    import threading
    import time

    from operator_profiler.timeline.trace_json import _Reader

    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    opened: dict = {}
    thread = threading.Thread(target=lambda: opened.setdefault("reader", _Reader(fifo, prefetch=True)))
    thread.start()
    with open(fifo, "w") as writer:
        writer.write('{"traceEvents": [')
        writer.flush()
        thread.join(timeout=10)
        reader = opened["reader"]
        time.sleep(0.5)  # the thread has the first bytes and waits, in one read, for a whole block or the end
        start = time.monotonic()
        closing = threading.Thread(target=reader.close, daemon=True)
        closing.start()
        closing.join(timeout=20)
        assert not closing.is_alive() and time.monotonic() - start < 15
