"""Static checks of the workflow definition: Snakemake's linter and snakefmt."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_snakemake_lint_is_clean():
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "--cores", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_snakefmt_has_nothing_to_change():
    snakefmt = shutil.which("snakefmt") or str(Path(sys.executable).with_name("snakefmt"))
    if not Path(snakefmt).exists():
        pytest.skip("snakefmt is not installed (pip install -e '.[test]')")
    files = [str(ROOT / "Snakefile"), *map(str, sorted((ROOT / "workflow").glob("*.smk")))]
    result = subprocess.run([snakefmt, "--check", *files], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
