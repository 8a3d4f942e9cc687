"""The train step the harness runs for ``mode: train``: forward and loss, backward, optimizer step and
``zero_grad``, each inside a phase range ``opprof.phase:<phase>``, so the profile splits time per phase.
Details: docs/modules.md#capture-training."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Iterator

import torch

from ..errors import WorkloadError
from ..naming import PHASE_PREFIX

#: config ``optimizer`` -> torch.optim class.
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
DEFAULT_OPTIMIZER = "adamw"
DEFAULT_LR = 1e-3


def _tensors(output) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) tuple/list/dict output, in order."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, Mapping):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (tuple, list)):
        for value in output:
            yield from _tensors(value)


def default_loss(output) -> torch.Tensor:
    """The loss of a model output when no ``loss_fn`` is configured (rules in the module docstring).

    Raises:
        WorkloadError: the output holds no floating-point tensor that requires grad (nothing to train:
            a frozen model, an integer output, or an output computed under ``no_grad``).
    """
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    parts = [t.float().square().mean() for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise WorkloadError(
            f"train mode: the model's output ({type(output).__name__}) holds no floating-point tensor that requires "
            "grad, so there is nothing to backpropagate; return a tensor that depends on the parameters, or set "
            "loss_fn: 'module:function' (called with (output, inputs), returning a scalar tensor)")
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def load_loss_fn(spec: str | None) -> Callable | None:
    """The workload's ``loss_fn`` callable, or None for :func:`default_loss`.

    Raises:
        WorkloadError: malformed spec, module not importable, no such callable.
    """
    if not spec:
        return None
    from .workloads import load_factory

    return load_factory(spec, what="loss_fn", key="loss_fn")


def make_optimizer(name: str, parameters, lr: float) -> torch.optim.Optimizer:
    """``torch.optim.<SGD|Adam|AdamW>(parameters, lr=lr)``.

    Raises:
        WorkloadError: unknown name (the config schema prevents it), or no trainable parameter.
    """
    if name not in OPTIMIZERS:
        raise WorkloadError(f"train mode: unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    params = [p for p in parameters if p.requires_grad]
    if not params:
        raise WorkloadError("train mode: the model has no parameter that requires grad, so there is nothing to "
                            "train; profile it with mode: inference")
    return OPTIMIZERS[name](params, lr=lr)


class TrainStep:
    """One train step of ``forward`` (the model, maybe compiled) over ``module``'s parameters.

    ``ranges``: the harness's range emitter (``push(name)``/``pop()``); ``phase`` says which phase runs
    now (for error messages), None between steps.
    """

    def __init__(self, module: torch.nn.Module, forward: Callable, inputs: tuple, workload: dict, ranges):
        self.forward = forward
        self.inputs = inputs
        self.ranges = ranges
        self.optimizer_name = workload.get("optimizer", DEFAULT_OPTIMIZER)
        self.lr = float(workload.get("lr", DEFAULT_LR))
        self.loss_fn_spec = workload.get("loss_fn")
        self.loss_fn = load_loss_fn(self.loss_fn_spec)
        self.optimizer = make_optimizer(self.optimizer_name, module.parameters(), self.lr)
        self.phase: str | None = None

    def describe(self) -> dict:
        """What run.json records about the step."""
        return {"optimizer": self.optimizer_name, "optimizer_class": f"torch.optim.{type(self.optimizer).__name__}",
                "lr": self.lr, "loss": f"loss_fn {self.loss_fn_spec}" if self.loss_fn_spec else "default_loss"}

    def _loss(self, output) -> torch.Tensor:
        if self.loss_fn is None:
            return default_loss(output)
        loss = self.loss_fn(output, self.inputs)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise WorkloadError(f"loss_fn {self.loss_fn_spec!r} returned {type(loss).__name__}"
                                f"{'' if not isinstance(loss, torch.Tensor) else f' of shape {list(loss.shape)}'}; "
                                "it must return a scalar tensor")
        if not loss.requires_grad:
            raise WorkloadError(f"loss_fn {self.loss_fn_spec!r} returned a tensor that does not require grad; "
                                "compute it from the model's output")
        return loss.reshape(())

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.ranges.push(PHASE_PREFIX + phase)

    def __call__(self) -> None:
        self._enter("forward")
        try:
            loss = self._loss(self.forward(*self.inputs))
        finally:
            self.ranges.pop()
        self._enter("backward")
        try:
            loss.backward()
        finally:
            self.ranges.pop()
        self._enter("optimizer")
        try:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        finally:
            self.ranges.pop()
        self.phase = None
