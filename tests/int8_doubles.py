"""A variant builder for the timing worker's int8 tests (imported by name in the worker's process; the tests put
this folder on PYTHONPATH): ``transforms.changes.build_variant`` for the real changes, and the pseudo-change
``flip_top1``: the output's two largest logits swap places at the tenth of the positions where they lie closest,
a deliberately wrong variant that moves few values by little (the gap between the two) and changes the predicted
token there."""

from __future__ import annotations

import torch

from operator_profiler.transforms.changes import build_variant


class Flipped:
    def __init__(self, variant):
        self.variant = variant
        self.checks, self.rewrites = variant.checks, variant.rewrites

    def run(self) -> torch.Tensor:
        out = self.variant.run().clone()
        rows = out.reshape(-1, out.shape[-1])
        top2 = rows.topk(2, dim=-1)
        gaps = top2.values[:, 0] - top2.values[:, 1]
        for index in gaps.argsort()[:max(1, len(rows) // 10)].tolist():
            first, second = top2.indices[index].tolist()
            rows[index, first], rows[index, second] = top2.values[index, 1], top2.values[index, 0]
        return out

    def warm_up(self, n: int = 3) -> None:
        for _ in range(n):
            self.run()


def build(model, inputs, changes, device, mode="infer"):
    real = [c for c in changes if c != "flip_top1"]
    variant = build_variant(model, inputs, real, device, mode=mode)
    return Flipped(variant) if "flip_top1" in changes else variant
