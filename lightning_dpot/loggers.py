"""Weights & Biases logging, offline by default, one directory per run; files of a run as W&B
artifacts (``ArtifactLogger``)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override


def wandb_online_from_env() -> bool:
    """``DPOT_WANDB_ONLINE=1`` (or ``true``/``yes``) turns online logging on."""
    return os.environ.get("DPOT_WANDB_ONLINE", "").strip().lower() in ("1", "true", "yes")


#: The run directories this process made (``WandbRunLogger``), for ``discard_refused_runs``.
RUN_DIRS_MADE: list[Path] = []
#: What a run directory holds before it explains anything: the W&B folder and the config.
_BOOKKEEPING = ("wandb", "config.yaml", "hparams.yaml")


def discard_refused_runs(since: int) -> list[Path]:
    """Remove the run directories made since ``RUN_DIRS_MADE[since]`` that hold nothing but
    the W&B folder and the config: a fit refused before it trained or released anything leaves
    no folder behind. A directory with anything else (a release journal, a report, a
    checkpoint) is kept: it records what happened. Returns the removed directories."""
    made = RUN_DIRS_MADE[since:]
    del RUN_DIRS_MADE[since:]
    if not made:  # refused before any logger started: nothing to close or remove
        return []
    import shutil

    import wandb

    if wandb.run is not None:
        wandb.run.finish(exit_code=1, quiet=True)  # its files are closed before removal
    removed = []
    for run_dir in made:
        if run_dir.is_dir() and all(p.name in _BOOKKEEPING for p in run_dir.iterdir()):
            shutil.rmtree(run_dir, ignore_errors=True)
            removed.append(run_dir)
            if not any(run_dir.parent.iterdir()):  # runs/ itself, left empty
                run_dir.parent.rmdir()
    return removed


@runtime_checkable
class ArtifactLogger(Protocol):
    """A logger that keeps files of a run as one versioned artifact (W&B artifacts)."""

    def log_files(self, name: str, artifact_type: str, paths: Sequence[str | Path]) -> None: ...


class WandbRunLogger(WandbLogger):
    """``WandbLogger`` that runs offline unless ``online=True`` or ``DPOT_WANDB_ONLINE=1``, and
    gives each run its own directory ``<save_dir>/<name>-<time>-<id>`` (which becomes the
    trainer's ``log_dir``: config.yaml, report.json, plots and samples land there, and ``dpot
    fit`` writes the checkpoints to its ``checkpoints/``). The directory is made when the run
    starts logging, so a run refused before it starts (a bad value) leaves nothing behind. The
    W&B run ends with the fit (``finalize``): a second fit in the same process gets a run,
    and a directory, of its own instead of Lightning's reuse of the W&B run in progress."""

    def __init__(
        self,
        name: str | None = None,
        project: str = "lightning_dpot",
        save_dir: str = "runs",
        online: bool | None = None,
        **kwargs,
    ) -> None:
        online = wandb_online_from_env() if online is None else online
        name = name or "run"  # `dpot fit` names an unnamed run after its method and data
        run_dir = Path(save_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        super().__init__(
            name=name, project=project, save_dir=str(run_dir), offline=not online, **kwargs
        )
        # Lightning always passes W&B an `anonymous` setting, which W&B ignores and warns about.
        self._wandb_init.pop("anonymous", None)
        # Absolute: a W&B service started by another process (another working directory) writes
        # part of the run, and would resolve a relative folder against its own.
        self._wandb_init["dir"] = os.path.abspath(run_dir)

    @property
    @override
    @rank_zero_experiment
    def experiment(self) -> Any:
        if not Path(self.save_dir).exists():
            RUN_DIRS_MADE.append(Path(self.save_dir))
        Path(self.save_dir).mkdir(parents=True, exist_ok=True)
        return super().experiment

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self._experiment is not None:  # kept, finished: its id and name stay readable
            self._experiment.finish(exit_code=0 if status == "success" else 1)

    @rank_zero_only
    def log_files(self, name: str, artifact_type: str, paths: Sequence[str | Path]) -> None:
        """Log ``paths`` as the artifact ``<name>-<run id>`` of type ``artifact_type``. W&B
        copies each file to its staging folder (``$WANDB_DATA_DIR``); offline, the artifact is
        recorded in the run's log, ``<save_dir>/wandb/offline-run-*/run-*.wandb``, and
        ``wandb sync`` uploads it."""
        import wandb

        artifact = wandb.Artifact(f"{name}-{self.experiment.id}", type=artifact_type)
        for path in paths:
            artifact.add_file(str(path))
        self.experiment.log_artifact(artifact)
