r"""The template of a central-DP method that releases one statistic of the private records
before training and fits its generator to it (the scheme of DP-MERF, Harder et al. 2021).

Once, when the fit starts (rank 0, then broadcast to every rank):

    s̃ = release(records, labels) = s(records, labels) + N(0, σ² I),

one Gaussian mechanism of ℓ2 sensitivity Δ (the release object's ``sensitivity``) under
replace-one adjacency. Training is post-processing of s̃: any number of steps, no privacy cost,
and the loss, a function of s̃ and the generator only, may be logged. The base does everything
that makes this true: it takes exactly one of σ and a target ε (calibrated at setup with the
analytic Gaussian mechanism, Balle & Wang 2018, for the one release at Δ); binds the central data
(``CentralPrivateData``) and checks it against the generator; refuses a fit whose release would
go unaccounted (``check_release_before_training``); draws the release once and stores it in the
``statistic`` buffer, so a checkpoint holds it and a resume never draws it again; and refuses a
training step before the release (the tuner's ``lr_find`` runs before the fit starts).

A method writes four things:

* ``release``: its release object, passed to the base's ``__init__`` (e.g. a
  ``ClippedSumRelease``: ``sensitivity``, ``calibrate``, ``event``, ``events``, ``facts``);
* ``prepare_release(datamodule, shape)``: the public quantities the release needs (a feature
  map, frequencies), from public facts of the data;
* ``release_statistic(datamodule, source)``: s̃ from the records, through ``self.release``, in
  the units the loss reads;
* ``statistic_loss(fake, labels)``: one step's loss on a generated batch against
  ``self.statistic``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import check_epsilon, check_nonnegative, check_positive_int
from lightning_dpot.methods.conditional import ConditionalGeneratorModule
from lightning_dpot.ot.precision import upcast
from lightning_dpot.privacy.accounting.calibration import calibrated_noise_std
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.privacy.events import EventLog, PrivacyEvent
from lightning_dpot.privacy.guards import check_release_before_training, warn_if_unaccounted
from lightning_dpot.rng import SecretNoise

__all__ = ["OneRelease", "ReleasedStatisticModule"]


class OneRelease(Protocol):
    """A release object that is drawn once: a Gaussian mechanism of declared sensitivity."""

    delta: float
    noise: SecretNoise
    events: EventLog
    calibrated: bool

    @property
    def sensitivity(self) -> float: ...

    @property
    def event(self) -> PrivacyEvent | None: ...

    def calibrate(self, noise_scale: float) -> None: ...

    def facts(self) -> dict[str, Any]: ...


class ReleasedStatisticModule(ReleasesPrivateData, ConditionalGeneratorModule):
    """A generator fitted to one private statistic released before training (module docstring).

    Args:
        generator: ``(z, labels) → records`` when ``conditional``, else ``z → records``.
        release: the method's release object (``OneRelease``), built with ``is_private=False``
            exactly when ``noise_scale`` is 0.
        statistic_shape: the shape of the released statistic (the ``statistic`` buffer).
        noise_scale / target_epsilon: exactly one: σ, the noise std on the statistic (0: the
            non-private reference), or the ε it is calibrated to at the release's δ.
        generated_batch_size: B, generated records per step.
        conditional: class-conditional generation (labels from the data source).
        **kwargs: ``GeneratorModule``'s (``latent_range``, ``lr``, ``optimizer``, ``betas``).

    Raises:
        ValueError: both or neither of ``noise_scale`` and ``target_epsilon``, or a parameter
            out of range (named).
    """

    #: the method's name in the privacy report
    method_description = "a generator fitted to one released statistic"

    def __init__(
        self,
        generator: nn.Module,
        release: OneRelease,
        statistic_shape: tuple[int, ...],
        noise_scale: float | None = None,
        target_epsilon: float | None = None,
        generated_batch_size: int = 100,
        conditional: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            generator, conditional,
            generated_batch_size=check_positive_int("generated_batch_size", generated_batch_size),
            **kwargs,
        )  # fmt: skip
        # The release object is state, not a setting: it holds the events (and, once drawn,
        # follows the checkpoint's release state), so it stays out of the hyperparameters.
        self.save_hyperparameters(ignore=["generator", "release", "statistic_shape"])
        if (noise_scale is None) == (target_epsilon is None):
            raise ValueError(
                "give exactly one of noise_scale (σ ≥ 0, 0 = not private) and target_epsilon "
                f"(> 0), got noise_scale={noise_scale!r}, target_epsilon={target_epsilon!r}"
            )
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon("target_epsilon", target_epsilon)
        )
        self.given_noise_scale = (
            None if noise_scale is None else check_nonnegative("noise_scale", noise_scale)
        )
        self.release = release
        self.register_buffer("released", torch.zeros((), dtype=torch.bool))
        self.register_buffer("statistic", torch.zeros(statistic_shape))

    # -- what a method writes ---------------------------------------------------------------
    def prepare_release(self, datamodule: Any, shape: tuple[int, ...]) -> None:
        """Build the public quantities the release needs from the data's public facts."""

    def release_statistic(self, datamodule: Any, source: Any) -> Tensor:
        """s̃ from ``datamodule``'s records through ``self.release`` (noise from ``source``)."""
        raise NotImplementedError

    def statistic_loss(self, fake: Tensor, labels: Tensor | None) -> Tensor:
        """One step's loss of the generated batch ``fake`` against ``self.statistic``."""
        raise NotImplementedError

    # -- privacy contract -------------------------------------------------------------------
    @override
    def privacy_releases(self) -> list[OneRelease]:
        return [self.release]

    @override
    def next_step_events(self) -> list[PrivacyEvent]:
        """Steps release nothing: the one release happens before training."""
        return []

    @override
    def planned_events(self) -> list[PrivacyEvent]:
        """The one release, before it is drawn (so a budget can refuse it)."""
        event = self.release.event
        return [] if bool(self.released) or event is None else [event]

    @override
    def privacy_context(self) -> dict[str, Any]:
        return {"method": self.method_description}

    # -- Lightning --------------------------------------------------------------------------
    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or self.bind_private_data(datamodule):
            return
        self.prepare_release(datamodule, self.check_central_data(datamodule))
        sigma = self.given_noise_scale
        if self.target_epsilon is not None:
            release = self.release
            sigma = calibrated_noise_std(self.target_epsilon, release.delta, release.sensitivity, 1)
            self.planned_release_count = 1
        if not self.release.calibrated:  # a resumed release keeps its checkpointed σ
            self.release.calibrate(float(sigma))

    @override
    def on_fit_start(self) -> None:
        """Release once (rank 0, broadcast), unless a checkpoint already holds the release;
        refused where it would not be accounted (``check_release_before_training``)."""
        warn_if_unaccounted(self)
        if bool(self.released):
            return
        check_release_before_training(self)
        if self.trainer.is_global_zero:
            source = self.release.noise.source(0, device=self.device)
            statistic = self.release_statistic(self.trainer.datamodule, source).float()
        else:
            statistic = torch.zeros_like(self.statistic)
        # Every rank fits the same s̃: only rank 0 draws it (one release, one event).
        self.statistic = self.trainer.strategy.broadcast(statistic, src=0).to(self.device)
        self.released = torch.ones((), dtype=torch.bool, device=self.device)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """One step of ``statistic_loss`` on a generated batch; ``batch`` is not read."""
        if not bool(self.released):
            raise RuntimeError(
                f"{type(self).__name__} trains only on its release, made when the fit starts "
                "(the tuner's lr_find runs before it: give lr instead)"
            )
        assert self.generated_batch_size is not None
        n = self.generated_batch_size
        labels = self.sample_labels(n) if self.conditional else None
        fake = upcast(self.generate(self.sample_latent(n), labels))
        loss = self.statistic_loss(fake, labels)
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)  # a function of s̃ only
        return loss
