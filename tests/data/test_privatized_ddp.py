"""Two CPU processes under DDP train on one and the same cached release."""

import json

import lightning as L
from lightning.pytorch.callbacks import Callback

from lightning_dpot.data import HalfCircle, PrivatizedDataModule
from lightning_dpot.data.release import tensor_sha256
from lightning_dpot.methods import EntropicWGAN
from lightning_dpot.nn import MLPGenerator


class _RecordRelease(Callback):
    def __init__(self, out_dir):
        self.out_dir = out_dir

    def on_train_start(self, trainer, pl_module):
        digest = tensor_sha256(trainer.datamodule.release)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(digest))


def test_ddp_ranks_load_the_same_release(tmp_path):
    # Secret seed: two ranks privatizing independently would produce different releases.
    dm = PrivatizedDataModule(
        HalfCircle(n=400, n_test=20),
        "gaussian",
        epsilon=5.0,
        delta=1e-4,
        batch_size=50,
        cache_dir=str(tmp_path / "cache"),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_RecordRelease(tmp_path)],
    )
    trainer.fit(EntropicWGAN(MLPGenerator(2, (2,), (16,))), dm)
    digests = {json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert len(digests) == 1
    assert len(list((tmp_path / "cache").glob("release-*.pt"))) == 1
