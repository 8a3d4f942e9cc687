"""Visible refusals: coverage.json, report.md and report.html say how many kernels got ncu
counters, how many were refused and why, per kernel name. A torch.profiler GPU trace and an ncu CSV written here
(the formats the tools write) go through the command line as a user would run it."""

from __future__ import annotations

import gzip
import json

from conftest import run_opprof

PID = 4242
HDR = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
       '"Device","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _trace(path):
    """aten::mm launches `gemm_a` three times (same configuration), aten::relu launches `relu_kernel` once."""
    events, corr, t = [], 0, 10.0
    for op, kernel in (("aten::mm", "gemm_a"), ("aten::mm", "gemm_a"), ("aten::mm", "gemm_a"),
                       ("aten::relu", "relu_kernel")):
        corr += 1
        events += [
            {"ph": "X", "cat": "cpu_op", "name": op, "pid": PID, "tid": 1, "ts": t, "dur": 5.0,
             "args": {"External id": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": 1, "ts": t + 1,
             "dur": 2.0, "args": {"correlation": corr, "External id": corr}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t + 4, "dur": 10.0,
             "args": {"correlation": corr, "External id": corr, "stream": 7, "device": 0, "grid": [8, 1, 1],
                      "block": [128, 1, 1]}},
        ]
        t += 20.0
    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
                   "traceEvents": events}, fh)


def _ncu_csv(path):
    """ncu profiled two of the three gemm_a launches (a kernel filter let one through less) and the relu."""
    rows = [(0, "gemm_a", 100), (1, "gemm_a", 101), (2, "relu_kernel", 102)]
    path.write_text(HDR + "".join(
        f'"{i}","77","python","h","{name}","1","7","(128, 1, 1)","(8, 1, 1)","0","Command line profiler metrics",'
        f'"gpu__time_duration.sum","nsecond","{value}"\n' for i, name, value in rows))


def opprof(*args, cwd):
    return run_opprof(*args, cwd=cwd)


def test_refused_counters_are_counted_and_shown(tmp_path):
    _trace(tmp_path / "trace.json.gz")
    _ncu_csv(tmp_path / "run.csv")
    (tmp_path / "layers.json").write_text("[]")
    steps = [
        ["timeline", "--kineto", "trace.json.gz", "--out", "res/timeline"],
        ["classify", "--timeline", "res/timeline", "--layers", "layers.json", "--out", "res/layers"],
        ["attribute", "--timeline", "res/timeline", "--kernel-layers", "res/layers/kernel_layers.parquet",
         "--out", "res/attribution/kernels.parquet"],
        ["ncu", "run.csv", "--out", "res/ncu/run.parquet"],
        ["match", "--timeline", "res/timeline", "--ncu", "res/ncu/run.parquet", "--out", "res"],
        ["aggregate", "--attribution", "res/attribution/kernels.parquet", "--instances", "res/layers/instances.parquet",
         "--classes", "res/layers/classes.json", "--device", "cuda", "--counters", "res/matched/kernel_metrics.parquet",
         "--matching", "res/matched/diagnostics.json", "--out", "res"],
        ["report", "--results", "res", "--timeline", "res/timeline", "--matching", "res/matched/diagnostics.json",
         "--out", "res/report.md"],
        ["report-html", "--results", "res", "--out", "res/report.html"],
    ]
    stderr = {}
    for step in steps:
        r = opprof(*step, cwd=tmp_path)
        assert r.returncode == 0, (step, r.stderr)
        stderr[step[0]] = r.stderr
    # Which two of the three gemm_a launches ncu measured cannot be told: none of the three gets counters; the relu,
    # last in both sequences, does.
    coverage = json.loads((tmp_path / "res" / "coverage.json").read_text())
    # the matching's hints (here: the file fits at more than one place, declare its window) reach the console,
    # coverage.json and both reports (QA round 4, A10: they were only inside diagnostics.json)
    hints = json.loads((tmp_path / "res" / "matched" / "diagnostics.json").read_text())["hints"]
    assert hints and any("--window" in h for h in hints)
    assert coverage["counters"].pop("hints") == hints
    assert [line for line in stderr["match"].splitlines() if line.startswith("opprof match: hint: ")] == [
        "opprof match: hint: " + " ".join(h.split()) for h in hints]
    assert coverage["counters"] == {
        "kernels": 4, "with_counters": 1, "measured": 1, "from_layer_class": 0, "refused": 3,
        "refused_reasons": {"unplaced_window": 3}, "refused_rows": 2,
        "refused_keys": [{"key": "gemm_a", "name": "gemm_a", "reason": "unplaced_window", "refused": 3,
                          "timeline": 3, "ncu": 2}],
        "not_measured": 0}
    report = (tmp_path / "res" / "report.md").read_text()
    assert ("hardware counters (ncu): 1 of 4 kernels; 3 refused (2 ncu rows that could not be placed): "
            "3 unplaced_window on `gemm_a` (timeline 3, ncu 2); 0 not measured") in report
    assert "## Counters refused" in report and "| `gemm_a` | unplaced_window | 3 | 3 | 2 |" in report
    assert "## Matching hints" in report and all(f"- {h}" in report for h in hints)
    html = (tmp_path / "res" / "report.html").read_text()
    assert "<h3>Counters refused</h3>" in html and 'id="refused-table"' in html
    assert "<h3>Matching hints</h3>" in html and "--window" in html.split("<h3>Matching hints</h3>")[1]
    assert "3 unplaced_window on <code>gemm_a</code> (timeline 3, ncu 2)" in html

    # Declaring that ncu ran launches 0-3 (all four): the file has three rows, so the declaration is not what ran;
    # nothing is attached, visibly.
    r = opprof("match", "--timeline", "res/timeline", "--ncu", "res/ncu/run.parquet", "--window", "run=0:4",
               "--out", "res2", cwd=tmp_path)
    assert r.returncode == 0 and "counters: 0 of 4 kernels; 4 refused (4 window_mismatch)" in r.stdout, r.stdout


def test_counters_and_matching_of_another_timeline_are_refused(tmp_path):
    """Found by a new user: aggregate took --counters/--matching matched on another trace (kernel ids are 0..n-1
    in every timeline) and reported the other trace's counters. They carry their timeline's identity now."""
    _trace(tmp_path / "trace.json.gz")
    _ncu_csv(tmp_path / "run.csv")
    (tmp_path / "layers.json").write_text("[]")
    other = tmp_path / "other.json.gz"
    with gzip.open(tmp_path / "trace.json.gz", "rt") as fh:
        text = fh.read().replace("relu_kernel", "gelu_kernel")  # another program: one kernel name differs
    with gzip.open(other, "wt") as fh:
        fh.write(text)
    for step in (["timeline", "--kineto", "trace.json.gz", "--out", "a/timeline"],
                 ["timeline", "--kineto", "other.json.gz", "--out", "b/timeline"],
                 ["classify", "--timeline", "b/timeline", "--layers", "layers.json", "--out", "b/layers"],
                 ["attribute", "--timeline", "b/timeline", "--out", "b/kernels.parquet"],
                 ["ncu", "run.csv", "--out", "a/run.parquet"],
                 ["match", "--timeline", "a/timeline", "--ncu", "a/run.parquet", "--out", "a"]):
        assert opprof(*step, cwd=tmp_path).returncode == 0, step
    base = ["aggregate", "--attribution", "b/kernels.parquet", "--instances", "b/layers/instances.parquet",
            "--classes", "b/layers/classes.json", "--device", "cuda", "--out", "agg"]
    for extra in (["--counters", "a/matched/kernel_metrics.parquet"], ["--matching", "a/matched/diagnostics.json"]):
        r = opprof(*base, *extra, cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and "was matched on another timeline" in lines[0], r.stderr
    assert not (tmp_path / "agg").exists()
    assert opprof(*base, cwd=tmp_path).returncode == 0
    r = opprof("report", "--results", "agg", "--matching", "a/matched/diagnostics.json", "--out", "r.md", cwd=tmp_path)
    assert r.returncode == 1 and "was matched on another timeline (4 kernels)" in r.stderr, r.stderr
    r = opprof("trace", "--timeline", "b/timeline", "--attribution", "b/kernels.parquet", "--counters",
               "a/matched/kernel_metrics.parquet", "--out", "t.json", cwd=tmp_path)
    assert r.returncode == 1 and "was matched on another timeline" in r.stderr
