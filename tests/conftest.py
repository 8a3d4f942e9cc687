"""Shared test settings, fixtures and helpers: the real-data folder (``REAL_DATA``, ``real_file``, ``need_real``,
``real_nsys_files``), the fake ``nvidia-smi`` (``smi``; the fake tools are in tests/fake_tools.py), the finished
nsys workflow run several modules read (``nsys_finished_run``; set-ups in tests/workflow_runs.py and
tests/nsys_workflow.py), ``opprof`` in-process (``run_opprof``), and a capture's side effects undone
(``torch_flags_kept``, ``importable_module``). Test modules import helpers from here or from those helper
modules, never from another test module.

Tests that read the real recordings expect them at ``../shared/data/real`` beside the repository
(they are never copied into it) and skip without them. In CI (``CI`` set) the folder must be there:
a green run that silently skipped a third of the suite would prove nothing.
"""

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"  # beside the repository, never copied into it
REAL_DATA = SHARED / "data" / "real"


def pytest_sessionstart(session):
    if os.environ.get("CI") and not REAL_DATA.is_dir():
        pytest.exit(f"CI run without the real test data at {REAL_DATA}: the real-data tests would be skipped", returncode=1)


@pytest.fixture
def real_nsys_files() -> list[Path]:
    """Every real nsys SQLite export in ``../shared/data/real/nsys`` (skips without the folder outside CI)."""
    files = sorted((REAL_DATA / "nsys").glob("*.sqlite"))
    if not files:
        if os.environ.get("CI"):
            pytest.fail(f"no real nsys exports in {REAL_DATA / 'nsys'} in a CI run")
        pytest.skip(f"real data not available: {REAL_DATA / 'nsys'}")
    return files


def real_file(*parts: str) -> Path:
    """A file of ``../shared/data/real``: fails a CI run when it is missing, skips the test otherwise."""
    path = REAL_DATA.joinpath(*parts)
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"real data file missing in a CI run: {path}")
        pytest.skip(f"real data not available: {path}")
    return path


def need_real(path: Path, *more: Path) -> Path:
    """``path`` (and ``more``), files or folders under ``../shared``, when they exist: fails a CI run when one is
    missing, skips the test otherwise."""
    for p in (path, *more):
        if not p.exists():
            if os.environ.get("CI"):
                pytest.fail(f"real data missing in a CI run: {p}")
            pytest.skip(f"real data not available: {p}")
    return path



@contextlib.contextmanager
def torch_flags_kept():
    """Restores on leaving the process-wide torch flags a capture sets (cuDNN benchmark, always; with
    harness.deterministic also deterministic algorithms, their fill of uninitialized memory, cuDNN deterministic
    and CUBLAS_WORKSPACE_CONFIG; a variant's Inductor freezing and Dynamo allow_rnn, which the harness sets for its
    process), so that the tests after it run unaffected (a frozen capture left freezing on for the next test's
    compiles: its GEMMs became mkl::_mkl_linear and its compile and capture no longer shared a cached graph)."""
    import torch
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.utils.deterministic.fill_uninitialized_memory, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    compiler = (inductor_config.freezing, dynamo_config.allow_rnn)
    try:
        yield
    finally:
        inductor_config.freezing, dynamo_config.allow_rnn = compiler
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]
        torch.utils.deterministic.fill_uninitialized_memory = saved[4]
        if saved[5] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[5]


@contextlib.contextmanager
def importable_module(folder: Path, name: str, source: str):
    """``source`` written as ``folder/<name>.py``, importable (``folder`` first on sys.path) while inside: a custom
    model's module as a workload's factory names it. sys.path and sys.modules are restored on leaving."""
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    sys.modules.pop(name, None)
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """The fake ``nvidia-smi`` (tests/fake_tools.py) first on PATH for this test, no CUDA_VISIBLE_DEVICES."""
    from fake_tools import install_fake_smi

    return install_fake_smi(tmp_path, monkeypatch)


@pytest.fixture(scope="session")
def nsys_finished_run(tmp_path_factory):
    """The workflow's CPU rules run to the end on placed nsys captures (tests/nsys_workflow.py), once per session:
    ``(setup, the dry run before the run)``. A test that changes the run puts it back (finished, nothing to do)."""
    from nsys_workflow import CUDA_NSYS, TARGETS, make_setup, snakemake

    setup = make_setup(tmp_path_factory.mktemp("wf_nsys"))
    # Placed captures have no Snakemake metadata: only the mtime trigger can fire for them, and it does
    # not, as they are newer than their inputs. So the plan holds the three CPU rules and no capture rule.
    dry = snakemake(setup, "-n", *TARGETS, *CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-4000:]
    result = snakemake(setup, *TARGETS, *CUDA_NSYS)
    assert result.returncode == 0, result.stderr[-4000:]
    return setup, dry


def run_opprof(*args, cwd) -> subprocess.CompletedProcess:
    """``opprof ARGS`` run in this process, in ``cwd``: its exit code, stdout and stderr as a CompletedProcess. The
    same code path as the command (``cli.main``, one-line errors included) without a Python start-up per call."""
    from operator_profiler.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
