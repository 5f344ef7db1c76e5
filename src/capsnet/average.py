"""An exponential moving average of a model's weights, as both training loops keep it (``TrainConfig.ema_decay``).

With ``ema_decay`` > 0, ``capsnet.train.fit`` (the whole model) and
``capsnet.gan.fit_gan`` (the generator) update ``WeightAverage`` after every
optimizer step, evaluate the average, and save it as the model's weights in
``best.safetensors`` and ``last.safetensors``: ``eval``, ``figures``,
``export``, ``generate`` and the viewer then use it. Training continues from
the model's own weights, which ``last.safetensors`` keeps beside the
optimizer's state (``with_training_weights``; one extra group of owner
"weights"), so a resume continues both exactly. Training itself is the same
with or without the average. (Polyak averaging; for GANs Yazici et al., "The
unusual effectiveness of averaging in GAN training", ICLR 2019.)
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from .checkpoint import Checkpoint, CheckpointError

__all__ = ["WeightAverage", "applied", "with_training_weights", "training_weights", "without_training_weights",
           "restore_training_weights", "WEIGHTS", "weights_tag"]

_OWNER = "weights"

# which weights of a checkpoint make the model (load_model, --weights): its model entry (for an averaged run, the
# average), or an averaged run's training weights
WEIGHTS = ("saved", "training")


def weights_tag(weights: str) -> str:
    """What a default output name made from ``weights`` carries, so a file made from an averaged run's training
    weights never replaces the average's: "-training-weights", or "" for the saved weights."""
    return "-training-weights" if weights == "training" else ""


class WeightAverage:
    """An exponential moving average of a module's floating-point weights and buffers.

    ``update(t)``, after optimizer step t (0, 1, ...), moves the average
    toward the weights by 1 - min(decay, (1 + t) / (10 + t)): TensorFlow's
    ``ExponentialMovingAverage`` warm-up, so that early in a run (or in a short
    one) the average spans roughly its last tenth instead of reaching back to
    the initial weights. ``applied()`` puts the average into the module for a
    while (evaluation, saving) and the training weights back after. Batch
    norm's running statistics are averaged with the weights (its step count
    is not).
    """

    def __init__(self, module: torch.nn.Module, decay: float) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must lie in (0, 1), got {decay}")
        self.decay = decay
        self.tensors = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
        self.average = [t.detach().clone() for t in self.tensors]

    def update(self, step: int) -> None:
        """Fold the module's weights after optimizer step ``step`` (counted from 0) into the average."""
        weight = 1 - min(self.decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(self.average, [t.detach() for t in self.tensors], weight)

    @contextlib.contextmanager
    def applied(self) -> Iterator[list[torch.Tensor]]:
        """The average in the module's tensors inside the block, its own (training) weights back after; the block
        gets a copy of those training weights (what a checkpoint keeps beside the optimizer's state)."""
        kept = [t.detach().clone() for t in self.tensors]
        with torch.no_grad():
            torch._foreach_copy_(self.tensors, self.average)
        try:
            yield kept
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.tensors, kept)


def applied(average: WeightAverage | None) -> contextlib.AbstractContextManager:
    """``average.applied()``, or no change without an average (the block then gets None)."""
    return contextlib.nullcontext() if average is None else average.applied()


def with_training_weights(opt_state: dict[str, Any], weights: list[torch.Tensor]) -> dict[str, Any]:
    """An optimizer state dict that also holds ``weights`` (the training weights while the checkpoint's model
    entry holds their average): one index per tensor after the optimizer's own, in a group of owner "weights",
    each with state {"value": tensor}."""
    first = max((i for g in opt_state["param_groups"] for i in g["params"]), default=-1) + 1
    groups = [*opt_state["param_groups"], {"params": list(range(first, first + len(weights))), "owner": _OWNER}]
    state = {**opt_state["state"], **{first + k: {"value": w.detach()} for k, w in enumerate(weights)}}
    return {**opt_state, "state": state, "param_groups": groups}


def training_weights(opt_state: dict[str, Any], where: object = "the checkpoint") -> list[torch.Tensor] | None:
    """The training weights ``with_training_weights`` put in, in order (None: the state holds none); an entry
    missing or not a tensor is a CheckpointError naming ``where`` (a KeyError came out of the CLI before)."""
    groups = [g for g in opt_state["param_groups"] if g.get("owner") == _OWNER]
    if not groups:
        return None
    state = {int(i): s for i, s in opt_state["state"].items()}
    for i in groups[0]["params"]:
        if not isinstance(i, int) or not torch.is_tensor(state.get(i, {}).get("value")):
            raise CheckpointError(f"{where} lacks the training weights' entry optim.{i}.value beside its average: the "
                                  f"file is damaged; use another checkpoint or leave out --weights training")
    return [state[i]["value"] for i in groups[0]["params"]]


def without_training_weights(opt_state: dict[str, Any]) -> dict[str, Any]:
    """The optimizer's own state dict, the training weights' group and entries (if any) left out."""
    ours = {i for g in opt_state["param_groups"] if g.get("owner") == _OWNER for i in g["params"]}
    return {**opt_state, "param_groups": [g for g in opt_state["param_groups"] if g.get("owner") != _OWNER],
            "state": {i: s for i, s in opt_state["state"].items() if int(i) not in ours}}


def restore_training_weights(ckpt: Checkpoint, average: WeightAverage) -> None:
    """Resume an averaged run: the average came in as the model's weights (so ``average`` was made from them); the
    training weights kept beside the optimizer's state go back into the model (a CheckpointError if they are
    missing or misfit)."""
    weights = training_weights(ckpt.optimizer_state, ckpt.path) if ckpt.optimizer_state is not None else None
    if weights is None or len(weights) != len(average.tensors) or any(
            w.shape != t.shape for w, t in zip(weights, average.tensors)):
        raise CheckpointError(f"{ckpt.path} holds no training weights that fit this model beside its average "
                              f"(ema_decay {average.decay}); it was not written by an averaged run of this model: "
                              f"start the run afresh in a new --out")
    for k, (w, t) in enumerate(zip(weights, average.tensors)):  # as load_weights checks the model's own tensors
        kind = "floating point" if t.is_floating_point() else "integer"
        if w.is_floating_point() != t.is_floating_point() or w.dtype == torch.bool:
            raise CheckpointError(f"{ckpt.path} holds training weight {k} as {str(w.dtype).replace('torch.', '')} "
                                  f"where the model has {kind} values: the file is damaged; use another checkpoint")
        if w.is_floating_point() and not torch.isfinite(w).all():
            raise CheckpointError(f"{ckpt.path} holds NaN or infinite values in training weight {k}: the run diverged "
                                  f"or the file is damaged; use another checkpoint")
    with torch.no_grad():
        torch._foreach_copy_(average.tensors, [w.to(t.device, t.dtype) for w, t in zip(weights, average.tensors)])
