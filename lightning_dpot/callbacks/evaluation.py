r"""Evaluation callbacks (SPEC §9): Fréchet distance, downstream utility, W₂ to raw data.

Each callback evaluates the module being trained every ``every_n_epochs`` training epochs
(``None``: only at the end) and once more at the end of training (``on_train_end``, while the
DDP process group is still up), logs its numbers to the loggers (and the progress bar, where
cheap) and contributes a section to ``report.json`` through ``report_key`` /
``report_section`` (see :class:`~lightning_dpot.callbacks.run_report.RunReport`). Sampling is
post-processing of the trained generator: no privacy cost. The *reference* data are the raw
held-out split of the datamodule (``test_data`` of
:class:`~lightning_dpot.data.PrivatizedDataModule`, ``test_records`` of the central-DP and
latent datamodules), never seen in training.

Generated samples come from the module's sampling protocol:

* ``sample(n) -> x`` — every generator method (:class:`~lightning_dpot.methods.base.
  GeneratorModule`, the DPSW flows and generators);
* ``sample_labeled(n) -> (x, y)`` (or the spelling ``sample_labelled``) — class-conditional
  methods (e.g. :class:`~lightning_dpot.methods.dp_sinkhorn.DPSinkhorn` with
  ``conditional=True``); needed by the utility metric only. A module whose
  ``sample_labeled`` raises ``ValueError`` (e.g. DP-Sinkhorn trained unconditionally) counts as
  unconditional.

Particle flows hold a fixed number of particles per rank; a request for more is capped at that
number (with a warning).

Metrics, formulas and references:

* :class:`FIDEvaluation` — d² = ‖μ_r − μ_g‖² + Tr(Σ_r + Σ_g − 2(Σ_rΣ_g)^{1/2}) between Gaussian
  fits of features of real and generated images (Heusel et al. 2017, Eq. 6). With
  ``feature_extractor="inception"`` this is **FID** (torchmetrics ``FrechetInceptionDistance``,
  standard InceptionV3 weights; paper 002 §D.1), log key ``fid``. With
  ``feature_extractor="classifier"`` the features are the penultimate layer of a small CNN
  trained on the real held-out split (offline stand-in; log key ``fd_classifier``; never called
  FID). Under DDP rank r generates ⌊N/W⌋ (+1 for r < N mod W) samples and adds the r-th shard of
  the real split; the metric states are sums with ``dist_reduce_fx="sum"``, so the value equals
  the single-process value on the union.
* :class:`UtilityEvaluation` — accuracy on the real held-out split of LogReg / MLP / CNN trained
  on labelled synthetic samples (paper 002 §D.2): quick settings during training, the paper's
  settings at the end. Unconditional generators are skipped with one warning.
* :class:`W2Evaluation` — exact W₂ between m-point subsamples of generated and raw held-out
  data, mean and standard error over R repeats (paper 001 §IV-C, m = 200).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_dpot.metrics.fid import ClassifierFrechetDistance, InceptionFID
from lightning_dpot.metrics.utility import (
    CLASSIFIERS,
    FULL,
    QUICK,
    UnlabelledSamplesError,
    UtilitySettings,
    downstream_utility,
)
from lightning_dpot.metrics.w2 import subsampled_w2
from lightning_dpot.privacy.validation import check_positive_int

__all__ = [
    "FIDEvaluation",
    "UtilityEvaluation",
    "W2Evaluation",
    "default_classifier_path",
    "generate_samples",
    "held_out_split",
    "rank_share",
]

FeatureExtractor = Literal["inception", "classifier"]


# --------------------------------------------------------------------------------------------
# Shared helpers: the reference split, the sampling protocol, DDP shares
# --------------------------------------------------------------------------------------------


def held_out_split(datamodule: Any) -> tuple[Tensor, Tensor | None]:
    """The raw held-out split ``(x, labels or None)`` of a datamodule (evaluation only).

    Reads ``test_data`` (:class:`~lightning_dpot.data.PrivatizedDataModule`) or
    ``test_records`` (central-DP and latent datamodules) with ``test_labels``; if they are not
    loaded, loads the datamodule's ``source`` (raw records, no privatization).
    """
    if datamodule is None:
        raise ValueError("evaluation needs a datamodule with a raw held-out split, got None")
    for name in ("test_data", "test_records"):
        x = getattr(datamodule, name, None)
        if x is not None:
            return x, getattr(datamodule, "test_labels", None)
    source = getattr(datamodule, "source", None)
    if source is not None:
        splits = source.load()
        if splits.test is not None:
            return splits.test, splits.test_labels
    raise ValueError(
        f"{type(datamodule).__name__} has no raw held-out split (test_data / test_records is "
        "None and its source has no test split); evaluation compares generated samples with "
        "held-out raw data, so give the source a test split (e.g. test_size > 0)"
    )


def _labelled_sampler(module: Any) -> Any:
    for name in ("sample_labeled", "sample_labelled"):
        method = getattr(module, name, None)
        if callable(method):
            return method
    return None


def _cap_to_particles(module: Any, n: int) -> int:
    particles = getattr(module, "particles", None)
    if isinstance(particles, Tensor) and particles.numel() == 0:
        raise ValueError(
            f"{type(module).__name__} holds no particles: a particle flow must be evaluated "
            "inside its training run (callbacks) or after restoring its particles and decoder "
            "(`lightning_dpot.commands.checkpoint.load_model` does both)"
        )
    if isinstance(particles, Tensor) and particles.ndim >= 1 and n > particles.shape[0]:
        warnings.warn(
            f"{type(module).__name__} holds {particles.shape[0]} particles on this rank; "
            f"evaluating on those instead of the requested {n} samples",
            stacklevel=3,
        )
        return int(particles.shape[0])
    return n


@torch.no_grad()
def generate_samples(module: Any, n: int, labelled: bool = False) -> tuple[Tensor, Tensor | None]:
    """``n`` generated samples on the CPU, with labels when ``labelled`` and the module is
    class-conditional (``sample_labeled(n) -> (x, y)``), else ``(sample(n), None)``.

    The module's train/eval mode is restored afterwards.
    """
    n = _cap_to_particles(module, check_positive_int("n", n))
    was_training = bool(getattr(module, "training", False))
    try:
        if labelled:
            sampler = _labelled_sampler(module)
            if sampler is not None:
                try:
                    x, y = sampler(n)
                except ValueError:  # e.g. DPSinkhorn(conditional=False).sample_labeled
                    pass
                else:
                    return x.detach().cpu(), y.detach().cpu()
        return module.sample(n).detach().cpu(), None
    finally:
        if hasattr(module, "train"):
            module.train(was_training)


def rank_share(total: int, rank: int, world_size: int) -> int:
    """Samples rank ``rank`` of ``world_size`` generates: ⌊N/W⌋ + [rank < N mod W] (sums to N)."""
    return total // world_size + int(rank < total % world_size)


def default_classifier_path(
    reference: Tensor, cache_dir: str | Path = ".dpot_cache", epochs: int = 5
) -> Path:
    """``<cache_dir>/feature_classifier-<sha256 of the reference split>-e<epochs>.pt``: one
    feature classifier per real split and training length, so every run evaluated against that
    split shares its weights (classifier-FD values are comparable only under the same
    weights)."""
    from lightning_dpot.data.release import tensor_sha256

    digest = tensor_sha256(reference.float())[:16]
    return Path(cache_dir) / f"feature_classifier-{digest}-e{epochs}.pt"


def _log_everywhere(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    values: dict[str, float],
    in_hook_that_can_log: bool,
    prog_bar: bool,
) -> None:
    """``pl_module.log`` where Lightning allows it (epoch-end hooks); at ``on_train_end`` the
    values go straight to the loggers and into ``trainer.callback_metrics`` (read by
    :class:`~lightning_dpot.callbacks.run_report.RunReport`)."""
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
    """Schedule (every n epochs + at the end, never twice for one step) and report history."""

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

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._run(trainer, pl_module, final=False)

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
    r"""FID (Inception) or the classifier-feature Fréchet distance of generated vs held-out images.

    d² = ‖μ_r − μ_g‖² + Tr(Σ_r + Σ_g − 2(Σ_rΣ_g)^{1/2}) (Heusel et al. 2017, Eq. 6) between the
    features of the raw held-out split (real side, accumulated **once** and kept across
    evaluations) and of ``num_samples`` generated images (paper 002 §D.1: 60,000 vs the test
    split). See the module docstring for DDP.

    Args:
        feature_extractor: ``"inception"`` — FID proper, torchmetrics
            ``FrechetInceptionDistance`` with the standard torch-fidelity InceptionV3 weights
            (log key ``fid``); ``"classifier"`` — the penultimate features of
            :class:`~lightning_dpot.metrics.fid.FeatureClassifier` (log key ``fd_classifier``;
            not FID, not comparable with FID).
        num_samples: N generated images per evaluation, over all ranks (paper: 60,000).
        every_n_epochs: also evaluate after every n-th epoch; ``None``: only at the end.
        feature_extractor_weights_path: local InceptionV3 weights file (offline FID); without
            it the torch hub cache is used, and construction fails naming this parameter if the
            file is in neither place.
        classifier_path: cached feature classifier; trained on the held-out split (≤
            ``classifier_epochs`` epochs) and saved there if absent. Default:
            :func:`default_classifier_path` in the datamodule's ``cache_dir`` (one file per
            held-out split and ``classifier_epochs``).
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
        if feature_extractor not in ("inception", "classifier"):
            raise ValueError(
                f"feature_extractor must be 'inception' or 'classifier', got {feature_extractor!r}"
            )
        self.feature_extractor = feature_extractor
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.feature_extractor_weights_path = feature_extractor_weights_path
        self.classifier_path = classifier_path
        self.classifier_epochs = check_positive_int("classifier_epochs", classifier_epochs)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.data_range = (float(data_range[0]), float(data_range[1]))
        self.metric: InceptionFID | ClassifierFrechetDistance | None = None
        self.num_real = 0
        if feature_extractor == "inception":
            # Fail now, not after hours of training, if the weights are missing.
            self.metric = InceptionFID(feature_extractor_weights_path, data_range=self.data_range)

    @property
    def log_key(self) -> str:
        return "fid" if self.feature_extractor == "inception" else "fd_classifier"

    @property
    def report_key(self) -> str:  # type: ignore[override]
        return self.log_key

    def describe(self) -> dict:
        if self.feature_extractor == "inception":
            extractor = (
                "InceptionV3 pool3 (2048-d), torch-fidelity FID weights "
                f"({self.feature_extractor_weights_path or 'torch hub cache'})"
            )
        else:
            extractor = (
                f"FeatureClassifier penultimate layer, weights {self.classifier_path} "
                "(trained on the raw held-out split; not FID)"
            )
        return {
            "metric": self.log_key,
            "feature_extractor": extractor,
            "num_generated": self.num_samples,
            "num_real": self.num_real,
            "real_split": "raw held-out split",
        }

    def _build_classifier_metric(
        self, reference: Tensor, labels: Tensor | None, cache_dir: str | Path = ".dpot_cache"
    ) -> ClassifierFrechetDistance:
        if self.classifier_path is None:
            self.classifier_path = str(
                default_classifier_path(reference, cache_dir, self.classifier_epochs)
            )
        path = Path(self.classifier_path)
        if not path.is_file() and labels is None:
            raise ValueError(
                f"classifier_path={self.classifier_path!r} does not exist and the held-out split "
                "has no labels to train the feature classifier on; give a trained classifier file"
            )
        return ClassifierFrechetDistance.from_classifier_file(
            path,
            reference,
            labels,
            train_kwargs={"epochs": self.classifier_epochs, "seed": 0},
        )

    def setup_metric(self, datamodule: Any, device: torch.device, rank: int, world: int) -> None:
        """Build the metric (classifier variant) and add this rank's shard of the real split.

        The classifier is trained on the full held-out split by rank 0 first (the others wait
        at a barrier and then load the cached file), so all ranks share its weights.
        """
        reference, labels = held_out_split(datamodule)
        if self.metric is None:
            cache_dir = getattr(datamodule, "cache_dir", ".dpot_cache")
            self.metric = self._build_classifier_metric(reference, labels, cache_dir)
        self.metric = self.metric.to(device)
        shard = reference[rank::world]
        for start in range(0, shard.shape[0], self.batch_size):
            self.metric.update(shard[start : start + self.batch_size].to(device), real=True)
        self.num_real = int(reference.shape[0])

    def compute_value(
        self, pl_module: Any, datamodule: Any, rank: int = 0, world_size: int = 1, barrier=None
    ) -> float:
        """Generate this rank's share of ``num_samples``, update, and compute (synced) d²."""
        device = getattr(pl_module, "device", torch.device("cpu"))
        if self.num_real == 0:
            if self.feature_extractor == "classifier" and self.metric is None and world_size > 1:
                if rank == 0:
                    reference, labels = held_out_split(datamodule)
                    cache_dir = getattr(datamodule, "cache_dir", ".dpot_cache")
                    self.metric = self._build_classifier_metric(reference, labels, cache_dir)
                if barrier is not None:
                    barrier()
            self.setup_metric(datamodule, device, rank, world_size)
        assert self.metric is not None
        self.metric.reset()  # generated side only: real statistics are kept
        share = rank_share(self.num_samples, rank, world_size)
        if share > 0:
            fake, _ = generate_samples(pl_module, share)
            for start in range(0, fake.shape[0], self.batch_size):
                self.metric.update(fake[start : start + self.batch_size].to(device), real=False)
        return float(self.metric.compute())

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        value = self.compute_value(
            pl_module,
            trainer.datamodule,
            trainer.global_rank,
            trainer.world_size,
            barrier=trainer.strategy.barrier,
        )
        return {self.log_key: value}

    def log_values(self, result: dict) -> dict[str, float]:
        return {self.log_key: result[self.log_key]}


# --------------------------------------------------------------------------------------------
# Downstream utility
# --------------------------------------------------------------------------------------------


class UtilityEvaluation(_EvaluationCallback):
    """Accuracy on the raw held-out split of classifiers trained on labelled synthetic samples.

    Paper 002 §D.2: acc(f) = (1/N_test) Σⱼ 1[f(xⱼ) = yⱼ] for f ∈ {LogReg, MLP, CNN} trained on
    {(x̃ᵢ, ỹᵢ)} ~ G (error rate 1 − acc in the paper), via
    :func:`~lightning_dpot.metrics.utility.downstream_utility`. During training the
    :data:`~lightning_dpot.metrics.utility.QUICK` settings are used; at the end ``final_mode``
    (default ``"full"``: the paper's protocol, 60,000 samples, patience 30). Runs on rank 0;
    the result is broadcast. Unconditional generators (no ``sample_labeled``) are skipped with
    one warning. Log keys ``utility/<classifier>``.

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
        unknown = [c for c in classifiers if c not in CLASSIFIERS]
        if unknown or not classifiers:
            raise ValueError(
                f"classifiers must be a non-empty subset of {CLASSIFIERS}, got {tuple(classifiers)}"
            )
        if final_mode not in ("full", "quick"):
            raise ValueError(f"final_mode must be 'full' or 'quick', got {final_mode!r}")
        self.classifiers = tuple(classifiers)
        self.final_mode = final_mode
        self.seed = int(seed)
        self.skipped: str | None = None

    def describe(self) -> dict:
        return {
            "metric": "downstream utility (accuracy on the raw held-out split)",
            "classifiers": list(self.classifiers),
            "num_synthetic": self.num_samples,
            "skipped": self.skipped,
        }

    def final_differs(self) -> bool:
        return self.final_mode == "full"

    def settings(self, final: bool) -> UtilitySettings:
        return FULL if final and self.final_mode == "full" else QUICK

    def compute_value(self, pl_module: Any, datamodule: Any, final: bool) -> dict | None:
        """``{classifier: accuracy, "mode": ...}``, or ``None`` (and one warning) when the
        generator is unconditional or the held-out split has no labels."""
        if self.skipped is not None:
            return None
        test_x, test_y = held_out_split(datamodule)
        x, y = generate_samples(pl_module, self.num_samples, labelled=True)
        if test_y is None:
            self.skipped = "the raw held-out split has no labels"
        else:
            try:
                accuracies = downstream_utility(
                    x,
                    y,
                    test_x,
                    test_y,
                    classifiers=self.classifiers,
                    settings=self.settings(final),
                    seed=self.seed,
                )
            except UnlabelledSamplesError:
                self.skipped = (
                    f"{type(pl_module).__name__} is an unconditional generator (no labelled "
                    "samples: it has no sample_labeled(n) -> (x, y))"
                )
            else:
                mode = "full" if final and self.final_mode == "full" else "quick"
                return {**accuracies, "mode": mode}
        warnings.warn(f"UtilityEvaluation skipped: {self.skipped}", stacklevel=2)
        return None

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        result = None
        if trainer.is_global_zero:
            result = self.compute_value(pl_module, trainer.datamodule, final)
        result = trainer.strategy.broadcast(result, src=0)
        if result is None:
            self.skipped = self.skipped or "unconditional generator (see rank 0)"
            return {}
        return result

    def log_values(self, result: dict) -> dict[str, float]:
        return {f"utility/{name}": result[name] for name in self.classifiers if name in result}


# --------------------------------------------------------------------------------------------
# W2 to raw data
# --------------------------------------------------------------------------------------------


class W2Evaluation(_EvaluationCallback):
    r"""Exact W₂ between generated and raw held-out samples on subsamples (paper 001 §IV-C).

    For r = 1..R: w_r = W₂(μ_{G[I_r]}, μ_{X[J_r]}) with |I_r| = |J_r| = m, solved exactly as an
    assignment (:func:`~lightning_dpot.metrics.w2.subsampled_w2`); reports the mean and the
    standard error s/√R. Images are flattened (28² = 784-d for MNIST), in pixel units of
    [−1, 1]. Runs on rank 0 (result broadcast). Log keys ``w2`` and ``w2_stderr``.

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
        self.subsample = check_positive_int("subsample", subsample)
        self.repeats = check_positive_int("repeats", repeats)
        if self.subsample > self.num_samples:
            raise ValueError(
                f"subsample must lie in [1, num_samples] = [1, {self.num_samples}], "
                f"got {self.subsample}"
            )
        self.seed = int(seed)

    def describe(self) -> dict:
        return {
            "metric": "exact W2 to the raw held-out split on subsamples (mean, stderr)",
            "num_generated": self.num_samples,
            "subsample": self.subsample,
            "repeats": self.repeats,
        }

    def compute_value(self, pl_module: Any, datamodule: Any) -> dict:
        reference, _ = held_out_split(datamodule)
        fake, _ = generate_samples(pl_module, self.num_samples)
        mean, stderr = subsampled_w2(
            fake,
            reference,
            subsample=min(self.subsample, fake.shape[0], reference.shape[0]),
            repeats=self.repeats,
            generator=torch.Generator().manual_seed(self.seed),
        )
        return {"w2": mean, "w2_stderr": stderr}

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, final: bool) -> dict:
        result = None
        if trainer.is_global_zero:
            result = self.compute_value(pl_module, trainer.datamodule)
        return trainer.strategy.broadcast(result, src=0)

    def log_values(self, result: dict) -> dict[str, float]:
        return {"w2": result["w2"], "w2_stderr": result["w2_stderr"]}
