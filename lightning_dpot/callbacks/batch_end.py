"""Work at the end of a training batch that must follow every callback's ``on_train_batch_end``.

Lightning calls the callbacks' hooks in list order, and a callback may end training or trigger
an output in its own hook (``EarlyStopping`` or a ``Timer`` setting ``should_stop``, which makes
the logger write after the batch). What depends on every callback's decision — committing the
release journal before anything derived from the releases leaves the process, closing a
profile's window — runs in an ``AfterBatch`` put last in the trainer's callback list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

__all__ = ["AfterBatch", "put_last"]


class AfterBatch(L.Callback):
    """Calls ``action(trainer, pl_module, batch_idx)`` in its ``on_train_batch_end``; no state."""

    def __init__(self, action: Callable[[L.Trainer, L.LightningModule, int], None]) -> None:
        self.action = action

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        self.action(trainer, pl_module, idx)


def put_last(trainer: L.Trainer, callback: AfterBatch) -> None:
    """Make ``callback`` the trainer's last callback (call it from a hook such as ``setup``:
    the list is rebound, so the hook being dispatched finishes over the old one)."""
    trainer.callbacks = [*(c for c in trainer.callbacks if c is not callback), callback]
