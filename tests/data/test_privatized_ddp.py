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


def _two_rank_trainer(callback: Callback) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )


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
    trainer = _two_rank_trainer(_RecordRelease(tmp_path))
    trainer.fit(EntropicWGAN(MLPGenerator(2, (2,), (16,))), dm)
    digests = {json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert len(digests) == 1
    assert len(list((tmp_path / "cache").glob("release-*.pt"))) == 1


class _RecordBatch(Callback):
    def __init__(self, out_dir):
        self.out_dir = out_dir

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        facts = {
            "rows": int(batch[0].shape[0]),
            "batch": tensor_sha256(batch[0]),
            "release": tensor_sha256(trainer.datamodule.release),
        }
        (self.out_dir / f"batch{trainer.global_rank}.json").write_text(json.dumps(facts))

    def on_train_end(self, trainer, pl_module):
        facts = {"steps": trainer.global_step, "converged": pl_module.last_sinkhorn.converged}
        (self.out_dir / f"end{trainer.global_rank}.json").write_text(json.dumps(facts))


def test_full_batch_ddp_gives_every_rank_the_whole_cached_release(tmp_path):
    # batch_size=None: the full-batch training of Reshetova et al. 2024. Lightning's distributed
    # sampler is left on (the default): each rank must still get all n released records,
    # unshuffled.
    dm = PrivatizedDataModule(
        HalfCircle(n=300, n_test=20),
        "gaussian",
        epsilon=5.0,
        delta=1e-4,
        batch_size=None,
        cache_dir=str(tmp_path / "cache"),
    )
    trainer = _two_rank_trainer(_RecordBatch(tmp_path))
    model = EntropicWGAN(MLPGenerator(2, (2,), (16,)), generated_batch_size=64)
    trainer.fit(model, dm)
    facts = [json.loads((tmp_path / f"batch{r}.json").read_text()) for r in (0, 1)]
    assert facts[0] == facts[1]
    assert facts[0]["rows"] == 300 and facts[0]["batch"] == facts[0]["release"]
    for r in (0, 1):
        assert json.loads((tmp_path / f"end{r}.json").read_text()) == {
            "steps": 2,
            "converged": True,
        }
