"""A throw-away single-node SLURM cluster on this machine, for tests/test_slurm.py.

Installs Debian's ``slurm-wlm`` and ``munge`` when missing (root only), writes a minimal
``/etc/slurm/slurm.conf`` (never over one it did not write), starts ``munged`` (unless one already
answers), ``slurmctld`` and ``slurmd`` in the foreground as child processes, and stops exactly those
processes, by PID, in :meth:`SingleNodeSlurm.stop`. No cgroups, no accounting daemon: containers
usually have neither, and the workflow's SLURM profile asks for ``squeue`` as the status command.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
MARK = "# written by operator-profiler tests/slurm_cluster.py"
PACKAGES = ("slurm-wlm", "munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_SOCKET_DIR = Path("/run/munge")


class SetupError(RuntimeError):
    """The cluster could not be set up here (the reason is the message)."""


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _missing_tools() -> list[str]:
    return [t for t in ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "munged", "munge")
            if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]


def install_packages() -> None:
    """apt-get install slurm-wlm and munge when their programs are missing."""
    if not _missing_tools():
        return
    if os.geteuid() != 0:
        raise SetupError(f"SLURM/munge programs missing ({', '.join(_missing_tools())}) and not root to install them")
    if shutil.which("apt-get") is None:
        raise SetupError("SLURM/munge programs missing and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    for cmd in (["apt-get", *lock, "update"],
                ["apt-get", *lock, "install", "-y", "--no-install-recommends", *PACKAGES]):
        result = _run(cmd, timeout=1200, env=env)
        if result.returncode != 0:
            raise SetupError(f"{' '.join(cmd)} failed: {result.stderr[-2000:]}")
    if _missing_tools():
        raise SetupError(f"still missing after apt-get install: {', '.join(_missing_tools())}")


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _wait(predicate, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise SetupError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


class SingleNodeSlurm:
    """One node (this machine, ``hostname -s``) in one default partition ``opprof``."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.wrote_conf = False

    # -- setup -----------------------------------------------------------------------------
    def start(self) -> None:
        if CONF.exists():
            text = CONF.read_text(errors="replace")
            if MARK not in text:  # (a file with the mark is a leftover of an interrupted run)
                raise SetupError(f"{CONF} exists and was not written by this test: refusing to overwrite "
                                 "a real SLURM configuration (run the test on a machine without one)")
        install_packages()
        if os.geteuid() != 0:
            raise SetupError("the single-node SLURM test needs root (slurmd runs jobs as root here)")
        for daemon in ("slurmctld", "slurmd"):
            if _run(["pgrep", "-x", daemon]).returncode == 0:
                raise SetupError(f"a {daemon} is already running on this machine: not starting a second one")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-f", str(CONF)], self.dir / "slurmctld.out")
        self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", str(CONF)], self.dir / "slurmd.out")
        _wait(self._node_idle, 90, "the node to be idle in sinfo", self.dir / "slurmd.out")

    def _start_munge(self) -> None:
        if self._munge_works():
            return  # a munged already serves the default socket: use it, never stop it
        if not MUNGE_KEY.exists():
            keygen = shutil.which("mungekey") or _sbin("mungekey")
            result = _run([keygen, "--create", "--keyfile", str(MUNGE_KEY)]) if Path(keygen).exists() else None
            if result is None or result.returncode != 0:
                with open("/dev/urandom", "rb") as rnd:
                    MUNGE_KEY.write_bytes(rnd.read(1024))
            shutil.chown(MUNGE_KEY, "munge", "munge")
            MUNGE_KEY.chmod(0o400)
        MUNGE_SOCKET_DIR.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
        MUNGE_SOCKET_DIR.chmod(0o755)
        self._spawn("munged", [_sbin("munged"), "-F"], self.dir / "munged.out", user="munge", group="munge")
        _wait(self._munge_works, 30, "munged to answer", self.dir / "munged.out")

    @staticmethod
    def _munge_works() -> bool:
        try:
            cred = _run(["munge", "-n"], timeout=10)
            return cred.returncode == 0 and _run(["unmunge"], timeout=10, input=cred.stdout).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _write_conf(self) -> None:
        probe = _run([_sbin("slurmd"), "-C"])
        node = next((line for line in probe.stdout.splitlines() if line.startswith("NodeName=")), None)
        if probe.returncode != 0 or node is None:
            raise SetupError(f"slurmd -C failed: {probe.stdout}{probe.stderr}")
        host = socket.gethostname().split(".")[0]
        if not node.startswith(f"NodeName={host} "):
            raise SetupError(f"slurmd -C reports {node.split()[0]}, hostname -s is {host}")
        state, spool = self.dir / "state", self.dir / "spool"
        state.mkdir(exist_ok=True)
        spool.mkdir(exist_ok=True)
        conf = f"""{MARK}; removed when the test ends
ClusterName=opprof-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd.pid
SlurmctldLogFile={self.dir}/slurmctld.log
SlurmdLogFile={self.dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# finished jobs stay visible to squeue (the profile's status command) for 10 minutes
MinJobAge=600
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=opprof Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        CONF.parent.mkdir(parents=True, exist_ok=True)
        CONF.write_text(conf)
        self.wrote_conf = True

    def _spawn(self, name: str, cmd: list[str], log: Path, **kw) -> None:
        out = open(log, "ab")
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kw)
        finally:
            out.close()
        self.procs.append((name, proc))
        time.sleep(0.5)
        if proc.poll() is not None:
            raise SetupError(f"{name} exited at once ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")

    @staticmethod
    def _node_idle() -> bool:
        result = _run(["sinfo", "--noheader", "--format=%t"], timeout=10)
        return result.returncode == 0 and result.stdout.split() == ["idle"]

    # -- teardown --------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the daemons this object started (by PID, newest first), then restore slurm.conf."""
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs.clear()
        if self.wrote_conf:
            CONF.unlink(missing_ok=True)
            self.wrote_conf = False

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.dir.glob("*.log")))
