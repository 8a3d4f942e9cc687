"""Stand-ins for the optimizer's ``build_variant`` and numerics module, which the timing worker imports by name
in its own process (tests put this folder on PYTHONPATH): the timing tests then measure real torch models
without depending on optimize.changes / optimize.numerics.

Changes understood by :func:`build`: ``x4`` runs the forward 4 times per iteration (4x the work, same output),
``unmet`` raises WorkloadError (an unmet precondition: the variant is rejected), ``crash`` raises RuntimeError
while building (a worker failure), ``noisy`` adds 1e-3 to the output (fails the numerics check), ``die`` ends the
process at once without a result (as the kernel's out-of-memory killer would), ``leaky`` sets a process-wide
switch (the float32 matmul precision) and leaves it set, ``slow`` sleeps 120 s while building (a worker to stop
mid-way).
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import torch

from operator_profiler.errors import WorkloadError

DEFAULT_TOLERANCES = {"float32": {"atol": 1e-5, "rtol": 1e-4}}


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



