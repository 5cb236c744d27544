"""Training runs: ``LightningCLI`` with this package's defaults, for ``dpot fit | validate | test |
predict``, ``dpot compare`` and scripts.

Every run writes config.yaml and report.json to its log dir, checkpoints atomically, and every
private run has an accountant: the config's ``PrivacyAccountantCallback``, or one attached that
enforces the method's own budget. A ``--config`` file may start from shared fragments
(:func:`~lightning_dpot.config.compose_config`); the command line still wins.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO
from typing_extensions import override

from lightning_dpot.callbacks import LDPPrivacyReport, PrivacyAccountantCallback, RunReport
from lightning_dpot.config import with_composed_configs
from lightning_dpot.plugins import AtomicCheckpointIO
from lightning_dpot.privacy.contract import ReleasesPrivateData

SUBCOMMANDS = ("fit", "validate", "test", "predict")


class DpotCLI(LightningCLI):
    """LightningCLI whose trainer writes checkpoints atomically unless the config names its own
    ``CheckpointIO`` plugin, and accounts every private run: a module that releases private
    data (:class:`~lightning_dpot.privacy.contract.ReleasesPrivateData`) and whose config names
    no accountant gets a ``PrivacyAccountantCallback()``, which enforces the module's own
    ``target_epsilon`` at its release objects' δ (if it has one). Both are added at
    instantiation, so ``config.yaml`` stays as written. A ``--config`` file that names
    ``__base__`` fragments is composed first (:func:`~lightning_dpot.config.compose_config`)."""

    @override
    def parse_arguments(self, parser: Any, args: Any) -> None:
        if isinstance(args, (list, tuple)):
            args = with_composed_configs(args)
        super().parse_arguments(parser, args)

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer_config = self._get(self.config_init, "trainer", default={}) or {}
        plugins = kwargs.pop("plugins", trainer_config.get("plugins")) or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            plugins.append(AtomicCheckpointIO())
        trainer = super().instantiate_trainer(plugins=plugins, **kwargs)
        model = getattr(self, "model", None)
        accounted = any(isinstance(cb, PrivacyAccountantCallback) for cb in trainer.callbacks)
        if isinstance(model, ReleasesPrivateData) and model.is_private and not accounted:
            # Before the checkpoint callbacks (Lightning keeps them last), so that a checkpoint
            # saved at the end of a batch holds the accountant's state after that batch.
            first = next(
                (i for i, cb in enumerate(trainer.callbacks) if isinstance(cb, Checkpoint)),
                len(trainer.callbacks),
            )
            trainer.callbacks.insert(first, PrivacyAccountantCallback())
        return trainer


def run_lightning(args: Sequence[str], run: bool = True) -> LightningCLI:
    """LightningCLI over any module/datamodule; the LDP privacy report and the run report
    (report.json) are attached to every run, after the config's own callbacks, and checkpoints
    are written atomically (:class:`~lightning_dpot.plugins.AtomicCheckpointIO`). ``run=False``
    only builds the model, datamodule and trainer (``args`` then hold no subcommand)."""
    with warnings.catch_warnings():
        # Lightning warns whenever both `args` and a command line exist; ours are the same.
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended")
        return DpotCLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults={"callbacks": [LDPPrivacyReport(), RunReport()]},
            save_config_kwargs={"overwrite": True},
            # Bad arguments raise (one line from `dpot`) instead of printing the whole usage.
            parser_kwargs={"exit_on_error": False}
            | {command: {"exit_on_error": False} for command in SUBCOMMANDS},
            run=run,
            args=list(args),
        )
