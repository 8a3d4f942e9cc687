"""``scripts/gpu-wheels``: which packages travel to the GPU machine as wheels (offline: no pip, no download).

The plan is tested on the real ``pyproject.toml`` and ``envs/gpu-image.txt``, and, for the dependencies of
dependencies, on pip's resolution recorded by ``scripts/gpu-wheels --record tests/data/gpu_wheels_resolution.json``
(CPython 3.12, manylinux x86_64); the download itself needs PyPI and is not run here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "gpu_wheels_resolution.json"


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_wheels", str(ROOT / "scripts" / "gpu-wheels"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_wheels", loader))
    sys.modules["gpu_wheels"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


gw = load_script()


def recorded() -> dict:
    return {name: gw.Node(v["version"], v["requires_dist"]) for name, v in json.loads(RECORDED.read_text()).items()}


def test_image_table_reads_versions_assumptions_and_names():
    image = gw.read_image()
    assert image.versions["numpy"] == "2.5.2" and image.versions["torch"] == "2.11.0"
    assert image.versions["pandas"] is None and image.versions["pyyaml"] is None
    assert "pyarrow" in image.assumed and image.versions["pyarrow"] is None
    assert "huggingface-hub" in image.versions  # names are canonical (huggingface_hub in pip list)
    assert "nvtx" not in image.versions  # the image has nvidia-nvtx (CUDA's library), not the nvtx package


def test_direct_dependencies_from_pyproject():
    deps = gw.project_dependencies()
    decisions, missing = gw.plan(deps, gw.read_image())
    names = {gw.canonical(gw.Requirement(d).name) for d in deps}
    assert set(decisions) == names  # nothing resolved: only the direct dependencies are decided
    # what is to be carried is what pip must resolve next
    assert {gw.canonical(r.name) for r in missing} == {n for n, d in decisions.items() if d.action == "carry"}
    assert decisions["torch"].action == "never"
    assert decisions["pandas"].action == "carry" and ">=3.0" in decisions["pandas"].why  # image's version unknown
    assert decisions["pyarrow"].action == "image" and "assumed" in decisions["pyarrow"].why
    for name in ("snakemake", "nvtx", "plotly", "msgspec", "orjson", "adbc-driver-sqlite"):
        assert decisions[name].action == "carry" and decisions[name].why == "not in the image"
    # in the image at an unknown version, but constrained by us: carried
    assert decisions["pyyaml"].action == "carry" and decisions["pygments"].action == "carry"


def test_recorded_resolution_plan():
    deps = gw.project_dependencies()
    resolved = recorded()
    lacking = {gw.canonical(gw.Requirement(d).name) for d in deps} - set(resolved) - {"torch"}
    assert not lacking, (f"the recorded resolution lacks {sorted(lacking)}: run scripts/gpu-wheels --record "
                         f"{RECORDED.relative_to(ROOT)}")
    decisions, missing = gw.plan(deps, gw.read_image(), resolved)
    assert not missing
    carry = {n for n, d in decisions.items() if d.action == "carry"}
    assert all(decisions[n].version == resolved[n].version for n in carry)
    assert not any(gw.never_carried(n) for n in carry)
    assert decisions["pulp"].action == "leave"
    # numpy: the image's 2.5.2 meets every constraint of the carried packages on it
    assert decisions["numpy"].action == "image" and decisions["numpy"].version == "2.5.2"
    assert decisions["numpy"].specs and all(gw.accepts(gw.SpecifierSet(s), "2.5.2") for _, s in decisions["numpy"].specs)
    # snakemake needs packaging <26, and the image's version is unknown: ours travels
    assert decisions["packaging"].action == "carry" and "<26" in decisions["packaging"].why
    # source archive only: built as a pure-Python wheel
    assert "connection-pool" in carry and set(gw.SDIST_ONLY) <= carry
    # everything the resolution holds is decided, except what only packages from the image need
    assert set(decisions) <= set(resolved) | {"torch"}


def test_image_package_brings_no_dependencies_and_a_carried_one_can_overrule_the_image():
    image = gw.Image(versions={"libimg": "1.0", "numpy": "2.5.2", "known": "1.0", "vague": None})
    resolved = {
        "ours": gw.Node("2.0", ["libimg>=0.5", "numpy>=2.6", "vague", 'old-py; python_version < "3.12"',
                                'extra-dep; extra == "fast"', "known>=1"]),
        "libimg": gw.Node("1.0", ["only-for-libimg"]),
        "numpy": gw.Node("2.6.0", []),
        "vague": gw.Node("3.0", []),
        "known": gw.Node("1.0", []),
        "extra-dep": gw.Node("1.0", []),
        "only-for-libimg": gw.Node("1.0", []),
        "old-py": gw.Node("1.0", []),
    }
    decisions, missing = gw.plan(["ours>=2", "vague>=2"], image, resolved)
    assert not missing
    assert decisions["ours"].action == "carry" and decisions["ours"].version == "2.0"
    assert decisions["libimg"].action == "image"
    assert "only-for-libimg" not in decisions  # the image's package brings its own dependencies
    assert decisions["numpy"].action == "carry" and "the image has 2.5.2; ours needs >=2.6" in decisions["numpy"].why
    assert decisions["vague"].action == "carry"  # unknown version, constrained (>=2) by pyproject
    assert decisions["known"].action == "image"
    assert "old-py" not in decisions  # markers are Python 3.12's
    assert "extra-dep" not in decisions
    decisions, _ = gw.plan(["ours[fast]>=2"], image, resolved)
    assert decisions["extra-dep"].action == "carry"


def test_unresolved_carried_package_is_reported_for_another_resolution():
    decisions, missing = gw.plan(["ours"], gw.Image(), {"ours": gw.Node("1", ["later>=2"])})
    assert decisions["later"].action == "carry" and decisions["later"].version is None
    assert [str(r) for r in missing] == ["later>=2"]


def test_summary_table_total_and_refusal(tmp_path):
    decisions = {"big": gw.Decision("big", "carry", "not in the image", "1.0"),
                 "small": gw.Decision("small", "carry", "not in the image", "2.0"),
                 "torch": gw.Decision("torch", "never", "never carried", "2.11.0")}
    wheels = {}
    for name, size in (("big", 3 * gw.MIB), ("small", gw.MIB // 2)):
        wheels[name] = tmp_path / f"{name}-1.0-py3-none-any.whl"
        wheels[name].write_bytes(b"\0" * size)
    lines, refusal = gw.summarize(decisions, wheels, 4.0, ".whl", 2 * gw.MIB)
    assert refusal is None
    assert lines[2].split()[:3] == ["big", "1.0", "3.00"] and lines[3].split()[:3] == ["small", "2.0", "0.50"]
    assert "torch" in lines[5] and "never" in lines[5]
    assert lines[-1] == ("total: 2 wheels, 3.50 MiB (limit 4 MiB); with the repository's travelling files "
                         "(2.00 MiB): 5.50 of 64 MiB")
    _, refusal = gw.summarize(decisions, wheels, 3.0, ".whl", None)
    assert refusal == "the wheels take 3.50 MiB, over the limit of 3 MiB (--limit-mib)"


def test_check_reports_missing_and_unmet_and_notes_torch():
    problems, notes, n = gw.check(["packaging<1", "no-such-package-opprof", "torch==0.0.1; sys_platform != 'x'"])
    assert any(p.startswith("packaging ") and "pyproject needs <1" in p for p in problems)
    assert "no-such-package-opprof: missing (pyproject needs it)" in problems
    if any(line.startswith("torch ") for line in notes):  # torch installed: its pin is a note, never a failure
        assert not any(p.startswith("torch") for p in problems)
    assert n >= 3


def test_stub_wheel_names_and_version(tmp_path):
    gw.stub_wheel(tmp_path, "typing-extensions", "4.16.0")
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name == "typing_extensions-4.16.0-py3-none-any.whl"
    assert gw.wheel_name(wheel) == ("typing-extensions", "4.16.0")


def test_gpu_command_in_docs():
    """docs/gpu.md's prepared command begins with the install prefix and fits the device tool (2000 chars)."""
    text = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- gpu-run-command -->\s*```bash\n(.*?)\n```\s*<!-- /gpu-run-command -->", text, re.S)
    assert block, "docs/gpu.md lacks the gpu-run-command block"
    command = block.group(1).strip()
    assert "\n" not in command and len(command) <= 2000
    assert command.startswith(("set -o pipefail; " + gw.GPU_PREFIX, gw.GPU_PREFIX))
    import subprocess
    import sys

    usage = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"), "--help"], capture_output=True,
                           text=True, check=True).stdout
    known = set(re.findall(r"--[a-z][\w-]+", usage.split("options:")[-1]))
    assert {"--first-contact", "--workdir", "--budget-s", "--small"} <= known
    for option in re.findall(r"scripts/gpu-check ([^;|}]*)", command):
        assert set(re.findall(r"--[\w-]+", option)) <= known, option
    assert "scripts/gpu-wheels --check" in command
