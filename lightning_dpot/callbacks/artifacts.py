"""What a run hands its user: the standalone generator and the run's files as W&B artifacts.

``RunArtifacts`` (attached to every ``dpot fit`` run, after
``RunReport``):

* at the end of fitting, writes ``generator.pt`` to the run's log dir: the standalone generator
  of ``export_generator``, with the ``privacy`` section of the run's
  ``report.json`` and its ``config.yaml`` embedded, when the module can be exported
  (``Exportable``); otherwise one line says why not and the run
  goes on;
* once every end-of-fit hook has written its files (at ``teardown``), logs to every
  ``ArtifactLogger`` (``WandbRunLogger``, offline too) the artifact ``outputs-<run id>`` (type
  ``run-outputs``:
  ``report.json``, ``privacy_report.json`` and every PNG of the log dir — sample grids, plots,
  ``epsilon.png``) and ``generator-<run id>`` (type ``model``: ``generator.pt``). With other
  loggers, or none, the files are written all the same.

Nothing new leaves the run: the PNGs are those the run wrote (and logged as images), the
report states what lies outside the guarantee, and the generator holds only the trained
network or the released particles. The two reports go out as
``shareable_report`` makes them (written to
``<log dir>/shared/``, so what left is there to read): without the privacy ledger's entry,
whose total over every release of the same records depends on the private data without noise,
or the release journal, and without absolute paths.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_dpot.export import Exportable, save_sampler
from lightning_dpot.loggers import ArtifactLogger
from lightning_dpot.nn.samplers import StandaloneSampler
from lightning_dpot.privacy.accounting.report import shareable_report

__all__ = ["RunArtifacts"]

GENERATOR_FILE = "generator.pt"
REPORT_FILES = ("report.json", "privacy_report.json")
SHARED_DIR = "shared"


class RunArtifacts(Callback):
    """Writes ``generator.pt`` and logs the run's files as artifacts (module docstring).

    Args:
        export_generator: write ``generator.pt`` at the end of fitting.

    Example::

        >>> import lightning as L
        >>> from lightning_dpot.callbacks import RunArtifacts, RunReport
        >>> callbacks = [RunReport(), RunArtifacts()]
        >>> trainer = L.Trainer(max_epochs=1, callbacks=callbacks, enable_progress_bar=False)
        >>> all(callback in trainer.callbacks for callback in callbacks)
        True
    """

    def __init__(self, export_generator: bool = True) -> None:
        super().__init__()
        self.export_generator = bool(export_generator)
        self._log_dir: Path | None = None
        self._fit_ended = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.log_dir broadcasts under DDP: read once here, where every rank calls it.
        self._log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self._fit_ended = False

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_ended = True
        if not self.export_generator:
            return
        if not isinstance(pl_module, Exportable):
            rank_zero_info(
                f"RunArtifacts: {type(pl_module).__name__} defines no standalone sampler; no "
                f"{GENERATOR_FILE} is written"
            )
            return
        sampler = self._sampler(pl_module)  # every rank: a flow gathers its particles
        if sampler is not None and trainer.is_global_zero:
            self._export(sampler, type(pl_module).__name__)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not self._fit_ended or not trainer.is_global_zero:
            return
        loggers = [logger for logger in trainer.loggers if isinstance(logger, ArtifactLogger)]
        if not loggers or self._log_dir is None:
            return
        outputs = self._shareable_reports()
        outputs += sorted(self._log_dir.glob("*.png"))
        generator = self._log_dir / GENERATOR_FILE
        for logger in loggers:
            if outputs:
                logger.log_files("outputs", "run-outputs", outputs)
            if generator.is_file():
                logger.log_files("generator", "model", [generator])

    def _shareable_reports(self) -> list[Path]:
        """The run's reports as they may leave the machine, written to ``<log dir>/shared/``."""
        assert self._log_dir is not None
        written = []
        for name in REPORT_FILES:
            path = self._log_dir / name
            if path.is_file():
                shared = self._log_dir / SHARED_DIR / name
                shared.parent.mkdir(exist_ok=True)
                report = shareable_report(json.loads(path.read_text()))
                shared.write_text(json.dumps(report, indent=2, sort_keys=True))
                written.append(shared)
        return written

    @staticmethod
    def _sampler(pl_module: Exportable) -> StandaloneSampler | None:
        try:
            return pl_module.standalone_sampler()
        except (ValueError, TypeError, AttributeError) as error:
            warnings.warn(f"RunArtifacts: no {GENERATOR_FILE} written: {error}", stacklevel=2)
            return None

    def _export(self, sampler: StandaloneSampler, method: str) -> None:
        assert self._log_dir is not None
        report_path, config_path = self._log_dir / "report.json", self._log_dir / "config.yaml"
        report: dict[str, Any] = (
            json.loads(report_path.read_text()) if report_path.is_file() else {}
        )
        if "privacy" not in report:
            warnings.warn(
                f"RunArtifacts: {GENERATOR_FILE} embeds no privacy report: {report_path} holds "
                "none (attach RunReport before RunArtifacts)",
                stacklevel=2,
            )
        config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else None
        try:
            save_sampler(
                sampler,
                self._log_dir / GENERATOR_FILE,
                privacy=report.get("privacy"),
                config=config,
                method=method,
            )
        except ValueError as error:
            warnings.warn(f"RunArtifacts: no {GENERATOR_FILE} written: {error}", stacklevel=2)
