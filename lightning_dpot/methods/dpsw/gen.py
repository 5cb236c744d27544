"""DPSWgen (Rakotomamonjy & Ralaivola 2021; Sebag et al. 2023, §5): a generator trained with the DP
sliced-Wasserstein loss on per-step releases (package docstring)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import (
    check_nonnegative_int,
    check_positive_int,
)
from lightning_dpot.data.protocols import LatentPrivateData, require_data
from lightning_dpot.distributed import rank_world
from lightning_dpot.methods.dpsw.release import (
    STREAM_FLOW,
    BatchReleases,
    SlicedReleaseModule,
)
from lightning_dpot.nn.samplers import GeneratorSampler
from lightning_dpot.ot.sliced import (
    dp_sliced_wasserstein_loss,
)
from lightning_dpot.rng import seeded_generator


class DPSWGen(SlicedReleaseModule):
    """DPSWgen baseline (Rakotomamonjy & Ralaivola 2021; Sebag et al. 2023, §5): a generator
    trained with the DP sliced-Wasserstein loss, accounted like ``DPSWFlowR``.

    Step ``k``: fresh ``Θ_k`` and release ``Ỹ_k`` of the fixed-size batch (as DPSWFlowR); generate
    images ``G(u)``, ``u ~ N(0, I)``; map them to the latent sphere with the frozen public encoder,
    ``z = E(G(u))`` (identity + unit-ball scaling without an autoencoder); minimise
    ``L = (1/N_θ) Σ_j W_2^2(θ_j#z * N(0, σ²), Ỹ_k[:, j])``
    (``dp_sliced_wasserstein_loss``, eq. 11). Each training batch
    releases once, so with ``accumulate_grad_batches = k`` one optimizer step is k releases, and
    the accountant composes k events.

    Samples: unlimited and free (``G(u)``).

    Start: with ``init_from_decoder``, the generator starts as the public stage-1 decoder (its
    weights loaded into ``DecoderGenerator``, which has the decoder's
    architecture; public data only, no privacy cost). A fresh decoder-shaped generator outputs
    an almost constant mid-grey image (``2·sigmoid(≈0) − 1 ≈ 0``), and a frozen ReLU encoder
    can be flat there: with the Fashion-MNIST autoencoder of ``configs/compare/fashion_cpu``
    every unit of its first layer is off at 0, ``∂E/∂x = 0`` exactly, and the generator never
    moves (docs/dpswflow.md, "DPSWgen's start"). The decoder was trained on unit-sphere latents
    and now reads ``u ~ N(0, I)`` (norm about √d): its first images are sharper-contrast
    decodings, already near the data (measured there). The start happens once, at the first
    ``setup`` of a module that was never trained (a flag in its state dict), so a resumed or
    reloaded generator keeps its weights.

    Args:
        generator: network ``u → record`` with ``latent_dim`` (paper: the decoder's architecture,
            ``DecoderGenerator``).
        generated_batch_size: generated samples per step.
        lr: Adam learning rate.
        num_directions, accountant, seed: as ``DPSWFlowR``.
        init_from_decoder: start from the public decoder (above); needs the data module's
            autoencoder and a generator whose ``body`` has its decoder's architecture.
        **kwargs: the release's arguments
            (``SlicedReleaseModule``: noise or target,
            δ, noise source).
    """

    def __init__(
        self,
        generator: nn.Module,
        num_directions: int = 70,
        generated_batch_size: int = 250,
        lr: float = 1e-3,
        accountant: Literal["rdp", "pld"] = "rdp",
        seed: int = 0,
        init_from_decoder: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_directions=num_directions, **kwargs)
        self.generator = generator
        self.generated_batch_size = check_positive_int("generated_batch_size", generated_batch_size)
        self.lr = lr
        self.accountant = accountant
        self.seed = check_nonnegative_int("seed", seed)
        self.batches = BatchReleases(self.release, self.seed)
        self.dim: int | None = None
        self.init_from_decoder = bool(init_from_decoder)
        # Set once the generator has had its start: a reloaded or resumed module keeps its weights.
        self.register_buffer("generator_started", torch.tensor(False))

    @override
    def privacy_context(self) -> dict[str, Any]:
        return {
            "method": "DPSWgen (Rakotomamonjy & Ralaivola 2021): one release per batch",
            "subset_seed_is_public": self.batches.subset_seed_is_public(),
        }

    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        require_data(datamodule, LatentPrivateData, type(self).__name__)
        if self.bind_private_data(datamodule):
            return
        datamodule.setup(stage)
        self.dim = int(datamodule.latent_dim)
        # Kept out of the module's state (the frozen public autoencoder belongs to stage 1).
        self.__dict__["_autoencoder"] = datamodule.autoencoder
        if self.init_from_decoder and not bool(self.generator_started):
            self._start_from_decoder(datamodule.autoencoder)
        self.planned_release_count = self.batches.bind(
            type(self).__name__, datamodule, self.trainer, self.target_epsilon, self.accountant
        )
        self.generator_started.fill_(True)

    def _start_from_decoder(self, autoencoder: nn.Module | None) -> None:
        body = getattr(self.generator, "body", None)
        if autoencoder is None or body is None:
            raise ValueError(
                "init_from_decoder=True needs the data module's autoencoder and a generator with "
                "the decoder's architecture (lightning_dpot.nn.DecoderGenerator); got "
                f"autoencoder={type(autoencoder).__name__}, generator="
                f"{type(self.generator).__name__}. Set init_from_decoder=False otherwise"
            )
        decoder = autoencoder.decoder_body.state_dict()
        shapes = {name: tuple(value.shape) for name, value in body.state_dict().items()}
        if shapes != {name: tuple(value.shape) for name, value in decoder.items()}:
            raise ValueError(
                "init_from_decoder=True: the generator's architecture differs from the "
                "autoencoder's decoder; give the generator the decoder's architecture, "
                "latent_dim and channels, or set init_from_decoder=False"
            )
        body.load_state_dict(decoder)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        # Checkpoints written before the flag existed hold a trained generator.
        checkpoint["state_dict"].setdefault("generator_started", torch.tensor(True))

    def to_latent(self, records: Tensor) -> Tensor:
        """Differentiable map of generated records to the private latents' space."""
        if self._autoencoder is None:
            z = records.reshape(records.shape[0], -1)
            return z / torch.linalg.vector_norm(z, dim=1, keepdim=True).clamp_min(1.0)
        self._autoencoder.to(records.device).eval()
        return self._autoencoder.encode(records)  # ℓ2-normalized, differentiable in records

    @override
    def forward(self, u: Tensor) -> Tensor:
        return self.generator(u)

    @override
    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor | None:
        # Each training batch is a release with its own subset and Θ, keyed by the batch's index
        # in the run (= global_step unless accumulate_grad_batches > 1, where one optimizer step
        # spans several batches: re-releasing one subset would not be a fresh subsampled step).
        step = self.trainer.current_epoch * self.batches.datamodule.steps_per_epoch + batch_idx
        theta, target_sorted = self.batches(step, self.device)
        u = torch.randn(self.generated_batch_size, self.generator.latent_dim, device=self.device)
        z = self.to_latent(self(u))
        g = seeded_generator(self.seed, STREAM_FLOW, step, rank_world()[0], device=z.device)
        loss = dp_sliced_wasserstein_loss(
            z, target_sorted.transpose(0, 1), theta, self.noise_scale, g
        )
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.generator.parameters(), lr=self.lr)

    @override
    @torch.no_grad()
    def sample(
        self, n: int, *, generator: torch.Generator | None = None, batch_size: int = 10_000
    ) -> Tensor:
        """``n`` records G(u), u ~ N(0, I), on the CPU in eval mode (free: post-processing)."""
        was_training = self.training
        self.eval()
        out = []
        try:
            for i in range(0, n, batch_size):
                shape = (min(batch_size, n - i), self.generator.latent_dim)
                device = self.device if generator is None else generator.device
                u = torch.randn(shape, generator=generator, device=device)
                out.append(self(u.to(self.device)).cpu())
        finally:
            self.train(was_training)
        return torch.cat(out) if out else torch.empty(0)

    def standalone_sampler(self) -> GeneratorSampler:
        """G(u), u ~ N(0, I), for ``export_generator`` (a copy of
        the generator only: no release, no autoencoder)."""
        return GeneratorSampler(self.generator, self.generator.latent_dim, "normal")
