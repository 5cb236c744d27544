"""``report.json``: one file per run with the final metrics, the privacy report and the config.

Any callback that implements ``ReportsSection`` (``report_key`` and
``report_section(trainer, pl_module) -> dict``) contributes a section under its ``report_key``
(e.g. the LDP report under ``privacy``), so new callbacks extend the report without touching
this one. A module that implements ``DescribesLoss`` adds its loss under ``loss``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dpot.privacy.contract import ReleasesPrivateData


@runtime_checkable
class ReportsSection(Protocol):
    """A callback that writes one section of ``report.json``."""

    report_key: str

    def report_section(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict | None:
        """The section, or ``None`` when the callback has nothing to report for this run."""
        ...


@runtime_checkable
class DescribesLoss(Protocol):
    """A module that states the loss it minimises (formula, regularization, backend)."""

    def loss_description(self) -> dict: ...


def _scalar(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def update_report(path: str | Path, sections: dict) -> dict:
    """Merge ``sections`` into the JSON object at ``path`` (created if absent)."""
    path = Path(path)
    report = json.loads(path.read_text()) if path.is_file() else {}
    report.update(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    return report


class RunReport(Callback):
    """Writes ``<log_dir>/report.json`` at the end of fitting (rank 0), and also when fitting
    ends by an exception after a step or a private release (then ``ended_by`` names it), so
    that a run that released private data always leaves its report."""

    def __init__(self) -> None:
        super().__init__()
        self._log_dir: Path | None = None

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.log_dir broadcasts under DDP: read once here, where every rank calls it.
        self._log_dir = Path(trainer.log_dir or trainer.default_root_dir)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, pl_module, None)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Write the report of a run that trained or released before the exception; a run
        refused before either leaves none."""
        released = isinstance(pl_module, ReleasesPrivateData) and pl_module.releases_emitted()
        if self._log_dir is not None and (trainer.global_step > 0 or released):
            self._write(trainer, pl_module, type(exception).__name__)

    def _write(
        self, trainer: L.Trainer, pl_module: L.LightningModule, ended_by: str | None
    ) -> None:
        log_dir = self._log_dir or Path(trainer.default_root_dir)
        if not trainer.is_global_zero:
            return
        sections: dict = {
            "method": type(pl_module).__name__,
            "metrics": {
                k: v
                for k, v in ((k, _scalar(v)) for k, v in trainer.callback_metrics.items())
                if v is not None
            },
            "global_step": trainer.global_step,
            "epochs": trainer.current_epoch,
            "config_path": str(log_dir / "config.yaml")
            if (log_dir / "config.yaml").is_file()
            else None,
            "ended_by": ended_by,
        }
        if isinstance(pl_module, DescribesLoss):
            sections["loss"] = pl_module.loss_description()
        for callback in trainer.callbacks:
            if isinstance(callback, ReportsSection):
                section = callback.report_section(trainer, pl_module)
                # A callback with nothing to say (None) never overwrites another's section, e.g.
                # the LDP report (no privatized data) vs. the central-DP accountant's "privacy".
                if section is not None or callback.report_key not in sections:
                    sections[callback.report_key] = section
        update_report(log_dir / "report.json", sections)
