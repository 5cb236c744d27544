"""Training runs: ``LightningCLI`` with this package's defaults, for ``dpot fit | validate | test |
predict``, ``dpot compare`` and scripts.

Every run writes config.yaml and report.json to its log dir and its checkpoints to
``<run dir>/checkpoints/``, atomically, and every private run has an accountant: the config's
``PrivacyAccountantCallback``, or one attached that enforces the method's own budget. Each method
builds its own optimizer from its ``lr`` (and ``optimizer``), so a config holds one learning rate
and no ``optimizer:`` section. A ``--config`` file may start from shared fragments
(``compose_config``); the command line still wins. The dependencies'
messages that say nothing about the run are dropped (``quiet_dependencies``).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO
from typing_extensions import override

from lightning_dpot.callbacks import (
    LDPPrivacyReport,
    PrivacyAccountantCallback,
    RunArtifacts,
    RunReport,
)
from lightning_dpot.config import with_composed_configs
from lightning_dpot.loggers import WandbRunLogger
from lightning_dpot.plugins import AtomicCheckpointIO
from lightning_dpot.privacy.contract import ReleasesPrivateData

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def checkpoints_in_run_dir(trainer: L.Trainer) -> None:
    """Point every ``ModelCheckpoint`` that names no ``dirpath`` at ``<run dir>/checkpoints``
    when the run logs to a ``WandbRunLogger`` (Lightning's default
    would be ``<run dir>/<project>/<W&B run id>/checkpoints``). Under DDP every rank's logger
    names a folder of its own; ``ModelCheckpoint.setup`` broadcasts rank 0's."""
    logger = trainer.logger
    if not isinstance(logger, WandbRunLogger):
        return
    folder = str((Path(logger.save_dir) / "checkpoints").resolve())
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            callback.dirpath = folder


class _DropLightningTips(logging.Filter):
    """Drops Lightning's product tips ("💡 Tip: … install litlogger / litmodels")."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip:")


#: Where Lightning's own messages are logged from (a record's ``pathname`` is its caller's).
_LIGHTNING_DIR = os.path.dirname(L.__file__) + os.sep


class _HoldStartupLines(logging.Filter):
    """Holds in ``held`` the informational records of Lightning's own code that reach
    ``handler``; warnings, and the package's messages logged through Lightning's
    ``rank_zero_info`` (privacy notes among them), pass at once."""

    def __init__(self, handler: logging.Handler, held: list) -> None:
        super().__init__()
        self.handler, self.held = handler, held

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not record.pathname.startswith(_LIGHTNING_DIR):
            return True
        self.held.append((self.handler, record))
        return False


class StartupLines:
    """Lightning's start-up lines ("Seed set to 0", "GPU available: ...", the model summary),
    held until training starts (``ReleaseStartupLines``): a run refused while its data or its
    method is set up ends with its one-line error alone, not after lines that read as if
    training had begun. Held are the records that reach the handlers Lightning's two loggers
    have when the hold begins (Lightning adds none when the root logger has handlers: nothing
    is held then). Holds nest; a process started by a DDP launcher prints only its own."""

    def __init__(self) -> None:
        self.held: list[tuple[logging.Handler, logging.LogRecord]] = []
        self.filters: list[_HoldStartupLines] = []
        self.depth = 0

    def hold(self) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        for name in ("lightning.pytorch", "lightning.fabric"):
            for handler in logging.getLogger(name).handlers:
                self.filters.append(_HoldStartupLines(handler, self.held))
                handler.addFilter(self.filters[-1])

    def release(self, show: bool = True, end: bool = False) -> None:
        """End the hold (for an ``end`` of the outermost block, or when training starts) and
        print what was held, in order, when ``show``."""
        if end:
            self.depth = max(self.depth - 1, 0)
            if self.depth:
                return
        for hold in self.filters:
            hold.handler.removeFilter(hold)
        self.filters.clear()
        held = list(self.held)
        self.held.clear()
        for handler, record in held if show else ():
            # A forked DDP process inherits its parent's records: the parent prints those.
            if record.process == os.getpid():
                handler.handle(record)


STARTUP_LINES = StartupLines()


class ReleaseStartupLines(Callback):
    """Prints the held start-up lines when training starts: after the data and the method are
    set up and checked (where a private input is validated and refused)."""

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        STARTUP_LINES.release()


@contextmanager
def quiet_dependencies() -> Iterator[None]:
    """Inside the block, the dependencies' messages that say nothing about the run are dropped,
    each picked by its text (and category): Lightning's product tips, and torch's
    ``FutureWarning`` that Lightning's own pytree code uses the deprecated ``LeafSpec``. Every
    other message shows, the package's own warnings among them; Lightning's start-up lines
    show once training starts (``StartupLines``), or at the end of a block that trained
    nothing, and not at all after an error (unless ``DPOT_DEBUG`` is set)."""
    tips = _DropLightningTips()
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # where rank_zero_info logs
    log.addFilter(tips)
    STARTUP_LINES.hold()
    failed = False  # an error, not an interrupt: Lightning's shutdown lines still show
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore",
                message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                category=FutureWarning,
            )
            yield
    except Exception:
        failed = True
        raise
    finally:
        STARTUP_LINES.release(not failed or bool(os.environ.get("DPOT_DEBUG")), end=True)
        log.removeFilter(tips)


def run_name(config: Any) -> str:
    """``<method>_<data>`` for a run whose logger names none: the method's class in snake case
    and the data's file or folder stem (or its source class), e.g. ``dpmerf_patients``."""
    method = str(config.get("model", {}).get("class_path", "run")).rsplit(".", 1)[-1]
    method = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", method).lower()
    source = (config.get("data", {}).get("init_args", {}) or {}).get("source") or {}
    args = source.get("init_args", {}) or {}
    where = next((args[k] for k in ("path", "root", "idx_dir") if args.get(k)), None)
    data = Path(str(where)).stem if where else str(source.get("class_path", "")).rsplit(".")[-1]
    name = f"{method}_{data.lower()}" if data else method
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)


class DpotCLI(LightningCLI):
    """LightningCLI whose trainer writes checkpoints atomically unless the config names its own
    ``CheckpointIO`` plugin, into ``<run dir>/checkpoints`` (``checkpoints_in_run_dir``),
    and accounts every private run: a module that releases private data
    (``ReleasesPrivateData``) and whose config names no
    accountant gets a ``PrivacyAccountantCallback()``, which enforces the module's own
    ``target_epsilon`` at its release objects' δ (if it has one). Both are added at
    instantiation, so ``config.yaml`` stays as written. A ``--config`` file that names
    ``__base__`` fragments is composed first (``compose_config``)."""

    @override
    def parse_arguments(self, parser: Any, args: Any) -> None:
        if isinstance(args, (list, tuple)):
            args = with_composed_configs(args)
        super().parse_arguments(parser, args)

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        logger = config.get("trainer", {}).get("logger")
        if logger is False and config.get("trainer", {}).get("default_root_dir") is None:
            # No logger: the run still gets a folder of its own (config.yaml, checkpoints,
            # report), not the current folder.
            stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            config.trainer.default_root_dir = str(Path("runs") / f"{run_name(config)}-{stamp}")
        if (
            getattr(logger, "class_path", None) == f"{WandbRunLogger.__module__}.WandbRunLogger"
            and logger.init_args.get("name") is None
        ):
            logger.init_args.name = run_name(config)

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer_config = self._get(self.config_init, "trainer", default={}) or {}
        plugins = kwargs.pop("plugins", trainer_config.get("plugins")) or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            plugins.append(AtomicCheckpointIO())
        trainer = super().instantiate_trainer(plugins=plugins, **kwargs)
        checkpoints_in_run_dir(trainer)
        model = getattr(self, "model", None)
        accounted = any(isinstance(cb, PrivacyAccountantCallback) for cb in trainer.callbacks)
        if isinstance(model, ReleasesPrivateData) and model.is_private and not accounted:
            # First: its batch-end hook drains, checks and commits the batch's releases before
            # any other callback (a checkpoint, a sample writer) sees what they produced.
            trainer.callbacks.insert(0, PrivacyAccountantCallback())
        trainer.callbacks.insert(0, ReleaseStartupLines())
        return trainer


def fit_epilog() -> str:
    """The package's methods, templates and data modules, for ``dpot fit --help``."""
    import lightning_dpot.data as data
    import lightning_dpot.methods as methods

    def names(module: Any, base: type) -> list[str]:
        found = (getattr(module, name) for name in module.__all__)
        return [c.__name__ for c in found if isinstance(c, type) and issubclass(c, base)]

    templates = ("GeneratorModule", "ConditionalGeneratorModule")
    trained = [n for n in names(methods, L.LightningModule) if n not in templates]
    return (
        f"methods (--model NAME; --model.help NAME lists its arguments): {', '.join(trained)}; "
        f"templates to subclass: {', '.join(templates)}, "
        "methods.central.SanitizedGradientModule, "
        "methods.released_statistic.ReleasedStatisticModule. Data modules (--data NAME): "
        f"{', '.join(names(data, L.LightningDataModule))}. Start from a config: "
        "configs/README.md"
    )


def run_lightning(args: Sequence[str], run: bool = True) -> LightningCLI:
    """LightningCLI over any module/datamodule; the LDP privacy report, the run report
    (report.json) and the run's artifacts (generator.pt; W&B artifacts,
    ``RunArtifacts``) are attached to every run, after the
    config's own callbacks, and checkpoints are written atomically
    (``AtomicCheckpointIO``). ``run=False`` only builds the model,
    datamodule and trainer (``args`` then hold no subcommand)."""
    # The package's methods and data modules, imported: `--model DPMERF` and `--model.help
    # DPMERF` resolve the short names of the subclasses jsonargparse has seen.

    with quiet_dependencies(), warnings.catch_warnings():
        # Lightning warns whenever both `args` and a command line exist; ours are the same.
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended")
        return DpotCLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            # Every method builds its optimizer from its own lr: no `optimizer:` section that
            # would replace it (and leave a second, unused learning rate in the config).
            auto_configure_optimizers=False,
            trainer_defaults={"callbacks": [LDPPrivacyReport(), RunReport(), RunArtifacts()]},
            save_config_kwargs={"overwrite": True},
            # Bad arguments raise (one line from `dpot`) instead of printing the whole usage.
            parser_kwargs={"exit_on_error": False}
            | {command: {"exit_on_error": False} for command in SUBCOMMANDS}
            | {"fit": {"exit_on_error": False, "epilog": fit_epilog()}},
            run=run,
            args=list(args),
        )
