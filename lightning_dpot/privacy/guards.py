"""Guards a private fit runs before and around its releases: a one-shot release that would go
unaccounted, a run with no accountant, a changing accumulation factor, and the planned number of
releases that noise is calibrated for."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = [
    "check_fixed_accumulation",
    "check_release_before_training",
    "planned_releases",
    "warn_if_unaccounted",
]


def check_release_before_training(module: Any) -> None:
    """Before a module releases once in ``on_fit_start`` (DPSWflow, DP-MERF): refuse a fit whose
    release would not be accounted — one that
    trains no batch (``max_steps``/``max_epochs``/``limit_train_batches`` 0: the accountant
    composes and reports from the training hooks), or a strategy that restores a checkpoint
    after ``on_fit_start`` (FSDP, DeepSpeed: the release would be drawn before the checkpoint
    that already holds one is read).

    Raises:
        ValueError: naming the setting, before any noise is drawn.
    """
    trainer = module.trainer
    name = type(module).__name__
    if 0 in (trainer.max_steps, trainer.max_epochs, trainer.limit_train_batches):
        raise ValueError(
            f"{name} releases once before training, but this fit trains no batch "
            f"(max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs}, "
            f"limit_train_batches={trainer.limit_train_batches}): the release would not be "
            "accounted. Train at least one batch"
        )
    if trainer.ckpt_path is not None and trainer.strategy.restore_checkpoint_after_setup:
        raise ValueError(
            f"{name} cannot resume under {type(trainer.strategy).__name__}: it restores the "
            "checkpoint after the fit starts, so the release the checkpoint holds would be drawn "
            "again. Resume with a strategy that restores before setup (e.g. ddp, auto)"
        )


def warn_if_unaccounted(module: Any) -> None:
    """Warn when a private module trains with no accountant among the trainer's callbacks
    (``dpot fit`` always attaches one; the Python API does not)."""
    trainer = module.trainer
    accounted = any(getattr(cb, "composes_privacy_events", False) for cb in trainer.callbacks)
    if module.is_private and not accounted:
        warnings.warn(
            f"{type(module).__name__} releases private data but no PrivacyAccountantCallback is "
            "attached: nothing composes its privacy events, so no epsilon is reported and no "
            "budget is enforced",
            UserWarning,
            stacklevel=2,
        )


def check_fixed_accumulation(trainer: Any) -> None:
    """Refuse a ``GradientAccumulationScheduler``: it changes ``accumulate_grad_batches`` (the
    releases per optimizer step) between epochs, after the noise was calibrated and the budget's
    look-ahead planned for the factor in force at the start."""
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    if any(isinstance(cb, GradientAccumulationScheduler) for cb in trainer.callbacks):
        raise ValueError(
            "GradientAccumulationScheduler changes accumulate_grad_batches during training, so "
            "the releases per optimizer step that target_epsilon was planned for would change: "
            "use a fixed Trainer(accumulate_grad_batches=k) for a private run with a target"
        )


def planned_releases(trainer: Any, steps_per_epoch: int) -> int:
    """Training batches of the run, one release each: the first limit Lightning reaches of
    ``max_steps`` (optimizer steps × accumulation) and ``max_epochs × steps_per_epoch``.

    Raises:
        ValueError: without a finite training length, or with a
            ``GradientAccumulationScheduler`` (``check_fixed_accumulation``).
    """
    check_fixed_accumulation(trainer)
    limits = []
    if trainer.max_steps is not None and trainer.max_steps > 0:
        limits.append(int(trainer.max_steps) * int(trainer.accumulate_grad_batches))
    if trainer.max_epochs is not None and trainer.max_epochs >= 0:
        limits.append(int(trainer.max_epochs) * steps_per_epoch)
    if not limits:
        raise ValueError(
            "target_epsilon needs a finite training length to calibrate σ: set trainer.max_steps "
            "or trainer.max_epochs"
        )
    return min(limits)
