"""Launch order between threads and within one timestamp (QA round 4: T1_threads, T6_tie). Fixtures are a Kineto
trace and an ncu CSV written here; each attached ``dram__bytes.sum`` names the launch it was measured on
(``kineto_ncu_writers``), so a wrong attachment is seen by comparing it with the kernel's correlation id."""

from __future__ import annotations

import json

import pandas as pd
from conftest import run_opprof
from kineto_ncu_writers import launch, write_kineto, write_ncu_csv

TRITON = "triton_poi_fused_add_0"


def _run(tmp_path, launches, order, steps=()):
    write_kineto(tmp_path / "trace.json", launches, steps)
    write_ncu_csv(tmp_path / "prof.csv", launches, order)
    for args in (("timeline", "--kineto", "trace.json", "--out", "tl"), ("ncu", "prof.csv", "--out", "prof.parquet"),
                 ("match", "--timeline", "tl", "--ncu", "prof.parquet", "--out", "m")):
        result = run_opprof(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    matched = pd.read_parquet(tmp_path / "m/matched/kernel_metrics.parquet")
    kernels = pd.read_parquet(tmp_path / "tl/kernels.parquet").set_index("kernel_id")
    diagnostics = json.loads((tmp_path / "m/matched/diagnostics.json").read_text())
    launch_of_kernel = {int(k): int(c) - 1000 for k, c in kernels["correlation_id"].items()}
    attached = {launch_of_kernel[int(k)]: int(v) - 1_000_000
                for k, v in zip(matched["kernel_id"], matched["dram__bytes.sum"])}
    return attached, diagnostics


def test_two_threads_alternating_one_kernel_are_refused_not_swapped(tmp_path):
    """T1: threads 11 and 12 launch the same kernel (same grid/block) alternately, launch calls never overlapping;
    the ncu run saw thread 12 first each time. Pairing by position would give each launch its neighbour's counters
    (12 of 12 wrong); the alternation X, Y, X, Y makes the launches a bag, and a token on two chains is refused."""
    launches, t = [], 100
    for _ in range(6):
        for tid, stream in ((11, 7), (12, 8)):
            launches.append(launch(tid, TRITON, t, stream=stream))
            t += 10
    order = [i for pair in range(6) for i in (2 * pair + 1, 2 * pair)]
    attached, diagnostics = _run(tmp_path, launches, order)
    assert attached == {}
    assert diagnostics["counters"]["refused"] == 12
    assert diagnostics["counters"]["refused_reasons"] == {"order_ambiguous": 12}


def test_one_hand_over_per_iteration_stays_ordered(tmp_path):
    """Forward on the main thread, backward on the autograd thread, optimizer on the main thread (X, Y, X) in each
    ProfilerStep: the program's order, so a kernel both threads launch still pairs by position, right."""
    launches, steps, t = [], [], 100
    for step in range(3):
        lo = t - 5
        for tid in (1, 2, 1):  # forward, backward, optimizer
            launches.append(launch(tid, "vectorized_elementwise_kernel", t, op="aten::add"))
            launches.append(launch(tid, f"gemm_{tid}", t + 10, op="aten::mm"))
            t += 30
        steps.append((step, lo, t - 5))
    attached, diagnostics = _run(tmp_path, launches, list(range(len(launches))), steps)
    assert attached == {i: i for i in range(len(launches))}
    assert diagnostics["counters"]["refused"] == 0


def test_alternation_inside_one_iteration_is_a_bag(tmp_path):
    """Inside one ProfilerStep two threads alternate twice (X, Y, X, Y): not a hand-over; the kernel both launch
    is refused, the kernels only one thread launches pair."""
    launches, t = [], 100
    for tid in (1, 2, 1, 2):
        launches.append(launch(tid, "vectorized_elementwise_kernel", t, op="aten::add"))
        launches.append(launch(tid, f"gemm_{tid}", t + 10, op="aten::mm", grid=(8 * tid, 1, 1)))
        t += 30
    order = [2, 3, 0, 1, 6, 7, 4, 5]  # the other thread first in the ncu run
    attached, diagnostics = _run(tmp_path, launches, order, steps=[(0, 90, t)])
    assert all(row == kernel for kernel, row in attached.items())
    assert set(attached) == {1, 3, 5, 7}  # the gemms: one thread each, in order along it
    assert diagnostics["counters"]["refused_reasons"] == {"order_ambiguous": 4}


def test_equal_launch_timestamps_of_one_thread_follow_correlation_ids(tmp_path):
    """T6: integer-µs Kineto timestamps, two launches of one thread in the same microsecond; the first goes to a
    busy stream, so it starts on the GPU later. Launch order is the correlation ids' order, not GPU start."""
    launches = [launch(11, "long_kernel", 100, stream=8, grid=(1, 1, 1), dur=500, op="aten::mm")]
    for i in range(3):
        base = 200 + 100 * i
        launches.append(launch(11, "add_kernel", base, stream=8, launch_dur=0, op="aten::add"))
        launches.append(launch(11, "add_kernel", base, stream=7, launch_dur=0, op="aten::add"))
    attached, diagnostics = _run(tmp_path, launches, list(range(len(launches))))
    assert attached == {i: i for i in range(7)}
    kernels = pd.read_parquet(tmp_path / "tl/kernels.parquet")
    assert kernels["correlation_id"].tolist() == sorted(kernels["correlation_id"].tolist())


def test_equal_launch_timestamps_of_two_threads_are_a_bag(tmp_path):
    """Two threads launch the same kernel in the same microsecond, twice: which came first is not known, so the
    pair is refused rather than ordered by correlation id of this run."""
    launches = []
    for base in (200, 300):
        launches.append(launch(11, "add_kernel", base, stream=7, launch_dur=0))
        launches.append(launch(12, "add_kernel", base, stream=8, launch_dur=0))
    attached, diagnostics = _run(tmp_path, launches, [1, 0, 3, 2])
    assert attached == {}
    assert diagnostics["counters"]["refused_reasons"] == {"order_ambiguous": 4}
