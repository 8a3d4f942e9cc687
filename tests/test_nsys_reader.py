"""Internals of the nsys reader that must give the same answer on their fast and their plain path:
vectorized NVTX nesting vs an explicit stack, ADBC (Arrow) vs sqlite3 reads, vectorized emit_nvtx
name parsing."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from operator_profiler.timeline import nsys
from operator_profiler.timeline.nesting import nest_push_pop, nest_with_stack, nesting_order, parent_cycle
from operator_profiler.timeline.nsys import parse_range_texts


def _stack_reference(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """Nesting of every push/pop stack by the explicit stack only."""
    pp = np.flatnonzero((ranges["kind"] == "nvtx_push_pop").to_numpy())
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([ranges["pid"].to_numpy()[pp], ranges["tid"].to_numpy()[pp],
                                                       ranges["domain"].to_numpy()[pp]]))
    order = np.argsort(codes, kind="stable")
    rows = pp[order]
    local_parent, local_depth, partial = nest_with_stack(codes[order], ranges["start_ns"].to_numpy()[rows],
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
    depth, parent, partial = nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges)
    assert np.array_equal(parent, want_parent)
    assert np.array_equal(depth, want_depth)
    assert partial == want_partial
    if not noise:
        assert partial == 0


@pytest.mark.parametrize("seed", range(3))
def test_nesting_of_threads_in_any_order_equals_the_explicit_stack(seed):
    """Rows not grouped by thread (every thread's ranges interleaved in start order, a missing domain) take
    the hashing path of the stack grouping instead of the run-length one: the same nesting."""
    rng = np.random.default_rng(seed)
    ranges = _random_ranges(rng, n_threads=4, per_thread=300, noise=True)
    ranges = ranges.sort_values(["start_ns", "effective_end_ns"], ascending=[True, False], kind="stable")
    ranges = ranges.reset_index(drop=True)
    ranges.loc[rng.random(len(ranges)) < 0.1, "domain"] = None
    ranges["domain"] = ranges["domain"].astype("category")
    depth, parent, partial = nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges.assign(domain=ranges["domain"].astype(object)
                                                                           .fillna("<none>")))
    assert np.array_equal(parent, want_parent)
    assert np.array_equal(depth, want_depth)
    assert partial == want_partial


def test_nesting_of_long_sibling_runs_equals_the_explicit_stack():
    """Thousands of top-level siblings and of children under one long parent (the runs that pointer
    jumping walks back through): the same nesting as the explicit stack."""
    n = 5000
    start = np.r_[np.arange(n) * 10, 10 * n, 10 * n + 1 + np.arange(n) * 10]
    end = np.r_[np.arange(n) * 10 + 5, 20 * n + 10, 10 * n + 6 + np.arange(n) * 10]
    ranges = pd.DataFrame({"pid": 1, "tid": 2, "domain": "default", "kind": "nvtx_push_pop", "start_ns": start,
                           "effective_end_ns": end})
    depth, parent, partial = nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth) and partial == want_partial
    assert (parent[:n + 1] == -1).all() and (parent[n + 1:] == n).all() and depth.max() == 1


@pytest.mark.parametrize("threads", [1, 5, 70_000])
@pytest.mark.parametrize("presorted", [False, True])
def test_nesting_order_is_lexsort_by_thread_start_and_longest_first(threads, presorted):
    """The reader's row order for nesting: (pid, tid, start, end descending), ties in row order, exactly as
    np.lexsort gives it, whether the rows come in start order or not, with many equal starts and ends, and
    with more threads than the radix sort's 16 bits."""
    rng = np.random.default_rng(threads)
    n = 200_000
    start = rng.integers(0, n // 4, n)  # many equal starts
    end = start + rng.integers(0, 3, n)  # and equal ends
    pid = rng.integers(0, 2**24, max(threads // 1000, 1))[rng.integers(0, max(threads // 1000, 1), n)]
    tid = rng.integers(0, threads, n)
    if presorted:
        by_start = np.argsort(start, kind="stable")
        start, end, pid, tid = start[by_start], end[by_start], pid[by_start], tid[by_start]
    assert np.array_equal(nesting_order(pid, tid, start, end), np.lexsort((-end, start, tid, pid)))


def test_nesting_of_every_real_export_equals_the_explicit_stack(real_nsys_files):
    for path in real_nsys_files:
        ranges = nsys.read_nsys(path).ranges
        if ranges.empty:
            continue
        depth, parent, _ = nest_push_pop(ranges)
        want_depth, want_parent, _ = _stack_reference(ranges)
        assert np.array_equal(parent, want_parent), path.name
        assert np.array_equal(depth, want_depth), path.name
        # And the written parent ids are those rows' range ids (range_id = row number).
        got = ranges["parent_id"].fillna(-1).to_numpy(dtype=np.int64)
        assert np.array_equal(got, parent), path.name


def test_arrow_and_sqlite3_reads_give_the_same_timeline(real_nsys_files, monkeypatch):
    with_arrow = {p.name: nsys.read_nsys(p) for p in real_nsys_files}
    monkeypatch.setattr(nsys._Export, "_query_arrow", lambda self, sql, private=False: None)
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


def test_emit_nvtx_decorations_in_any_order_and_malformed():
    """Only decorated texts are searched (the values are put back in place): fields in another order, a
    stashed seq beside a seq, a marker without a number (null), a text that starts with a field (no
    ", " before it: not a decoration, but its seq is read, as the regex ``(?:^|, )seq = `` reads it)."""
    parsed = parse_range_texts(["plain", "seq = 5", "x, seq = abc", "z, op_id = 7, seq = 2",
                                "w, stashed seq = 4, seq = 9", "multi\nline, seq = 3", "", "y, sizes = [1", "plain too"])
    assert parsed["name"].tolist() == ["plain", "seq = 5", "x", "z", "w", "multi\nline", "", "y", "plain too"]
    assert parsed["seq"].tolist() == [pd.NA, 5, pd.NA, 2, 9, 3, pd.NA, pd.NA, pd.NA]
    assert parsed["stashed_seq"].tolist() == [pd.NA, pd.NA, pd.NA, pd.NA, 4, pd.NA, pd.NA, pd.NA, pd.NA]
    assert parsed["op_id"].tolist() == [pd.NA, pd.NA, pd.NA, 7, pd.NA, pd.NA, pd.NA, pd.NA, pd.NA]
    assert parsed["sizes"].isna().all()
    assert len(parse_range_texts([])) == 0 and len(parse_range_texts(["a", "b"])) == 2


def _parsed_by_regex(texts: list) -> dict[str, list]:
    """What the definitions read, text by text: the name is the text without the _DECORATIONS regex
    (RE2, pyarrow), each field what its _FIELDS regex extracts (a number as a Python int: none beyond
    int64, no negative seq); only texts holding " = " are decorated."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(texts, type=pa.string())
    cut = pc.replace_substring_regex(arr, nsys._DECORATIONS, "", max_replacements=1).to_pylist()
    out = {"name": ["" if t is None else (c if " = " in t else t) for t, c in zip(texts, cut)]}
    for column, (_, pattern) in nsys._FIELDS.items():
        values = []
        for text, match in zip(texts, pc.extract_regex(arr, pattern).to_pylist()):
            value = None if text is None or " = " not in text or match is None else match["v"]
            if value is not None and column != "sizes":
                value = int(value)
                value = None if not -(2 ** 63) <= value < 2 ** 63 or (column == "seq" and value < 0) else value
            values.append(value)
        out[column] = values
    return out


def test_operator_names_cut_where_the_decoration_regex_cuts():
    # The reader finds decorations on the bytes (fast); the definition is the regex _DECORATIONS, whose
    # ".*$" does not cross a newline: both must agree, edge cases included.
    texts = ["x, y, seq = 1", "seq = 5", "a, seq = 1, b, seq = 2", "q, seq = 1\nmore", "q, op_id = 1, seq = 2\n",
             "aa, sizes = [], input_op_ids = []", "é, op_id = 1", "a, b = c", "", None, "n, stashed seq = 3, op_id = 4",
             "m, input_op_ids = [(1, 0)]\n, seq = 3", "r,seq = 1", "u , seq = 1"]
    assert parse_range_texts(texts)["name"].tolist() == _parsed_by_regex(texts)["name"]
    assert parse_range_texts(texts)["name"].tolist()[:3] == ["x, y", "seq = 5", "a"]


@pytest.mark.parametrize("chunk", [None, 997])
def test_range_texts_parse_as_the_regexes_read_them_on_random_texts(chunk, monkeypatch):
    """Random texts made of the decorations' pieces (field names with and without ", ", signs, 8- and
    9-digit numbers, numbers beyond int64, newlines, a two-byte character): every column and the list of
    texts whose number does not fit int64 equal the regexes' reading, parsed at once or in chunks."""
    import random

    if chunk:
        monkeypatch.setattr(nsys, "_PARSE_CHUNK", chunk)

    pieces = ["aten::mm", "x", ", ", "seq = ", ", seq = ", "stashed seq = ", ", stashed seq = ", "op_id = ", ", op_id = ",
              ", sizes = ", "sizes = ", "[[1, 2], [3]]", "[", "]", ", input_op_ids = ", "[(1, 0)]", "-", "0", "7", "123",
              "99999999999999999999", "9223372036854775807", "9223372036854775808", "\n", "é", " = ", "a, b = c",
              "00012", "abc", " ", "12345678", "123456789", "1234567", "-0", "seq", "op_id", "stashed seq",
              "input_op_ids", "sizes"]
    rng = random.Random(7)
    texts = [None if rng.random() < 0.02 else "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
             for _ in range(20_000)]
    texts += ["seq = -x, seq = 3", "x, seq = , seq = 4", "xop_id = 2", "stashed seq = -1, stashed seq = 2", "a, seq = 7"]
    parsed = parse_range_texts(texts)
    expected = _parsed_by_regex(texts)
    for column, values in expected.items():
        got = [None if pd.isna(v) else v for v in parsed[column].tolist()]
        assert got == values, column
    assert len(parsed.attrs["numbers_beyond_int64"]) > 100  # (the pieces make many)
    beyond = [t for t in texts if t is not None and " = " in t and any(
        (m := re.search(nsys._FIELDS[column][1].replace("(?P<v>", "("), t, re.ASCII))
        and not -(2 ** 63) <= int(m.group(1)) < 2 ** 63 for column in ("seq", "stashed_seq", "op_id"))]
    assert parsed.attrs["numbers_beyond_int64"] == list(dict.fromkeys(beyond))  # each text once, in text order


# Robustness found by a fresh user (a QA pass) ------------------------------------------------------

import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from nsys_export import Kernel, Nvtx, Runtime, write_nsys_export  # noqa: E402

from operator_profiler import stages, tables  # noqa: E402


def _opprof(*args):
    return subprocess.run([sys.executable, "-m", "operator_profiler.cli", *map(str, args)], capture_output=True,
                          text=True, check=False, timeout=120)


def _one_line_error(result) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    # Notes a stage logged before failing (INFO/WARNING lines) may precede the error line.
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("INFO:", "WARNING:"))]
    assert len(lines) == 1, lines
    return lines[0]


def _small(path):
    return write_nsys_export(path, nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200), Nvtx("outer", 59, "10:1", 50, 300)],
                             runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1)],
                             kernels=[Kernel("gemm", 10, 7, 170, 190, 1)])


def test_invalid_utf8_text_is_decoded_tolerantly(tmp_path):
    db = _small(tmp_path / "r.sqlite")
    with sqlite3.connect(db) as conn:  # bytes 0xff are not UTF-8 (real exports hold such strings)
        conn.execute("UPDATE NVTX_EVENTS SET text = CAST(X'6174656e3a3a6d6dff' AS TEXT) WHERE text = 'aten::mm'")
    ranges = nsys.read_nsys(db).ranges
    assert sorted(ranges["name"]) == ["aten::mm\ufffd", "outer"]


def test_a_non_integer_time_is_a_one_line_error_naming_the_column(tmp_path):
    db = _small(tmp_path / "r.sqlite")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon'")
    line = _one_line_error(_opprof("timeline", "--nsys", db, "--out", tmp_path / "tl"))
    assert "CUPTI_ACTIVITY_KIND_KERNEL column start holds 'soon'" in line
    assert not (tmp_path / "tl" / "kernels.parquet").exists()


def test_a_damaged_page_is_a_one_line_error(tmp_path):
    db = _small(tmp_path / "r.sqlite")
    data = bytearray(db.read_bytes())
    page = 4096
    data[3 * page: 3 * page + 512] = b"\xde\xad" * 256  # overwrite inside the file (not a truncation)
    db.write_bytes(bytes(data))
    result = _opprof("timeline", "--nsys", db, "--out", tmp_path / "tl")
    if result.returncode == 0:  # the damaged page held nothing the reader needs
        return
    assert "export the report again" in _one_line_error(result)


def test_nameless_ranges_never_name_an_operator(tmp_path):
    db = write_nsys_export(tmp_path / "r.sqlite",
                           nvtx=[Nvtx("outer", 59, "10:1", 50, 300), Nvtx(None, 59, "10:1", 100, 200)],
                           runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1)],
                           kernels=[Kernel("gemm", 10, 7, 170, 190, 1)])
    timeline = stages.export_timeline(db, tmp_path / "tl")
    assert any("1 NVTX range(s) have no name" in w for w in timeline.diagnostics["warnings"])
    att = stages.attribute_files(tmp_path / "tl", None, None, tmp_path / "a.parquet")
    assert att["operator"].tolist() == ["outer"]


def test_a_kernel_ending_before_it_starts_counts_zero_time(tmp_path):
    db = write_nsys_export(tmp_path / "r.sqlite", runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1),
                                                          Runtime("cudaLaunchKernel_v7000", "10:1", 160, 165, 2)],
                           kernels=[Kernel("bad", 10, 7, 300, 200, 1), Kernel("good", 10, 7, 310, 320, 2)])
    timeline = nsys.read_nsys(db)
    assert timeline.kernels.set_index("name")["duration_ns"].to_dict() == {"bad": 0, "good": 10}
    assert any(w.startswith("1 kernel(s) end before they start ('bad')") for w in timeline.diagnostics["warnings"])


def test_bad_attribute_options_and_outputs_are_one_line_errors(tmp_path):
    db = _small(tmp_path / "r.sqlite")
    assert _opprof("timeline", "--nsys", db, "--out", tmp_path / "tl").returncode == 0
    line = _one_line_error(_opprof("attribute", "--timeline", tmp_path / "tl", "--out", tmp_path / "a.parquet",
                                   "--nvtx-ignore-range", "("))
    assert "'(' is not a regular expression" in line
    (tmp_path / "a_dir").mkdir()
    line = _one_line_error(_opprof("attribute", "--timeline", tmp_path / "tl", "--out", tmp_path / "a_dir"))
    assert "a_dir" in line
    assert not list(tmp_path.glob("*.tmp"))  # no partial output left behind
    (tmp_path / "file").write_text("x")
    line = _one_line_error(_opprof("timeline", "--nsys", db, "--out", tmp_path / "file"))
    assert "file" in line


def test_operator_domain_mismatch_is_explained(tmp_path):
    db = write_nsys_export(tmp_path / "r.sqlite", domains={(10, 3): "mylib"},
                           nvtx=[Nvtx("step", 59, "10:1", 100, 200, domain=3)],
                           runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1)],
                           kernels=[Kernel("gemm", 10, 7, 170, 190, 1)])
    assert _opprof("timeline", "--nsys", db, "--out", tmp_path / "tl").returncode == 0
    result = _opprof("attribute", "--timeline", tmp_path / "tl", "--out", tmp_path / "a.parquet")
    assert result.returncode == 0
    assert "NVTX operator domain(s) 'default' have no push/pop ranges in this capture; domains present: 'mylib'" \
        in result.stderr
    assert "1 kernel(s) are inside NVTX ranges of domain(s) 'mylib' only" in result.stderr
    result = _opprof("attribute", "--timeline", tmp_path / "tl", "--out", tmp_path / "b.parquet",
                     "--nvtx-operator-domain", "mylib")
    assert result.returncode == 0 and "WARNING" not in result.stderr
    assert tables.read_table(tmp_path / "b.parquet")["operator"].tolist() == ["step"]


def test_cli_chain_on_a_real_export_captured_elsewhere(real_nsys_files, tmp_path):
    """timeline -> classify -> attribute -> aggregate -> report without our capture's run.json."""
    thunder = next(p for p in real_nsys_files if p.name.startswith("fuser_thunder"))
    (tmp_path / "layers.json").write_text("[]")
    steps = [
        ("timeline", "--nsys", thunder, "--out", tmp_path / "tl"),
        ("classify", "--timeline", tmp_path / "tl", "--layers", tmp_path / "layers.json", "--out", tmp_path / "layers"),
        ("attribute", "--timeline", tmp_path / "tl", "--kernel-layers", tmp_path / "layers" / "kernel_layers.parquet",
         "--out", tmp_path / "attribution.parquet"),
        ("aggregate", "--attribution", tmp_path / "attribution.parquet", "--instances",
         tmp_path / "layers" / "instances.parquet", "--classes", tmp_path / "layers" / "classes.json", "--device", "cuda",
         "--out", tmp_path / "agg"),
        ("report", "--results", tmp_path / "agg", "--timeline", tmp_path / "tl", "--workload", "thunder",
         "--out", tmp_path / "report.md"),
    ]
    for step in steps:
        result = _opprof(*step)
        assert result.returncode == 0, (step[0], result.stderr)
    report = (tmp_path / "report.md").read_text()
    for expected in ("Nsight Systems 2025.1.1.110, export schema 3.17.1", "GPU(s): NVIDIA H200",
                     "8 of 18 kernels attributed", "hardware counters: not collected (no Nsight Compute data",
                     "- no GPU activity captured for pid 50922", "| ExecutorRunFusion::cuLaunchKernel | 6 | 6 |"):
        assert expected in report, expected
    assert "CPU" not in report


def test_evidence_is_valid_json_whatever_the_range_names(tmp_path):
    import json

    names = ['outer "quoted" \\ back', "tab\there", "ünïcode ✓"]
    db = write_nsys_export(tmp_path / "r.sqlite",
                           nvtx=[Nvtx(names[0], 59, "10:1", 10, 500), Nvtx(names[1], 59, "10:1", 20, 400),
                                 Nvtx(names[2], 59, "10:1", 30, 300)],
                           runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1)],
                           kernels=[Kernel("gemm", 10, 7, 170, 190, 1)])
    stages.export_timeline(db, tmp_path / "tl")
    att = stages.attribute_files(tmp_path / "tl", None, None, tmp_path / "a.parquet")
    evidence = json.loads(att["evidence"].iloc[0])["nvtx"]
    assert evidence["stack"] == names and evidence["operator"] == names[2]


def test_files_from_different_timelines_are_refused(tmp_path):
    one = _small(tmp_path / "one.sqlite")
    two = write_nsys_export(tmp_path / "two.sqlite", runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1),
                                                             Runtime("cudaLaunchKernel_v7000", "10:1", 250, 255, 2)],
                            kernels=[Kernel("a", 10, 7, 170, 190, 1), Kernel("b", 10, 7, 270, 290, 2)])
    (tmp_path / "layers.json").write_text("[]")
    for name, db in (("one", one), ("two", two)):
        assert _opprof("timeline", "--nsys", db, "--out", tmp_path / name).returncode == 0
        assert _opprof("classify", "--timeline", tmp_path / name, "--layers", tmp_path / "layers.json",
                       "--out", tmp_path / f"{name}_layers").returncode == 0
    line = _one_line_error(_opprof("attribute", "--timeline", tmp_path / "two", "--kernel-layers",
                                   tmp_path / "one_layers" / "kernel_layers.parquet", "--out", tmp_path / "a.parquet"))
    assert "come from different timelines" in line
    assert _opprof("attribute", "--timeline", tmp_path / "one", "--out", tmp_path / "a.parquet").returncode == 0
    assert _opprof("aggregate", "--attribution", tmp_path / "a.parquet", "--instances",
                   tmp_path / "one_layers" / "instances.parquet", "--classes", tmp_path / "one_layers" / "classes.json",
                   "--out", tmp_path / "agg").returncode == 0
    line = _one_line_error(_opprof("report", "--results", tmp_path / "agg", "--timeline", tmp_path / "two",
                                   "--out", tmp_path / "r.md"))
    assert "timeline of 2 kernels" in line and "1" in line


def test_report_of_a_capture_whose_ranges_are_in_another_domain(tmp_path, real_nsys_files):
    extrap = next(p for p in real_nsys_files if p.name.startswith("extrap_concurrent"))
    (tmp_path / "layers.json").write_text("[]")
    for step in (("timeline", "--nsys", extrap, "--out", tmp_path / "tl"),
                 ("classify", "--timeline", tmp_path / "tl", "--layers", tmp_path / "layers.json", "--out", tmp_path / "l"),
                 ("attribute", "--timeline", tmp_path / "tl", "--out", tmp_path / "a.parquet"),
                 ("aggregate", "--attribution", tmp_path / "a.parquet", "--instances", tmp_path / "l" / "instances.parquet",
                  "--classes", tmp_path / "l" / "classes.json", "--out", tmp_path / "agg"),
                 ("report", "--results", tmp_path / "agg", "--timeline", tmp_path / "tl", "--out", tmp_path / "r.md")):
        assert _opprof(*step).returncode == 0, step[0]
    report = (tmp_path / "r.md").read_text()
    assert "12 kernel(s) lie inside NVTX ranges, but none that names an operator" in report
    assert "--nvtx-operator-domain NAME" in report
    gpus = next(line for line in report.splitlines() if line.startswith("- GPU(s):"))
    assert gpus == "- GPU(s): GeForce GTX 1060 with Max-Q Design"  # not the display adapters the export also lists


def test_graph_kernels_are_projected_onto_their_capture_ranges(tmp_path):
    from nsys_export import GraphNode

    db = write_nsys_export(tmp_path / "r.sqlite", nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200)],
                           graph_nodes=[GraphNode("10:1", 150, 160, 1), GraphNode("10:1", 300, 301, 11, 1)],
                           runtime=[Runtime("cudaGraphLaunch", "10:1", 1000, 1010, 50),
                                    Runtime("cudaGraphLaunch", "10:1", 2000, 2010, 51)],
                           kernels=[Kernel("k", 10, 7, 1030, 1040, 50, graph_node_id=11),
                                    Kernel("k", 10, 7, 2030, 2040, 51, graph_node_id=11)])
    stages.export_timeline(db, tmp_path / "tl")
    projection = tables.read_table(tmp_path / "tl" / "nvtx_gpu_projection.parquet").set_index("name")
    row = projection.loc["aten::mm"]
    assert (int(row["kernel_count"]), int(row["gpu_time_ns"]), int(row["gpu_start_ns"]), int(row["gpu_end_ns"])) == \
        (2, 20, 1030, 2040)


def test_kernels_are_ordered_by_launch_start_pid_correlation_id_and_start():
    # finish_kernels sorts with one np.lexsort; the order it must give is pandas' stable sort on
    # (launch start or else start, pid, correlation id with nulls last, start), ties kept in row order.
    from operator_profiler.timeline.model import finish_kernels

    rng = np.random.default_rng(0)
    n = 2000
    kernels = pd.DataFrame({
        "pid": rng.integers(1, 3, n),
        "launch_start_ns": pd.array(np.where(rng.random(n) < 0.1, None, rng.integers(0, 50, n)), dtype="Int64"),
        "start_ns": rng.integers(0, 60, n), "end_ns": rng.integers(60, 90, n),
        "correlation_id": pd.array(np.where(rng.random(n) < 0.1, None, rng.integers(1, 30, n)), dtype="Int64"),
        "name": [f"k{i % 7}" for i in range(n)], "mangled_name": [None] * n, "row": np.arange(n)})
    no_ranges = pd.DataFrame({"iteration": pd.array([], dtype="Int64"), "start_ns": pd.array([], dtype="int64"),
                              "end_ns": pd.array([], dtype="Int64"), "pid": pd.array([], dtype="int64")})
    expected = kernels.assign(
        _launch=kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64"),
        _corr=kernels["correlation_id"].fillna(np.iinfo(np.int64).max).astype("int64"),
    ).sort_values(["_launch", "pid", "_corr", "start_ns"], kind="stable")["row"].tolist()
    finished = finish_kernels(kernels, no_ranges, "nsys")
    assert finished["row"].tolist() == expected
    assert finished["kernel_id"].tolist() == list(range(n))


def test_nvtx_rows_read_on_a_second_thread_fall_back_and_fail_on_the_main_one(real_nsys_files, monkeypatch):
    """The NVTX ranges are read on a thread of their own while the kernels are read: when ADBC cannot read
    them there, sqlite3 reads them on the main thread (same timeline); an error raised on that thread is
    raised by read_nsys; an error on the main thread stops it; the thread is gone when read_nsys returns."""
    import threading

    path = next(p for p in real_nsys_files if p.name.startswith("extrap_concurrent"))
    expected = nsys.read_nsys(path)
    real_query = nsys._Export._query_arrow
    private_calls = []

    def no_private_arrow(self, sql, private=False):
        if private:
            private_calls.append(sql)
            return None
        return real_query(self, sql)

    monkeypatch.setattr(nsys._Export, "_query_arrow", no_private_arrow)
    fallback = nsys.read_nsys(path)
    assert len(private_calls) == 1 and "NVTX_EVENTS" in private_calls[0]
    for table in ("kernels", "launches", "ranges", "activities"):
        pd.testing.assert_frame_equal(getattr(expected, table), getattr(fallback, table), obj=table)
    assert len(fallback.ranges) == 76
    monkeypatch.undo()

    def broken(texts):
        raise RuntimeError(f"parse failed on {threading.current_thread().name}")

    monkeypatch.setattr(nsys, "parse_range_texts", broken)
    with pytest.raises(RuntimeError, match="parse failed on nsys-nvtx-ranges"):
        nsys.read_nsys(path)
    assert not any(t.name == "nsys-nvtx-ranges" for t in threading.enumerate())
    monkeypatch.undo()

    def launches_fail(*args):
        raise RuntimeError("launch calls failed")

    monkeypatch.setattr(nsys, "_read_launches", launches_fail)
    with pytest.raises(RuntimeError, match="launch calls failed"):
        nsys.read_nsys(path)  # (the thread waits for the capture end, never given: stopped, not hung)
    assert not any(t.name == "nsys-nvtx-ranges" for t in threading.enumerate())


def test_take_rows_reorders_every_column_and_empties_the_source():
    from operator_profiler.timeline.model import all_null_ints, take_rows

    frame = pd.DataFrame({"a": np.array([10, 11, 12]), "b": pd.array([1, None, 3], dtype="Int64"),
                          "c": pd.Series(["x", None, "z"], dtype="str"), "d": pd.Categorical(["p", "q", "p"]),
                          "e": np.array([[1], [], [2, 3]], dtype=object)})
    dtypes = frame.dtypes.to_dict()
    out = take_rows(frame, np.array([2, 0, 1]))
    assert out["a"].tolist() == [12, 10, 11]
    assert out["b"].tolist() == [3, 1, pd.NA]
    assert [None if pd.isna(v) else v for v in out["c"]] == ["z", "x", None]
    assert out["d"].tolist() == ["p", "p", "q"] and out["e"].tolist() == [[2, 3], [1], []]
    assert out.dtypes.to_dict() == dtypes and list(out.index) == [0, 1, 2]
    assert list(frame.columns) == []  # each column freed once taken
    nulls = all_null_ints(3)
    assert nulls.dtype == "Int64" and pd.isna(nulls).all() and len(all_null_ints(0)) == 0


def test_decoration_numbers_beyond_int64_are_no_value_and_warned(tmp_path):
    """A seq/op_id/stashed seq of 19+ digits is read exactly; one beyond int64 (torch never writes one) is
    null and the reader says which texts: it used to stop the read with an Arrow cast traceback."""
    from nsys_export import Nvtx, launch, rows, write_nsys_export

    parsed = parse_range_texts(["v, seq = 99999999999999999999", "a, seq = 9223372036854775807",
                                "b, op_id = 9223372036854775808", "c, stashed seq = 123456789012345678901", "e, seq = 7"])
    assert parsed["name"].tolist() == ["v", "a", "b", "c", "e"]
    assert parsed["seq"].tolist() == [pd.NA, 9223372036854775807, pd.NA, pd.NA, 7]
    assert parsed["op_id"].isna().all() and parsed["stashed_seq"].isna().all()
    assert sorted(parsed.attrs["numbers_beyond_int64"]) == ["b, op_id = 9223372036854775808",
                                                            "c, stashed seq = 123456789012345678901",
                                                            "v, seq = 99999999999999999999"]
    db = write_nsys_export(tmp_path / "report.sqlite",
                           nvtx=[Nvtx("aten::mm, seq = 99999999999999999999999, op_id = 3", 59, "10:1", 100, 400)],
                           **rows(launch("k1", "10:1", 200, 1)))
    timeline = nsys.read_nsys(db)
    assert timeline.ranges["name"].tolist() == ["aten::mm"] and timeline.ranges["op_id"].tolist() == [3]
    assert timeline.ranges["seq"].isna().all()
    assert any("1 NVTX range text(s) hold a seq/op_id/stashed seq beyond 64 bits" in w
               and "seq = 99999999999999999999999" in w for w in timeline.diagnostics["warnings"])


def test_ctrl_c_during_an_adbc_query_is_not_taken_for_an_unreadable_result(real_nsys_files, monkeypatch):
    """During a query on the main thread ADBC handles SIGINT itself, tries to cancel (the SQLite driver cannot)
    and raises that failure ``from KeyboardInterrupt``: that must stop the read, not send the query to sqlite3.
    (A stand-in connection raises what ADBC raises: a real SIGINT cannot be timed into a query here.)"""
    import adbc_driver_sqlite.dbapi as adbc

    class Cursor:
        def execute(self, sql):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as interrupt:
                raise RuntimeError("NOT_IMPLEMENTED: cancel") from interrupt

        def close(self):
            pass

    class Connection:
        def cursor(self):
            return Cursor()

        def close(self):
            pass

    monkeypatch.setattr(adbc, "connect", lambda uri: Connection())
    export = nsys._Export(real_nsys_files[0])
    try:
        with pytest.raises(KeyboardInterrupt):
            export.query("SELECT id, value FROM StringIds")
    finally:
        export.close()
    assert not nsys._interrupted(RuntimeError("NOT_IMPLEMENTED"))


@pytest.mark.parametrize("odd", [None, "null", "negative", "beyond CUDA's limits"])
def test_grid_texts_built_per_distinct_triple_equal_the_texts_built_per_kernel(odd):
    """``_xyz`` builds the "x,y,z" texts once per distinct triple when the dimensions pack into one int64 and
    per kernel otherwise: the same texts either way (a null dimension: no text)."""
    rng = np.random.default_rng(3)
    n = 1000
    df = pd.DataFrame({"gridX": rng.integers(1, 2**31, 4)[rng.integers(0, 4, n)], "gridY": rng.integers(1, 3, n),
                       "gridZ": 1}).astype("Int64")
    if odd == "null":
        df.loc[5, "gridY"] = pd.NA
    elif odd == "negative":
        df.loc[5, "gridZ"] = -1
    elif odd is not None:
        df.loc[5, "gridY"] = 2**16
    got = nsys._xyz(df, "grid")
    want = [None if pd.isna(v).any() else ",".join(str(int(x)) for x in v) for v in df.to_numpy(dtype=object)]
    assert [None if pd.isna(v) else v for v in got.tolist()] == want
    assert want[5] is None if odd == "null" else want[5].count(",") == 2


@pytest.mark.parametrize("seed", range(4))
def test_parent_cycle_finds_a_chain_that_never_ends(seed):
    """``parent_cycle`` against walking each chain by hand: None on a forest (deep chains included), a row whose
    chain runs into the cycle once one is made (a self parent, or a loop far up a long chain)."""
    rng = np.random.default_rng(seed)
    n = 3000
    parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])  # each parent is an earlier row
    parent[1000:1400] = np.arange(999, 1399)  # one 400-deep chain

    def walks_forever(row):
        seen = set()
        while row >= 0:
            if row in seen:
                return True
            seen.add(row)
            row = parent[row]
        return False

    assert parent_cycle(parent) is None and parent_cycle(np.full(5, -1)) is None and parent_cycle(np.array([])) is None
    if seed % 2:
        parent[1200] = 1399  # 1399 -> 1398 -> ... -> 1200 -> 1399: a 200-range loop at the top of the long chain
    else:
        loop_at = int(rng.integers(0, n))
        parent[loop_at] = loop_at  # a self parent
    row = parent_cycle(parent)
    assert row is not None and walks_forever(row)


def test_the_gil_switch_interval_is_restored_after_concurrent_reads(real_nsys_files):
    """read_nsys shortens the process-wide GIL switch interval while its two threads run: after reads in several
    threads at once (and after a failed read) the interval is the caller's again."""
    import sys
    import threading

    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        for _ in range(3):
            threads = [threading.Thread(target=nsys.read_nsys, args=(p,)) for p in real_nsys_files[:4]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sys.getswitchinterval() == pytest.approx(0.004)
        with pytest.raises(Exception):
            nsys.read_nsys(real_nsys_files[0].parent / "no such export.sqlite")
        assert sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        sys.setswitchinterval(previous)


@pytest.mark.parametrize("zero_length", [[], [3000], [3000, 3000], [1000], [5000]])
def test_an_overlap_is_counted_beside_zero_length_ranges_at_its_start(zero_length):
    """A [1000, 5000] and B [3000, 8000] overlap without nesting: counted (the reader warns) whatever
    zero-length ranges sit at B's start, A's start or A's end (a zero-length range at B's start was counted
    as closed before B, which hid the overlap), with the explicit stack's parents and depths."""
    spans = [(1000, 5000), (3000, 8000)] + [(t, t) for t in zero_length]
    ranges = pd.DataFrame({"pid": 1, "tid": 2, "domain": "default", "kind": "nvtx_push_pop",
                           "start_ns": [s for s, _ in spans], "effective_end_ns": [e for _, e in spans]})
    ranges = ranges.sort_values(["start_ns", "effective_end_ns"], ascending=[True, False]).reset_index(drop=True)
    depth, parent, partial = nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth)
    assert partial == want_partial == 1


@pytest.mark.parametrize("seed", range(6))
def test_nesting_with_many_zero_length_ranges_equals_the_explicit_stack(seed):
    """Random stacks where a third of the ranges are zero-length, on few distinct timestamps (ties everywhere)."""
    rng = np.random.default_rng(100 + seed)
    n = 3000
    start = rng.integers(0, 200, n)
    end = np.where(rng.random(n) < 0.33, start, start + rng.integers(0, 40, n))
    ranges = pd.DataFrame({"pid": 1, "tid": rng.integers(0, 3, n), "domain": "default", "kind": "nvtx_push_pop",
                           "start_ns": start, "effective_end_ns": end})
    ranges = ranges.sort_values(["tid", "start_ns", "effective_end_ns"], ascending=[True, True, False],
                                kind="stable").reset_index(drop=True)
    depth, parent, partial = nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth) and partial == want_partial


def test_nesting_of_ranges_spanning_the_whole_int64_range():
    """A range from -2**63 to 2**63 - 1 (a damaged export): the span of the times does not fit an int64, the
    nesting still equals the explicit stack's (its span overflowed to 0 and divided by it)."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    ranges = pd.DataFrame({"pid": 1, "tid": 2, "domain": "default", "kind": "nvtx_push_pop",
                           "start_ns": np.array([lo, 0, 5], dtype=np.int64),
                           "effective_end_ns": np.array([hi, 10, 6], dtype=np.int64)})
    depth, parent, partial = nest_push_pop(ranges)
    want_depth, want_parent, want_partial = _stack_reference(ranges)
    assert np.array_equal(parent, want_parent) and np.array_equal(depth, want_depth) and partial == want_partial
    assert parent.tolist() == [-1, 0, 1]


def test_categorical_columns_outside_the_contract_are_plain_strings_in_the_files(real_nsys_files, tmp_path):
    """QA: ``activity`` (a categorical in memory, not a contract column) went into kernels.parquet as a
    dictionary column, although the files hold plain strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = next(p for p in real_nsys_files if "fuser_test_matmul" in p.name)
    timeline = nsys.read_nsys(path)
    assert isinstance(timeline.kernels["activity"].dtype, pd.CategoricalDtype)
    nsys.write_nsys_timeline(timeline, tmp_path)
    schema = pq.read_schema(tmp_path / "kernels.parquet")
    assert not any(pa.types.is_dictionary(f.type) for f in schema)
    assert pa.types.is_string(schema.field("activity").type) or pa.types.is_large_string(schema.field("activity").type)
    written = pq.read_table(tmp_path / "kernels.parquet").column("activity").to_pylist()
    assert written == timeline.kernels["activity"].astype(str).tolist()


def test_projection_strings_of_categoricals_equal_astype_str():
    """The GPU projection's ``domain``/``kind`` columns: a categorical decoded from its codes gives what
    ``astype("str")`` gives (values, missing values, dtype), also for empty and non-string categories."""
    from operator_profiler.attribution.nvtx import _as_str

    columns = [
        pd.Series(pd.Categorical(["default", "opprof", None, "default"])),
        pd.Series(pd.Categorical([None, None], categories=pd.Index([], dtype=object))),
        pd.Series(pd.Categorical([3, 1, None])),  # numbers: their text as astype gives it ('3.0')
        pd.Series(pd.Categorical(["a", "b"])).iloc[:0],
        pd.Series(["nvtx_push_pop", None], dtype="str"),  # not a categorical: astype itself
    ]
    for column in columns:
        got, want = pd.Series(_as_str(column)), pd.Series(column.astype("str").array)
        pd.testing.assert_series_equal(got, want)


def test_adbc_reads_in_batches_of_arrow_batch_rows(tmp_path, monkeypatch):
    """ADBC queries fetch ``ARROW_BATCH_ROWS`` rows per Arrow batch (not the driver's 1,024): a result of several
    batches comes back whole and equal to sqlite3's. The driver infers each column's type from the first batch: a
    value of another type in a later batch fails the query (sqlite3 reads it instead), where one in the first batch
    would have made the column text (so the option is in force when a change after row 4 fails it)."""
    import sqlite3

    path = tmp_path / "rows.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id INTEGER, start INTEGER, value TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, 10 * i, f"s{i}") for i in range(10)])
    conn.execute("CREATE TABLE odd (id INTEGER, value)")
    conn.executemany("INSERT INTO odd VALUES (?, ?)", [(i, i) for i in range(6)] + [(6, "later text")])
    conn.commit()
    conn.close()
    export = nsys._Export(path)
    try:
        assert export._query_arrow("SELECT id, value FROM odd") is not None  # one batch: the column read as text
        monkeypatch.setattr(nsys, "ARROW_BATCH_ROWS", 4)
        assert export._query_arrow("SELECT id, value FROM odd") is None  # the text in row 7, after batch 1
        fast = export._query_arrow("SELECT id, start, value FROM t")
        assert fast is not None and fast["id"].tolist() == list(range(10))
        plain = pd.DataFrame(export.rows("SELECT id, start, value FROM t"), columns=["id", "start", "value"])
        pd.testing.assert_frame_equal(fast.astype(object), plain.astype(object))
    finally:
        export.close()


def test_gpu_projection_runs_with_the_bulk_allocator_settings(real_nsys_files, monkeypatch):
    """gpu_projection runs under heap.bulk_memory (Arrow on the system allocator, as measured for the reader and
    NVTX attribution), also with its helpers defined beside it."""
    import pyarrow as pa

    from operator_profiler.attribution import nvtx

    seen = []
    real_enclose = nvtx.enclose

    def enclose(*args, **kwargs):
        seen.append(pa.default_memory_pool().backend_name)
        return real_enclose(*args, **kwargs)

    monkeypatch.setattr(nvtx, "enclose", enclose)
    path = next(p for p in real_nsys_files if "fuser_test_matmul" in p.name)
    timeline = nsys.read_nsys(path)
    assert len(nvtx.gpu_projection(timeline.kernels, timeline.ranges))
    assert seen == ["system"]
