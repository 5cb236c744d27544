"""DPSWflow (Algorithm 2: one release) and DPSWflow-r (Algorithm 1: a release per step) of
Sebag et al. 2023; the particles are the samples (package docstring)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import (
    check_nonnegative,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
)
from lightning_dpot.data.latent import PublicDecoder
from lightning_dpot.data.protocols import LatentPrivateData, require_data
from lightning_dpot.distributed import rank_world
from lightning_dpot.methods.dpsw.release import (
    STREAM_DIRECTIONS,
    STREAM_FLOW,
    STREAM_INIT,
    STREAM_RELEASE,
    STREAM_SUBSET,
    BatchReleases,
    SlicedReleaseModule,
)
from lightning_dpot.nn.samplers import LatentDecoder, ParticleSampler, Reshape
from lightning_dpot.ot.sliced import random_directions, sliced_wasserstein
from lightning_dpot.ot.sliced_flow import sliced_flow_step
from lightning_dpot.privacy.accounting.calibration import calibrated_noise_std
from lightning_dpot.privacy.guards import check_release_before_training
from lightning_dpot.rng import seeded_generator


class _ParticleFlow(SlicedReleaseModule):
    """Particles as module state, manual optimisation, decoding and checkpoints; the arguments
    both flows share (each flow adds its own and forwards the rest here and to
    ``SlicedReleaseModule``).

    Args:
        num_particles: particles N (all ranks together).
        step_size: h; diffusion: λ; init_std: std of μ0 = N(0, init_std²·I) (default 1/√d).
        evaluate_at: see ``sliced_flow_drift``.
        seed: seed of the public random streams (Θ, the M_θ-column subsets, flow noise, initial
            particles): post-processing or data-independent, so it may be published.
        **kwargs: the release's arguments (``num_directions``, ``noise_scale`` or
            ``target_epsilon``, ``delta``, ``delta_s``, ``w_bound``, ``noise_seed``,
            ``secure_rng``).
    """

    def __init__(
        self,
        num_particles: int = 4000,
        step_size: float = 1.0,
        diffusion: float = 0.0,
        init_std: float | None = None,
        evaluate_at: Literal["noisy", "projection"] = "noisy",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.num_particles = check_positive_int("num_particles", num_particles)
        if self.num_particles < 2:
            raise ValueError(f"num_particles must be >= 2, got {num_particles!r}")
        self.step_size = check_positive("step_size", step_size)
        self.diffusion = check_nonnegative("diffusion", diffusion)
        self.init_std = None if init_std is None else check_positive("init_std", init_std)
        self.evaluate_at = evaluate_at
        self.seed = check_nonnegative_int("seed", seed)
        self.dim: int | None = None
        # Parameter only so that Lightning counts optimizer steps (global_step) in manual mode.
        self._step_clock = nn.Parameter(torch.zeros(1))
        self.register_buffer("particles", torch.empty(0), persistent=False)
        self.decoder: PublicDecoder | None = None

    # -- setup -----------------------------------------------------------------------------------
    def _datamodule(self) -> Any:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        return require_data(datamodule, LatentPrivateData, type(self).__name__)

    def _init_particles(self, n: int, dim: int, rank: int) -> Tensor:
        std = self.init_std if self.init_std is not None else 1.0 / math.sqrt(dim)
        g = seeded_generator(self.seed, STREAM_INIT, rank)
        return std * torch.randn(n, dim, generator=g)

    @override
    def setup(self, stage: str) -> None:
        datamodule = self._datamodule()
        if self.bind_private_data(datamodule):
            return
        datamodule.setup(stage)
        self.dim = int(datamodule.latent_dim)
        self.decoder = datamodule.public_decoder()
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

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([self._step_clock], lr=0.0)

    def _tick(self) -> None:
        """One optimizer step (no parameter changes): advances ``trainer.global_step``."""
        self.optimizers().step()

    def _flow_step(self, target_sorted: Tensor, theta: Tensor, step: int) -> None:
        rank, _ = rank_world()
        g = seeded_generator(self.seed, STREAM_FLOW, step, rank, device=self.particles.device)
        self.particles = sliced_flow_step(
            self.particles,
            target_sorted,
            theta,
            self.step_size,
            self.noise_scale,
            self.diffusion,
            g,
            evaluate_at=self.evaluate_at,
            target_sorted=True,
        )

    # -- checkpoints (particles of all ranks) ----------------------------------------------------
    def all_particles(self) -> Tensor:
        """The particles of every rank, in rank order, on the CPU (a collective under DDP:
        every rank must call it)."""
        _, world = rank_world()
        particles = self.particles
        if world > 1:
            parts = [torch.zeros_like(particles) for _ in range(world)]
            torch.distributed.all_gather(parts, particles.contiguous())
            particles = torch.cat(parts)
        return particles.detach().cpu()

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["dpsw_particles"] = self.all_particles()

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rank, world = rank_world()
        particles = checkpoint["dpsw_particles"]
        shard = particles.shape[0] // world
        self.particles = particles[rank * shard : (rank + 1) * shard].to(self.device)
        self.dim = int(particles.shape[1])
        super().on_load_checkpoint(checkpoint)

    def attach_datamodule(self, datamodule: Any) -> None:
        """Attach the public decoder of a (not set-up) ``PrivateLatentDataModule`` after a
        checkpoint load (``dpot sample`` / ``dpot evaluate``, see
        ``lightning_dpot.commands.checkpoint``). Loads only the stage-1 autoencoder weights:
        no private record is read and no mechanism is called."""
        from lightning_dpot.data.latent import load_autoencoder_checkpoint

        autoencoder = getattr(datamodule, "autoencoder", None)
        if autoencoder is not None and getattr(datamodule, "latents", None) is None:
            load_autoencoder_checkpoint(autoencoder, datamodule.autoencoder_checkpoint)
        self.decoder = datamodule.public_decoder()

    # -- samples ---------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, z: Tensor) -> Tensor:
        """Latents → records on the CPU (the latents themselves before a decoder is attached)."""
        if self.decoder is None:
            return z
        return self.decoder(z).cpu()

    @property
    @override
    def max_samples(self) -> int:
        """The particles this rank holds (a flow returns its particles, no more)."""
        return int(self.particles.shape[0])

    @override
    @torch.no_grad()
    def sample(self, n: int, *, generator: torch.Generator | None = None) -> Tensor:
        """The first ``n`` particles of this rank, decoded. The particles are the samples, so
        nothing is drawn: ``generator`` is accepted for the protocol and unused."""
        n = check_positive_int("n", n)
        if n > self.max_samples:
            raise ValueError(
                f"n={n} exceeds the {self.max_samples} particles of this rank; "
                + self._more_samples_note()
            )
        return self.decode(self.particles[:n])

    def _more_samples_note(self) -> str:
        raise NotImplementedError

    def standalone_sampler(self) -> ParticleSampler:
        """The particles of every rank (``all_particles``, a collective under DDP) with the
        public decoder, for ``export_generator``. Particles are
        post-processing of the releases; neither the release cache nor any private latent goes
        in."""
        particles = self.all_particles()
        autoencoder = None if self.decoder is None else self.decoder.autoencoder
        if autoencoder is not None:
            return ParticleSampler(particles, LatentDecoder(autoencoder))
        shape = particles.shape[1:] if self.decoder is None else self.decoder.record_shape
        return ParticleSampler(particles, Reshape(shape))

    @override
    def on_fit_end(self) -> None:
        """Save the particles and a grid of their images (rank 0). The privacy report is the
        accountant's (``PrivacyAccountantCallback``)."""
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
    """DPSWflow (Sebag et al. 2023, Algorithm 2): one cached release, ``M_θ`` of ``N_θ``
    directions/step.

    Algorithm: draw ``Θ ∈ R^{N_θ×d}`` once; release ``Ỹ = YΘᵀ + Z`` once (all private latents);
    cache ``sort(Ỹ)`` per column. Step ``k``: pick ``M_θ`` columns ``J_k`` (generator seeded by
    ``(seed, k)``), ``X_{k+1} = X_k + h·v̂(X_k; Ỹ[:, J_k], Θ[J_k]) + sqrt(2λh)·ξ`` (eqs. 18–21,
    ``sliced_flow_step``).

    Privacy: one Gaussian mechanism with sensitivity ``Δ = 2·sqrt(w(N_θ, δ_s))`` (all ``N_θ``
    directions count, whichever ``M_θ`` a step uses), emitted as one
    ``GaussianRelease``: ``ε`` from the analytic Gaussian
    mechanism at ``δ``. Give either ``noise_scale`` (σ) or ``target_epsilon`` (σ is then
    calibrated with the analytic Gaussian mechanism). ε never grows with steps.

    Samples: ``num_particles``; more are free with ``generate`` (a new flow from the cache).

    Args:
        num_particles: particles N (all ranks together).
        num_directions: ``N_θ`` (paper: 31).
        directions_per_step: ``M_θ ≤ N_θ`` (paper: 25).
        **kwargs: the arguments every flow shares (``_ParticleFlow``: particles, step, seed)
            and the release's (``SlicedReleaseModule``:
            noise or target, δ, noise source).
    """

    def __init__(
        self,
        num_particles: int = 4000,
        num_directions: int = 31,
        directions_per_step: int = 25,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_particles=num_particles, num_directions=num_directions, **kwargs)
        self.directions_per_step = check_positive_int("directions_per_step", directions_per_step)
        if directions_per_step > num_directions:
            raise ValueError(
                f"directions_per_step must be <= num_directions={num_directions}, "
                f"got {directions_per_step!r}"
            )
        self.register_buffer("released", torch.zeros((), dtype=torch.bool))
        self.register_buffer("theta", torch.empty(0))
        self.register_buffer("release_sorted", torch.empty(0))

    @override
    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        """Size the placeholder buffers (empty until ``calibrate``) to the saved release, so
        that a state dict loads into a fresh module (checkpoints; ``ddp_spawn`` hands rank 0's
        weights back to the main process this way)."""
        for name in ("theta", "release_sorted"):
            saved = state_dict.get(prefix + name)
            if isinstance(saved, Tensor) and getattr(self, name).numel() == 0:
                setattr(self, name, torch.empty_like(saved, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    @override
    def next_step_events(self) -> list:
        """Steps release nothing: the one release happens before training."""
        return []

    @override
    def calibrate(self, datamodule: Any) -> None:
        n_private = datamodule.num_private
        self.theta = torch.zeros(self.release.num_directions, self.dim, device=self.device)
        self.release_sorted = torch.zeros(
            self.release.num_directions, n_private, device=self.device
        )
        sigma = self.release.noise_scale
        if self.target_epsilon is not None:
            sigma = calibrated_noise_std(
                self.target_epsilon, self.release.delta, self.release.sensitivity(self.dim), 1
            )
            self.planned_release_count = 1
        self.release.calibrate(sigma, self.dim)

    @override
    def on_fit_start(self) -> None:
        """Release once (rank 0, broadcast), unless a checkpoint already holds the release;
        refused where it would not be accounted (``check_release_before_training``)."""
        super().on_fit_start()  # warns when no accountant is attached
        if bool(self.released):
            return
        check_release_before_training(self)
        datamodule = self._datamodule()
        theta = self.release.directions(self.dim, seeded_generator(self.seed, STREAM_DIRECTIONS))
        if self.trainer.is_global_zero:
            records = datamodule.private_records()
            source = self.release.noise.source(STREAM_RELEASE, device=records.device)
            noisy = self.release(records, theta, source)
            release_sorted = torch.sort(noisy.transpose(0, 1), dim=1).values
        else:
            release_sorted = torch.zeros_like(self.release_sorted).cpu()
        release_sorted = self.trainer.strategy.broadcast(release_sorted, src=0)
        self.theta = theta.to(self.device)
        self.release_sorted = release_sorted.to(self.device)
        self.released = torch.ones((), dtype=torch.bool, device=self.device)

    def _directions_at(self, step: int) -> Tensor:
        g = seeded_generator(self.seed, STREAM_SUBSET, step)
        return torch.randperm(self.release.num_directions, generator=g)[: self.directions_per_step]

    @override
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
            g = seeded_generator(seed, STREAM_FLOW, step, 2**20, device=particles.device)
            particles = sliced_flow_step(
                particles, self.release_sorted[idx].transpose(0, 1), self.theta[idx],
                self.step_size, self.noise_scale, self.diffusion, g,
                evaluate_at=self.evaluate_at, target_sorted=True,
            )  # fmt: skip
        return self.decode(particles)

    @override
    def _more_samples_note(self) -> str:
        return "DPSWFlow.generate(n, num_steps) reruns the flow from the cached release for free"

    @override
    def privacy_context(self) -> dict[str, Any]:
        return {"method": "DPSWflow (Sebag et al. 2023, Algorithm 2): one release"}

    @override
    def planned_events(self) -> list:
        """The one release, before it is drawn (so a budget can refuse it)."""
        event = self.release.event
        return [] if bool(self.released) or event is None else [event]


class DPSWFlowR(_ParticleFlow):
    """DPSWflow-r (Sebag et al. 2023, Algorithm 1): fresh Θ and a fresh fixed-size batch every step.

    Step ``k``: ``Θ_k`` (``N_θ`` checked directions, generator seeded by ``(seed, k)``), release
    ``Ỹ_k = B_k Θ_kᵀ + Z_k`` of the batch ``B_k`` (``b`` of the ``n`` records, uniformly without
    replacement by the datamodule, from its secret sampling seed), then
    ``X_{k+1} = X_k + h·v̂(X_k; Ỹ_k, Θ_k) + sqrt(2λh)·ξ`` (eqs. 18–21).

    Privacy (replace-one): each release emits one subsampled-Gaussian-without-replacement event,
    ratio ``γ = b/n``, multiplier ``σ/Δ``, ``Δ = 2·sqrt(w(N_θ, δ_s))``; RDP per step bounded by
    Wang, Balle & Kasiviswanathan 2019 (for ``b = n``: ``α/(2(σ/Δ)²)``), composed by
    ``PrivacyAccountantCallback``. Give ``noise_scale`` or
    ``target_epsilon`` (σ is then the smallest multiplier reaching it over the planned ``T`` =
    max_steps or max_epochs·steps_per_epoch).

    Samples: the ``num_particles`` particles only — more would need another flow on new releases,
    which spends budget (the accountant would have to compose them).

    The datamodule must set ``batch_size`` (``sample_rate=None``).

    Args:
        num_particles: particles N (all ranks together).
        num_directions: ``N_θ`` (paper: 70).
        accountant: used to calibrate σ from ``target_epsilon``: ``"rdp"`` only (``"pld"`` is
            refused: dp-accounting has no PLD analysis of sampling without replacement).
        **kwargs: the arguments every flow shares (``_ParticleFlow``: particles, step, seed)
            and the release's (``SlicedReleaseModule``:
            noise or target, δ, noise source).
    """

    def __init__(
        self,
        num_particles: int = 4000,
        num_directions: int = 70,
        accountant: Literal["rdp", "pld"] = "rdp",
        **kwargs: Any,
    ) -> None:
        super().__init__(num_particles=num_particles, num_directions=num_directions, **kwargs)
        self.accountant = accountant
        self.batches = BatchReleases(self.release, self.seed)

    @override
    def calibrate(self, datamodule: Any) -> None:
        self.planned_release_count = self.batches.bind(
            type(self).__name__, datamodule, self.trainer, self.target_epsilon, self.accountant
        )

    @override
    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        step = self.trainer.global_step  # the loader only yields step numbers
        theta, target_sorted = self.batches(step, self.particles.device)
        self._flow_step(target_sorted.transpose(0, 1), theta, step)
        self._tick()

    @override
    def _more_samples_note(self) -> str:
        return (
            "DPSWFlowR cannot make more samples for free: a new flow needs new releases of the "
            "private data, which spends privacy budget"
        )

    @override
    def privacy_context(self) -> dict[str, Any]:
        return {
            "method": "DPSWflow-r (Sebag et al. 2023, Algorithm 1): one release per step",
            "subset_seed_is_public": self.batches.subset_seed_is_public(),
        }


def toy_sliced_wasserstein(particles: Tensor, target: Tensor, num_directions: int = 500) -> float:
    """SW_2 between particles and target records on fixed seeded directions (evaluation)."""
    theta = random_directions(num_directions, particles.shape[1], seeded_generator(12345))
    return float(sliced_wasserstein(particles.cpu().float(), target.cpu().float(), theta))
