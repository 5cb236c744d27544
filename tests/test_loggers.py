"""WandbRunLogger: offline, one directory and one W&B run per fit, also for several fits in one
process (Lightning's WandbLogger would log a second fit into the W&B run still in progress)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_dpot.loggers import WandbRunLogger


def test_each_fit_in_one_process_gets_a_wandb_run_and_a_directory_of_its_own(tmp_path):
    import wandb

    runs = []
    for name in ("first", "second"):
        logger = WandbRunLogger(name=name, save_dir=str(tmp_path / "runs"))
        trainer = L.Trainer(
            max_steps=2,
            logger=logger,
            limit_val_batches=0,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(BoringModel())
        runs.append((Path(logger.save_dir), logger.version))
        assert wandb.run is None  # ended with the fit
    (first, first_id), (second, second_id) = runs
    assert first != second and first_id != second_id
    for run_dir, run_id in runs:
        (offline,) = (run_dir / "wandb").glob("offline-run-*")
        assert offline.name.endswith(run_id)
