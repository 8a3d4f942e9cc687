"""Running an external tool (ncu, nvidia-smi, a toy program) with a time limit that holds for its whole process
tree: the tool runs in its own process group, and on the limit the group is killed, so nothing it started (the
program ncu profiles, a child that kept its output pipe open) outlives it or keeps holding the GPU. Output is
decoded leniently (bytes that are not UTF-8 become U+FFFD): a tool's garbage is reported, never a crash."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass


@dataclass
class ToolRun:
    code: int  # the exit status; -1 when it did not run or was stopped at the limit
    text: str  # stdout then stderr
    timed_out: bool = False
    error: str | None = None  # why it did not run (OSError text)

    def said(self) -> str:
        """One line: the first ``==ERROR==`` line, else the last line, else what happened."""
        if self.error:
            return self.error
        lines = [ln.strip() for ln in self.text.splitlines() if ln.strip()]
        if self.timed_out:
            return "no answer within the time limit" + (f" (last said: {lines[-1][:120]})" if lines else "")
        return next((ln for ln in lines if ln.startswith("==ERROR==")), lines[-1] if lines else "no output")


def run_tool(cmd: list[str], timeout_s: float, env: dict | None = None) -> ToolRun:
    """Run ``cmd`` (no shell) for at most ``timeout_s`` seconds (its process group is killed at the limit)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as exc:
        return ToolRun(-1, "", error=f"{type(exc).__name__}: {exc}")
    try:
        out, err = proc.communicate(timeout=max(0.1, float(timeout_s)))
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a child still holds the pipes open: give up on its output
            out, err = b"", b""
        timed_out = True
    text = out.decode("utf-8", errors="replace") + err.decode("utf-8", errors="replace")
    return ToolRun(-1 if timed_out else proc.returncode, text, timed_out)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
