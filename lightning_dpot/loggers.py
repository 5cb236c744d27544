"""Weights & Biases logging, offline by default, one directory per run."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from typing_extensions import override


def wandb_online_from_env() -> bool:
    """``DPOT_WANDB_ONLINE=1`` (or ``true``/``yes``) turns online logging on."""
    return os.environ.get("DPOT_WANDB_ONLINE", "").strip().lower() in ("1", "true", "yes")


class WandbRunLogger(WandbLogger):
    """``WandbLogger`` that runs offline unless ``online=True`` or ``DPOT_WANDB_ONLINE=1``, and
    gives each run its own directory ``<save_dir>/<name>-<time>-<id>`` (which becomes the
    trainer's ``log_dir``: config.yaml, report.json, plots and samples land there). The
    directory is made when the run starts logging, so a run refused before it starts (a bad
    value) leaves nothing behind."""

    def __init__(
        self,
        name: str = "run",
        project: str = "lightning_dpot",
        save_dir: str = "runs",
        online: bool | None = None,
        **kwargs,
    ) -> None:
        online = wandb_online_from_env() if online is None else online
        run_dir = Path(save_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        super().__init__(
            name=name, project=project, save_dir=str(run_dir), offline=not online, **kwargs
        )

    @property
    @override
    @rank_zero_experiment
    def experiment(self) -> Any:
        Path(self.save_dir).mkdir(parents=True, exist_ok=True)
        return super().experiment
