"""Which results a failed, interrupted or partial run left stale (operator_profiler.stale).

Real files in a temporary folder, with made-up records of what each output was made from (the shape of
Snakemake's metadata: the job's inputs and the sha256 of the small ones). The workflow-level behaviour
(Snakemake's own records, removal, re-runs) is tested in tests/test_workflow.py.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from operator_profiler.stale import DIRECTORY_TIMESTAMP, Made, Stale, describe, find_stale, mtime, remove

LIB = "/opt/lib/operator_profiler/stages.py"  # a library module: an input no rule makes


def sha(path) -> str:
    return "sha256:" + hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def chain(tmp_path, monkeypatch):
    """capture -> timeline -> layers (a directory output) -> operators -> report, written in that order,
    each one second after the one before (report also reads the capture directly)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    paths = {"capture": "r/capture.json.gz", "timeline": "r/kernels.parquet", "layers": "r/classes",
             "operators": "r/operators.parquet", "report": "r/report.md"}
    for i, (name, path) in enumerate(paths.items()):
        if name == "layers":
            os.mkdir(path)
            for name in ("a.json", DIRECTORY_TIMESTAMP):
                (tmp_path / path / name).write_text("{}")
                os.utime(tmp_path / path / name, (1000 + i, 1000 + i))
            os.utime(path, (5000, 5000))  # a directory's own mtime moves with its files: not what counts
        else:
            (tmp_path / path).write_text(name)
            os.utime(path, (1000 + i, 1000 + i))
    made = {
        paths["timeline"]: Made((paths["capture"], LIB), {paths["capture"]: sha(paths["capture"])}),
        paths["layers"]: Made((paths["timeline"], LIB)),
        paths["operators"]: Made((paths["layers"] + "/a.json", paths["timeline"])),
        paths["report"]: Made((paths["operators"], paths["capture"]), {paths["capture"]: sha(paths["capture"])}),
    }
    return paths, made


def made_by_a_rule(path: str) -> bool:
    return path.startswith("r/")


def test_a_consistent_chain_has_nothing_stale(chain):
    paths, made = chain
    assert mtime(paths["layers"]) == 1002  # the timestamp file, not the directory's own 5000
    assert find_stale(made, made_by_a_rule) == {}


def test_everything_made_from_a_missing_output_is_stale_with_that_cause(chain):
    paths, made = chain
    os.unlink(paths["timeline"])  # a failed export_timeline: Snakemake removed its output
    cause = Stale(paths["timeline"], missing=True)
    assert find_stale(made, made_by_a_rule) == {paths["layers"]: cause, paths["operators"]: cause,
                                                 paths["report"]: cause}


def test_a_missing_library_module_is_no_cause(chain):
    paths, made = chain
    made[paths["report"]] = Made((paths["operators"], "/opt/lib/gone.py"))
    assert find_stale(made, made_by_a_rule) == {}


def test_a_changed_output_makes_what_follows_stale_unless_its_content_is_the_recorded_one(chain):
    paths, made = chain
    capture = paths["capture"]
    os.utime(capture, (2000, 2000))  # newer than everything, same content: Snakemake would not re-run
    assert find_stale(made, made_by_a_rule) == {}
    with open(capture, "w") as f:  # new content (a corrupt or new capture)
        f.write("garbage")
    os.utime(capture, (2000, 2000))
    cause = Stale(capture, missing=False)
    assert find_stale(made, made_by_a_rule) == {p: cause for p in (paths["timeline"], paths["layers"],
                                                                    paths["operators"], paths["report"])}
    # Without Snakemake's mtime rerun trigger, only missing outputs count.
    assert find_stale(made, made_by_a_rule, check_changed=False) == {}


def test_a_newer_input_without_a_recorded_checksum_counts_as_changed(chain):
    paths, made = chain
    os.utime(paths["operators"], (1003.5, 1003.5))  # still older than the report
    assert find_stale(made, made_by_a_rule) == {}
    os.utime(paths["operators"], (1004.5, 1004.5))  # newer than the report (1004); no checksum recorded
    assert find_stale(made, made_by_a_rule) == {paths["report"]: Stale(paths["operators"], missing=False)}


def test_remove_deletes_files_and_whole_directory_outputs(chain):
    paths, _ = chain
    remove([paths["layers"], paths["report"], "r/never-there.txt"])
    assert not os.path.exists(paths["layers"]) and not os.path.exists(paths["report"])
    assert os.path.exists(paths["operators"])


def test_describe_is_one_line_with_the_causes_and_the_reports_first():
    stale = {f"results/w/layers/c{i}.json": Stale("results/w/timeline/kernels.parquet", True) for i in range(6)}
    stale["results/w/report.md"] = Stale("results/w/timeline/kernels.parquet", True)
    stale["results/w/report.html"] = Stale("results/w/capture/run.json", False)
    line = describe(stale, "removed them; this run rebuilds them", shown=3)
    assert "\n" not in line
    assert line == ("stale results: 8 output(s) were made from results/w/timeline/kernels.parquet, now missing "
                    "(a job failed or was interrupted, or a file was deleted); and from results/w/capture/run.json, "
                    "changed since: results/w/report.html, results/w/report.md, results/w/layers/c0.json and "
                    "5 more; removed them; this run rebuilds them")
