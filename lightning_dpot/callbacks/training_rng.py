"""The random draws of the training steps as one stream that checkpoints carry.

A generator method draws each step's latents z and labels from torch's global generator
(``sample_latent``, ``sample_labels``). Lightning does not save that
generator in a checkpoint, and a resumed process seeds it afresh (``seed_everything``): its
steps would draw the first steps' latents again, so the weights would leave those of the
uninterrupted run. ``TrainingRngStream`` keeps the state of the global generators that the
training steps use (the CPU one and that of the module's CUDA device) apart from the rest of the
process and saves it in every checkpoint, so a resumed run draws what the uninterrupted run
would have drawn: with the same public noise and sampling seeds, the same weights, bit for bit.

Before every training batch the stream's state is put into the global generators (the first
batch of a new run starts the stream from their state then: the run's ``seed_everything``);
after the batch the stream's state is kept and the one from before the batch put back. What
runs between batches (a data loader's new iterator at each epoch, validation, sample callbacks)
thus neither takes from the stream nor depends on it. The stream is not a source of privacy
noise: the release objects draw theirs from their own sources (``docs/secure_noise.md``).

Use it only with a method whose steps draw a fixed number of values from the global
generators (DP-Sinkhorn draws ``num_cross`` latents and labels whatever the batch): the saved
state tells how many values were drawn, so a method drawing one latent per real record of a
Poisson batch would write the sum of its secret batch sizes into every checkpoint.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["TrainingRngStream"]


def _states(device: torch.device) -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def _set_states(states: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


class TrainingRngStream(Callback):
    """Keeps the global generators' state of the training steps in checkpoints (module
    docstring): a resumed run continues the stream of latents and labels where the checkpoint
    left it. Single-device runs (under DDP every rank would need its own stream), and methods
    whose steps draw a fixed number of values (module docstring)."""

    def __init__(self) -> None:
        self._stream: dict[str, torch.Tensor] | None = None  # between batches
        self._outside: dict[str, torch.Tensor] | None = None  # during a batch
        self._device = torch.device("cpu")

    @property
    def state_key(self) -> str:
        return "TrainingRngStream"

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._device = pl_module.device
        self._outside = _states(self._device)
        if self._stream is not None:
            _set_states(self._stream, self._device)

    @override
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._leave_batch()

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._leave_batch()

    def _leave_batch(self) -> None:
        if self._outside is not None:
            self._stream = _states(self._device)
            _set_states(self._outside, self._device)
            self._outside = None

    @override
    def state_dict(self) -> dict[str, Any]:
        """The stream's state (its current one, when a checkpoint is written inside a batch)."""
        stream = _states(self._device) if self._outside is not None else self._stream
        return {} if stream is None else {"stream": {k: v.clone() for k, v in stream.items()}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        stream = state_dict.get("stream")
        self._stream = None if stream is None else {k: v.clone() for k, v in stream.items()}
