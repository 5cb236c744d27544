r"""DP sliced-Wasserstein flows and the DPSWgen baseline (paper 004, §4–5, Algorithms 1–2).

All three methods touch the private data only through the Gaussian release of random projections
(eq. 23, :func:`~lightning_dpot.privacy.sliced_sensitivity.gaussian_sliced_release`)

    M(Y) = Y Θᵀ + Z,   Z_{ij} ~ N(0, σ²),   records ‖y_i‖₂ ≤ 1 (ℓ2-normalized latents),

whose ℓ2 (Frobenius) sensitivity under **replace-one** adjacency is ``Δ = 2·sqrt(w(N_θ, δ_s))``
(Lemma 1, eqs. 24–26). The release is one object,
:class:`~lightning_dpot.privacy.sliced_release.SlicedGaussianRelease`: it checks
``‖Θ‖²_op ≤ w`` on every draw of the directions (redrawing otherwise), so Δ holds
deterministically and the guarantee carries no δ_s term; it emits one privacy event per call,
which the accountant composes (:mod:`lightning_dpot.privacy.contract`). Everything after the
release (sorting, quantiles, the particle updates, the generator's gradient) is
post-processing.

* :class:`DPSWFlow` (Algorithm 2): Θ of ``N_θ`` directions is drawn **once**, the whole private set
  is released **once** (one Gaussian mechanism, no composition) and the sorted release is cached
  as module state (saved in checkpoints; never redrawn on resume or per DDP rank — rank 0 draws
  and broadcasts). Each step uses ``M_θ`` of the ``N_θ`` columns, chosen by a generator seeded by
  ``(seed, step)``. Guarantee: ``(ε, δ)`` with ``ε`` from the analytic Gaussian mechanism
  (Balle & Wang 2018) for ``σ/Δ``; it does not grow with the number of steps.
  *Samples*: the particles (``num_particles`` of them). Any number more is free: rerun the flow
  from the cached release (:meth:`DPSWFlow.generate`), which is post-processing.
* :class:`DPSWFlowR` (Algorithm 1): every step draws a fresh Θ (seeded by ``(seed, step)``) and
  releases a fresh private minibatch of exactly ``b`` of the ``n`` records, drawn uniformly
  without replacement (seeded by ``(seed, step)``; the datamodule's ``batch_size``). The
  accountant composes ``T`` steps of the subsampled Gaussian without replacement, ratio ``b/n``,
  noise multiplier ``σ/Δ``, under replace-one adjacency
  (:class:`~lightning_dpot.callbacks.PrivacyAccountantCallback`, from the emitted events).
  *Samples*: exactly the ``num_particles`` particles. More samples would need a new flow, i.e. new
  releases of private data, which spends budget: :meth:`DPSWFlowR.sample` refuses ``n`` beyond
  the particle count.
* :class:`DPSWGen` (baseline, Rakotomamonjy & Ralaivola 2021): a generator with the decoder's
  architecture, trained by minimising the DP sliced-Wasserstein loss between the public-encoder
  latents of its images and the per-step release; accounted exactly like :class:`DPSWFlowR`.
  *Samples*: unlimited and free (a trained generator).

**Adjacency.** Every guarantee here is for *replacing* one record (``n`` public), the relation of
the sensitivity Δ (Lemma 1). :class:`DPSWFlow` releases the full private set once. For
:class:`DPSWFlowR` / :class:`DPSWGen` each sampled record is released as its own noisy row, so the
batch size is visible: they therefore use fixed-size batches (``b`` rows every step, a public
number) drawn uniformly without replacement, independently of the data. Replacing one record
changes at most one released row (the subset is drawn from indices, not values), by at most Δ in
ℓ2 given Θ, so a step is the subsampled Gaussian without replacement with ratio ``γ = b/n`` and
multiplier ``σ/Δ``. Its RDP is bounded by Wang, Balle & Kasiviswanathan 2019 ("Subsampled Rényi
DP and analytical moments accountant", Thm. 9/27), composed over ``T`` steps by dp-accounting's
``RdpAccountant(REPLACE_ONE)`` (:func:`~lightning_dpot.privacy.accountants.swor_gaussian_epsilon`;
no PLD analysis exists for it in dp-accounting, so only RDP is reported). Poisson sampling
(add/remove-one, the paper's accounting) is refused: with one row per sampled record it is not
proven for this mechanism. See ``docs/dpswflow.md``.

**DDP.** Particles are sharded across ranks (``num_particles`` must be divisible by the world
size); directions come from generators seeded by ``(seed, step)``, identical on every rank. The
DPSWFlow release is drawn on rank 0 and broadcast. The per-step batch of DPSWFlowR / DPSWGen is
the same ``b`` indices on every rank (seeded by ``(seed, step)``); rank ``r`` releases the rows
``r, r + W, ...`` of it (disjoint shards, each record's row is noised once) and the rows are
all-gathered (post-processing), so every rank flows toward the same released batch of ``b`` rows.
Checkpoints gather all shards. Use ``Trainer(use_distributed_sampler=False)``: Lightning's
distributed sampler would split the step loaders.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn

from lightning_dpot.distributed import all_gather_rows, rank_world
from lightning_dpot.ot.sliced import (
    dp_sliced_wasserstein_loss,
    random_directions,
    sliced_flow_step,
    sliced_wasserstein,
)
from lightning_dpot.privacy.accountants import swor_min_noise_multiplier
from lightning_dpot.privacy.contract import ReleasesPrivateData, warn_if_unaccounted
from lightning_dpot.privacy.gaussian import gaussian_sigma
from lightning_dpot.privacy.secure_rng import seeded_generator
from lightning_dpot.privacy.sliced_release import SlicedGaussianRelease
from lightning_dpot.privacy.sliced_sensitivity import WBound
from lightning_dpot.privacy.validation import (
    check_epsilon,
    check_nonnegative,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
)

__all__ = ["DPSWFlow", "DPSWFlowR", "DPSWGen", "seeded_generator"]

_STREAM_DIRECTIONS, _STREAM_RELEASE, _STREAM_FLOW, _STREAM_INIT, _STREAM_SUBSET = range(5)


def _check_sigma_or_target(noise_sigma: float | None, target_epsilon: float | None) -> None:
    if (noise_sigma is None) == (target_epsilon is None):
        raise ValueError(
            "give exactly one of noise_sigma (σ ≥ 0, 0 = not private) and target_epsilon "
            f"(> 0), got noise_sigma={noise_sigma!r}, target_epsilon={target_epsilon!r}"
        )
    if noise_sigma is not None:
        check_nonnegative("noise_sigma", noise_sigma)


def _planned_releases(trainer: L.Trainer, steps_per_epoch: int) -> int:
    """Training batches of the run, one release each (optimizer steps × accumulation)."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return int(trainer.max_steps) * int(trainer.accumulate_grad_batches)
    if trainer.max_epochs is None or trainer.max_epochs < 0:
        raise ValueError(
            "target_epsilon needs a finite training length to calibrate σ: set trainer.max_steps "
            "or trainer.max_epochs"
        )
    return int(trainer.max_epochs) * steps_per_epoch


class _BatchReleases:
    """The per-step releases of DPSWflow-r and DPSWgen (module docstring, "Adjacency"): at step
    k, the ``b`` indices the datamodule draws without replacement from its secret seed, fresh
    checked directions Θ_k from ``(seed, k)``, and this rank's rows of the batch released."""

    def __init__(self, release: SlicedGaussianRelease, seed: int) -> None:
        self.release, self.seed = release, seed
        self.datamodule: Any = None

    def bind(
        self,
        name: str,
        datamodule: Any,
        trainer: L.Trainer,
        target_epsilon: float | None,
        accountant: str,
    ) -> None:
        """Check the datamodule's sampling and calibrate σ (from ``target_epsilon`` over the
        planned steps, or as given) for ``b`` of ``n`` records per step."""
        if getattr(datamodule, "sample_rate", None) is not None:
            raise ValueError(
                f"{name} releases one noisy row per sampled record, so Poisson sampling "
                f"(sample_rate={datamodule.sample_rate!r}) would make the batch size part of the "
                "output, which its add/remove accounting does not cover: set the datamodule's "
                "batch_size (fixed size b, drawn without replacement) and sample_rate=None"
            )
        if getattr(datamodule, "batch_size", None) is None:
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
        sigma = self.release.noise_sigma
        if target_epsilon is not None:
            steps = _planned_releases(trainer, datamodule.steps_per_epoch)
            multiplier = swor_min_noise_multiplier(
                n_accounted, b, steps, target_epsilon, self.release.delta, accountant
            )
            sigma = multiplier * self.release.sensitivity(int(dim))
        self.release.calibrate(sigma, int(dim), dataset_size=n_accounted, batch_size=b)

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
            batch.shape[1], seeded_generator(self.seed, _STREAM_DIRECTIONS, step)
        ).to(batch.device)
        source = self.release.noise.source(_STREAM_RELEASE, step, rank, device=batch.device)
        noisy = all_gather_rows(self.release(batch, theta, source))
        return theta, torch.sort(noisy.transpose(0, 1), dim=1).values

    def subset_seed_is_public(self) -> bool | None:
        """Whether the subsets come from a public seed (then no amplification is claimed)."""
        return None if self.datamodule is None else self.datamodule.seed is not None


class _SlicedReleaseModule(ReleasesPrivateData, L.LightningModule):
    """A module whose only access to private data is one :class:`SlicedGaussianRelease`."""

    release: SlicedGaussianRelease

    def _build_release(
        self,
        noise_sigma: float | None,
        num_directions: int,
        delta: float,
        delta_s: float,
        w_bound: WBound,
        noise_seed: int | None,
        secure_rng: bool,
    ) -> None:
        self.release = SlicedGaussianRelease(
            num_directions, delta, delta_s, w_bound, noise_seed, secure_rng,
            is_private=noise_sigma != 0.0,
        )  # fmt: skip
        self.release.noise_sigma = 0.0 if noise_sigma is None else float(noise_sigma)

    def privacy_releases(self) -> list[SlicedGaussianRelease]:
        return [self.release]

    @property
    def noise_sigma(self) -> float:
        """σ of the release (what the flow's drift and the DP-SW loss deconvolve)."""
        return self.release.noise_sigma

    @property
    def mechanism_calls(self) -> int:
        """Releases of private data so far (restored checkpoints included)."""
        return self.release.events.total

    def on_train_start(self) -> None:
        warn_if_unaccounted(self)


class _ParticleFlow(_SlicedReleaseModule):
    """Particles as module state, manual optimisation, decoding and checkpoints."""

    def __init__(
        self,
        num_particles: int,
        num_directions: int,
        noise_sigma: float | None,
        target_epsilon: float | None,
        delta: float,
        delta_s: float,
        w_bound: WBound,
        step_size: float,
        diffusion: float,
        init_std: float | None,
        evaluate_at: Literal["noisy", "projection"],
        seed: int,
        noise_seed: int | None,
        secure_rng: bool,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        _check_sigma_or_target(noise_sigma, target_epsilon)
        self._build_release(
            noise_sigma, num_directions, delta, delta_s, w_bound, noise_seed, secure_rng
        )
        self.num_particles = check_positive_int("num_particles", num_particles)
        if self.num_particles < 2:
            raise ValueError(f"num_particles must be >= 2, got {num_particles!r}")
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon(target_epsilon, "target_epsilon")
        )
        self.step_size = check_positive("step_size", step_size)
        self.diffusion = check_nonnegative("diffusion", diffusion)
        self.init_std = None if init_std is None else check_positive("init_std", init_std)
        self.evaluate_at = evaluate_at
        self.seed = check_nonnegative_int("seed", seed)
        self.dim: int | None = None
        # Parameter only so that Lightning counts optimizer steps (global_step) in manual mode.
        self._step_clock = nn.Parameter(torch.zeros(1))
        self.register_buffer("particles", torch.empty(0), persistent=False)

    # -- setup -----------------------------------------------------------------------------------
    def _datamodule(self) -> Any:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or not hasattr(datamodule, "private_records"):
            raise TypeError(
                f"{type(self).__name__} needs a PrivateLatentDataModule (private_records(), "
                "decode()), got " + type(datamodule).__name__
            )
        return datamodule

    def _init_particles(self, n: int, dim: int, rank: int) -> Tensor:
        std = self.init_std if self.init_std is not None else 1.0 / math.sqrt(dim)
        g = seeded_generator(self.seed, _STREAM_INIT, rank)
        return std * torch.randn(n, dim, generator=g)

    def setup(self, stage: str) -> None:
        if self.dim is not None:
            return
        datamodule = self._datamodule()
        datamodule.setup(stage)
        self.dim = int(datamodule.latent_dim)
        self._decode = datamodule.decode
        rank, world = rank_world()
        if self.num_particles % world:
            raise ValueError(
                f"num_particles={self.num_particles} must be divisible by the world size {world}"
            )
        shard = self.num_particles // world
        self.particles = self._init_particles(shard, self.dim, rank).to(self.device)
        self.calibrate(datamodule)

    def calibrate(self, datamodule: Any) -> None:
        raise NotImplementedError

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([self._step_clock], lr=0.0)

    def _tick(self) -> None:
        """One optimizer step (no parameter changes): advances ``trainer.global_step``."""
        self.optimizers().step()

    def _flow_step(self, target_sorted: Tensor, theta: Tensor, step: int) -> None:
        rank, _ = rank_world()
        g = seeded_generator(self.seed, _STREAM_FLOW, step, rank, device=self.particles.device)
        self.particles = sliced_flow_step(
            self.particles,
            target_sorted,
            theta,
            self.step_size,
            self.noise_sigma,
            self.diffusion,
            g,
            evaluate_at=self.evaluate_at,
            target_sorted=True,
        )

    # -- checkpoints (particles of all ranks) ----------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        _, world = rank_world()
        particles = self.particles
        if world > 1:
            parts = [torch.zeros_like(particles) for _ in range(world)]
            torch.distributed.all_gather(parts, particles.contiguous())
            particles = torch.cat(parts)
        checkpoint["dpsw_particles"] = particles.detach().cpu()
        checkpoint["dpsw_release"] = self.release.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rank, world = rank_world()
        particles = checkpoint["dpsw_particles"]
        shard = particles.shape[0] // world
        self.particles = particles[rank * shard : (rank + 1) * shard].to(self.device)
        self.dim = int(particles.shape[1])
        self.release.load_state_dict(checkpoint["dpsw_release"])

    def attach_datamodule(self, datamodule: Any) -> None:
        """Attach the public decoder of a (not set-up) ``PrivateLatentDataModule`` after a
        checkpoint load (``dpot sample`` / ``dpot evaluate``, see
        :mod:`lightning_dpot.commands.checkpoint`). Loads only the stage-1 autoencoder weights:
        no private record is read and no mechanism is called."""
        from lightning_dpot.data.latent import load_autoencoder_checkpoint

        autoencoder = getattr(datamodule, "autoencoder", None)
        if autoencoder is not None and getattr(datamodule, "latents", None) is None:
            load_autoencoder_checkpoint(autoencoder, datamodule.autoencoder_checkpoint)
        self._decode = datamodule.decode

    # -- samples ---------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, z: Tensor) -> Tensor:
        decode = getattr(self, "_decode", None)
        if decode is None:
            return z
        return decode(z).cpu()

    @torch.no_grad()
    def sample(self, n: int | None = None) -> Tensor:
        """The first ``n`` (default all) particles of this rank, decoded."""
        n = self.particles.shape[0] if n is None else check_positive_int("n", n)
        if n > self.particles.shape[0]:
            raise ValueError(
                f"n={n} exceeds the {self.particles.shape[0]} particles of this rank; "
                + self._more_samples_note()
            )
        return self.decode(self.particles[:n])

    def _more_samples_note(self) -> str:
        raise NotImplementedError

    def on_fit_end(self) -> None:
        """Save the particles and a grid of their images (rank 0). The privacy report is the
        accountant's (:class:`~lightning_dpot.callbacks.PrivacyAccountantCallback`)."""
        if self._trainer is None:
            return
        # trainer.log_dir broadcasts under DDP: every rank must read it (else rank 0 deadlocks).
        log_dir = Path(self.trainer.log_dir or self.trainer.default_root_dir)
        if not self.trainer.is_global_zero:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        samples = self.sample(min(64, self.particles.shape[0]))
        if samples.ndim == 4 and samples.shape[1] in (1, 3):
            from torchvision.utils import save_image

            from lightning_dpot.grids import images_to_grid

            save_image(images_to_grid(samples), log_dir / "samples.png")
        torch.save(self.particles.detach().cpu(), log_dir / "particles.pt")


class DPSWFlow(_ParticleFlow):
    """DPSWflow (paper 004, Algorithm 2): one cached release, ``M_θ`` of ``N_θ`` directions/step.

    Algorithm: draw ``Θ ∈ R^{N_θ×d}`` once; release ``Ỹ = YΘᵀ + Z`` once (all private latents);
    cache ``sort(Ỹ)`` per column. Step ``k``: pick ``M_θ`` columns ``J_k`` (generator seeded by
    ``(seed, k)``), ``X_{k+1} = X_k + h·v̂(X_k; Ỹ[:, J_k], Θ[J_k]) + sqrt(2λh)·ξ`` (eqs. 18–21,
    :func:`~lightning_dpot.ot.sliced.sliced_flow_step`).

    Privacy: one Gaussian mechanism with sensitivity ``Δ = 2·sqrt(w(N_θ, δ_s))`` (all ``N_θ``
    directions count, whichever ``M_θ`` a step uses), emitted as one
    :class:`~lightning_dpot.privacy.events.GaussianRelease`: ``ε`` from the analytic Gaussian
    mechanism at ``δ``. Give either ``noise_sigma`` (σ) or ``target_epsilon`` (σ is then
    calibrated with the analytic Gaussian mechanism). ε never grows with steps.

    Samples: ``num_particles``; more are free with :meth:`generate` (a new flow from the cache).

    Args:
        num_particles: particles N (all ranks together).
        num_directions: ``N_θ`` (paper: 31).
        directions_per_step: ``M_θ ≤ N_θ`` (paper: 25).
        noise_sigma / target_epsilon: exactly one.
        delta: δ of the Gaussian mechanism; delta_s, w_bound: the threshold w on ‖Θ‖²_op
            (:class:`~lightning_dpot.privacy.sliced_release.SlicedGaussianRelease`).
        step_size: h; diffusion: λ; init_std: std of μ0 = N(0, init_std²·I) (default 1/√d).
        evaluate_at: see :func:`~lightning_dpot.ot.sliced.sliced_flow_drift`.
        seed: seed of the public random streams (Θ, the M_θ-column subsets, flow noise, initial
            particles): post-processing or data-independent, so it may be published.
        noise_seed: ``None`` (default): the release noise comes from the OS entropy pool and is
            never recorded. An integer makes it reproducible, but anyone who knows it can
            subtract the noise: tests and debugging only.
        secure_rng: release noise from the OS CSPRNG instead (``docs/secure_noise.md``).
    """

    def __init__(
        self,
        num_particles: int = 4000,
        num_directions: int = 31,
        directions_per_step: int = 25,
        noise_sigma: float | None = None,
        target_epsilon: float | None = None,
        delta: float = 1e-5,
        delta_s: float = 1e-8,
        w_bound: WBound = "chernoff",
        step_size: float = 1.0,
        diffusion: float = 0.0,
        init_std: float | None = None,
        evaluate_at: Literal["noisy", "projection"] = "noisy",
        seed: int = 0,
        noise_seed: int | None = None,
        secure_rng: bool = False,
    ) -> None:
        super().__init__(
            num_particles, num_directions, noise_sigma, target_epsilon, delta, delta_s, w_bound,
            step_size, diffusion, init_std, evaluate_at, seed, noise_seed, secure_rng,
        )  # fmt: skip
        self.save_hyperparameters()
        self.directions_per_step = check_positive_int("directions_per_step", directions_per_step)
        if directions_per_step > num_directions:
            raise ValueError(
                f"directions_per_step must be <= num_directions={num_directions}, "
                f"got {directions_per_step!r}"
            )
        self.register_buffer("released", torch.zeros((), dtype=torch.bool))
        self.register_buffer("theta", torch.empty(0))
        self.register_buffer("release_sorted", torch.empty(0))

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        """Size the placeholder buffers (empty until :meth:`calibrate`) to the saved release, so
        that a state dict loads into a fresh module (checkpoints; ``ddp_spawn`` hands rank 0's
        weights back to the main process this way)."""
        for name in ("theta", "release_sorted"):
            saved = state_dict.get(prefix + name)
            if isinstance(saved, Tensor) and getattr(self, name).numel() == 0:
                setattr(self, name, torch.empty_like(saved, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    def next_step_events(self) -> list:
        """Steps release nothing: the one release happens before training."""
        return []

    def calibrate(self, datamodule: Any) -> None:
        n_private = datamodule.num_private
        self.theta = torch.zeros(self.release.num_directions, self.dim, device=self.device)
        self.release_sorted = torch.zeros(
            self.release.num_directions, n_private, device=self.device
        )
        sigma = self.release.noise_sigma
        if self.target_epsilon is not None:
            sigma = gaussian_sigma(
                self.target_epsilon, self.release.delta, self.release.sensitivity(self.dim)
            )
        self.release.calibrate(sigma, self.dim)

    def on_fit_start(self) -> None:
        """Release once (rank 0, broadcast), unless a checkpoint already holds the release."""
        if bool(self.released):
            return
        datamodule = self._datamodule()
        theta = self.release.directions(self.dim, seeded_generator(self.seed, _STREAM_DIRECTIONS))
        if self.trainer.is_global_zero:
            records = datamodule.private_records()
            source = self.release.noise.source(_STREAM_RELEASE, device=records.device)
            noisy = self.release(records, theta, source)
            release_sorted = torch.sort(noisy.transpose(0, 1), dim=1).values
        else:
            release_sorted = torch.zeros_like(self.release_sorted).cpu()
        release_sorted = self.trainer.strategy.broadcast(release_sorted, src=0)
        self.theta = theta.to(self.device)
        self.release_sorted = release_sorted.to(self.device)
        self.released = torch.ones((), dtype=torch.bool, device=self.device)

    def _directions_at(self, step: int) -> Tensor:
        g = seeded_generator(self.seed, _STREAM_SUBSET, step)
        return torch.randperm(self.release.num_directions, generator=g)[: self.directions_per_step]

    def training_step(self, batch: Any, batch_idx: int) -> None:
        step = self.trainer.global_step
        idx = self._directions_at(step).to(self.theta.device)
        self._flow_step(self.release_sorted[idx].transpose(0, 1), self.theta[idx], step)
        self._tick()

    @torch.no_grad()
    def generate(self, n: int, num_steps: int, seed: int | None = None) -> Tensor:
        """``n`` new samples from a fresh flow of ``num_steps`` steps on the cached release:
        post-processing of the one release, so it costs no privacy. Returns decoded samples."""
        if not bool(self.released):
            raise RuntimeError("no release cached yet: fit the module first")
        n = check_positive_int("n", n)
        num_steps = check_positive_int("num_steps", num_steps)
        seed = self.seed if seed is None else int(seed)
        particles = self._init_particles(n, self.theta.shape[1], rank=2**20 + seed)
        particles = particles.to(self.theta.device)
        for step in range(num_steps):
            idx = self._directions_at(step).to(self.theta.device)
            g = seeded_generator(seed, _STREAM_FLOW, step, 2**20, device=particles.device)
            particles = sliced_flow_step(
                particles, self.release_sorted[idx].transpose(0, 1), self.theta[idx],
                self.step_size, self.noise_sigma, self.diffusion, g,
                evaluate_at=self.evaluate_at, target_sorted=True,
            )  # fmt: skip
        return self.decode(particles)

    def _more_samples_note(self) -> str:
        return "DPSWFlow.generate(n, num_steps) reruns the flow from the cached release for free"

    def privacy_context(self) -> dict[str, Any]:
        return {"method": "DPSWflow (paper 004, Algorithm 2): one release"}

    def planned_events(self) -> list:
        """The one release, before it is drawn (so a budget can refuse it)."""
        event = self.release.event
        return [] if bool(self.released) or event is None else [event]


class DPSWFlowR(_ParticleFlow):
    """DPSWflow-r (paper 004, Algorithm 1): fresh Θ and a fresh fixed-size batch every step.

    Step ``k``: ``Θ_k`` (``N_θ`` checked directions, generator seeded by ``(seed, k)``), release
    ``Ỹ_k = B_k Θ_kᵀ + Z_k`` of the batch ``B_k`` (``b`` of the ``n`` records, uniformly without
    replacement by the datamodule, from its secret sampling seed), then
    ``X_{k+1} = X_k + h·v̂(X_k; Ỹ_k, Θ_k) + sqrt(2λh)·ξ`` (eqs. 18–21).

    Privacy (replace-one): each release emits one subsampled-Gaussian-without-replacement event,
    ratio ``γ = b/n``, multiplier ``σ/Δ``, ``Δ = 2·sqrt(w(N_θ, δ_s))``; RDP per step bounded by
    Wang, Balle & Kasiviswanathan 2019 (for ``b = n``: ``α/(2(σ/Δ)²)``), composed by
    :class:`~lightning_dpot.callbacks.PrivacyAccountantCallback`. Give ``noise_sigma`` or
    ``target_epsilon`` (σ is then the smallest multiplier reaching it over the planned ``T`` =
    max_steps or max_epochs·steps_per_epoch).

    Samples: the ``num_particles`` particles only — more would need another flow on new releases,
    which spends budget (the accountant would have to compose them).

    Args: as :class:`DPSWFlow` (no ``directions_per_step``; paper ``N_θ`` = 70) plus
        ``accountant`` used to calibrate σ from ``target_epsilon``: ``"rdp"`` only (``"pld"``
        is refused: dp-accounting has no PLD analysis of sampling without replacement). The
        datamodule must set ``batch_size`` (``sample_rate=None``).
    """

    def __init__(
        self,
        num_particles: int = 4000,
        num_directions: int = 70,
        noise_sigma: float | None = None,
        target_epsilon: float | None = None,
        delta: float = 1e-5,
        delta_s: float = 1e-8,
        w_bound: WBound = "chernoff",
        step_size: float = 1.0,
        diffusion: float = 0.0,
        init_std: float | None = None,
        evaluate_at: Literal["noisy", "projection"] = "noisy",
        accountant: Literal["rdp", "pld"] = "rdp",
        seed: int = 0,
        noise_seed: int | None = None,
        secure_rng: bool = False,
    ) -> None:
        super().__init__(
            num_particles, num_directions, noise_sigma, target_epsilon, delta, delta_s, w_bound,
            step_size, diffusion, init_std, evaluate_at, seed, noise_seed, secure_rng,
        )  # fmt: skip
        self.save_hyperparameters()
        self.accountant = accountant
        self.batches = _BatchReleases(self.release, self.seed)

    def calibrate(self, datamodule: Any) -> None:
        self.batches.bind(
            type(self).__name__, datamodule, self.trainer, self.target_epsilon, self.accountant
        )

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        step = self.trainer.global_step  # the loader only yields step numbers
        theta, target_sorted = self.batches(step, self.particles.device)
        self._flow_step(target_sorted.transpose(0, 1), theta, step)
        self._tick()

    def _more_samples_note(self) -> str:
        return (
            "DPSWFlowR cannot make more samples for free: a new flow needs new releases of the "
            "private data, which spends privacy budget"
        )

    def privacy_context(self) -> dict[str, Any]:
        return {
            "method": "DPSWflow-r (paper 004, Algorithm 1): one release per step",
            "subset_seed_is_public": self.batches.subset_seed_is_public(),
        }


class DPSWGen(_SlicedReleaseModule):
    """DPSWgen baseline (Rakotomamonjy & Ralaivola 2021; paper 004 §5): a generator trained with
    the DP sliced-Wasserstein loss, accounted like :class:`DPSWFlowR`.

    Step ``k``: fresh ``Θ_k`` and release ``Ỹ_k`` of the fixed-size batch (as DPSWFlowR); generate
    images ``G(u)``, ``u ~ N(0, I)``; map them to the latent sphere with the frozen public encoder,
    ``z = E(G(u))`` (identity + unit-ball scaling without an autoencoder); minimise
    ``L = (1/N_θ) Σ_j W_2^2(θ_j#z * N(0, σ²), Ỹ_k[:, j])``
    (:func:`~lightning_dpot.ot.sliced.dp_sliced_wasserstein_loss`, eq. 11). Each training batch
    releases once, so with ``accumulate_grad_batches = k`` one optimizer step is k releases, and
    the accountant composes k events.

    Samples: unlimited and free (``G(u)``).

    Args:
        generator: network ``u → record`` with ``latent_dim`` (paper: the decoder's architecture,
            :class:`~lightning_dpot.nn.ConvDecoderGenerator32`).
        generated_batch_size: generated samples per step.
        lr: Adam learning rate. Others as :class:`DPSWFlowR`.
    """

    def __init__(
        self,
        generator: nn.Module,
        num_directions: int = 70,
        noise_sigma: float | None = None,
        target_epsilon: float | None = None,
        delta: float = 1e-5,
        delta_s: float = 1e-8,
        w_bound: WBound = "chernoff",
        generated_batch_size: int = 250,
        lr: float = 1e-3,
        accountant: Literal["rdp", "pld"] = "rdp",
        seed: int = 0,
        noise_seed: int | None = None,
        secure_rng: bool = False,
    ) -> None:
        super().__init__()
        _check_sigma_or_target(noise_sigma, target_epsilon)
        self.save_hyperparameters(ignore=["generator"])
        self.generator = generator
        self._build_release(
            noise_sigma, num_directions, delta, delta_s, w_bound, noise_seed, secure_rng
        )
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon(target_epsilon, "target_epsilon")
        )
        self.generated_batch_size = check_positive_int("generated_batch_size", generated_batch_size)
        self.lr = lr
        self.accountant = accountant
        self.seed = check_nonnegative_int("seed", seed)
        self.batches = _BatchReleases(self.release, self.seed)
        self.dim: int | None = None

    def privacy_context(self) -> dict[str, Any]:
        return {
            "method": "DPSWgen (Rakotomamonjy & Ralaivola 2021): one release per batch",
            "subset_seed_is_public": self.batches.subset_seed_is_public(),
        }

    def setup(self, stage: str) -> None:
        if self.dim is not None:
            return
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or not hasattr(datamodule, "private_records"):
            raise TypeError("DPSWGen needs a PrivateLatentDataModule")
        datamodule.setup(stage)
        self.dim = int(datamodule.latent_dim)
        # Kept out of the module's state (the frozen public autoencoder belongs to stage 1).
        self.__dict__["_autoencoder"] = datamodule.autoencoder
        self.batches.bind(
            type(self).__name__, datamodule, self.trainer, self.target_epsilon, self.accountant
        )

    def to_latent(self, records: Tensor) -> Tensor:
        """Differentiable map of generated records to the private latents' space."""
        if self._autoencoder is None:
            z = records.reshape(records.shape[0], -1)
            return z / torch.linalg.vector_norm(z, dim=1, keepdim=True).clamp_min(1.0)
        self._autoencoder.to(records.device).eval()
        return self._autoencoder.encode(records)  # ℓ2-normalized, differentiable in records

    def forward(self, u: Tensor) -> Tensor:
        return self.generator(u)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor | None:
        # Each training batch is a release with its own subset and Θ, keyed by the batch's index
        # in the run (= global_step unless accumulate_grad_batches > 1, where one optimizer step
        # spans several batches: re-releasing one subset would not be a fresh subsampled step).
        step = self.trainer.current_epoch * self.batches.datamodule.steps_per_epoch + batch_idx
        theta, target_sorted = self.batches(step, self.device)
        u = torch.randn(self.generated_batch_size, self.generator.latent_dim, device=self.device)
        z = self.to_latent(self(u))
        g = seeded_generator(self.seed, _STREAM_FLOW, step, rank_world()[0], device=z.device)
        loss = dp_sliced_wasserstein_loss(
            z, target_sorted.transpose(0, 1), theta, self.noise_sigma, g
        )
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.generator.parameters(), lr=self.lr)

    @torch.no_grad()
    def sample(self, n: int) -> Tensor:
        """``n`` generated records (free: post-processing)."""
        u = torch.randn(n, self.generator.latent_dim, device=self.device)
        return self(u).cpu()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["dpsw_release"] = self.release.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.release.load_state_dict(checkpoint["dpsw_release"])


def toy_sliced_wasserstein(particles: Tensor, target: Tensor, num_directions: int = 500) -> float:
    """SW_2 between particles and target records on fixed seeded directions (evaluation)."""
    theta = random_directions(num_directions, particles.shape[1], seeded_generator(12345))
    return float(sliced_wasserstein(particles.cpu().float(), target.cpu().float(), theta))
