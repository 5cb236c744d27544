r"""Evaluation callbacks: when to evaluate; what to compute is the evaluators'.

Each callback checks when fitting starts that it can score the run (a held-out split; images
for the Fréchet distance; labels and a class-conditional method for utility) and refuses it in
one line otherwise. It evaluates the module being trained every ``every_n_epochs`` training
epochs (``None``: only at the end) and once more at the end of training (``on_train_end``, while
the DDP process group is still up), logs its numbers to the loggers (and the progress bar, where
cheap) and contributes a section to ``report.json`` through ``report_key`` /
``report_section`` (see ``RunReport``).

The metrics are the evaluators of ``lightning_dpot.metrics.evaluators`` (formulas and
references there), built with their options checked by
``MetricSelection``, as ``dpot evaluate`` and
``dpot compare`` build them. Samples come
from the ``Generative`` protocol (post-processing: no privacy
cost); the reference is the datamodule's raw held-out split
(``held_out_split``). Under DDP the Fréchet distance is
computed on all ranks (each generates its ``rank_share`` and adds its shard of the real split; the
metric states are sums, so the value
equals the single-process value on the union); utility and W₂ run on rank 0 and are broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.data.protocols import held_out_split
from lightning_dpot.generative import draw, require_generative
from lightning_dpot.grids import is_image_batch
from lightning_dpot.metrics.evaluators import (
    FeatureExtractor,
    default_classifier_path,
    rank_share,
)
from lightning_dpot.metrics.selection import MetricSelection
from lightning_dpot.metrics.utility import CLASSIFIERS, FULL, QUICK

__all__ = ["FIDEvaluation", "UtilityEvaluation", "W2Evaluation"]


def _log_everywhere(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    values: dict[str, float],
    in_hook_that_can_log: bool,
    prog_bar: bool,
) -> None:
    """``pl_module.log`` where Lightning allows it (epoch-end hooks); at ``on_train_end`` the
    values go straight to the loggers and into ``trainer.callback_metrics`` (read by
    ``RunReport``)."""
    finite = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}
    if in_hook_that_can_log:
        for key, value in finite.items():
            pl_module.log(key, value, prog_bar=prog_bar, rank_zero_only=True)
        return
    for key, value in finite.items():
        trainer.callback_metrics[key] = torch.tensor(value)
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(finite, step=trainer.global_step)


class _EvaluationCallback(Callback):
    """The fit-start check (``check_run``), the schedule (every n epochs + at the end, never
    twice for one step) and the report history."""

    report_key = "evaluation"
    prog_bar = True

    def __init__(self, every_n_epochs: int | None) -> None:
        self.every_n_epochs = (
            None if every_n_epochs is None else check_positive_int("every_n_epochs", every_n_epochs)
        )
        self.history: list[dict[str, Any]] = []
        self._last_step: int | None = None

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        raise NotImplementedError

    def check_run(
        self,
        pl_module: L.LightningModule,
        datamodule: Any,
        reference: Tensor,
        labels: Tensor | None,
    ) -> None:
        """Raise ``ValueError`` naming what this evaluation needs and the run lacks; ``reference``
        and ``labels`` are the raw held-out split."""

    def log_values(self, result: dict) -> dict[str, float]:
        raise NotImplementedError

    def final_differs(self) -> bool:
        """Whether the end-of-training evaluation uses other settings than the periodic one
        (then it runs even when the last epoch was just evaluated)."""
        return False

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> None:
        if trainer.sanity_checking:
            return
        if self._last_step == trainer.global_step and not (final and self.final_differs()):
            return
        result = self.evaluate(trainer, pl_module, final)
        if not result:
            return
        result = {"epoch": trainer.current_epoch, "global_step": trainer.global_step, **result}
        self.history.append(result)
        self._last_step = trainer.global_step
        _log_everywhere(
            trainer, pl_module, self.log_values(result), not final, prog_bar=self.prog_bar
        )

    def check_before_release(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a run this evaluation cannot score; the datamodule asks before it releases
        anything (``check_before_release``)."""
        try:
            reference, labels = held_out_split(trainer.datamodule)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{type(self).__name__}: {err}") from err
        self.check_run(pl_module, trainer.datamodule, reference, labels)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The same check, for a datamodule that released nothing before the fit."""
        self.check_before_release(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._run(trainer, pl_module, final=False)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run(trainer, pl_module, final=True)

    def report_section(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        return {
            **self.describe(),
            "final": self.history[-1] if self.history else None,
            "history": self.history,
        }

    def describe(self) -> dict:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Fréchet distance (FID or classifier FD)
# --------------------------------------------------------------------------------------------


class FIDEvaluation(_EvaluationCallback):
    r"""FID (Inception) or the classifier-feature Fréchet distance of generated vs held-out
    images (``FrechetEvaluator``; Cao et al. 2021, §D.1:
    60,000 generated vs the test split). The real side is accumulated once and kept.

    Args:
        feature_extractor: ``"inception"`` — FID proper (log key ``fid``); ``"classifier"`` —
            the project classifier's features (log key ``fd_classifier``; not FID).
        num_samples: N generated images per evaluation, over all ranks (paper: 60,000).
        every_n_epochs: also evaluate after every n-th epoch; ``None``: only at the end.
        feature_extractor_weights_path: local InceptionV3 weights file (offline FID); without
            it the torch hub cache is used, and construction fails naming this parameter if the
            file is in neither place.
        classifier_path: cached feature classifier; trained on the held-out split and saved
            there if absent (default: one file per held-out split in the datamodule's
            ``cache_dir``).
        classifier_epochs: training epochs of the feature classifier when it is trained here.
        batch_size: images per metric update.
        data_range: value range of the images (project convention [−1, 1]).
    """

    def __init__(
        self,
        feature_extractor: FeatureExtractor = "inception",
        num_samples: int = 60_000,
        every_n_epochs: int | None = None,
        feature_extractor_weights_path: str | None = None,
        classifier_path: str | None = None,
        classifier_epochs: int = 5,
        batch_size: int = 500,
        data_range: tuple[float, float] = (-1.0, 1.0),
    ) -> None:
        super().__init__(every_n_epochs)
        self.num_samples = check_positive_int("num_samples", num_samples)
        options = {
            "feature_extractor": feature_extractor,
            "weights_path": feature_extractor_weights_path,
            "classifier_path": classifier_path,
            "classifier_epochs": classifier_epochs,
            "batch_size": batch_size,
            "data_range": data_range,
        }
        self.evaluator = MetricSelection.parse({"frechet": options}).frechet_evaluator()

    @property
    def log_key(self) -> str:
        return self.evaluator.key

    @property
    @override
    def report_key(self) -> str:  # type: ignore[override]
        return self.log_key

    @override
    def describe(self) -> dict:
        return {**self.evaluator.describe(), "num_generated": self.num_samples}

    @override
    def check_run(
        self,
        pl_module: L.LightningModule,
        datamodule: Any,
        reference: Tensor,
        labels: Tensor | None,
    ) -> None:
        """Images, and for the classifier features a classifier file or labels to train one."""
        if not is_image_batch(reference):
            raise ValueError(
                "FIDEvaluation compares images (records (C, H, W) with C in (1, 3)); "
                f"{type(datamodule).__name__} holds records of shape {tuple(reference.shape[1:])}"
            )
        evaluator = self.evaluator
        if evaluator.feature_extractor != "classifier" or labels is not None:
            return
        cache_dir = getattr(datamodule, "cache_dir", ".dpot_cache")
        path = evaluator.classifier_path or default_classifier_path(
            reference, cache_dir, evaluator.classifier_epochs
        )
        if not Path(path).is_file():
            raise ValueError(
                "FIDEvaluation(feature_extractor='classifier') trains its feature classifier on "
                f"the held-out labels, and {type(datamodule).__name__}'s held-out split has none; "
                f"give classifier_path, a trained classifier file (no file at {str(path)!r})"
            )

    def compute_value(
        self, pl_module: Any, datamodule: Any, rank: int = 0, world_size: int = 1, barrier=None
    ) -> float:
        """Add this rank's shard of the real split (first call), generate this rank's share of
        ``num_samples`` and compute the (synced) d²."""
        reference, labels = held_out_split(datamodule)
        self.evaluator.set_reference(
            reference,
            labels,
            cache_dir=getattr(datamodule, "cache_dir", ".dpot_cache"),
            device=getattr(pl_module, "device", torch.device("cpu")),
            rank=rank,
            world_size=world_size,
            barrier=barrier,
        )
        share = rank_share(self.num_samples, rank, world_size)
        fake = draw(pl_module, share)[0] if share > 0 else reference[:0].float()
        return self.evaluator.score(fake)[self.log_key]

    @override
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        value = self.compute_value(
            pl_module,
            trainer.datamodule,
            trainer.global_rank,
            trainer.world_size,
            barrier=trainer.strategy.barrier,
        )
        return {self.log_key: value}

    @override
    def log_values(self, result: dict) -> dict[str, float]:
        return {self.log_key: result[self.log_key]}


# --------------------------------------------------------------------------------------------
# Downstream utility
# --------------------------------------------------------------------------------------------


class UtilityEvaluation(_EvaluationCallback):
    """Accuracy on the raw held-out split of classifiers trained on labelled synthetic samples
    (``UtilityEvaluator``, Cao et al. 2021, §D.2).

    During training the ``QUICK`` settings are used; at the
    end ``final_mode`` (default ``"full"``: the paper's protocol, 60,000 samples, patience 30).
    Runs on rank 0; the result is broadcast. Log keys ``utility/<classifier>``. A run whose
    method is unconditional or whose held-out split has no labels is refused when fitting
    starts.

    Args:
        num_samples: labelled synthetic samples (paper: 60,000).
        classifiers: any of ``"logreg"``, ``"mlp"``, ``"cnn"``.
        every_n_epochs: quick evaluation after every n-th epoch; ``None``: only at the end.
        final_mode: ``"full"`` (paper settings) or ``"quick"`` at the end.
        seed: seeds the classifiers' training (not the generator's samples).
    """

    report_key = "utility"

    def __init__(
        self,
        num_samples: int = 60_000,
        classifiers: Sequence[str] = CLASSIFIERS,
        every_n_epochs: int | None = None,
        final_mode: Literal["full", "quick"] = "full",
        seed: int = 0,
    ) -> None:
        super().__init__(every_n_epochs)
        self.num_samples = check_positive_int("num_samples", num_samples)
        if final_mode not in ("full", "quick"):
            raise ValueError(f"final_mode must be 'full' or 'quick', got {final_mode!r}")
        selection = MetricSelection.parse({"utility": {"classifiers": classifiers}})
        self.evaluator = selection.utility_evaluator(seed)
        self.final_mode = final_mode

    @property
    def classifiers(self) -> tuple[str, ...]:
        return self.evaluator.classifiers

    @override
    def describe(self) -> dict:
        return {**self.evaluator.describe(), "num_synthetic": self.num_samples}

    @override
    def final_differs(self) -> bool:
        return self.final_mode == "full"

    @override
    def check_run(
        self,
        pl_module: L.LightningModule,
        datamodule: Any,
        reference: Tensor,
        labels: Tensor | None,
    ) -> None:
        """Labels on the held-out split, and a class-conditional method."""
        if labels is None:
            raise ValueError(
                "UtilityEvaluation scores classifiers on the labelled held-out split; "
                f"{type(datamodule).__name__}'s held-out split has no labels"
            )
        if not require_generative(pl_module).conditional:
            raise ValueError(
                "UtilityEvaluation trains classifiers on the labelled samples of a "
                f"class-conditional method; {type(pl_module).__name__} is unconditional"
            )

    def compute_value(self, pl_module: Any, datamodule: Any, final: bool) -> dict:
        """``{classifier: accuracy, "mode": ...}`` of a class-conditional ``pl_module``.

        Raises:
            UnlabelledSamplesError: ``pl_module`` is unconditional.
        """
        test_x, test_y = held_out_split(datamodule)
        x, y = draw(pl_module, self.num_samples, labelled=True)
        full = final and self.final_mode == "full"
        accuracies = self.evaluator.score(x, y, test_x, test_y, FULL if full else QUICK)
        return {**accuracies, "mode": "full" if full else "quick"}

    @override
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        result = None
        if trainer.is_global_zero:
            result = self.compute_value(pl_module, trainer.datamodule, final)
        return trainer.strategy.broadcast(result, src=0)

    @override
    def log_values(self, result: dict) -> dict[str, float]:
        return {f"utility/{name}": result[name] for name in self.classifiers if name in result}


# --------------------------------------------------------------------------------------------
# W2 to raw data
# --------------------------------------------------------------------------------------------


class W2Evaluation(_EvaluationCallback):
    r"""Exact W₂ between generated and raw held-out samples on subsamples
    (``W2Evaluator``, Reshetova et al. 2024, §IV-C).
    Runs on rank 0 (result broadcast). Log keys ``w2`` and ``w2_stderr``.

    Args:
        num_samples: generated samples to subsample from (≥ ``subsample``).
        subsample: m (paper: 200).
        repeats: R.
        every_n_epochs: also evaluate after every n-th epoch; ``None``: only at the end.
        seed: seed of the subsample draws.
    """

    report_key = "w2"

    def __init__(
        self,
        num_samples: int = 2000,
        subsample: int = 200,
        repeats: int = 10,
        every_n_epochs: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(every_n_epochs)
        self.num_samples = check_positive_int("num_samples", num_samples)
        selection = MetricSelection.parse({"w2": {"subsample": subsample, "repeats": repeats}})
        self.evaluator = selection.w2_evaluator(seed)
        if self.evaluator.subsample > self.num_samples:
            raise ValueError(
                f"subsample must lie in [1, num_samples] = [1, {self.num_samples}], got {subsample}"
            )

    @property
    def repeats(self) -> int:
        return self.evaluator.repeats

    @property
    def subsample(self) -> int:
        return self.evaluator.subsample

    @override
    def describe(self) -> dict:
        return {**self.evaluator.describe(), "num_generated": self.num_samples}

    def compute_value(self, pl_module: Any, datamodule: Any) -> dict:
        reference, _ = held_out_split(datamodule)
        fake, _ = draw(pl_module, self.num_samples)
        return self.evaluator.score(fake, reference)

    @override
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        result = None
        if trainer.is_global_zero:
            result = self.compute_value(pl_module, trainer.datamodule)
        return trainer.strategy.broadcast(result, src=0)

    @override
    def log_values(self, result: dict) -> dict[str, float]:
        return {"w2": result["w2"], "w2_stderr": result["w2_stderr"]}
