"""Streaming, tolerant reader of torch.profiler's (Kineto's) Chrome trace JSON: event by event, gzipped or not,
repairing or skipping malformed events with a warning (real traces are truncated or hand-edited), so a
multi-GB trace is never loaded as one object.
Details: docs/modules.md#timeline-trace-json."""

from __future__ import annotations

import gc
import gzip
import json
import os
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import orjson
from ..errors import TimelineError

BLOCK = 8 << 20  # decompressed bytes per read (and per parsed chunk, about)
MAX_RECOVER = 64 << 20  # a malformed region longer than this is not recovered
TAIL_WINDOW = 4 << 20  # bytes at the end of the file searched for metadata after traceEvents
EXACT_TS_LIMIT = float(2**43)  # µs; below it a float64 ts still determines its ns exactly
_WS = b" \t\r\n"
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_ARRAY_END = re.compile(rb"\}[ \t\r\n]*\]")
# A ts with a fraction and at least 13 integer digits: the only kind that can reach EXACT_TS_LIMIT
# (2**43 µs has 13 digits); Kineto writes no exponents. A chunk without one needs no per-event check.
_BIG_FRACTIONAL_TS = re.compile(rb'"ts"[ \t\r\n]*:[ \t\r\n]*-?[0-9]{13,}\.[0-9]')
_TS_NUMBER = re.compile(rb'("(?:ts|dur)"[ \t\r\n]*:[ \t\r\n]*)(-?[0-9]+\.[0-9]+(?:[eE][-+]?[0-9]+)?)')
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)
_SCALAR_END = re.compile(rb"[,}\]]")


def _quote_ts(text: bytes) -> bytes:
    """``"ts": 1695835535123456.789`` -> ``"ts": "1695835535123456.789"`` (same for ``dur``)."""
    out, last = [], 0
    for m in _TS_NUMBER.finditer(text):
        out += (text[last:m.end(1)], b'"', m.group(2), b'"')
        last = m.end()
    if not out:
        return text
    out.append(text[last:])
    return b"".join(out)


def _lenient(text: bytes):
    """Parse one JSON value, tolerating invalid UTF-8 (-> U+FFFD) and raw control characters in
    strings; ``ts``/``dur`` floats come back as exact decimal strings. Raises ``ValueError``."""
    return json.loads(_quote_ts(text).decode("utf-8", errors="replace"), strict=False)


def _loads(text: bytes):
    """orjson, then :func:`_lenient`. Returns ``(value, repaired)``; raises ``ValueError``."""
    try:
        return orjson.loads(text), False
    except orjson.JSONDecodeError:
        return _lenient(text), True


def _is_utf8(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _needs_exact(events: list) -> bool:
    for ev in events:
        if ev.__class__ is dict:
            ts = ev.get("ts")
            if ts.__class__ is float and not -EXACT_TS_LIMIT < ts < EXACT_TS_LIMIT:
                return True
    return False


def _is_gzip(path: Path) -> bool:
    """Whether the file is gzip-compressed, from its first two bytes (RFC 1952 magic 1f 8b), whatever its name says
    (a gzip file named .json, a plain one named .gz); from the suffix where the file cannot be peeked (a pipe)."""
    try:
        if path.is_file():
            with open(path, "rb") as fh:
                return fh.read(2) == b"\x1f\x8b"
    except OSError:
        pass
    return path.suffix == ".gz"


class _Reader:
    """Decompressed bytes of the file in a growing buffer; ``base`` is the offset of ``buf[0]``.

    ``prefetch``: blocks are read (for a ``.gz``, decompressed) by a background thread, a few blocks ahead,
    while the caller parses the previous ones: zlib and file reads release the GIL, so on a second core the
    decompression costs the parse no wall time. A read error is raised by :meth:`fill` where it is met.
    """

    AHEAD = 2  # blocks read ahead of the parse (memory: AHEAD x BLOCK)

    def __init__(self, path: Path, prefetch: bool = False):
        self.path = path
        try:
            self.gzipped = _is_gzip(path)
            self.fh = gzip.open(path, "rb") if self.gzipped else open(path, "rb")
        except OSError as exc:
            raise TimelineError(f"{path}: cannot open the trace ({exc})") from None
        self.buf = b""
        self.base = 0
        self.eof = False
        self.size = os.fstat(self.fh.fileno()).st_size
        self._raw = getattr(self.fh, "fileobj", None) or self.fh
        self._raw_read = 0  # bytes of the file on disk consumed by the blocks handed out
        self._blocks: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if prefetch:
            self._blocks = queue.Queue(maxsize=self.AHEAD)
            self._thread = threading.Thread(target=self._read_ahead, name=f"read {path.name}", daemon=True)
            self._thread.start()

    def _read_ahead(self) -> None:
        """The prefetch thread: ``(block, raw offset)`` items, then ``(b"", offset)`` at the end, or
        ``(exception, offset)`` where a read fails."""
        blocks = self._inflated_blocks() if self.gzipped else iter(lambda: self.fh.read(BLOCK), b"")
        while not self._stop.is_set():
            try:
                block = next(blocks, b"")
                item = (block, self._tell_raw())
            except (OSError, EOFError, zlib.error) as exc:
                item, block = (exc, None), b""
            while not self._stop.is_set():
                try:
                    self._blocks.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not block:
                return

    def _inflated_blocks(self) -> Iterator[bytes]:
        """The decompressed content of a ``.gz`` in blocks of up to :data:`BLOCK` bytes, with zlib directly
        (gzip members, CRC and length checked by zlib): each call inflates a whole block without taking the
        GIL, where ``gzip`` would take it back every 128 KiB. Raises as ``gzip`` does: ``EOFError`` for a
        truncated member, ``gzip.BadGzipFile`` (an ``OSError``) for bytes after a member that start none,
        ``zlib.error`` for corrupt data."""
        raw = self._raw
        inflater = zlib.decompressobj(31)
        data = b""
        started = False  # bytes of the current member seen
        head = raw.read(2)
        if head and head != b"\x1f\x8b":
            raise gzip.BadGzipFile(f"Not a gzipped file ({head!r})")
        data = head
        while True:
            if not data:
                data = raw.read(1 << 20)
                if not data:
                    if started and not inflater.eof:
                        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                    return
            if inflater.eof:  # the next member, or padding
                rest = data.lstrip(b"\0")
                if not rest:
                    data = b""
                    continue
                if not rest.startswith(b"\x1f\x8b"):
                    raise gzip.BadGzipFile(f"Not a gzipped file ({rest[:2]!r})")
                inflater, data, started = zlib.decompressobj(31), rest, False
            started = True
            block = inflater.decompress(data, BLOCK)
            data = inflater.unconsumed_tail or inflater.unused_data
            if block:
                yield block

    def _tell_raw(self) -> int:
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return 0

    def _read_block(self, length: int) -> bytes:
        if self._blocks is None:
            block = self.fh.read(length)
            self._raw_read = self._tell_raw()
            return block
        block, self._raw_read = self._blocks.get()
        if isinstance(block, BaseException):
            raise block
        return block

    def fraction_read(self) -> float | None:
        """Share of the file on disk read so far (compressed bytes for a ``.gz``), for progress lines."""
        return min(1.0, self._raw_read / self.size) if self.size else None

    def fill(self, length: int) -> bool:
        """Read until ``len(buf) >= length`` or the end of the file; False if nothing was added."""
        added = False
        while len(self.buf) < length and not self.eof:
            try:
                block = self._read_block(max(BLOCK, length - len(self.buf)))
            except (OSError, EOFError, zlib.error) as exc:
                raise TimelineError(
                    f"{self.path}: the file cannot be read past byte offset {self.base + len(self.buf)} of its "
                    f"{'decompressed ' if self.gzipped else ''}content ({exc}); the trace is "
                    "truncated or corrupt: re-export it with prof.export_chrome_trace(...)"
                ) from None
            if not block:
                self.eof = True
            else:
                self.buf += block
                added = True
        return added

    def compact(self, pos: int) -> None:
        self.buf = self.buf[pos:]
        self.base += pos

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                # A read blocked on a pipe that stays open never returns, and it holds the file's lock:
                # closing would wait for it forever. The daemon thread keeps the file and ends with us.
                return
            self._thread = None
        self.fh.close()


class KinetoTrace:
    """A Chrome trace JSON file opened for streaming.

    ``trace.get(key)`` / ``trace.metadata``: the top-level members except ``traceEvents``
    (``baseTimeNanoseconds``, ``deviceProperties``, ``distributedInfo`` ...); members written after
    ``traceEvents`` (Kineto writes ``baseTimeNanoseconds`` there) are found by a pre-scan of the
    file's last :data:`TAIL_WINDOW` bytes (for a ``.gz``, one decompression pass), checked against
    the full parse at the end. ``trace.events()`` yields ``(index, event)`` in file order: ``index``
    is the position in ``traceEvents`` (skipped malformed elements keep their index), ``event`` the
    dict as JSON gives it (``ts``/``dur``: int, float or exact decimal string, see module docstring).
    ``trace.offset(index)``: the byte offset of the event just yielded (or one of its chunk).
    ``trace.warnings``: repairs and skips, plain strings, filled while iterating.
    ``trace["traceEvents"]`` materialises the whole list (small traces and tests only).

    Raises:
        TimelineError: unreadable or non-JSON file, no ``traceEvents`` list, truncated file, or a
            malformed region that cannot be confined to one event (message: file + byte offset).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.warnings: list[str] = []
        self.events_read = 0
        self._skipped: list[int] = []
        self._repaired: list[int] = []
        self._header: dict = {}
        self._tail: dict | None = None  # metadata after traceEvents, once known
        self._tail_prescanned: dict | None = None
        self._segments: list[tuple[int, int, int, int]] = []  # (first index, count, abs lo, abs hi)
        self._exact = False
        self._typed = None
        self._bare = False
        self._reader: _Reader | None = None
        reader = _Reader(self.path)
        try:
            self._events_start = self._scan_header(reader)
        finally:
            reader.close()

    # -- metadata -------------------------------------------------------------------------------
    def _error(self, offset: int, what: str) -> TimelineError:
        # read as it is (its first bytes decide), but a .gz that is not gzip is worth saying
        misnamed = " (named .gz, it is not gzip-compressed)" if self.path.suffix == ".gz" and not _is_gzip(self.path) \
            else ""
        return TimelineError(f"{self.path}: {what} at byte offset {offset}{misnamed}; not a readable torch.profiler "
                             "(Kineto) trace: pass the file written by prof.export_chrome_trace(...), optionally gzipped")

    def _scan_header(self, r: _Reader) -> int:
        """Parse the members before ``traceEvents``; return the offset just after its ``[``."""
        r.fill(1 << 16)
        pos = 3 if r.buf.startswith(b"\xef\xbb\xbf") else 0
        pos = self._skip_ws(r, pos)
        if pos >= len(r.buf):
            raise self._error(pos, "empty file")
        if r.buf[pos:pos + 1] == b"[":
            self._bare = True
            return pos + 1
        if r.buf[pos:pos + 1] != b"{":
            raise self._error(pos, "neither a JSON object with a 'traceEvents' list nor a bare event array")
        pos += 1
        while True:
            pos = self._skip_ws(r, pos)
            if r.buf[pos:pos + 1] == b"}":
                raise TimelineError(f"{self.path}: no 'traceEvents' list at the top level; not a Kineto trace")
            m = self._match(r, _STRING, pos)
            if m is None:
                raise self._error(pos, "expected a member name")
            key = _lenient(m.group())
            pos = self._skip_ws(r, m.end())
            if r.buf[pos:pos + 1] != b":":
                raise self._error(pos, "expected ':'")
            pos = self._skip_ws(r, pos + 1)
            if key == "traceEvents":
                if r.buf[pos:pos + 1] != b"[":
                    raise TimelineError(f"{self.path}: 'traceEvents' at byte offset {pos} is not a list; not a Kineto trace")
                return pos + 1
            end = self._value_end(r, pos)
            try:
                self._header[key] = _loads(r.buf[pos:end])[0]
            except ValueError:
                raise self._error(pos, f"invalid value of {key!r}") from None
            pos = self._skip_ws(r, end)
            sep = r.buf[pos:pos + 1]
            if sep == b",":
                pos += 1
            elif sep == b"}":
                raise TimelineError(f"{self.path}: no 'traceEvents' list at the top level; not a Kineto trace")
            else:
                raise self._error(pos, "expected ',' or '}'")

    @staticmethod
    def _skip_ws(r: _Reader, pos: int) -> int:
        while True:
            while pos < len(r.buf) and r.buf[pos] in _WS:
                pos += 1
            if pos < len(r.buf) or not r.fill(len(r.buf) + BLOCK):
                return pos

    def _match(self, r: _Reader, regex: re.Pattern, pos: int):
        while True:
            m = regex.match(r.buf, pos)
            if m is not None and m.end() < len(r.buf):
                return m
            if not r.fill(len(r.buf) + BLOCK):
                return m

    def _value_end(self, r: _Reader, pos: int) -> int:
        """End offset of the JSON value starting at ``pos`` (header values: small)."""
        if r.buf[pos:pos + 1] == b'"':
            m = self._match(r, _STRING, pos)
            if m is None:
                raise self._error(pos, "unterminated string")
            return m.end()
        if r.buf[pos:pos + 1] not in (b"{", b"["):
            while True:
                m = _SCALAR_END.search(r.buf, pos)
                if m is not None:
                    return m.start()
                if not r.fill(len(r.buf) + BLOCK):
                    raise self._error(pos, "file ends inside a value")
        depth, i = 0, pos
        while True:
            m = _TOKEN.search(r.buf, i)
            if m is None or (m.group()[:1] == b'"' and m.end() == len(r.buf)):
                if not r.fill(len(r.buf) + BLOCK):
                    raise self._error(pos, "file ends inside a value")
                continue
            tok = m.group()[:1]
            depth += 1 if tok in (b"{", b"[") else -1 if tok in (b"}", b"]") else 0
            i = m.end()
            if depth == 0:
                return i

    def _parse_tail(self, tail: bytes) -> dict | None:
        """Members after the ``]`` of traceEvents (``tail`` starts right after it), or None if
        ``tail`` is not the valid rest of the top-level value."""
        s = tail.strip(_WS)
        if self._bare:
            return {} if not s else None
        if s == b"}":
            return {}
        if not s.startswith(b","):
            return None
        try:
            value = _loads(b"{" + s[1:])[0]
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _prescan_tail(self) -> dict:
        """Metadata after traceEvents from the last TAIL_WINDOW bytes of the file (see class doc)."""
        if _is_gzip(self.path):
            window = b""
            try:
                with gzip.open(self.path, "rb") as fh:
                    while block := fh.read(BLOCK):
                        window = (window + block)[-TAIL_WINDOW:]
            except (OSError, EOFError, zlib.error):
                return {}  # the main pass reports the error with its offset
        else:
            with open(self.path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - TAIL_WINDOW))
                window = fh.read()
        end = len(window)
        for _ in range(10000):
            i = window.rfind(b"]", 0, end)
            if i < 0:
                break
            before = window[:i].rstrip(_WS)[-1:]
            if before in (b"}", b"["):
                meta = self._parse_tail(window[i + 1:])
                if meta is not None:
                    return meta
            end = i
        return {}

    @property
    def metadata(self) -> dict:
        if self._tail is not None:
            return {**self._header, **self._tail}
        if self._tail_prescanned is None:
            self._tail_prescanned = {} if self._bare else self._prescan_tail()
        return {**self._header, **self._tail_prescanned}

    def get(self, key: str, default=None):
        if key in self._header:
            return self._header[key]
        return self.metadata.get(key, default)

    def __getitem__(self, key: str):
        if key == "traceEvents":
            return [ev for _, ev in self.events()]
        return self.metadata[key]

    # -- events ---------------------------------------------------------------------------------
    def offset(self, index: int) -> int | None:
        """Byte offset (decompressed) of event ``index`` if it lies in the chunk being yielded."""
        for first, count, lo, hi in self._segments:
            if first <= index < first + count:
                if count == 1:
                    return lo
                return self._locate(index - first, lo, hi)
        return None

    def _locate(self, k: int, lo: int, hi: int) -> int | None:
        r = self._reader
        cur = lo - r.base
        for m in _BOUNDARY.finditer(r.buf, cur, hi - r.base):
            try:
                orjson.loads(r.buf[cur:m.start() + 1])
            except orjson.JSONDecodeError:
                continue  # a boundary inside a nested value
            if k == 0:
                return r.base + cur
            k -= 1
            cur = m.end() - 1
        return r.base + cur if k == 0 else None

    def events(self) -> Iterator[tuple[int, object]]:
        """Yield ``(index, event)`` in file order; fills :attr:`warnings` when done (see class doc)."""
        for index, events in self.chunks():
            for event in events:
                yield index, event
                index += 1

    def fraction_read(self) -> float | None:
        """While :meth:`chunks` runs: the share of the file read so far (0..1), None when unknown."""
        return self._reader.fraction_read() if self._reader is not None else None

    def chunks(self, typed: tuple | None = None) -> Iterator[tuple[int, list]]:
        """Yield ``(index of the first event, [event, ...])`` in file order: :meth:`events` without a
        generator step per event (the caller loops over each list). Fills :attr:`warnings` when done.

        ``typed``: ``(decode, decode_exact)``, two ``msgspec.json.Decoder(list[SomeStruct]).decode``, the
        first refusing a float ``ts`` beyond :data:`EXACT_TS_LIMIT` µs, the second taking it as ``Decimal``
        (the exact text): a chunk that is valid UTF-8 and fits either schema comes as a list of those
        structs (only the fields they declare are built, the rest is skipped in C); any other chunk comes
        as dicts, exactly as without ``typed``, and single repaired events always do, so the caller
        handles both."""
        self._index = 0
        self._typed = typed
        self._skipped, self._repaired, self.warnings = [], [], []
        self._reader = _Reader(self.path, prefetch=True)
        # The cyclic GC off while events stream: the caller typically keeps millions of acyclic rows,
        # and each full collection would walk them all (measured: orjson.loads 3.3 s -> 1.0 s for
        # 600k events). Restored as it was when the iteration ends or is abandoned.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            yield from self._events()
        finally:
            self._reader.close()
            if was_enabled:
                gc.enable()
        self._summarise()

    def _events(self):
        r = self._reader
        r.fill(self._events_start + BLOCK)
        r.compact(self._events_start)
        pos = self._skip_ws(r, 0)
        if r.buf[pos:pos + 1] == b"]":
            self._finish_meta(self._parse_tail(r.buf[pos + 1:]), pos + 1)
            return
        while True:
            self._segments = []
            if pos > BLOCK:
                r.compact(pos)
                pos = 0
            r.fill(pos + BLOCK)
            hi = len(r.buf)
            last = None
            for m in _BOUNDARY.finditer(r.buf, max(pos, hi - (1 << 16)), hi):
                last = m
            if last is None:
                for m in _BOUNDARY.finditer(r.buf, pos, hi):
                    last = m
            if last is None:
                if r.eof:
                    yield from self._final(pos)
                    return
                r.fill(len(r.buf) + BLOCK)  # an event longer than a block
                continue
            pos = yield from self._parse_range(pos, last.start() + 1, last.end() - 1)
            if pos < 0:  # the malformed element runs into the end of the array
                yield from self._final(self._final_from)
                return

    def _emit_bulk(self, evs: list, lo: int, hi: int):
        self._segments.append((self._index, len(evs), self._reader.base + lo, self._reader.base + hi))
        index = self._index
        self._index += len(evs)
        self.events_read += len(evs)
        yield index, evs

    def _emit_one(self, ev, lo: int, hi: int):
        self._segments.append((self._index, 1, self._reader.base + lo, self._reader.base + hi))
        self._index += 1
        self.events_read += 1
        yield self._index - 1, [ev]

    def _bulk(self, lo: int, hi: int) -> list:
        text = b"".join((b"[", memoryview(self._reader.buf)[lo:hi], b"]"))  # one copy, not two
        # msgspec does not check the UTF-8 of the strings it skips; the general path repairs them and warns
        if self._typed is not None and (text.isascii() or _is_utf8(text)):
            decode, decode_exact = self._typed
            try:
                return decode(text)
            except msgspec.ValidationError:
                try:  # a float ts beyond EXACT_TS_LIMIT fails the first schema, not this one
                    return decode_exact(text)
                except msgspec.DecodeError:
                    pass
            except msgspec.DecodeError:
                pass  # not the schema, or not valid JSON: the general path decides
        if self._exact:
            return orjson.loads(_quote_ts(text))
        if _BIG_FRACTIONAL_TS.search(text) is not None:  # cheaper than looking at every parsed ts
            evs = orjson.loads(text)
            if _needs_exact(evs):
                self._exact = True
                return orjson.loads(_quote_ts(text))
            return evs
        return orjson.loads(text)

    def _one(self, text: bytes):
        """One element: ``(value, repaired)`` with the same ts exactness as :meth:`_bulk`;
        raises ``ValueError``."""
        try:
            ev = orjson.loads(_quote_ts(text) if self._exact else text)
        except orjson.JSONDecodeError:
            return _lenient(text), True
        if not self._exact and _needs_exact([ev]):
            self._exact = True
            ev = orjson.loads(_quote_ts(text))
        return ev, False

    def _error_pos(self, lo: int, hi: int, exc: orjson.JSONDecodeError) -> int:
        """Buffer position of the first error in ``buf[lo:hi]`` (orjson reports invalid UTF-8 at
        the start of its input, so that position comes from a strict decode)."""
        if "UTF-8" in str(exc):
            try:
                self._reader.buf[lo:hi].decode("utf-8")
            except UnicodeDecodeError as bad:
                return lo + bad.start
        return min(lo + max(exc.pos - 1, 0), hi)  # -1: the "[" added by _bulk

    def _parse_range(self, lo: int, hi: int, nxt: int):
        """Yield the events in ``buf[lo:hi]`` (from an event start to the end of an event);
        return where the next event starts (``nxt``, or later if recovery went past ``hi``;
        -1: the rest belongs to :meth:`_final`)."""
        while lo < hi:
            try:
                evs = self._bulk(lo, hi)
            except orjson.JSONDecodeError as exc:
                p = self._error_pos(lo, hi, exc)
            else:
                yield from self._emit_bulk(evs, lo, hi)
                return nxt
            # the whole events before the error position, in bulk (the error position only moves back)
            while True:
                good = None
                for m in _BOUNDARY.finditer(self._reader.buf, lo, p + 1):
                    if m.end() - 1 <= p:
                        good = m
                if good is None:
                    break
                try:
                    evs = self._bulk(lo, good.start() + 1)
                except orjson.JSONDecodeError as again:
                    p = min(p, self._error_pos(lo, good.start() + 1, again), good.start())
                    continue
                yield from self._emit_bulk(evs, lo, good.start() + 1)
                lo = good.end() - 1
                break
            lo = yield from self._recover(lo, p)
            if lo < 0:
                return lo
            if lo >= hi:
                return max(lo, nxt)
        return nxt

    def _recover(self, bad: int, p: int):
        """The element starting at ``bad`` (error at ``p``): repair it leniently, or skip it up to
        the boundary after which a valid element follows. Returns where parsing resumes."""
        r = self._reader
        search = max(p, bad)
        while True:
            m = _BOUNDARY.search(r.buf, search)
            if m is None or m.end() >= len(r.buf):
                if r.fill(len(r.buf) + BLOCK):
                    continue
                if m is None:  # the element runs into the end of the array: _final handles it
                    self._final_from = bad
                    return -1
            end = m.start() + 1
            if r.base + end - (r.base + bad) > MAX_RECOVER:
                raise TimelineError(
                    f"{self.path}: malformed JSON at byte offset {r.base + p} (traceEvents[{self._index}], "
                    f"event starting at byte offset {r.base + bad}) that cannot be confined to one event within "
                    f"{MAX_RECOVER >> 20} MB; the trace is corrupt: re-export it, or repair the bytes at that offset"
                )
            try:
                ev, repaired = self._one(r.buf[bad:end])
                if repaired:
                    self._repaired.append(r.base + bad)
                yield from self._emit_one(ev, bad, end)
                return m.end() - 1
            except ValueError:
                pass
            if self._valid_after(m.end() - 1):
                self._refuse_second_document(bad, m.end() - 1)
                self._skipped.append(r.base + bad)
                self._segments.append((self._index, 1, r.base + bad, r.base + end))
                self._index += 1
                return m.end() - 1
            search = m.end() - 1

    def _valid_after(self, start: int) -> bool:
        """Whether a valid element starts at ``start`` (it ends at one of the next 4 boundaries, or
        at the end of the array)."""
        r = self._reader
        r.fill(start + (1 << 20))
        for i, m in enumerate(_BOUNDARY.finditer(r.buf, start)):
            if i >= 4:
                break
            try:
                _loads(r.buf[start:m.start() + 1])
                return True
            except ValueError:
                continue
        m = _ARRAY_END.search(r.buf, start)
        if m is not None:
            try:
                _loads(r.buf[start:m.start() + 1])
                return True
            except ValueError:
                pass
        return False

    def _final(self, pos: int):
        """The last element, the ``]`` and the members after it (the whole rest is in the buffer)."""
        r = self._reader
        for m in _ARRAY_END.finditer(r.buf, pos):
            meta = self._parse_tail(r.buf[m.end():])
            if meta is None:
                if self._whole_event(r.buf[pos:m.start() + 1]):  # the array ends here: what follows is wrong
                    raise self._error(r.base + m.end(), "invalid JSON after the 'traceEvents' array (extra data "
                                                        "after the document, or two documents in one file?)")
                continue
            text = r.buf[pos:m.start() + 1]
            try:
                ev, repaired = self._one(text)
                if repaired:
                    self._repaired.append(r.base + pos)
                yield from self._emit_one(ev, pos, m.start() + 1)
            except ValueError:
                self._refuse_second_document(pos, m.start() + 1)
                self._skipped.append(r.base + pos)
                self._index += 1
            self._finish_meta(meta, m.end())
            return
        self._refuse_non_objects(pos)
        raise TimelineError(
            f"{self.path}: the 'traceEvents' array is not closed: the file ends at byte offset {r.base + len(r.buf)} "
            f"inside the element starting at byte offset {r.base + pos} (traceEvents[{self._index}]); the trace is "
            "truncated (profiler killed, or a partial copy): re-export it with prof.export_chrome_trace(...)"
        )

    def _refuse_second_document(self, lo: int, hi: int) -> None:
        """A region about to be skipped as a malformed event that closes the array and opens another
        ``traceEvents`` is two traces in one file (concatenated): refused, never merged."""
        region = self._reader.buf[lo:hi]
        if _ARRAY_END.search(region) and b'"traceEvents"' in region:
            raise self._error(self._reader.base + lo, "a second 'traceEvents' array after the first one's end "
                                                      "(two traces concatenated into one file?)")

    @staticmethod
    def _whole_event(text: bytes) -> bool:
        """``text`` is exactly one JSON object (strictly parsed)."""
        try:
            return isinstance(orjson.loads(text), dict)
        except orjson.JSONDecodeError:
            return False

    def _refuse_non_objects(self, pos: int) -> None:
        """Where the rest of the array is complete JSON whose elements are not all objects (``[1, 2, 3]``),
        say so instead of calling the file truncated. Only on that error path (a parse per closing ``]``)."""
        r = self._reader
        for k, m in enumerate(re.finditer(rb"\]", r.buf[pos:])):
            if k >= 64:
                return
            try:
                rest = orjson.loads(b"[" + r.buf[pos:pos + m.end()])
            except orjson.JSONDecodeError:
                continue
            if self._parse_tail(r.buf[pos + m.end():]) is None:
                continue
            for j, element in enumerate(rest):
                if not isinstance(element, dict):
                    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
                        type(element), "a number")
                    raise TimelineError(
                        f"{self.path}: traceEvents[{self._index + j}] is {kind}, not an event object (from byte "
                        f"offset {r.base + pos}); not a torch.profiler (Kineto) trace: pass the file written by "
                        "prof.export_chrome_trace(...)")
            return

    def _finish_meta(self, meta: dict | None, after: int) -> None:
        if meta is None:
            raise self._error(self._reader.base + after, "invalid JSON after the 'traceEvents' array")
        base, pre = meta.get("baseTimeNanoseconds"), (self._tail_prescanned or {}).get("baseTimeNanoseconds")
        if self._tail_prescanned is not None and base != pre:
            raise TimelineError(
                f"{self.path}: baseTimeNanoseconds after traceEvents ({base}) differs from the pre-scan of the "
                f"file's end ({pre}); please report this trace"
            )
        self._tail = meta

    def _summarise(self) -> None:
        def offsets(xs: list[int]) -> str:
            shown = ", ".join(str(x) for x in xs[:20])
            return shown + (f", ... ({len(xs) - 20} more)" if len(xs) > 20 else "")

        for found, what, why in (
            (self._skipped, "malformed event{s} skipped", "not valid JSON even leniently, e.g. unescaped quotes in a name"),
            (self._repaired, "event{s} repaired", "not strict JSON: invalid UTF-8 replaced by U+FFFD, raw control "
                                                  "characters kept, NaN or Infinity read as numbers"),
        ):
            if found:
                s = "s" if len(found) > 1 else ""
                self.warnings.append(f"{len(found)} {what.format(s=s)} at byte offset{s} {offsets(found)} of "
                                     f"{self.path.name} ({why}; docs/field-cases.md C18)")


def open_trace(path: Path) -> KinetoTrace:
    """Open a ``.json`` / ``.json.gz`` Chrome trace for streaming (see :class:`KinetoTrace`)."""
    return KinetoTrace(path)
