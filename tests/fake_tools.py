"""Fake command-line tools: test doubles put first on PATH where the real tool cannot run on the test machine
(no GPU, no Nsight tools). Each writes its argv to a log the tests read back.

* ``nvidia-smi`` (:class:`FakeSmi`): answers ``--query-gpu`` / ``--query-supported-clocks`` / ``-L`` from a JSON state
  file, which ``-lgc/-lmc`` update (``-lgc tdp,tdp`` locks to the GPU's ``tdp_sm``) and ``-rgc/-rmc`` clear, so later
  queries see the lock; return codes 3 (not supported) and 4 (no permission) on request. Loop mode (``-lms N``)
  prints a sample line every N ms until killed and counts as a client holding the GPU; as the driver does, the fake
  drops its locked clocks when a call exits while no loop is alive and the GPU's persistence mode is Disabled (the
  default here). Deprecated cells read ``[Requested functionality has been deprecated]``, an unknown field fails
  the whole query (``Field "x" is not a valid field to query.``, exit status 2: the real exit status was not
  observed). It imitates the documented command line and CSV shape (``--format=csv,noheader,nounits``); its error
  texts and the ``-lgc`` output are approximations. A fake ``sudo`` beside it runs ``sudo -n CMD`` (or refuses as
  sudo does without a NOPASSWD rule).
* ``ncu`` (:class:`FakeNcu`): collections take launches of a launch sequence the test wrote; an import prints a
  raw-page CSV with the metric names, units and values of the real recorded dropout CSV (read at test time);
  ``--query-metrics`` prints the REAL answer of ncu 2024.1.1 for chip gh100 (tests/data/ncu-2024.1.1); on request
  a collection prints ncu's real texts for counters held by DCGM and for metrics it cannot access
  (``FAKE_NCU_FAIL=dcgm``, ``FAKE_NCU_REFUSE=a,b`` [``FAKE_NCU_REFUSE_AS=error``]: exit statuses assumed);
  see tests/test_ncu_replay.py and tests/test_ncu_metric_query.py.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import textwrap
from pathlib import Path

from conftest import real_file

from operator_profiler.capture.clocks import DEFAULT_APP_FIELDS, GPU_FIELDS, SAMPLE_FIELDS


def write_tool(bin_dir: Path, name: str, script: str) -> Path:
    """An executable ``bin_dir/name`` running the Python ``script`` with this interpreter."""
    exe = bin_dir / name
    exe.write_text(f"#!{sys.executable}\n" + script)
    exe.chmod(0o755)
    return exe


H100 = "NVIDIA H100 80GB HBM3"
# the cell text of a real H200 row (docs/formats.md#nvidia-smi)
DEPRECATED = "[Requested functionality has been deprecated]"

FAKE_SMI = textwrap.dedent(r"""
    import datetime, json, os, signal, sys, time
    argv = sys.argv[1:]
    with open(os.environ["FAKE_NVSMI_LOG"], "a") as f:
        f.write(json.dumps(argv) + "\n")
    path = os.environ["FAKE_NVSMI_STATE"]
    CLIENTS = path + ".clients"  # one file "<gpu>.<pid>" per live loop (-lms) process: an NVML client held open
    SAMPLES = path + ".samples"  # one line per sample a loop printed

    def load():
        with open(path) as f:
            return json.load(f)

    def save(st):
        with open(path + ".tmp", "w") as f:
            json.dump(st, f)
        os.replace(path + ".tmp", path)

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def clients(idx):
        try:
            names = os.listdir(CLIENTS)
        except FileNotFoundError:
            return []
        pids = [int(n.split(".")[1]) for n in names if n.split(".")[0] == idx]
        return [p for p in pids if p != os.getpid() and alive(p)]

    def evaporate(idx):
        # The driver de-initializes a GPU when its last client exits, unless persistence mode is on, and
        # locked clocks go with it (nvidia-smi --help-query-gpu, persistence_mode).
        st = load()
        gpu = st["gpus"][idx]
        if gpu.get("persistence", "Disabled") != "Enabled" and not clients(idx):
            if gpu["locked_sm"] is not None or gpu["locked_mem"] is not None:
                gpu["locked_sm"] = gpu["locked_mem"] = None
                save(st)

    st = load()
    if argv == ["-L"]:
        for idx, gpu in sorted(st["gpus"].items()):
            print(f"GPU {idx}: {gpu['name']} (UUID: {gpu['uuid']})")
            for k, mig in enumerate(gpu.get("mig_devices", [])):
                print(f"  MIG 3g.40gb     Device  {k}: (UUID: {mig})")
        sys.exit(0)
    idx = argv[argv.index("-i") + 1] if "-i" in argv else "0"
    idx = next((k for k, g in st["gpus"].items() if idx in (k, g["uuid"])), None)
    if idx is None:
        print("No devices were found")
        sys.exit(6)
    gpu = st["gpus"][idx]

    def mhz(v):
        return "[N/A]" if v is None else DEPRECATED if v == "deprecated" else str(v)

    DEPRECATED = "[Requested functionality has been deprecated]"
    for flag, key in (("-lgc", "locked_sm"), ("-lmc", "locked_mem"), ("-rgc", "locked_sm"), ("-rmc", "locked_mem")):
        if flag in argv:
            how = st.get("fail", {}).get(flag)
            if how == "permission":
                print(f"Failed to change clocks for GPU {idx}: Insufficient Permissions")
                sys.exit(4)
            if how == "unsupported":
                print(f"Setting locked clocks is not supported for GPU {idx}.")
                sys.exit(3)
            if flag in ("-lgc", "-lmc"):
                lo, hi = argv[argv.index(flag) + 1].split(",")
                gpu[key] = gpu["tdp_sm"] if (lo, hi) == ("tdp", "tdp") and flag == "-lgc" else int(hi)
                print(f"GPU clocks set to ({lo}, {hi}) for GPU {idx}.")
            else:
                gpu[key] = None
                print(f"All done.")
            save(st)
            evaporate(idx)  # this process, a client, exits now
            sys.exit(0)

    def values(fields):
        sm = gpu["locked_sm"] + gpu.get("skew_sm", 0) if gpu["locked_sm"] else gpu["idle_sm"]
        mem = gpu["locked_mem"] if gpu["locked_mem"] else gpu["idle_mem"]
        stamp = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        known = {"name": gpu["name"], "uuid": gpu["uuid"], "timestamp": stamp,
                 "persistence_mode": gpu.get("persistence", "Disabled"), "mig.mode.current": gpu.get("mig", "Disabled"),
                 "clocks.current.sm": mhz(sm), "clocks.current.memory": mhz(mem),
                 "clocks.max.sm": mhz(gpu["max_sm"]), "clocks.max.memory": mhz(gpu["max_mem"]),
                 "clocks.default_applications.graphics": mhz(gpu["app_sm"]),
                 "clocks.default_applications.memory": mhz(gpu["app_mem"]),
                 "clocks_event_reasons.active": gpu.get("reasons", "0x0000000000000000"),
                 "clocks_throttle_reasons.active": gpu.get("reasons", "0x0000000000000000"),
                 "compute_cap": gpu.get("cc", "9.0"), "driver_version": gpu.get("driver", "580.159.04"),
                 "pci.bus_id": gpu.get("bus_id", "00000000:19:00.0")}
        for f in fields:
            if f not in known or f in gpu.get("invalid_fields", []):
                print(f'Field "{f}" is not a valid field to query.')
                sys.exit(2)
        return ", ".join(known[f] for f in fields)

    for a in argv:
        if a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1].split(",")
            if "-lms" not in argv:
                print(values(fields))
                sys.exit(0)
            # loop mode: a sample line every N ms until killed
            values(fields)  # an invalid field fails before the loop starts
            if gpu.get("loop_refused"):
                print("fake nvidia-smi: loop mode failed as the test asked")
                sys.exit(255)
            os.makedirs(CLIENTS, exist_ok=True)
            me = os.path.join(CLIENTS, f"{idx}.{os.getpid()}")
            open(me, "w").close()

            def leave(*_):
                evaporate(idx)  # (clients() leaves this process out) before the marker goes: a test that waits
                os.remove(me)   # for no client sees the driver's state after the last one left
                sys.exit(0)

            signal.signal(signal.SIGTERM, leave)
            interval = int(argv[argv.index("-lms") + 1]) / 1000
            n = 0
            while True:
                st = load()
                gpu = st["gpus"][idx]
                print(values(fields), flush=True)
                with open(SAMPLES, "a") as f:
                    f.write(idx + "\n")
                n += 1
                if gpu.get("loop_exits_after") and n >= gpu["loop_exits_after"]:
                    leave()  # the client holding the GPU goes away (killed, crashed)
                time.sleep(interval)
        if a.startswith("--query-supported-clocks="):
            for mem, grs in gpu["supported"].items():
                for gr in grs:
                    print(f"{mem}, {gr}")
            sys.exit(0)
    print("fake nvidia-smi: unexpected arguments", argv, file=sys.stderr)
    sys.exit(2)
""")

# `sudo -n CMD...` (clocks.sudo): logs ["sudo", *argv] to the fake nvidia-smi's log, refuses as sudo does without a
# NOPASSWD rule when the state says "sudo": "password", else runs CMD.
FAKE_SUDO = textwrap.dedent(r"""
    import json, os, sys
    argv = sys.argv[1:]
    with open(os.environ["FAKE_NVSMI_LOG"], "a") as f:
        f.write(json.dumps(["sudo", *argv]) + "\n")
    if argv[:1] != ["-n"]:
        sys.exit("fake sudo: only non-interactive calls (-n) are expected")
    with open(os.environ["FAKE_NVSMI_STATE"]) as f:
        st = json.load(f)
    if st.get("sudo") == "password":
        print("sudo: a password is required", file=sys.stderr)
        sys.exit(1)
    os.execv(argv[1], argv[1:])
""")

# For the fake nsys and ncu: a real tool runs for seconds, while the fake nvidia-smi's read-back loop (if one runs)
# samples the clocks; these fakes wait until it printed two more samples, so the job has read-backs.
WAIT_FOR_SMI_SAMPLES = textwrap.dedent("""
    def wait_for_smi_samples(n=2, timeout=20.0):
        import os, time
        state = os.environ.get("FAKE_NVSMI_STATE")
        if not state or not os.path.isdir(state + ".clients") or not os.listdir(state + ".clients"):
            return
        def count():
            try:
                with open(state + ".samples") as f:
                    return len(f.read().splitlines())
            except FileNotFoundError:
                return 0
        want, t0 = count() + n, time.monotonic()
        while count() < want and time.monotonic() - t0 < timeout:
            time.sleep(0.01)
""")

TEST_SAMPLE_MS = 50  # the clock read-back loop's interval in these tests (clocks.SAMPLE_MS is 500)


def gpu_state(**kw):
    """One fake GPU: an H100 with default application clocks, persistence mode off, not in MIG mode. ``tdp_sm`` is
    what ``-lgc tdp,tdp`` locks to (a made-up value of this fake); ``app_sm="deprecated"`` makes the cell read
    ``[Requested functionality has been deprecated]``, ``invalid_fields`` fail a query as an unknown field does."""
    gpu = {"name": H100, "uuid": "GPU-1234", "idle_sm": 345, "idle_mem": 2619, "max_sm": 1980, "max_mem": 2619,
           "app_sm": 1755, "app_mem": 2619, "supported": {"2619": [1980, 1755, 1500, 1200], "1593": [1500, 1200]},
           "tdp_sm": 1590, "persistence": "Disabled", "mig": "Disabled", "reasons": "0x0000000000000000",
           "locked_sm": None, "locked_mem": None}
    gpu.update(kw)
    return gpu


class FakeSmi:
    def __init__(self, root: Path):
        self.bin = root / "fake bin"
        self.bin.mkdir(parents=True)
        write_tool(self.bin, "nvidia-smi", FAKE_SMI)
        write_tool(self.bin, "sudo", FAKE_SUDO)
        self.state = root / "fake state.json"
        self.log = root / "fake calls.log"
        self.log.write_text("")
        self.write({"gpus": {"0": gpu_state()}})

    def write(self, state: dict) -> None:
        tmp = self.state.with_name(self.state.name + ".test-tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state)  # the fake's loop reads the state while a test changes it

    def read(self) -> dict:
        return json.loads(self.state.read_text())

    def gpu(self, **kw) -> None:
        st = self.read()
        st["gpus"]["0"].update(kw)
        self.write(st)

    def fail(self, flag: str, how: str) -> None:
        st = self.read()
        st.setdefault("fail", {})[flag] = how
        self.write(st)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def clear(self) -> None:
        self.log.write_text("")

    def samples(self) -> int:
        """How many sample lines the loop processes (``-lms``) printed so far."""
        path = Path(str(self.state) + ".samples")
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_samples(self, n: int = 2, timeout: float = 20.0) -> None:
        """Wait until the loop printed ``n`` more samples (a job that runs a while under the read-back loop)."""
        import time

        want, t0 = self.samples() + n, time.monotonic()
        while self.samples() < want:
            assert time.monotonic() - t0 < timeout, "the fake nvidia-smi loop printed no samples"
            time.sleep(0.01)

    def clients(self) -> list[str]:
        """The live loop processes (``<gpu>.<pid>``)."""
        folder = Path(str(self.state) + ".clients")
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []

    def env(self) -> dict:
        return {"FAKE_NVSMI_STATE": str(self.state), "FAKE_NVSMI_LOG": str(self.log),
                "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}


def install_fake_smi(tmp_path: Path, monkeypatch) -> FakeSmi:
    """The fake nvidia-smi first on PATH (in a folder with a space) for this test, no CUDA_VISIBLE_DEVICES, and
    the clock read-back loop sampling every :data:`TEST_SAMPLE_MS` ms."""
    from operator_profiler.capture import clocks

    fake = FakeSmi(tmp_path / "with space")
    for k, v in fake.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(clocks, "SAMPLE_MS", TEST_SAMPLE_MS)
    return fake


FORMAT = "--format=csv,noheader,nounits"
QUERY = ["-i", "0", "--query-gpu=" + ",".join(GPU_FIELDS), FORMAT]
SUPPORTED = ["-i", "0", "--query-supported-clocks=memory,graphics", FORMAT]
DEFAULT_APP = ["-i", "0", "--query-gpu=" + ",".join(DEFAULT_APP_FIELDS), FORMAT]
SAMPLER = ["-i", "0", "--query-gpu=" + ",".join(SAMPLE_FIELDS), FORMAT, "-lms", str(TEST_SAMPLE_MS)]
LEGACY_SAMPLER = ["-i", "0", "--query-gpu=" + ",".join((*SAMPLE_FIELDS[:-1], "clocks_throttle_reasons.active")), FORMAT,
                  "-lms", str(TEST_SAMPLE_MS)]


def clock_target(policy="base", sm=1755, mem=2619, **kw):
    return {"policy": policy, "device": "cuda", "gpu": H100, "gpu_index": "0", "gpu_uuid": "GPU-1234",
            "sm_mhz": sm, "mem_mhz": mem, "reason": f"policy {policy}", **kw}


def lock_calls(sm, mem):
    """The calls of locked_clocks up to the job: the GPU query, the read-back loop (started first: it holds the GPU
    while the clocks are locked), the locks."""
    return [QUERY, SAMPLER, ["-i", "0", "-lgc", f"{sm},{sm}"], ["-i", "0", "-lmc", f"{mem},{mem}"]]


RESTORE = [["-i", "0", "-rgc"], ["-i", "0", "-rmc"]]


REAL_CSV = ("ncu", "a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv")
#: Real ``ncu --query-metrics-mode suffix`` output (ncu 2024.1.1, tests/data/ncu-2024.1.1/PROVENANCE.md).
NCU_QUERY = Path(__file__).resolve().parent / "data" / "ncu-2024.1.1"
NCU_QUERY_GH100 = NCU_QUERY / "suffix-catalog-bases.gh100.txt.gz"
NCU_QUERY_GA100 = NCU_QUERY / "suffix-catalog-bases.ga100.txt.gz"

FAKE_NCU = WAIT_FOR_SMI_SAMPLES + r'''
import json, os, sys
argv = sys.argv[1:]
if argv in (["--help"], ["--list-chips"]):  # the REAL texts of ncu 2024.1.1 (tests/data/ncu-2024.1.1)
    import gzip
    folder = os.path.dirname(os.environ["FAKE_NCU_QUERY"])
    if argv == ["--help"]:
        sys.stdout.write(gzip.open(os.path.join(folder, "help.txt.gz"), "rt").read())
    else:
        sys.stdout.write(open(os.path.join(folder, "list-chips.txt")).read())
    sys.exit(0)
if argv == ["--version"]:  # as ncu 2025.1 prints it (not logged: it is no collection or export)
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\n"
          "Version 2025.1.1.0 (build 35528883) (public-release)")
    sys.exit(0)
with open(os.environ["FAKE_NCU_LOG"], "a") as fh:
    fh.write(json.dumps(argv) + "\n")
def opt(name):
    return argv[argv.index(name) + 1]
if "--query-metrics-mode" in argv or "--query-metrics" in argv:  # the REAL output of ncu 2024.1.1 for a chip
    import gzip
    if not os.environ.get("FAKE_NCU_QUERY") or ("--devices" in argv and os.environ.get("FAKE_NCU_QUERY_DEVICE") == "fail"):
        print("==ERROR== Driver could not be loaded.")  # what the real ncu 2024.1.1 prints without a driver
        sys.exit(1)
    sys.stdout.write(gzip.open(os.environ["FAKE_NCU_QUERY"], "rt").read())
    sys.exit(0)
if "-i" in argv:  # ncu -i REPORT --csv --page raw ...: print the raw page
    report = json.load(open(opt("-i")))
    data = json.load(open(os.environ["FAKE_NCU_DATA"]))
    ident = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
             "Grid Size", "Device", "CC"]
    metrics = [m for m, _ in data["metrics"]]
    q = lambda row: ",".join('"%s"' % c for c in row)
    print(q(ident + metrics))
    print(q([""] * len(ident) + [u for _, u in data["metrics"]]))
    for i, (name, grid, block) in enumerate(report["launches"]):
        values = data["values"][i % len(data["values"])]
        print(q([str(i), str(report["pid"]), "python3", "host", name, "1", "7", block, grid, "0", "9.0"] + values))
    sys.exit(0)
if os.environ.get("FAKE_NCU_FAIL") == "perm":
    print("==PROF== Connected to process 4711 (python3)")
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
          "Counters on the target device 0.")
    sys.exit(1)
wait_for_smi_samples()
requested = opt("--metrics").split(",") if "--metrics" in argv else []
refuse = [m for m in os.environ.get("FAKE_NCU_REFUSE", "").split(",") if m and m in requested]
if os.environ.get("FAKE_NCU_FAIL") == "dcgm":  # real ncu text (docs/formats.md#ncu-errors); exit status assumed
    print("==PROF== Connected to process 4711 (python3)")
    print("==ERROR== An error was reported by the driver")
    print("==ERROR== Profiling failed because a driver resource was unavailable. Ensure that no other tool (like "
          "DCGM) is concurrently collecting profiling data. See https://docs.nvidia.com/nsight-compute/"
          "ProfilingGuide/index.html#faq for more details.")
    print("==WARNING== No kernels were profiled.")
    sys.exit(1)
if refuse and os.environ.get("FAKE_NCU_REFUSE_AS") == "error":  # older ncu: the collection fails
    print("==PROF== Connected to process 4711 (python3)")
    print("==ERROR== Failed to access the following %d metrics: %s" % (len(refuse), ", ".join(refuse)))
    sys.exit(1)
if refuse:  # newer ncu: a warning, and the collection goes on
    print("==WARNING== Unable to access the following %d metrics: %s." % (len(refuse), ", ".join(refuse)))
skip = int(opt("--launch-skip")) if "--launch-skip" in argv else 0
count = int(opt("--launch-count")) if "--launch-count" in argv else 10**9
if "operator_profiler.first_contact_toy" in argv:  # first contact's toy program: ncu's documented filters
    toy = json.load(open(os.environ["FAKE_NCU_TOY"]))
    sequence = toy["window"] + ([] if "--nvtx-include" in argv else toy["after_range"])
    if "--nvtx-include" not in argv and toy.get("skip_counts_launches_before_start"):
        skip = max(0, skip - toy["before"])  # the undocumented case: launches before cudaProfilerStart counted
    launches = [[name, "(1, 1, 1)", "(128, 1, 1)"] for name in sequence][skip:skip + count]
else:
    launches = json.load(open(os.environ["FAKE_NCU_SEQUENCE"]))[skip:skip + count]
n = int(os.environ.get("FAKE_NCU_PID_COUNTER_START", "4711")) + sum(1 for _ in open(os.environ["FAKE_NCU_LOG"]))
print("==PROF== Connected to process %d (python3)" % n)
if not launches:
    print("==WARNING== No kernels were profiled.")
    sys.exit(0)
with open(opt("--export"), "w") as fh:
    json.dump({"launches": launches, "pid": n}, fh)
print("==PROF== Report: " + opt("--export"))
'''


def real_metric_rows(n: int = 4) -> dict:
    """Metric names, units and the values of the first ``n`` results of the real dropout CSV (details page)."""
    rows = list(csv.DictReader(real_file(*REAL_CSV).open()))
    metrics: dict[str, str] = {}
    values: dict[str, dict[str, str]] = {}
    for r in rows:
        if int(r["ID"]) >= n:
            break
        metrics.setdefault(r["Metric Name"], r["Metric Unit"])
        values.setdefault(r["ID"], {})[r["Metric Name"]] = r["Metric Value"].replace(",", "")
    return {"metrics": list(metrics.items()),
            "values": [[values[i].get(m, "") for m in metrics] for i in sorted(values, key=int)]}


class FakeNcu:
    def __init__(self, root: Path, sequence: list[list[str]]):
        self.bin = root / "fake ncu bin"
        self.bin.mkdir(parents=True)
        write_tool(self.bin, "ncu", FAKE_NCU)
        self.log = root / "ncu calls.jsonl"
        self.data = root / "real metric rows.json"
        self.data.write_text(json.dumps(real_metric_rows()))
        self.sequence = root / "launch sequence.json"
        self.set_sequence(sequence)

    def set_sequence(self, sequence: list[list[str]]) -> None:
        self.sequence.write_text(json.dumps(sequence))

    def env(self) -> dict:
        return {"FAKE_NCU_LOG": str(self.log), "FAKE_NCU_DATA": str(self.data),
                "FAKE_NCU_SEQUENCE": str(self.sequence), "FAKE_NCU_QUERY": str(NCU_QUERY_GH100)}

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def collections(self) -> list[list[str]]:
        return [c for c in self.calls() if "-i" not in c and not self._query(c)]

    def queries(self) -> list[list[str]]:
        return [c for c in self.calls() if self._query(c)]

    @staticmethod
    def _query(call: list[str]) -> bool:
        return "--query-metrics-mode" in call or "--query-metrics" in call
