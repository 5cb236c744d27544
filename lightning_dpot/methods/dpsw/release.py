"""The sliced Gaussian release shared by the DPSW methods: the module base that owns one
``SlicedGaussianRelease``, and the per-step batch
releases of DPSWflow-r and DPSWgen (package docstring: adjacency, DDP)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from lightning_dpot.checks import check_epsilon, check_nonnegative
from lightning_dpot.data.protocols import LatentPrivateData, require_data
from lightning_dpot.distributed import all_gather_rows, rank_world
from lightning_dpot.generative import Generative
from lightning_dpot.methods.dpsw.sensitivity import WBound
from lightning_dpot.methods.dpsw.sliced_release import SlicedGaussianRelease
from lightning_dpot.privacy.accounting.analysis.schemes import WITHOUT_REPLACEMENT, swor_sample_rate
from lightning_dpot.privacy.accounting.calibration import calibrated_noise_std
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.privacy.guards import planned_releases, warn_if_unaccounted
from lightning_dpot.rng import seeded_generator

STREAM_DIRECTIONS, STREAM_RELEASE, STREAM_FLOW, STREAM_INIT, STREAM_SUBSET = range(5)


def check_sigma_or_target(noise_scale: float | None, target_epsilon: float | None) -> None:
    if (noise_scale is None) == (target_epsilon is None):
        raise ValueError(
            "give exactly one of noise_scale (σ ≥ 0, 0 = not private) and target_epsilon "
            f"(> 0), got noise_scale={noise_scale!r}, target_epsilon={target_epsilon!r}"
        )
    if noise_scale is not None:
        check_nonnegative("noise_scale", noise_scale)


class BatchReleases:
    """The per-step releases of DPSWflow-r and DPSWgen (module docstring, "Adjacency"): at step
    k, the ``b`` indices the datamodule draws without replacement from its secret seed, fresh
    checked directions Θ_k from ``(seed, k)``, and this rank's rows of the batch released."""

    def __init__(self, release: SlicedGaussianRelease, seed: int) -> None:
        self.release, self.seed = release, seed
        self.datamodule: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """All but the bound datamodule, whose private records a saved module must not carry."""
        return {**self.__dict__, "datamodule": None}

    def bind(
        self,
        name: str,
        datamodule: Any,
        trainer: L.Trainer,
        target_epsilon: float | None,
        accountant: str,
    ) -> int | None:
        """Check the datamodule's sampling and calibrate σ (from ``target_epsilon`` over the
        planned steps, or as given) for ``b`` of ``n`` records per step. Returns the planned
        number of releases the calibration used (``None``: σ was given)."""
        if datamodule.sample_rate is not None:
            raise ValueError(
                f"{name} releases one noisy row per sampled record, so Poisson sampling "
                f"(sample_rate={datamodule.sample_rate!r}) would make the batch size part of the "
                "output, which its add/remove accounting does not cover: set the datamodule's "
                "batch_size (fixed size b, drawn without replacement) and sample_rate=None"
            )
        if datamodule.batch_size is None:
            raise ValueError(
                f"{name} releases a fixed-size minibatch drawn without replacement every step: "
                "set the datamodule's batch_size (an integer b in [1, n])"
            )
        n, b, dim = int(datamodule.num_private), int(datamodule.batch_size), datamodule.latent_dim
        if not 1 <= b <= n:
            raise ValueError(
                f"batch_size must be in [1, n={n}] (the number of private records), got {b!r}"
            )
        self.datamodule = datamodule
        # A subset drawn from a public seed is known: account b of b (no amplification).
        n_accounted = b if self.subset_seed_is_public() else n
        sigma, steps = self.release.noise_scale, None
        if target_epsilon is not None:
            steps = planned_releases(trainer, datamodule.steps_per_epoch)
            sigma = calibrated_noise_std(
                target_epsilon,
                self.release.delta,
                self.release.sensitivity(int(dim)),
                steps,
                swor_sample_rate(n_accounted, b),
                WITHOUT_REPLACEMENT,
                accountant,
            )
        self.release.calibrate(sigma, int(dim), dataset_size=n_accounted, batch_size=b)
        return steps

    def batch(self, step: int, device: torch.device) -> Tensor:
        """This rank's rows ``rank, rank + W, ...`` of step ``step``'s batch."""
        if self.datamodule is None:
            raise RuntimeError("call setup() (fit) first")
        rank, world = rank_world()
        indices = self.datamodule.without_replacement_indices(step)
        return self.datamodule.private_records()[indices[rank::world]].to(device)

    def __call__(self, step: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Θ_k and the sorted, all-gathered release ``(N_θ, b)`` of step ``step``."""
        rank, _ = rank_world()
        batch = self.batch(step, device)
        theta = self.release.directions(
            batch.shape[1], seeded_generator(self.seed, STREAM_DIRECTIONS, step)
        ).to(batch.device)
        source = self.release.noise.source(STREAM_RELEASE, step, rank, device=batch.device)
        noisy = all_gather_rows(self.release(batch, theta, source))
        return theta, torch.sort(noisy.transpose(0, 1), dim=1).values

    def subset_seed_is_public(self) -> bool | None:
        """Whether the subsets come from a public seed (then no amplification is claimed)."""
        return None if self.datamodule is None else self.datamodule.seed is not None


class SlicedReleaseModule(ReleasesPrivateData, L.LightningModule, Generative):
    """A module whose only access to private data is one ``SlicedGaussianRelease``; it
    declares the release's arguments once for every DPSW method (each method adds its own and
    forwards these).

    Args:
        num_directions: ``N_θ``, the directions of one release.
        noise_scale / target_epsilon: exactly one: the standard deviation σ of the release's
            noise (0: not private), or the ε that σ is calibrated to.
        delta: δ of the Gaussian mechanism; delta_s, w_bound: the threshold w on ‖Θ‖²_op
            (``SlicedGaussianRelease``).
        noise_seed: ``None`` (default): the release noise comes from the OS entropy pool and is
            never recorded. An integer makes it reproducible, but anyone who knows it can
            subtract the noise: tests and debugging only.
        secure_rng: release noise from the OS CSPRNG instead (``docs/secure_noise.md``).
    """

    release: SlicedGaussianRelease

    def __init__(
        self,
        num_directions: int = 70,
        noise_scale: float | None = None,
        target_epsilon: float | None = None,
        delta: float = 1e-5,
        delta_s: float = 1e-8,
        w_bound: WBound = "chernoff",
        noise_seed: int | None = None,
        secure_rng: bool = False,
    ) -> None:
        super().__init__()
        # Here, not in the methods: Lightning collects the arguments of every __init__ on the
        # call stack, so the method's own and all of these (defaults included) are recorded.
        self.save_hyperparameters(ignore=["generator"])
        check_sigma_or_target(noise_scale, target_epsilon)
        self.release = SlicedGaussianRelease(
            num_directions, delta, delta_s, w_bound, noise_seed, secure_rng,
            is_private=noise_scale != 0.0,
        )  # fmt: skip
        self.release.noise_scale = 0.0 if noise_scale is None else float(noise_scale)
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon("target_epsilon", target_epsilon)
        )

    @override
    def privacy_releases(self) -> list[SlicedGaussianRelease]:
        return [self.release]

    @property
    def noise_scale(self) -> float:
        """σ of the release (what the flow's drift and the DP-SW loss deconvolve)."""
        return self.release.noise_scale

    @property
    def mechanism_calls(self) -> int:
        """Releases of private data so far (restored checkpoints included)."""
        return self.release.events.total

    def check_data(self, datamodule: Any) -> None:
        """Refuse a datamodule without the private latents every DPSW method trains on, before
        a local-DP datamodule would release anything
        (``ChecksDataBeforeRelease``)."""
        require_data(datamodule, LatentPrivateData, type(self).__name__)

    @override
    def on_fit_start(self) -> None:
        """Warn before any release (DPSWflow releases in ``on_fit_start``) when no accountant
        is attached."""
        warn_if_unaccounted(self)
