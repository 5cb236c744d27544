"""``TrainingRngStream``: the global-generator draws of the training steps continue across a
resume as in the uninterrupted run, and draws between batches do not shift them."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dpot.callbacks import TrainingRngStream


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec).*")
        yield


class DrawsLatents(L.LightningModule):
    """Draws its "latents" from torch's global generator at every step, as generator methods
    do (``sample_latent``), and keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.drawn: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        z = torch.rand(3)
        self.drawn.append(z)
        return (self.weight - z.sum()).pow(2).sum()

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(2, 1)), batch_size=1)  # 2 steps an epoch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class DrawsBetweenBatches(L.Callback):
    """Something outside the steps that draws from the global generator (a sample callback)."""

    def on_train_epoch_start(self, trainer, pl_module):
        torch.rand(5)


class SaveAt(L.Callback):
    def __init__(self, path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def _fit(root, callbacks, steps, ckpt_path=None) -> DrawsLatents:
    L.seed_everything(0, verbose=False)
    module = DrawsLatents()
    L.Trainer(
        default_root_dir=root, max_steps=steps, accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks,
    ).fit(module, ckpt_path=ckpt_path)  # fmt: skip
    return module


@pytest.mark.parametrize("stream", [True, False])
def test_a_resumed_run_draws_what_the_uninterrupted_run_draws_only_with_the_stream(
    tmp_path, stream
):
    def callbacks(*more):
        return [*([TrainingRngStream()] if stream else []), DrawsBetweenBatches(), *more]

    whole = _fit(tmp_path / "whole", callbacks(), 5).drawn
    ckpt = tmp_path / "job1.ckpt"
    first = _fit(tmp_path / "job1", callbacks(SaveAt(ckpt, 3)), 5).drawn  # inside epoch 2
    second = _fit(tmp_path / "job2", callbacks(), 5, ckpt_path=ckpt).drawn
    assert len(first) == 3 and len(second) == 2
    assert all(torch.equal(a, b) for a, b in zip(first, whole, strict=False))
    if stream:
        assert all(torch.equal(a, b) for a, b in zip(second, whole[3:], strict=True))
    else:  # seeded afresh by seed_everything: the second job's latents are other ones
        assert not torch.equal(second[0], whole[3])
