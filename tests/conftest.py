"""Shared test settings.

Tests that read the real recordings expect them at ``../shared/data/real`` beside the repository
(they are never copied into it) and skip without them. In CI (``CI`` set) the folder must be there:
a green run that silently skipped a third of the suite would prove nothing.
"""

import os
from pathlib import Path

import pytest

REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"


def pytest_sessionstart(session):
    if os.environ.get("CI") and not REAL_DATA.is_dir():
        pytest.exit(f"CI run without the real test data at {REAL_DATA}: the real-data tests would be skipped", returncode=1)
