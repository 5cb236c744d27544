"""Evaluation of 2-D runs: distance of generated samples to the true support, how evenly they
cover a curve support, and a scatter plot of raw / privatized / generated points
(Reshetova et al. 2024, Fig. 1–2)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.data.manifolds import CurveSource
from lightning_dpot.generative import draw
from lightning_dpot.grids import ImageLogger, save_figure
from lightning_dpot.metrics.evaluators import ManifoldEvaluator


class ManifoldEvaluation(Callback):
    """Logs ``manifold_error`` = mean over generated x of dist(x, support) every
    ``every_n_epochs`` and at the end of fitting, where the plot ``scatter.png`` is saved to the
    run directory and sent to the logger. For curve supports (half-circle, ellipse, rectangle)
    it also logs ``arc_coverage`` (``coverage``:
    the share of 18 equal arc pieces holding at least a quarter of the uniform share of the
    samples within 0.25 of the curve), which catches a generator that covers only part of it.

    Needs a datamodule whose ``source`` is a curve with a known support (the metrics are
    ``ManifoldEvaluator``'s); any other run is refused
    when fitting starts.

    Args:
        num_samples: generated points per evaluation.
        every_n_epochs: also evaluate after every n-th training epoch.
        plot: save and log ``scatter.png`` at the end.

    Raises:
        ValueError: at fit start, when the datamodule's source is not a curve.
    """

    def __init__(self, num_samples: int = 5000, every_n_epochs: int = 10, plot: bool = True):
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.every_n_epochs = check_positive_int("every_n_epochs", every_n_epochs)
        self.plot = plot

    def check_before_release(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a run whose data has no known curve support, before the datamodule releases
        anything (``check_before_release``)."""
        datamodule = trainer.datamodule
        source = getattr(datamodule, "source", None)
        if not isinstance(source, CurveSource):
            raise ValueError(
                "ManifoldEvaluation measures the distance to a known curve (sources HalfCircle, "
                f"Ellipse, Rectangle); {type(datamodule).__name__} has source "
                f"{type(source).__name__}"
            )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The same check, for a datamodule that released nothing before the fit."""
        self.check_before_release(trainer, pl_module)

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule
    ) -> tuple[dict[str, float], torch.Tensor]:
        evaluator = ManifoldEvaluator(trainer.datamodule.source)
        samples, _ = draw(pl_module, self.num_samples)
        return evaluator.score(samples), samples

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            metrics, _ = self._measure(trainer, pl_module)
            for name, value in metrics.items():
                pl_module.log(name, value, prog_bar=True)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics, samples = self._measure(trainer, pl_module)
        error = metrics["manifold_error"]
        for name, value in metrics.items():
            trainer.callback_metrics[name] = torch.tensor(value)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
        path = Path(trainer.log_dir or trainer.default_root_dir) / "scatter.png"
        if self.plot and trainer.is_global_zero:
            self.save_scatter(trainer, samples, path, error)
            for logger in trainer.loggers:
                if isinstance(logger, ImageLogger):
                    logger.log_image(key="scatter", images=[str(path)])

    @staticmethod
    def save_scatter(trainer: L.Trainer, samples: torch.Tensor, path: Path, error: float) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        dm = trainer.datamodule
        panels = [
            ("raw (held-out)", dm.test_records),
            ("privatized", dm.release),
            (f"generated (error {error:.3f})", samples),
        ]
        fig, axes = plt.subplots(1, 3, figsize=(12, 4), sharex=True, sharey=True)
        for ax, (title, pts) in zip(axes, panels, strict=True):
            if pts is not None:
                pts = pts[: len(samples)].reshape(-1, 2)
                ax.scatter(pts[:, 0], pts[:, 1], s=1, alpha=0.3)
            ax.set_title(title)
            ax.set_xlim(-4, 4)
            ax.set_ylim(-4, 4)
            ax.set_aspect("equal")
        fig.tight_layout()
        save_figure(fig, path)
