r"""DP sliced-Wasserstein flows and the DPSWgen baseline (Sebag et al. 2023, §4–5, Algorithms 1–2).

All three methods touch the private data only through the Gaussian release of random projections
(eq. 23, ``gaussian_sliced_release``)

    M(Y) = Y Θᵀ + Z,   Z_{ij} ~ N(0, σ²),   records ‖y_i‖₂ ≤ 1 (ℓ2-normalized latents),

whose ℓ2 (Frobenius) sensitivity under **replace-one** adjacency is ``Δ = 2·sqrt(w(N_θ, δ_s))``
(Lemma 1, eqs. 24–26). The release is one object,
``SlicedGaussianRelease``: it checks
``‖Θ‖²_op ≤ w`` on every draw of the directions (redrawing otherwise), so Δ holds
deterministically and the guarantee carries no δ_s term; it emits one privacy event per call,
which the accountant composes (``lightning_dpot.privacy.contract``). Everything after the
release (sorting, quantiles, the particle updates, the generator's gradient) is
post-processing.

* ``DPSWFlow`` (Algorithm 2): Θ of ``N_θ`` directions is drawn **once**, the whole private set
  is released **once** (one Gaussian mechanism, no composition) and the sorted release is cached
  as module state (saved in checkpoints; never redrawn on resume or per DDP rank — rank 0 draws
  and broadcasts). Each step uses ``M_θ`` of the ``N_θ`` columns, chosen by a generator seeded by
  ``(seed, step)``. Guarantee: ``(ε, δ)`` with ``ε`` from the analytic Gaussian mechanism
  (Balle & Wang 2018) for ``σ/Δ``; it does not grow with the number of steps.
  *Samples*: the particles (``num_particles`` of them). Any number more is free: rerun the flow
  from the cached release (``DPSWFlow.generate``), which is post-processing.
* ``DPSWFlowR`` (Algorithm 1): every step draws a fresh Θ (seeded by ``(seed, step)``) and
  releases a fresh private minibatch of exactly ``b`` of the ``n`` records, drawn uniformly
  without replacement (seeded by ``(seed, step)``; the datamodule's ``batch_size``). The
  accountant composes ``T`` steps of the subsampled Gaussian without replacement, ratio ``b/n``,
  noise multiplier ``σ/Δ``, under replace-one adjacency
  (``PrivacyAccountantCallback``, from the emitted events).
  *Samples*: exactly the ``num_particles`` particles. More samples would need a new flow, i.e. new
  releases of private data, which spends budget: ``DPSWFlowR.sample`` refuses ``n`` beyond
  the particle count.
* ``DPSWGen`` (baseline, Rakotomamonjy & Ralaivola 2021): a generator with the decoder's
  architecture, trained by minimising the DP sliced-Wasserstein loss between the public-encoder
  latents of its images and the per-step release; accounted exactly like ``DPSWFlowR``.
  *Samples*: unlimited and free (a trained generator).

**Adjacency.** Every guarantee here is for *replacing* one record (``n`` public), the relation of
the sensitivity Δ (Lemma 1). ``DPSWFlow`` releases the full private set once. For
``DPSWFlowR`` / ``DPSWGen`` each sampled record is released as its own noisy row, so the
batch size is visible: they therefore use fixed-size batches (``b`` rows every step, a public
number) drawn uniformly without replacement, independently of the data. Replacing one record
changes at most one released row (the subset is drawn from indices, not values), by at most Δ in
ℓ2 given Θ, so a step is the subsampled Gaussian without replacement with ratio ``γ = b/n`` and
multiplier ``σ/Δ``. Its RDP is bounded by Wang, Balle & Kasiviswanathan 2019 ("Subsampled Rényi
DP and analytical moments accountant", Thm. 9/27), composed over ``T`` steps
(``subsampled_gaussian_epsilon``,
``sampling="without_replacement"``; dp-accounting has no PLD analysis for it, so only RDP is
reported). Poisson sampling (add/remove-one, the paper's accounting) is refused: with one row per
sampled record it is not proven for this mechanism. See ``docs/dpswflow.md``.

**DDP.** Particles are sharded across ranks (``num_particles`` must be divisible by the world
size); directions come from generators seeded by ``(seed, step)``, identical on every rank. The
DPSWFlow release is drawn on rank 0 and broadcast. The per-step batch of DPSWFlowR / DPSWGen is
the same ``b`` indices on every rank (seeded by ``(seed, step)``); rank ``r`` releases the rows
``r, r + W, ...`` of it (disjoint shards, each record's row is noised once) and the rows are
all-gathered (post-processing), so every rank flows toward the same released batch of ``b`` rows.
Checkpoints gather all shards. The step loaders yield every step on every rank
(``lightning_dpot.data.replicated``), whatever ``use_distributed_sampler``.

**Saved modules.** ``torch.save(model)`` or ``pickle`` (after fit or from a callback mid-run)
keeps the particles or generator, the cached release and the public stage-1 autoencoder, so a
loaded module still samples and decodes; it never keeps the datamodule or its private latents
(a fit binds them, the trainer is dropped as Lightning drops it).
"""

from lightning_dpot.methods.dpsw.flow import DPSWFlow, DPSWFlowR, toy_sliced_wasserstein
from lightning_dpot.methods.dpsw.gen import DPSWGen

__all__ = ["DPSWFlow", "DPSWFlowR", "DPSWGen", "toy_sliced_wasserstein"]
