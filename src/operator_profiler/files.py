"""Atomic file writers: a temp file renamed into place, so a failing stage leaves no partial output."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    """Indented JSON with sorted keys (byte-identical for equal content)."""
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def write_parquet_atomic(df, path: Path) -> None:
    """A pandas DataFrame as parquet (no index)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)
