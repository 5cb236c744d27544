"""The local-DP privacy report: logged once at the start of fitting, written to report.json.

For locally privatized data the guarantee is fixed when the release is made; training is
post-processing and spends nothing (Reshetova et al. 2024, Remark 1), so there is nothing to
accumulate.

The loggers receive the report only as it may leave the machine
(``shareable_report``): a logger's files are
uploaded (``wandb sync``), and the privacy ledger's total and path describe this machine's other
releases of the same records. ``report.json`` in the run directory keeps the whole report.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dpot.callbacks.scope import outside_the_guarantee
from lightning_dpot.data.protocols import LocalDPRelease, satisfies
from lightning_dpot.privacy.accounting.report import shareable_report


class LDPPrivacyReport(Callback):
    """Reads ``trainer.datamodule.privacy_report()`` and logs its shareable form as
    hyperparameters."""

    report_key = "privacy"

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report = self._report(trainer)
        if report is None:
            return
        shared = shareable_report(report)
        for logger in trainer.loggers:
            logger.log_hyperparams({f"privacy/{k}": v for k, v in shared.items()})

    def report_section(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict | None:
        return self._report(trainer)

    @staticmethod
    def _report(trainer: L.Trainer) -> dict | None:
        datamodule = trainer.datamodule
        if not satisfies(datamodule, LocalDPRelease):
            return None
        return {
            **datamodule.privacy_report(),
            "outside_the_guarantee": outside_the_guarantee(trainer),
        }
