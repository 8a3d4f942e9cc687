"""Stand-ins for the optimizer's ``build_variant`` and numerics module, which the timing worker imports by name
in its own process (tests put this folder on PYTHONPATH): the timing tests then measure real torch models
without depending on transforms.changes / optimize.numerics.

Changes understood by :func:`build`: ``x4`` runs the forward 4 times per iteration (4x the work, same output),
``unmet`` raises WorkloadError (an unmet precondition: the variant is rejected), ``crash`` raises RuntimeError
while building (a worker failure), ``noisy`` adds 1e-3 to the output (fails the numerics check), ``die`` ends the
process at once without a result (as the kernel's out-of-memory killer would), ``leaky`` sets a process-wide
switch (the float32 matmul precision) and leaves it set, ``slow`` sleeps 120 s while building (a worker to stop
mid-way), ``busy`` makes the process report that other processes kept :data:`BUSY_OTHERS` CPUs busy during its
repetitions (every process; ``busy:0,2``: only processes 0 and 2, the others then report a quiet machine, 0 CPUs,
whatever the machine running the test does), as a machine shared with other jobs would.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import torch

from operator_profiler.errors import WorkloadError

DEFAULT_TOLERANCES = {"float32": {"atol": 1e-5, "rtol": 1e-4}}
#: The load a ``busy`` process reports (CPUs kept busy by other processes): more than any machine's spare CPUs.
BUSY_OTHERS = 64.0


def _process_index() -> int:
    """This worker's process index, from its spec (``timing_worker SPEC.json OUT.json``)."""
    import json
    import sys

    return int(json.loads(open(sys.argv[1]).read()).get("process", 0))


def _report_busy(changes) -> None:
    """``busy`` / ``busy:I,J``: this process's load figure says the machine was busy (module docstring)."""
    wanted = next((c for c in changes if c == "busy" or c.startswith("busy:")), None)
    if wanted is None:
        return
    busy = wanted == "busy" or _process_index() in {int(i) for i in wanted.partition(":")[2].split(",")}
    from operator_profiler.capture import machine

    real = machine.other_cpu_load

    def busy_load(start, threads, min_window_s=None):
        return {**real(start, threads, min_window_s=min_window_s), "other_cpu_load": BUSY_OTHERS if busy else 0.0}

    machine.other_cpu_load = busy_load


class NumericsResult(NamedTuple):
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    reason: str | None


def variant_dtype(changes: list[str]) -> str:
    return "float32"


def compare_outputs(reference, candidate, dtype, tolerances) -> NumericsResult:
    limits = tolerances[dtype]
    diff = (candidate - reference).abs()
    max_abs = float(diff.max())
    max_rel = float((diff / reference.abs().clamp_min(1e-12)).max())
    cosine = float(torch.nn.functional.cosine_similarity(candidate.flatten(), reference.flatten(), dim=0))
    ok = bool(torch.allclose(candidate, reference, atol=limits["atol"], rtol=limits["rtol"]))
    reason = None if ok else f"max abs error {max_abs:.3g} > {limits['atol']}"
    return NumericsResult(max_abs, max_rel, cosine, ok, reason)


class Repeated:
    """A variant that runs ``model`` ``times`` times per iteration."""

    def __init__(self, model, inputs, times: int, offset: float):
        self.model, self.inputs, self.times, self.offset = model, inputs, times, offset

    def run(self):
        for _ in range(self.times):
            out = self.model(*self.inputs)
        return out + self.offset if self.offset else out

    def warm_up(self, n: int) -> None:
        for _ in range(n):
            self.run()


def build(model, inputs, changes, device, mode="infer"):
    _report_busy(changes)
    if "unmet" in changes:
        raise WorkloadError("unmet: this machine lacks the feature")
    if "die" in changes:
        os._exit(3)
    if "slow" in changes:
        time.sleep(120)
    if "leaky" in changes:
        torch.set_float32_matmul_precision("medium")
    if "crash" in changes:
        raise RuntimeError("the build broke")
    return Repeated(model, inputs, 4 if "x4" in changes else 1, 1e-3 if "noisy" in changes else 0.0)




# ------------------------------------------------------------------------------ a miscompile, deterministically

#: torch 2.13's Inductor miscompiles attention with softmax(dim=-2) (pytorch#196468, as reported from the field: max_rel
#: 0.025 compiled at fp32, 0.026 compiled with bf16 autocast). The bug did not reproduce on this project's machine
#: (torch 2.13.0+cpu, AVX2, no avx512_bf16: :func:`attention_softmax_dim_minus2` compiled lay max_rel 1.9e-7 from
#: eager at fp32, and under bf16 autocast 4.1e-3 from eager bf16, itself 6.6e-3 from FP32 eager: correct), so
#: :func:`build_miscompiling`'s ``compile`` stands in for it deterministically: the output scaled by 1 + MISCOMPILE,
#: i.e. max_rel 0.025 against whatever it is compared with, in any dtype, on any CPU.
MISCOMPILE = 0.025


class SoftmaxOverQueries(torch.nn.Module):
    """Single-head attention whose softmax runs over dim -2 (the queries), the pattern of pytorch#196468."""

    def __init__(self, d_model: int):
        super().__init__()
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)
        self.scale = d_model ** -0.5

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-2)
        return self.out(weights @ v)


def attention_softmax_dim_minus2(d_model: int = 32, seq_len: int = 8, batch_size: int = 2):
    """A custom workload factory: (:class:`SoftmaxOverQueries`, (x,)), x of shape (batch_size, seq_len, d_model)."""
    return SoftmaxOverQueries(d_model), (torch.randn(batch_size, seq_len, d_model),)


class Miscompiled:
    """The model run eagerly (under CPU bf16 autocast with ``bf16_autocast``, as transforms.changes applies it), its
    output scaled by ``scale`` in float32 (1: unchanged)."""

    def __init__(self, model, inputs, autocast: bool, scale: float):
        self.model, self.inputs, self.autocast, self.scale = model, inputs, autocast, scale

    def run(self):
        with torch.autocast("cpu", torch.bfloat16, enabled=self.autocast):
            out = self.model(*self.inputs)
        return out.float() * self.scale if self.scale != 1.0 else out

    def warm_up(self, n: int) -> None:
        for _ in range(n):
            self.run()


def build_miscompiling(model, inputs, changes, device, mode="infer"):
    """A variant builder with the real changes' ids whose ``compile`` miscompiles (:data:`MISCOMPILE`) and whose
    ``bf16_autocast`` is real CPU autocast (whatever the CPU: no native-bf16 precondition); every other change
    (``max_autotune``, ``freezing``, ``sdpa_rewrite``) leaves the model as it is, i.e. is exact."""
    return Miscompiled(model, inputs, "bf16_autocast" in changes, 1.0 + MISCOMPILE if "compile" in changes else 1.0)
