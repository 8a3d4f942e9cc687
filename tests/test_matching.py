"""Matching ncu rows to timeline kernels: a scoped alignment that attaches counters only where the input pins them
(docs/field-cases.md C02, C15, C16, C22, C23). Every situation observed in the field is a fixture here, built
as the tools write it (ncu details-page CSV text, timeline kernels tables), with the right pairs or the refusal
asserted; expected pairs are read off the fixture, never from the code."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import real_file, run_opprof

from operator_profiler import stages
from operator_profiler.matching import (
    ORDER_RUNG,
    base_name,
    demangle,
    match_invocations,
    names_agree,
    normalize,
    parse_process_map,
    parse_window_specs,
)
from operator_profiler.matching.align import AMBIGUOUS, PINNED, UNALIGNED, pin
from operator_profiler.ncu.csv_reader import NcuCsvError

DROPOUT = "a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv"
HDR = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
       '"Device","Section Name","Metric Name","Metric Unit","Metric Value"\n')
OLD_HDR = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",'
           '"Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _row(i, name, value, pid=500, device=0, grid="(1, 1, 1)", block="(1, 1, 1)", metric="gpu__time_duration.sum",
         unit="nsecond"):
    return (f'"{i}","{pid}","python","h","{name}","1","7","{block}","{grid}","{device}","Command line profiler metrics",'
            f'"{metric}","{unit}","{value}"\n')


def _old_row(i, name, value, pid=500):
    return (f'"{i}","{pid}","python","h","{name}","2023-May-09 15:12:33","1","7","Command line profiler metrics",'
            f'"gpu__time_duration.sum","nsecond","{value}"\n')


def _csv(tmp_path, rows, name="run.csv", header=HDR):
    path = tmp_path / name
    path.write_text(header + "".join(rows), encoding="utf-8")
    return path


def _ncu(tmp_path, rows, name="run.csv", header=HDR) -> pd.DataFrame:
    csv = _csv(tmp_path, rows, name, header)
    return stages.parse_ncu_files([csv], tmp_path / (name + ".parquet"))


def _kernels(names, **cols) -> pd.DataFrame:
    df = pd.DataFrame({"kernel_id": range(len(names)), "pid": 1, "device": 0, "name": names, "mangled_name": None,
                       "match_key": names, "stream": 7, "grid": "1,1,1", "block": "1,1,1", "launch_tid": 1})
    for c, v in cols.items():
        df[c] = v
    df["occurrence"] = df.groupby(["pid", "match_key"]).cumcount()
    return df


def _pairs(matched) -> list:
    return matched[["kernel_id", "ncu_id"]].values.tolist()


def _durations(matched) -> list:
    """The fixtures give every row a distinct duration (ns), so a wrong attachment shows."""
    return [round(v * 1e9) for v in matched["gpu__time_duration.sum"]]


# ------------------------------------------------------------------------------------------- alignment


def test_pin_keeps_only_pairs_every_optimal_alignment_contains():
    assert pin([0, 1, 0], [0, 1, 0]).n_to_t.tolist() == [0, 1, 2]  # identical
    a = pin([5, 0, 6, 0, 7, 0], [5, 0, 6, 7, 0])  # one launch of 0 filtered out, between distinct neighbours
    assert a.n_to_t.tolist() == [0, 1, 2, 4, 5] and a.t_state.tolist() == [2, 2, 2, 0, 2, 2]
    a = pin([0, 0, 0], [0, 0])  # which two of three? unknowable
    assert a.n_to_t.tolist() == [-1, -1] and a.n_state.tolist() == [AMBIGUOUS] * 2
    a = pin([1, 2], [2, 1])  # swapped: either could be the one the runs share
    assert a.n_to_t.tolist() == [-1, -1] and a.lcs == 1
    a = pin([1, 2, 3], [1, 9, 3])  # 9 is nowhere in the timeline
    assert a.n_to_t.tolist() == [0, -1, 2] and a.n_state.tolist() == [PINNED, UNALIGNED, PINNED]


def test_pin_agrees_with_brute_force_on_random_sequences():
    """Exhaustive check of both methods (embedding and bit-parallel LCS) against enumerating every optimal
    alignment of small random sequences."""
    from functools import lru_cache

    import operator_profiler.matching.align as align

    rng = np.random.default_rng(7)
    for _ in range(400):
        t = rng.integers(0, 3, rng.integers(0, 8)).tolist()
        n = rng.integers(0, 3, rng.integers(0, 8)).tolist()

        @lru_cache(None)
        def best(i, j):
            if i == len(t) or j == len(n):
                return 0
            return max(best(i + 1, j), best(i, j + 1), (1 + best(i + 1, j + 1)) if t[i] == n[j] else 0)

        alignments = []

        def walk(i, j, acc):
            if best(i, j) == 0:
                alignments.append(frozenset(acc))
                return
            if t[i] == n[j] and 1 + best(i + 1, j + 1) == best(i, j):
                walk(i + 1, j + 1, acc + [(i, j)])
            if best(i + 1, j) == best(i, j):
                walk(i + 1, j, acc)
            if best(i, j + 1) == best(i, j):
                walk(i, j + 1, acc)

        walk(0, 0, [])
        expected = frozenset.intersection(*alignments)
        for general in (False, True):
            embed = align.embed
            if general:
                align.embed = lambda *a, **k: None
            try:
                got = pin(t, n)
            finally:
                align.embed = embed
            assert {(int(i), j) for j, i in enumerate(got.n_to_t) if i >= 0} == expected, (t, n, general)
            assert got.lcs == best(0, 0)


# ------------------------------------------------------------------------------------------------ names


def test_name_ladder_forms():
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
    cufilt = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
              "at::detail::Array<char *, (int)1>>(int, T2, T3)")  # nsys 2024 / ncu 2021 style
    libstdcxx = demangle(mangled)
    assert libstdcxx.startswith("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                                "at::detail::Array<char*, 1> >(int")
    assert normalize(cufilt) == normalize(libstdcxx) == \
        "at::native::vectorized_elementwise_kernel<4,at::native::FillFunctor<float>,at::detail::Array<char*,1>>"
    assert normalize("k<(unsigned long)3, (bool)1>(x)") == normalize("void k<3ul, true>(y)") == "k<3,1>"
    assert normalize("k<float, (bool)0>") == normalize("k<float, false>") == normalize("k<float, 0>")
    assert normalize("f<at::Foo<const c10::Scalar &>>") == normalize("f<at::Foo<c10::Scalar const&> >")
    assert normalize("at::native::(anonymous namespace)::f<int>") == normalize("at::native::<unnamed>::f<int>")
    assert base_name(mangled) == base_name(cufilt) == "vectorized_elementwise_kernel"
    assert names_agree(cufilt, mangled, mangled) == "mangled"
    assert names_agree(cufilt, None, mangled) == "normalized"
    assert names_agree(cufilt, None, "vectorized_elementwise_kernel") == "function"
    assert names_agree(cufilt, mangled, "_ZN2at6native29vectorized_elementwise_kernelILi2EEEvi") is None


def test_names_printed_as_function_bases_match_where_unique(tmp_path):
    """--print-kernel-base function (docs/formats.md#ncu-kernel-names): `gemm_kernel` is one timeline kernel, so
    its rows resolve on the `function` rung; `elementwise` stands for two instantiations, whose four rows against
    their four launches pair in order (the only order-preserving pairing: ORDER_RUNG)."""
    k = ["void gemm_kernel<128>(float*)", "void ns::elementwise<1>(int)", "void ns::elementwise<2>(int)"]
    kernels = _kernels(k * 2)
    ncu = _ncu(tmp_path, [_row(i, n, 100 + i) for i, n in
                          enumerate(["gemm_kernel", "elementwise", "elementwise"] * 2)])
    matched, diag = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4], [5, 5]]
    assert _durations(matched) == [100, 101, 102, 103, 104, 105]
    assert matched["name_rung"].tolist() == ["function", ORDER_RUNG, ORDER_RUNG] * 2
    assert diag["name_rungs"] == {"function": 2, ORDER_RUNG: 4}
    assert diag["ncu_only_reasons"] == {} and diag["counters"]["refused"] == 0
    assert diag["per_key"]["void ns::elementwise<1>(int)"]["ncu"] == 2  # each row counts toward the kernel it got
    assert diag["per_key"]["void ns::elementwise<2>(int)"]["matched"] == 2


def test_three_rows_of_one_base_name_pair_with_three_launches_in_order(tmp_path):
    """Three rows `k` (--print-kernel-base function, docs/formats.md#ncu-kernel-names) against
    three launches of three instantiations of `k`, with other kernels between them: the rows pair with the
    launches in order (equal counts, one scope), and each kernel gets its own row's duration."""
    names = ["void ns::k<1>(float*)", "void other_a(int)", "void ns::k<2>(float*)", "void other_b(int)",
             "void ns::k<4>(float*)"]
    ncu = _ncu(tmp_path, [_row(i, n, 10 * (i + 1)) for i, n in enumerate(["k", "other_a", "k", "other_b", "k"])])
    matched, diag = match_invocations(_kernels(names), ncu)
    assert _pairs(matched) == [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4]]
    assert _durations(matched) == [10, 20, 30, 40, 50]
    assert matched["name_rung"].tolist() == [ORDER_RUNG, "normalized", ORDER_RUNG, "normalized", ORDER_RUNG]


def test_a_base_name_with_fewer_rows_than_launches_is_refused(tmp_path):
    """Three rows `elementwise` against four launches of its two instantiations: which launch ncu did not profile
    is open, so no row of the name is placed and the four launches are refused (`name_ambiguous`); the unique
    name still pairs."""
    k = ["void gemm_kernel<128>(float*)", "void ns::elementwise<1>(int)", "void ns::elementwise<2>(int)"]
    ncu = _ncu(tmp_path, [_row(i, n, 100 + i) for i, n in
                          enumerate(["gemm_kernel", "elementwise", "elementwise", "gemm_kernel", "elementwise"])])
    matched, diag = match_invocations(_kernels(k * 2), ncu)
    assert _pairs(matched) == [[0, 0], [3, 3]] and _durations(matched) == [100, 103]
    assert set(matched["name_rung"]) == {"function"}
    assert diag["ncu_only_reasons"] == {"name_ambiguous": 3}
    assert diag["counters"]["refused_reasons"] == {"name_ambiguous": 4}
    assert [k["kernel_id"] for k in diag["timeline_only_kernels"]] == [1, 2, 4, 5]


def test_a_base_name_whose_rows_swap_the_instantiations_configurations_is_refused(tmp_path):
    """Equal counts are not enough: the launch configurations (docs/formats.md#ncu-csv: Grid Size, Block Size)
    of the two instantiations must read in the rows' order; rows whose configurations come in another order
    cannot all pin, so none of the name's rows is attached."""
    names = ["void ns::k<1>(float*)", "void ns::k<2>(float*)"]
    kernels = _kernels(names, grid=["1,1,1", "2,1,1"])
    ncu = _ncu(tmp_path, [_row(0, "k", 5, grid="(2, 1, 1)"), _row(1, "k", 6, grid="(1, 1, 1)")])
    matched, diag = match_invocations(kernels, ncu)
    assert matched.empty
    assert diag["ncu_only_reasons"] == {"name_ambiguous": 2}
    assert diag["counters"]["refused_reasons"] == {"name_ambiguous": 2}
    # in the launches' order they pair, the configuration agreeing on each
    ncu = _ncu(tmp_path, [_row(0, "k", 5, grid="(1, 1, 1)"), _row(1, "k", 6, grid="(2, 1, 1)")], name="ok.csv")
    matched, _ = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[0, 0], [1, 1]] and _durations(matched) == [5, 6]


def test_a_base_name_in_a_declared_launch_window_pairs_in_order(tmp_path):
    """--launch-skip 2 --launch-count 3 over k<1>, k<2>, k<1>, k<2>, k<1>: the file's three rows `k` are the
    window's three launches (kernel ids 2, 3, 4)."""
    names = ["void ns::k<1>(int)", "void ns::k<2>(int)"] * 2 + ["void ns::k<1>(int)"]
    ncu = _ncu(tmp_path, [_row(i, "k", 7 + i) for i in range(3)])
    matched, diag = match_invocations(_kernels(names), ncu, window={"launch_skip": 2, "launch_count": 3})
    assert _pairs(matched) == [[2, 0], [3, 1], [4, 2]] and _durations(matched) == [7, 8, 9]
    assert set(matched["name_rung"]) == {ORDER_RUNG}


def test_a_base_name_beside_a_row_naming_one_of_its_kernels_is_refused(tmp_path):
    """A file that names `k<2>` in full once and `k` bare twice (two exports merged): the bare rows could be
    any of the three launches the full row does not take, in a file that is not one naming scheme; refused."""
    names = ["void ns::k<1>(int)", "void ns::k<2>(int)", "void ns::k<1>(int)"]
    ncu = _ncu(tmp_path, [_row(0, "k", 1), _row(1, "ns::k<2>", 2), _row(2, "k", 3)])
    matched, diag = match_invocations(_kernels(names), ncu)
    assert _pairs(matched) == [[1, 1]] and matched["name_rung"].tolist() == ["normalized"]
    assert diag["ncu_only_reasons"] == {"name_ambiguous": 2}


def test_names_from_another_demangler_match_on_the_normalized_rung(tmp_path):
    timeline = ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)",
                "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)"]
    printed = ["at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float> >(int, T2)",
               "void at::native::reduce_kernel<(int)512, (int)1>(at::native::ReduceOp<float>)"]
    matched, diag = match_invocations(_kernels(timeline), _ncu(tmp_path, [_row(0, printed[0], 7), _row(1, printed[1], 8)]))
    assert _pairs(matched) == [[0, 0], [1, 1]] and matched["name_rung"].tolist() == ["normalized", "normalized"]
    assert diag["name_rungs"] == {"normalized": 2}


def test_mangled_ncu_names_match_a_demangled_timeline_through_the_demangler(tmp_path):
    """Our own replays print mangled names; a torch.profiler timeline only has demangled ones (CUPTI's style)."""
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
    other = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIdEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
    timeline = ["void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
                "at::detail::Array<char *, (int)1>>(int, T2, T3)",
                "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<double>, "
                "at::detail::Array<char *, (int)1>>(int, T2, T3)"]
    matched, _ = match_invocations(_kernels(timeline * 2), _ncu(tmp_path, [_row(i, n, i) for i, n in
                                                                           enumerate([mangled, other] * 2)]))
    assert _pairs(matched) == [[0, 0], [1, 1], [2, 2], [3, 3]] and set(matched["name_rung"]) == {"normalized"}


# ----------------------------------------------------------------------------------- missing launches


def test_one_launch_fewer_in_ncu_is_refused_not_prefix_aligned(tmp_path):
    """Observed: 3 timeline launches, 2 ncu rows -> the first two got the rows, status ok. Which launch is
    missing cannot be told from three identical launches."""
    kernels = _kernels(["gemm"] * 3)
    ncu = _ncu(tmp_path, [_row(0, "gemm", 10), _row(1, "gemm", 11)])
    matched, diag = match_invocations(kernels, ncu)
    assert matched.empty
    assert diag["counters"]["refused"] == 3 and diag["ncu_only_reasons"] == {"unplaced_window": 2}
    # declared: launches 0-2, three launches, but two rows: the declaration is not what ncu ran, nothing attached
    matched, diag = match_invocations(kernels, ncu, {"launch_skip": 0, "launch_count": 3})
    assert matched.empty and diag["per_key"]["gemm"]["status"] == "window_mismatch"
    assert diag["counters"]["refused_keys"] == [{"key": "gemm", "name": "gemm", "reason": "window_mismatch",
                                                 "refused": 3, "timeline": 3, "ncu": 2}]
    assert any("not the launches of its declared window" in h for h in diag["hints"])


def test_a_filtered_launch_between_distinct_neighbours_is_placed(tmp_path):
    kernels = _kernels(["a", "g", "b", "g", "c", "g"])
    ncu = _ncu(tmp_path, [_row(i, n, 100 + i) for i, n in enumerate(["a", "g", "b", "c", "g"])])
    matched, diag = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[0, 0], [1, 1], [2, 2], [4, 3], [5, 4]] and _durations(matched) == [100, 101, 102,
                                                                                                   103, 104]
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [(3, "not_in_ncu")]
    assert diag["counters"]["refused"] == 0 and diag["per_key"]["g"]["status"] == "ok"


def test_an_extra_helper_kernel_on_the_ncu_side(tmp_path):
    kernels = _kernels(["a", "g", "b"])
    matched, diag = match_invocations(kernels, _ncu(tmp_path, [_row(0, "a", 1), _row(1, "helper", 2),
                                                                _row(2, "g", 3), _row(3, "b", 4)]))
    assert _pairs(matched) == [[0, 0], [1, 2], [2, 3]]
    assert diag["ncu_only_rows"] == [{"ncu_id": 1, "source": str(tmp_path / "run.csv"), "name": "helper",
                                      "reason": "name_unmatched"}]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, [_row(0, "a", 1), _row(1, "g", 2), _row(2, "g", 3),
                                                                _row(3, "b", 4)], name="twice.csv"))
    assert _pairs(matched) == [[0, 0], [2, 3]]  # one of the two g rows is extra: neither is attached
    assert diag["ncu_only_reasons"] == {"count_mismatch": 2}
    assert diag["counters"]["refused_keys"] == [{"key": "g", "name": "g", "reason": "count_mismatch", "refused": 1,
                                                 "timeline": 1, "ncu": 2}]


# ----------------------------------------------------------------------------------------- windows


def test_launch_skip_without_a_window_is_refused_and_with_it_is_exact(tmp_path):
    """Observed: `ncu --launch-skip 3 --launch-count 3` imported without a window gave launches 0-2 the counters
    of launches 3-5."""
    kernels = _kernels(["gemm"] * 6)
    csv = _csv(tmp_path, [_row(0, "gemm", 13), _row(1, "gemm", 14), _row(2, "gemm", 15)])
    ncu = stages.parse_ncu_files([csv], tmp_path / "ncu.parquet")
    matched, diag = match_invocations(kernels, ncu)
    assert matched.empty and diag["ncu_only_reasons"] == {"unplaced_window": 3}
    assert diag["per_key"]["gemm"]["status"] == "unplaced_window" and diag["counters"]["refused"] == 6
    assert any(h.startswith(f"1 ncu file(s) ({csv})") and "--window NAME=SKIP:COUNT" in h for h in diag["hints"])
    matched, diag = match_invocations(kernels, ncu, parse_window_specs(["run=3:3"]))
    assert _pairs(matched) == [[3, 0], [4, 1], [5, 2]] and _durations(matched) == [13, 14, 15]
    assert diag["counters"] == {**diag["counters"], "with_counters": 3, "refused": 0, "not_measured": 3}


def test_launch_window_counted_over_one_kernel_like_ncu_k(tmp_path):
    kernels = _kernels(["other", "gemm", "other", "gemm", "gemm"])
    ncu = _ncu(tmp_path, [_row(0, "gemm", 7)])
    matched, _ = match_invocations(kernels, ncu, parse_window_specs(["run.csv=1:1:gemm"]))
    assert _pairs(matched) == [[3, 0]]


def test_two_segment_files_are_placed_by_content_not_argument_order(tmp_path):
    """Observed: two ncu CSVs of one program, passed in glob order, matched in argument order, each restarting at
    ID 0. Here the second segment is passed first."""
    kernels = _kernels(["a", "b", "c", "d", "e", "f"])
    late = _csv(tmp_path, [_row(0, "d", 3), _row(1, "e", 4), _row(2, "f", 5)], "seg_b.csv")
    early = _csv(tmp_path, [_row(0, "a", 0), _row(1, "b", 1), _row(2, "c", 2)], "seg_a.csv")
    ncu = stages.parse_ncu_files([late, early], tmp_path / "ncu.parquet")
    matched, diag = match_invocations(kernels, ncu)
    assert matched["kernel_id"].tolist() == list(range(6)) and _durations(matched) == list(range(6))
    # A periodic program: each segment fits either repetition, so neither is attached ...
    kernels = _kernels(["a", "b", "c"] * 2)
    late = _csv(tmp_path, [_row(0, "a", 3), _row(1, "b", 4), _row(2, "c", 5)], "seg_b.csv")
    early = _csv(tmp_path, [_row(0, "a", 0), _row(1, "b", 1), _row(2, "c", 2)], "seg_a.csv")
    ncu = stages.parse_ncu_files([late, early], tmp_path / "ncu.parquet")
    matched, diag = match_invocations(kernels, ncu)
    assert matched.empty and diag["ncu_only_reasons"] == {"unplaced_window": 6}
    # ... even when the user says they are runs of consecutive launches; the recorded windows place them.
    matched, diag = match_invocations(kernels, ncu, parse_window_specs(["seg_a=contiguous", "seg_b=contiguous"]))
    assert matched.empty
    matched, diag = match_invocations(kernels, ncu, parse_window_specs(["seg_a.csv=0:3", "seg_b.csv=3:3"]))
    assert matched["kernel_id"].tolist() == list(range(6)) and _durations(matched) == list(range(6))


def test_a_run_with_another_input_attaches_nothing_even_with_a_blank_configuration(tmp_path):
    """Found by a new user: a run of the same program with another input (every grid doubled) attached nothing,
    until one row's Grid/Block Size was blank: then the configuration check was off for the whole file and every
    row attached. Configurations are compared wherever both sides have them; the blank row pairs with nothing."""
    names = ["a", "b", "c", "d"]
    kernels = _kernels(names, grid="8,1,1")
    rows = [_row(i, n, i, grid="(16, 1, 1)") for i, n in enumerate(names)]
    rows[2] = rows[2].replace('"(16, 1, 1)"', '""')
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows))
    assert matched.empty
    # no row of a, b, d pairs: not autotuning candidates beside a real launch (QA round 4, A2)
    assert diag["ncu_only_reasons"] == {"launch_config_not_in_timeline": 3, "launch_config_unknown": 1}
    assert any("other input shapes" in h for h in diag["hints"])
    same = [_row(i, n, i, grid="(8, 1, 1)") for i, n in enumerate(names)]
    same[2] = same[2].replace('"(8, 1, 1)"', '""')
    matched, diag = match_invocations(kernels, _ncu(tmp_path, same, "same.csv"))
    assert _pairs(matched) == [[0, 0], [1, 1], [3, 3]] and diag["ncu_only_reasons"] == {"launch_config_unknown": 1}
    assert diag["counters"]["refused_reasons"] == {"launch_config_unknown": 1}  # kernel c: the blank row may be it


def test_two_files_that_pin_the_same_kernel_attach_neither_and_names_must_be_unique(tmp_path):
    """Found by a new user: `--window prof=0:30` with run1/prof.csv and run2/prof.csv applied to both, and the file
    given first won the kernels both pinned. A window name that fits two files, or two names for one file, is
    an error; a kernel two files pin gets neither's counters (refused, both rows listed)."""
    from operator_profiler.matching.windows import check_window

    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    kernels = _kernels(["a", "b", "c", "d"])
    first = _csv(tmp_path / "run1", [_row(0, "a", 1), _row(1, "b", 2), _row(2, "c", 3)], "prof.csv")
    second = _csv(tmp_path / "run2", [_row(0, "b", 20), _row(1, "c", 30), _row(2, "d", 40)], "prof.csv")
    ncu = stages.parse_ncu_files([second, first], tmp_path / "ncu.parquet")
    with pytest.raises(ValueError, match="fits 2 ncu files"):
        check_window({"sources": {"prof": {"launch_skip": 0, "launch_count": 3}}}, [str(second), str(first)])
    with pytest.raises(ValueError, match="has 2 windows"):
        check_window({"sources": {str(first): {"contiguous": True}, "run1/prof.csv": {"contiguous": True}}},
                     [str(first)])
    matched, diag = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[0, 0], [3, 2]] and _durations(matched) == [1, 40]
    assert diag["counters"]["refused_reasons"] == {"measured_twice": 2}  # b and c: measured by both files
    assert sorted((r["source"][-13:], r["ncu_id"]) for r in diag["ncu_only_rows"]) == [
        ("run1/prof.csv", 1), ("run1/prof.csv", 2), ("run2/prof.csv", 0), ("run2/prof.csv", 1)]


def test_contiguous_window_is_placed_where_it_occurs_once(tmp_path):
    """A subsequence fits many places in a long program; a run of consecutive launches fits where it occurs."""
    kernels = _kernels(["a", "b", "a", "c", "a", "b", "d"])
    ncu = _ncu(tmp_path, [_row(0, "a", 4), _row(1, "b", 5)])
    matched, diag = match_invocations(kernels, ncu)  # a, b: kernels (0, 1), (0, 5), (2, 5) or (4, 5)
    assert matched.empty and diag["ncu_only_reasons"] == {"unplaced_window": 2}
    matched, diag = match_invocations(kernels, ncu, {"contiguous": True})  # "a b" runs at 0-1 and at 4-5
    assert matched.empty and diag["ncu_only_reasons"] == {"unplaced_window": 2}
    assert diag["counters"]["refused_reasons"] == {"unplaced_window": 4}  # kernels 0, 1, 4, 5


def test_a_declared_window_that_is_not_what_ncu_ran_attaches_nothing(tmp_path):
    """ncu profiled launches 10-19 (its --launch-skip counted from the program's start, the timeline starting
    later); the user declares 0:10. Some rows would align by chance inside 0-9: a wrong window must not attach
    them. A contiguous claim whose rows occur nowhere as a run is refused the same way."""
    names = [f"k{i % 7}" for i in range(30)]
    kernels = _kernels(names)
    ncu = _ncu(tmp_path, [_row(j, names[10 + j], 10 + j) for j in range(10)])
    matched, diag = match_invocations(kernels, ncu, {"launch_skip": 0, "launch_count": 10})
    assert matched.empty and diag["ncu_only_reasons"] == {"window_mismatch": 10}
    assert diag["counters"]["refused_reasons"] == {"window_mismatch": 10}
    matched, _ = match_invocations(kernels, ncu, {"launch_skip": 10, "launch_count": 10})
    assert _pairs(matched) == [[10 + j, j] for j in range(10)] and _durations(matched) == list(range(10, 20))
    shuffled = _ncu(tmp_path, [_row(j, n, j) for j, n in enumerate(["k1", "k0", "k2"])], "shuffled.csv")
    matched, diag = match_invocations(kernels, shuffled, {"contiguous": True})
    assert matched.empty and diag["ncu_only_reasons"] == {"window_mismatch": 3}


def test_an_ncu_file_of_another_program_attaches_nothing(tmp_path):
    """Found on real data: the A100 BERT ncu CSV against an H100 BERT trace. Most of its names are kernels the
    timeline never ran; one reduce_kernel<128, 4> would have paired with the trace's only reduce_kernel<512, 1> by
    function name. A templated name that differs is another kernel, and a file whose names are mostly foreign is
    not placed at all."""
    kernels = _kernels(["void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<bool>)", "gemm_x", "gemm_y"])
    rows = [_row(0, "void at::native::reduce_kernel<(int)128, (int)4>(at::native::ReduceOp<float>)", 1),
            _row(1, "gemm_x", 2), _row(2, "sgemm_a", 3), _row(3, "sgemm_b", 4), _row(4, "softmax_c", 5)]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows))
    assert matched.empty and diag["ncu_only_reasons"] == {"file_does_not_fit": 5}
    assert any("4 of its 5 rows name kernels the timeline process never launched" in h for h in diag["hints"])
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows[:2], "two.csv"))  # one foreign name of two
    assert _pairs(matched) == [[1, 1]] and diag["ncu_only_reasons"] == {"name_unmatched": 1}


def test_contiguous_window_unique_run(tmp_path):
    kernels = _kernels(["a", "b", "a", "c", "a", "d"])
    ncu = _ncu(tmp_path, [_row(0, "a", 4), _row(1, "c", 5)])
    matched, _ = match_invocations(kernels, ncu, {"contiguous": True})
    assert _pairs(matched) == [[2, 0], [3, 1]]


# -------------------------------------------------------------------------------- processes and devices


def _two_ranks():
    k = _kernels(["gemm", "relu", "gemm", "relu"], pid=[100, 100, 200, 200], device=[0, 0, 1, 1],
                 launch_tid=[100, 100, 200, 200])
    return k


def test_two_ranks_in_one_ncu_file_are_refused_unless_mapped_never_across_processes(tmp_path):
    """Observed: `--target-processes all`, two ranks: rank 0's kernel got rank 1's counters. ncu's Process ID
    values (7, 8) are not the timeline's, and device ordinals do not tell processes apart (each process numbers
    the GPUs it sees: under CUDA_VISIBLE_DEVICES rank 1's only GPU is its device 0). Two ranks running the same
    program fit each other: refused until the user names the pairs."""
    rows = [_row(0, "gemm", 80, pid=8, device=1), _row(1, "gemm", 70, pid=7, device=0),
            _row(2, "relu", 81, pid=8, device=1), _row(3, "relu", 71, pid=7, device=0)]
    matched, diag = match_invocations(_two_ranks(), _ncu(tmp_path, rows))
    assert matched.empty and diag["ncu_only_reasons"] == {"process_ambiguous": 4}
    assert diag["counters"]["refused_reasons"] == {"process_ambiguous": 4}
    matched, diag = match_invocations(_two_ranks(), _ncu(tmp_path, rows, "m.csv"), process_map={7: 100, 8: 200})
    assert _pairs(matched) == [[0, 1], [1, 3], [2, 0], [3, 2]] and _durations(matched) == [70, 71, 80, 81]
    assert sorted((s["ncu_pid"], s["timeline_pid"], s["mapped_by"]) for s in diag["scopes"]) == [
        (7, 100, "process_map"), (8, 200, "process_map")]
    # rank 1 alone, profiled under CUDA_VISIBLE_DEVICES=1 (its Device column says 0): never rank 0's by ordinal
    alone = [_row(0, "gemm", 80, pid=8, device=0), _row(1, "relu", 81, pid=8, device=0)]
    matched, diag = match_invocations(_two_ranks(), _ncu(tmp_path, alone, "alone.csv"))
    assert matched.empty and diag["ncu_only_reasons"] == {"process_ambiguous": 2}


def test_two_ranks_without_device_column_are_refused_unless_mapped(tmp_path):
    rows = [_old_row(0, "gemm", 80, pid=8), _old_row(1, "gemm", 70, pid=7), _old_row(2, "relu", 81, pid=8),
            _old_row(3, "relu", 71, pid=7)]
    ncu = _ncu(tmp_path, rows, header=OLD_HDR)
    kernels = _two_ranks().assign(grid=None, block=None)
    matched, diag = match_invocations(kernels, ncu)
    assert matched.empty and diag["ncu_only_reasons"] == {"process_ambiguous": 4}
    assert diag["counters"]["refused_reasons"] == {"process_ambiguous": 4}
    assert any("--process-map" in h for h in diag["hints"])
    matched, diag = match_invocations(kernels, ncu, process_map=parse_process_map(["7=100", "8=200"]))
    assert _pairs(matched) == [[0, 1], [1, 3], [2, 0], [3, 2]] and _durations(matched) == [70, 71, 80, 81]


def test_ranks_with_different_programs_are_told_apart_by_launch_sequence(tmp_path):
    kernels = _kernels(["gemm", "relu", "log", "gemm", "relu"], pid=[100, 100, 100, 200, 200])
    rows = [_old_row(0, "gemm", 1, pid=9), _old_row(1, "relu", 2, pid=9), _old_row(2, "log", 3, pid=9)]
    matched, diag = match_invocations(kernels.assign(grid=None, block=None), _ncu(tmp_path, rows, header=OLD_HDR))
    assert _pairs(matched) == [[0, 0], [1, 1], [2, 2]] and diag["scopes"][0]["mapped_by"] == "launch_sequence"


def test_data_parallel_two_devices_in_one_process_pair_per_device(tmp_path):
    """Observed: nn.DataParallel, one process driving two GPUs: ncu's Device column was dropped and counters
    crossed devices. The replicas' launches interleave differently in the two runs."""
    kernels = _kernels(["gemm", "gemm", "relu", "relu"], device=[0, 1, 0, 1], launch_tid=[11, 12, 11, 12])
    rows = [_row(0, "gemm", 10, device=1), _row(1, "gemm", 0, device=0), _row(2, "relu", 1, device=0),
            _row(3, "relu", 11, device=1)]
    matched, _ = match_invocations(kernels, _ncu(tmp_path, rows))
    assert _pairs(matched) == [[0, 1], [1, 0], [2, 2], [3, 3]] and _durations(matched) == [0, 10, 1, 11]
    matched, diag = match_invocations(kernels.assign(grid=None, block=None), _ncu(
        tmp_path, [_old_row(i, n, i) for i, n in enumerate(["gemm", "gemm", "relu", "relu"])], "old.csv", OLD_HDR))
    assert matched.empty and diag["ncu_only_reasons"] == {"device_unknown": 4}


# ------------------------------------------------------------------------------------------- CUDA graphs


def _graph_replay(configs, streams):
    """One cudaGraphLaunch (correlation 50) replaying node kernels `node` on the given streams, between two
    ordinary launches."""
    n = len(configs)
    names = ["pre"] + ["node"] * n + ["post"]
    return _kernels(names, stream=[7] + streams + [7], grid=["1,1,1"] + [g for g, _ in configs] + ["1,1,1"],
                    block=["1,1,1"] + [b for _, b in configs] + ["1,1,1"],
                    launch_api=["cudaLaunchKernel"] + ["cudaGraphLaunch"] * n + ["cudaLaunchKernel"],
                    correlation_id=[1] + [50] * n + [2])


def test_graph_nodes_that_run_in_another_order_pair_by_launch_configuration(tmp_path):
    """Observed: with different configurations the key was declared diverged and neither got counters."""
    kernels = _graph_replay([("64,1,1", "128,1,1"), ("32,1,1", "256,1,1")], [20, 21])
    rows = [_row(0, "pre", 1), _row(1, "node", 3, grid="(32, 1, 1)", block="(256, 1, 1)"),
            _row(2, "node", 2, grid="(64, 1, 1)", block="(128, 1, 1)"), _row(3, "post", 4)]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows))
    assert _pairs(matched) == [[0, 0], [1, 2], [2, 1], [3, 3]] and _durations(matched) == [1, 2, 3, 4]


def test_identical_graph_nodes_on_several_streams_are_refused(tmp_path):
    """Observed: same name and configuration, different order in the two runs: paired `ok` (wrongly). Which
    node ran first cannot be told; on one stream (a dependency chain) the order holds."""
    same = [("8,1,1", "128,1,1")] * 2
    rows = [_row(0, "pre", 1), _row(1, "node", 2, grid="(8, 1, 1)", block="(128, 1, 1)"),
            _row(2, "node", 3, grid="(8, 1, 1)", block="(128, 1, 1)"), _row(3, "post", 4)]
    matched, diag = match_invocations(_graph_replay(same, [20, 21]), _ncu(tmp_path, rows))
    assert _pairs(matched) == [[0, 0], [3, 3]]
    assert diag["counters"]["refused_reasons"] == {"order_ambiguous": 2}
    matched, diag = match_invocations(_graph_replay(same, [20, 20]), _ncu(tmp_path, rows, "chain.csv"))
    assert _pairs(matched) == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_interleaving_threads_do_not_pair_same_named_launches(tmp_path):
    """Two threads launching at once (their launch calls overlap): their order differs from run to run. A kernel
    both threads launch is refused around the overlap; distinct kernels still pair by name."""
    names = ["x1", "s", "y1", "s", "x2", "y2"]
    launch = {"launch_start_ns": [0, 100, 105, 200, 300, 400], "launch_end_ns": [10, 110, 115, 210, 310, 410]}
    kernels = _kernels(names, launch_tid=[1, 1, 2, 2, 1, 2], **launch)  # calls 1 and 2 overlap (100-110, 105-115)
    rows = [_row(i, n, i) for i, n in enumerate(["x1", "s", "s", "y1", "x2", "y2"])]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows))
    assert dict(_pairs(matched)) == {0: 0, 2: 3, 4: 4, 5: 5}
    assert diag["counters"]["refused_reasons"] == {"order_ambiguous": 2}
    # the same launches one after the other, one hand-over there and back (X, Y, X): the order is the program's
    kernels = _kernels(names[:5], launch_tid=[1, 1, 2, 2, 1], launch_start_ns=[0, 100, 120, 200, 300],
                       launch_end_ns=[10, 110, 130, 210, 310])
    rows = [_row(i, n, i) for i, n in enumerate(names[:5])]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows, "handover.csv"))
    assert _pairs(matched) == [[i, i] for i in range(5)]
    # two hand-overs each way (X, Y, X, Y) without iteration ranges: threads taking turns on their own look the
    # same, so the kernel both launch is refused (DESIGN.md §3, bags); the others pair
    kernels = _kernels(names, launch_tid=[1, 1, 2, 2, 1, 2], launch_start_ns=[0, 100, 120, 200, 300, 400],
                       launch_end_ns=[10, 110, 130, 210, 310, 410])
    rows = [_row(i, n, i) for i, n in enumerate(names)]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows, "alternation.csv"))
    assert _pairs(matched) == [[0, 0], [2, 2], [4, 4], [5, 5]]
    assert diag["counters"]["refused_reasons"] == {"order_ambiguous": 2}


def test_a_launch_inside_another_threads_op_is_concurrent(tmp_path):
    """Thread 2 launches `s` while thread 1 is inside aten::mm: the two threads ran at once, so their `s` launches
    can come in either order in the ncu run."""
    names = ["s", "s"]
    kernels = _kernels(names, launch_tid=[1, 2], launch_start_ns=[100, 150], launch_end_ns=[110, 160])
    ranges = pd.DataFrame({"range_id": [0], "pid": [1], "tid": [1], "name": ["aten::mm"], "start_ns": [90],
                           "end_ns": [400]})
    rows = [_row(0, "s", 0), _row(1, "s", 1)]
    matched, diag = match_invocations(kernels, _ncu(tmp_path, rows), ranges=ranges)
    assert matched.empty and diag["counters"]["refused_reasons"] == {"order_ambiguous": 2}
    assert _pairs(match_invocations(kernels, _ncu(tmp_path, rows, "b.csv"))[0]) == [[0, 0], [1, 1]]  # no ranges


def test_one_hand_over_between_threads_is_ordered(tmp_path):
    """Forward on the main thread, backward on the autograd thread, optimizer on the main thread again."""
    names = ["add", "mm", "mm_bwd", "add", "adam", "add"]
    kernels = _kernels(names, launch_tid=[1, 1, 2, 2, 1, 1])
    matched, diag = match_invocations(kernels, _ncu(tmp_path, [_row(i, n, i) for i, n in enumerate(names)]))
    assert _pairs(matched) == [[i, i] for i in range(6)] and diag["counters"]["refused"] == 0


# ----------------------------------------------------------------------------------------------- C02


def test_c02_nvtx_filter_drops_backward_kernels(tmp_path):
    kernels = _kernels(["fwd_kernel", "bwd_kernel", "fwd_kernel", "bwd_kernel"], launch_tid=[1, 2, 1, 2])
    ncu = _ncu(tmp_path, [_row(0, "fwd_kernel", 10, metric="Duration", unit="usecond"),
                          _row(1, "fwd_kernel", 11, metric="Duration", unit="usecond")])
    matched, diag = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[0, 0], [2, 1]]
    assert matched["Duration"].tolist() == pytest.approx([10e-6, 11e-6])
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [
        (1, "launched_on_other_thread"), (3, "launched_on_other_thread")]
    assert diag["coverage_by_name"] == {"bwd_kernel": "0/2", "fwd_kernel": "2/2"}
    assert any("--nvtx-include" in h for h in diag["hints"])


def test_c02_fixture_b_no_kernels_profiled_is_an_error(tmp_path):
    csv = tmp_path / "run.csv"
    csv.write_text("==PROF== Connected to process 42 (/usr/bin/python3)\n==PROF== Disconnected from process 42\n"
                   "==WARNING== No kernels were profiled.\n")
    with pytest.raises(NcuCsvError):
        stages.parse_ncu_files([csv], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


# ----------------------------------------------------------------------------------------------- C15


def _c15(tmp_path, configs):
    rows = [_row(i, "triton_mm_0", 100 + i, grid=g, block=b) for i, (g, b) in enumerate(configs)]
    kernels = _kernels(["other", "triton_mm_0", "triton_mm_0"], grid="128,1,1", block="128,1,1")
    return match_invocations(kernels, _ncu(tmp_path, rows))


def test_c15_autotune_surplus_disambiguated_by_launch_configuration(tmp_path):
    configs = [("(64, 1, 1)", "(256, 1, 1)"), ("(256, 1, 1)", "(64, 1, 1)"), ("(128, 1, 1)", "(256, 1, 1)"),
               ("(32, 1, 1)", "(128, 1, 1)"), ("(128, 1, 1)", "(128, 1, 1)"), ("(128, 1, 1)", "(128, 1, 1)")]
    matched, diag = _c15(tmp_path, configs)
    assert _pairs(matched) == [[1, 4], [2, 5]] and _durations(matched) == [104, 105]
    assert [(r["ncu_id"], r["reason"]) for r in diag["ncu_only_rows"]] == [
        (i, "likely_autotune_or_benchmark") for i in range(4)]
    assert diag["per_key"]["triton_mm_0"]["status"] == "ncu_surplus"
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [(0, "not_in_ncu")]


def test_c15_surplus_indistinguishable_is_a_count_mismatch(tmp_path):
    matched, diag = _c15(tmp_path, [("(128, 1, 1)", "(128, 1, 1)")] * 6)
    assert matched.empty and diag["matched"] == 0
    assert diag["per_key"]["triton_mm_0"]["status"] == "count_mismatch"
    assert diag["ncu_only_reasons"] == {"count_mismatch": 6}
    assert diag["timeline_only_reasons"] == {"count_mismatch": 2, "not_in_ncu": 1}
    assert diag["counters"]["refused_keys"][0] == {"key": "triton_mm_0", "name": "triton_mm_0",
                                                   "reason": "count_mismatch", "refused": 2, "timeline": 2, "ncu": 6}
    assert any("launch-skip" in h for h in diag["hints"])


# ----------------------------------------------------------------------------------------------- C16


def test_c16_nccl_kernels_are_timeline_only_with_coverage_split(tmp_path):
    kernels = _kernels(["gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"], stream=[7, 20],
                       duration_ns=[250, 740], launch_tid=1)
    ncu = _ncu(tmp_path, [_row(0, "gemm", 80, metric="sm__throughput.avg.pct_of_peak_sustained_elapsed", unit="%")])
    matched, diag = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[0, 0]]
    assert [(k["kernel_id"], k["reason"]) for k in diag["timeline_only_kernels"]] == [(1, "communication_not_profiled")]
    cov = diag["counters_coverage"]
    assert (cov["compute"]["with_counters_ns"], cov["compute"]["time_ns"]) == (250, 250)
    assert (cov["communication"]["with_counters_ns"], cov["communication"]["time_ns"]) == (0, 740)
    assert cov["overall"]["fraction"] == pytest.approx(250 / 990)


# ----------------------------------------------------------------------------------------------- C23


def test_c23_formatted_csv_values_arrive_normalized_on_the_matched_kernels(tmp_path):
    pre = ('==PROF== Connected to process 500 (/usr/bin/python3)\nepoch 1 loss 0.3\n'
           '==PROF== Profiling "gemm" - 0: 0%....50%....100% - 8 passes\n')
    rows = [_row(0, "gemm", "1,234.56", metric="Duration", unit="usecond"),
            _row(0, "gemm", "6,655", metric="Elapsed Cycles", unit="cycle"),
            _row(0, "gemm", "87.30", metric="DRAM Throughput", unit="%"),
            _row(0, "gemm", "n/a", metric="L1/TEX Hit Rate", unit="%"),
            _row(1, "gemm", "1.20", metric="Duration", unit="msecond"),
            _row(1, "gemm", "812.40", metric="Memory Throughput", unit="Gbyte/second"),
            _row(2, "gemm", "1.61", metric="Memory Throughput", unit="Tbyte/second"),
            _row(2, "gemm", "950", metric="Duration", unit="nsecond")]
    csv = tmp_path / "run.csv"
    csv.write_text(pre + HDR + "".join(rows), encoding="utf-8")
    ncu = stages.parse_ncu_files([csv], tmp_path / "ncu.parquet")
    matched, diag = match_invocations(_kernels(["gemm"] * 3), ncu)
    assert diag["matched"] == 3 and matched.kernel_id.tolist() == [0, 1, 2]
    assert matched["Duration"].tolist() == pytest.approx([1.23456e-3, 1.2e-3, 950e-9])
    assert matched["Elapsed Cycles"].iloc[0] == 6655
    assert matched["Memory Throughput"].iloc[1:].tolist() == pytest.approx([8.124e11, 1.61e12])
    assert matched["L1/TEX Hit Rate"].isna().iloc[0]  # n/a -> null, not 0
    assert matched.attrs["units"]["Duration"] == "second"


# ------------------------------------------------------------------------------------------ real file


def test_real_dropout_162_launches_with_one_different_timeline_kernel_attach_nothing(tmp_path):
    """162 launches of one kernel (real ncu 2022 CSV). If the timeline's launch 100 is another kernel, one ncu row
    is a launch the timeline lacks and no position can be pinned: nothing is attached (the old matcher gave the
    first 100 kernels counters and stopped). Declaring the window as the replay does pins by position, up to
    launch 100, and reports where the names disagree."""
    ncu = stages.parse_ncu_files([real_file("ncu", DROPOUT)], tmp_path / "ncu.parquet")
    name = ncu["name"].iloc[0]
    assert len(ncu) == 162 and ncu["name"].nunique() == 1
    kernels = _kernels([name] * 162, pid=33512, grid="1024,1,1", block="256,1,1", launch_tid=33512,
                       duration_ns=12000)
    matched, diag = match_invocations(kernels, ncu)
    assert _pairs(matched) == [[i, i] for i in range(162)]  # the same program: the identity
    assert matched["dram__bytes.sum"].iloc[0] == 4194688.0
    renamed = ("void at::native::(anonymous namespace)::fused_dropout_kernel<double, double, unsigned int, 1>"
               "(at::cuda::detail::TensorInfo<double, unsigned int>)")
    kernels.loc[100, ["name", "match_key"]] = renamed
    matched, diag = match_invocations(kernels, ncu)
    assert matched.empty and diag["ncu_only_reasons"] == {"count_mismatch": 162}
    assert diag["per_key"][name]["status"] == "count_mismatch"
    matched, diag = match_invocations(kernels, ncu, {"kernel_ids": list(range(162))})
    assert matched.empty
    d = diag["name_disagreements"][0]
    assert (d["position"], d["kernel_id"], d["ncu_id"], d["timeline_name"], d["ncu_name"]) == (
        100, 100, 100, renamed, name)


# ---------------------------------------------------------------------------------------------- CLI


def test_opprof_match_writes_metrics_and_diagnostics(tmp_path):
    ncu = tmp_path / "ncu.parquet"
    csv = _csv(tmp_path, [_row(0, "k", "2", metric="dram__bytes.sum", unit="Kbyte"),
                          _row(1, "k", "5", metric="dram__bytes.sum", unit="byte")])
    stages.parse_ncu_files([csv], ncu)
    (tmp_path / "timeline").mkdir()
    _kernels(["k", "k", "j"]).to_parquet(tmp_path / "timeline" / "kernels.parquet", index=False)
    cmd = ["match", "--timeline", str(tmp_path / "timeline"), "--ncu", str(ncu), "--out", str(tmp_path)]
    r = run_opprof(*cmd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "counters: 2 of 3 kernels; 0 refused" in r.stdout
    metrics = pd.read_parquet(tmp_path / "matched" / "kernel_metrics.parquet")
    assert metrics[["kernel_id", "ncu_id", "dram__bytes.sum"]].values.tolist() == [[0, 0, 2000.0], [1, 1, 5.0]]
    diag = json.loads((tmp_path / "matched" / "diagnostics.json").read_text())
    assert diag["units"] == {"dram__bytes.sum": "byte"} and diag["timeline_only_kernels"][0]["reason"] == "not_in_ncu"
    # a window and a process map on the command line; bad values are one-line errors
    r = run_opprof(*cmd, "--window", "run=1:2", "--process-map", "500=1", cwd=tmp_path)
    # launches 1-2 are (k, j), the file has (k, k): the declared window is not what ncu ran; refused, visibly
    assert r.returncode == 0 and "counters: 0 of 3 kernels; 2 refused (2 window_mismatch)" in r.stdout, r.stdout
    (tmp_path / "w.json").write_text(json.dumps({"sources": {"run": {"launch_skip": -1, "launch_count": 2}}}))
    bad_values = {
        ("--window", "run=x:2"): "expected NAME=SKIP:COUNT",
        ("--process-map", "500:1"): "expected NCU_PID=TIMELINE_PID",
        ("--window", "run=0:1", "--window", "w.json"): "either one JSON file",
        ("--window", "typo=0:1"): "names 'typo', which is none of the ncu files (run.csv)",
        ("--window", str(tmp_path / "w.json")): "window of run: window launch_skip must be a non-negative integer",
        ("--process-map", "500=9"): "has no process 9 (its processes: 1)",
        ("--window", "run=0:2:regex:["): "is not a valid regular expression",
    }
    for bad, needle in bad_values.items():
        r = run_opprof(*cmd, *bad, cwd=tmp_path)
        assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert needle in r.stderr, (bad, r.stderr)


# ---------------------------------------------------------------------------------- layer-class broadcast


def test_counters_of_the_measured_instance_are_broadcast_by_position():
    """Two identical layers (one class) and one kernel outside layers: ncu measured only blocks.0
    (the representative) and the rest kernel; blocks.1 gets blocks.0's counters position by position.
    A kernel whose position has a different kernel name in the representative gets none."""
    from operator_profiler.matching import broadcast_to_instances

    kernels = pd.DataFrame({"kernel_id": range(7),
                            "match_key": ["gemm", "relu", "gemm", "relu", "copy", "gemm", "oddball"]})
    kernel_layers = pd.DataFrame({
        "kernel_id": range(7),
        "layer_class": ["Block-1", "Block-1", "Block-1", "Block-1", "rest", "Block-1", "Block-1"],
        "position": [0, 1, 0, 1, 0, 0, 1],  # kernels 5, 6: blocks.0 again in a later iteration, one odd kernel
    })
    matched = pd.DataFrame({"kernel_id": [0, 1, 4], "ncu_id": [0, 1, 2], "dram__bytes.sum": [100.0, 10.0, 7.0]})
    matched.attrs = {"units": {"dram__bytes.sum": "byte"}}
    counters, stats = broadcast_to_instances(matched, kernels, kernel_layers)
    got = counters.set_index("kernel_id")
    assert got["counters_from"].to_dict() == {0: 0, 1: 1, 2: 0, 3: 1, 4: 4, 5: 0}
    assert got["dram__bytes.sum"].to_dict() == {0: 100.0, 1: 10.0, 2: 100.0, 3: 10.0, 4: 7.0, 5: 100.0}
    assert 6 not in got.index  # 'oddball' at the position of 'relu': not guessed
    assert stats["Block-1"] == {"kernels": 6, "measured": 2, "filled": 3, "without_counters": 1, "name_mismatch": 1,
                                "config_mismatch": 0}
    assert counters.attrs["units"] == {"dram__bytes.sum": "byte"}


def test_two_measured_instances_report_how_far_apart_they_are():
    from operator_profiler.matching import broadcast_to_instances

    kernels = pd.DataFrame({"kernel_id": range(4), "match_key": ["gemm", "relu", "gemm", "relu"]})
    kernel_layers = pd.DataFrame({"kernel_id": range(4), "layer_class": "Block-1", "position": [0, 1, 0, 1]})
    matched = pd.DataFrame({"kernel_id": range(4), "ncu_id": range(4),
                            "dram__bytes.sum": [100.0, 10.0, 110.0, 10.0], "sm__throughput.avg.pct_of_peak_sustained_elapsed":
                            [50.0, 20.0, 50.0, 25.0]})
    counters, stats = broadcast_to_instances(matched, kernels, kernel_layers)
    assert counters["counters_from"].tolist() == [0, 1, 2, 3]  # measured kernels keep their own
    diff = stats["Block-1"]["verify_max_relative_difference"]
    assert diff["dram__bytes.sum"] == pytest.approx(10 / 110)
    assert diff["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(5 / 25)


# ------------------------------------------------------------------------------------------- real names


def test_real_nsys_kernel_names_normalize_alike_from_both_demanglers(real_nsys_files):
    """Every kernel of the real nsys exports that has a mangled name: nsys's demangled text (the cu++filt style of
    CUPTI, which a torch.profiler trace shows too) and libstdc++'s demangling of the mangled name (what ncu's
    mangled names become here) are equal on the normalized rung, and no two different mangled names collide
    there. Names read with plain sqlite3 (StringIds), not with the reader."""
    import sqlite3

    pairs = set()
    for path in real_nsys_files:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        cols = {r[1] for r in conn.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
        if "mangledName" in cols and "demangledName" in cols:
            pairs |= set(conn.execute(
                "SELECT m.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds m ON m.id = k.mangledName "
                "JOIN StringIds d ON d.id = k.demangledName"))
        conn.close()
    mangled = [(m, d) for m, d in pairs if m.startswith("_Z")]
    assert len(mangled) >= 60  # templated ATen, cuBLAS-wrapped, nvFuser and NCCL kernels of five exports
    differ = [(m, d) for m, d in mangled if normalize(demangle(m)) != normalize(d)]
    assert differ == []
    by_form: dict = {}
    for m, d in mangled:
        by_form.setdefault(normalize(d), set()).add(m)
    assert [f for f, ms in by_form.items() if len(ms) > 1] == []
