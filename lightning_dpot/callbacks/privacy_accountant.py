"""Central-DP budget: compose every optimizer step, log ε, stop before the target is exceeded.

Contract with the LightningModule
---------------------------------
A private module defines ``dp_step() -> dict | None`` returning
``{"noise_multiplier": σ, "sample_rate": q}``: what ONE optimizer step (one increment of
``trainer.global_step``) releases, as one step of the Poisson-subsampled Gaussian mechanism
(:mod:`lightning_dpot.privacy.accountants`) under add/remove-one adjacency. A module that releases
a fixed-size batch of ``b`` of its ``n`` records drawn uniformly without replacement adds
``"sampling": "without_replacement", "dataset_size": n, "batch_size": b`` (and ``sample_rate``
``= b/n``); the step is then accounted as the subsampled Gaussian without replacement under
replace-one adjacency (Wang, Balle, Kasiviswanathan 2019; RDP only, dp-accounting has no PLD for
it). ``"sampling"`` defaults to ``"poisson"``; one run (and its checkpoints) uses one scheme.
σ is the noise standard deviation divided by the ℓ2 sensitivity of what is noised (for
DP-Sinkhorn's jointly clipped block: std 2Δσ over sensitivity 2Δ, SPEC §6), q the Poisson rate
of the real-data sampler (:mod:`lightning_dpot.data.poisson`). The module, not the user, knows
these numbers. ``None`` means "not private" and is refused. ``dp_step`` is called before every
step (the values may change during training, e.g. a noise schedule) and after it, to look one
step ahead.

What the callback does
----------------------
* records one SGM event per optimizer step (``on_train_batch_end``, from the increase of
  ``trainer.global_step``, so skipped steps cost nothing and manual optimisation works);
* logs ``epsilon`` (progress bar and logger) and ``privacy/steps``;
* stops training **before** the first step that would exceed ``target_epsilon`` at ``delta``:
  after each step it asks whether ε after one more step of the module's current (σ, q) would be
  above the target and, if so, sets ``trainer.should_stop`` so that Lightning ends the loop before
  the next batch starts. The decision uses the remaining step budget, computed once per (σ, q) by
  :meth:`~lightning_dpot.privacy.accountants.PrivacyAccountant.max_additional_steps`, so it is
  exact and costs nothing per step. ``on_train_batch_start`` re-checks as a safety net; since
  Lightning ignores a callback's ``-1`` from that hook, a step that would overshoot there (only
  possible when Lightning cannot stop early because of ``min_steps``/``min_epochs``, or when the
  module changed (σ, q) between steps) raises :class:`PrivacyBudgetExceededError` instead, before
  the step runs;
* keeps its state (the history of (σ, q, steps) runs) in checkpoints through Lightning's stateful
  callback API, so ``trainer.fit(ckpt_path=...)`` continues the count exactly and ends at the same
  step and ε as an uninterrupted run. The target may be changed on resume: the restored spent
  history is what counts (a lower target than what was already spent is refused);
* writes ``privacy_report.json`` (rank 0) to ``trainer.log_dir`` at the end of training and
  contributes the same dict to ``report.json`` (:class:`~lightning_dpot.callbacks.run_report.
  RunReport`) under ``privacy``.

Not supported: ``accumulate_grad_batches > 1`` (each micro-batch is its own Poisson sample, so one
optimizer step would be several SGM releases); it is refused at the start of fitting.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from lightning_dpot.privacy.accountants import (
    ACCOUNTANTS,
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    POISSON,
    PrivacyAccountant,
    check_sampling,
    make_accountant,
    swor_sample_rate,
)
from lightning_dpot.privacy.validation import (
    check_delta,
    check_epsilon,
    check_positive,
    check_positive_int,
    check_probability,
)


class PrivacyBudgetExceededError(RuntimeError):
    """Raised before an optimizer step that would take ε past the target."""


def read_dp_sampling(pl_module: L.LightningModule) -> tuple[str, int | None, int | None]:
    """``(sampling, dataset_size, batch_size)`` from ``pl_module.dp_step()``, validated.

    ``("poisson", None, None)`` when the module does not say (the default scheme). For
    ``"without_replacement"`` ``dataset_size`` n and ``batch_size`` b are required, with
    ``1 <= b <= n`` and ``sample_rate == b/n``.
    """
    name = type(pl_module).__name__
    read_dp_step(pl_module)
    release = pl_module.dp_step()
    sampling = check_sampling(release.get("sampling", POISSON))
    if sampling == POISSON:
        return sampling, None, None
    if not {"dataset_size", "batch_size"} <= set(release):
        raise ValueError(
            f"{name}.dp_step() declares sampling={sampling!r} and must then also give "
            f"'dataset_size' and 'batch_size', got {release!r}"
        )
    n = check_positive_int(f"{name}.dp_step()['dataset_size']", release["dataset_size"])
    b = check_positive_int(f"{name}.dp_step()['batch_size']", release["batch_size"])
    rate = swor_sample_rate(n, b)
    if not math.isclose(float(release["sample_rate"]), rate, rel_tol=1e-12):
        raise ValueError(
            f"{name}.dp_step()['sample_rate']={release['sample_rate']!r} must equal "
            f"batch_size/dataset_size = {b}/{n} = {rate!r} for sampling {sampling!r}"
        )
    return sampling, n, b


def read_dp_step(pl_module: L.LightningModule) -> tuple[float, float]:
    """``(noise_multiplier, sample_rate)`` from ``pl_module.dp_step()``, validated."""
    name = type(pl_module).__name__
    dp_step = getattr(pl_module, "dp_step", None)
    if not callable(dp_step):
        raise TypeError(
            f"{name} has no dp_step() method. PrivacyAccountantCallback needs the module to "
            "declare what one optimizer step releases: dp_step() -> {'noise_multiplier': sigma, "
            "'sample_rate': q}"
        )
    release = dp_step()
    if release is None:
        raise ValueError(
            f"{name}.dp_step() returned None: the module declares that it is not private (no "
            "noise or no Poisson sampling), so there is no (epsilon, delta) guarantee to account. "
            "Remove PrivacyAccountantCallback or configure the module with a noise multiplier"
        )
    if not isinstance(release, Mapping) or not {"noise_multiplier", "sample_rate"} <= set(release):
        raise ValueError(
            f"{name}.dp_step() must return a dict with keys 'noise_multiplier' and "
            f"'sample_rate', got {release!r}"
        )
    return (
        check_positive(f"{name}.dp_step()['noise_multiplier']", release["noise_multiplier"]),
        check_probability(f"{name}.dp_step()['sample_rate']", release["sample_rate"]),
    )


class PrivacyAccountantCallback(Callback):
    """Compose the module's SGM steps and stop before (``target_epsilon``, ``delta``) is exceeded.

    Args:
        target_epsilon: ε that training must never exceed (> 0).
        delta: δ of the guarantee, in (0, 1); typically < 1/N for N private records.
        accountant: accountant that drives logging and stopping, ``"rdp"`` or ``"pld"``.
        also_report: further accountants whose ε goes into :meth:`report` (computed at the end
            of training only).
        log_every_n_steps: compute and log ε every this many steps (and at the last step).
            Default: every step for ``"rdp"`` (~0.2 ms), ``trainer.log_every_n_steps`` for
            ``"pld"`` (a full PLD composition per evaluation).
        report_filename: name of the JSON report written to ``trainer.log_dir``.

    The module contract and the behaviour are in the module docstring.
    """

    report_key = "privacy"
    _STATE_VERSION = 1

    def __init__(
        self,
        target_epsilon: float,
        delta: float,
        accountant: str = "rdp",
        also_report: Sequence[str] = ("pld",),
        log_every_n_steps: int | None = None,
        report_filename: str = "privacy_report.json",
    ) -> None:
        super().__init__()
        self.target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
        self.delta = check_delta(delta)
        self.accountant: PrivacyAccountant = make_accountant(accountant)
        also_report = [also_report] if isinstance(also_report, str) else list(also_report)
        for name in also_report:
            if name not in ACCOUNTANTS:
                raise ValueError(
                    f"also_report entries must be in {list(ACCOUNTANTS)}, got {name!r}"
                )
        self.also_report = [name for name in dict.fromkeys(also_report) if name != accountant]
        self.log_every_n_steps = (
            None
            if log_every_n_steps is None
            else check_positive_int("log_every_n_steps", log_every_n_steps)
        )
        self.report_filename = report_filename
        self.stopped_by_budget = False
        self._restored = False
        self._restored_target: float | None = None
        self._recorded_global_step: int | None = None
        self._last_global_step = 0
        self._steps_per_batch = 1
        self._pending: tuple[float, float] | None = None
        self._budget: tuple[Any, int] | None = None
        self._swor_sizes: tuple[int | None, int | None] = (None, None)

    # -- budget -------------------------------------------------------------------------------

    def _budget_total(self, sigma: float, q: float) -> tuple[int, int]:
        """``(steps of (σ, q) in the current run, largest total for that run within target)``."""
        history = self.accountant.history
        if history and history[-1][:2] == (sigma, q):
            prefix, in_run = tuple(history[:-1]), history[-1][2]
        else:
            prefix, in_run = tuple(history), 0
        key = (sigma, q, prefix)
        if self._budget is None or self._budget[0] != key:
            extra = self.accountant.max_additional_steps(sigma, q, self.target_epsilon, self.delta)
            self._budget = (key, in_run + extra)
        return in_run, self._budget[1]

    def remaining_steps(self, noise_multiplier: float, sample_rate: float) -> int:
        """How many more steps of (σ, q) keep ε ≤ ``target_epsilon``."""
        in_run, total = self._budget_total(
            check_positive("noise_multiplier", noise_multiplier),
            check_probability("sample_rate", sample_rate),
        )
        return total - in_run

    def epsilon(self) -> float:
        """ε spent so far under the driving accountant."""
        return self.accountant.get_epsilon(self.delta)

    # -- Lightning hooks ----------------------------------------------------------------------

    def _sync_sampling(self, pl_module: L.LightningModule) -> None:
        """Set the accountant's sampling scheme from ``dp_step()``; refused (ValueError) if the
        accountant cannot analyse it or the restored history used the other scheme."""
        sampling, n, b = read_dp_sampling(pl_module)
        if sampling != self.accountant.sampling or (n, b) != self._swor_sizes:
            self.accountant.sampling = sampling
            self._swor_sizes = (n, b)
            self._budget = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        read_dp_step(pl_module)
        self._sync_sampling(pl_module)
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "PrivacyAccountantCallback does not support accumulate_grad_batches="
                f"{trainer.accumulate_grad_batches!r} (accepted: 1): every micro-batch is its own "
                "Poisson sample and release, so one optimizer step would be several SGM steps"
            )
        if trainer.min_steps or trainer.min_epochs:
            warnings.warn(
                f"min_steps={trainer.min_steps!r} / min_epochs={trainer.min_epochs!r} keep "
                "Lightning from stopping early: if the privacy budget runs out before they are "
                "met, PrivacyAccountantCallback raises PrivacyBudgetExceededError before the "
                "step that would exceed it",
                UserWarning,
                stacklevel=2,
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_global_step = trainer.global_step
        self.stopped_by_budget = False
        if not self._restored and trainer.global_step > 0:
            warnings.warn(
                f"training resumes at global_step={trainer.global_step} but the checkpoint holds "
                "no PrivacyAccountantCallback state: those earlier steps are NOT accounted. "
                "Only resume private runs from checkpoints written with this callback",
                UserWarning,
                stacklevel=2,
            )
        elif self._restored and self._recorded_global_step != trainer.global_step:
            warnings.warn(
                f"the restored privacy history was recorded at global_step="
                f"{self._recorded_global_step} but training resumes at global_step="
                f"{trainer.global_step}; the accountant counts {self.accountant.steps} steps",
                UserWarning,
                stacklevel=2,
            )
        if self._restored_target is not None and self._restored_target != self.target_epsilon:
            rank_zero_info(
                f"PrivacyAccountantCallback: target_epsilon changed on resume from "
                f"{self._restored_target} to {self.target_epsilon}; the {self.accountant.steps} "
                "restored steps still count"
            )
        spent = self.epsilon()
        if spent > self.target_epsilon:
            raise ValueError(
                f"target_epsilon={self.target_epsilon!r} is already exceeded at delta="
                f"{self.delta!r}: the restored history of {self.accountant.steps} steps spends "
                f"epsilon={spent:.6g} ({self.accountant.name}). Training can only spend more; "
                "raise target_epsilon or start a new run on new data"
            )
        sigma, q = read_dp_step(pl_module)
        remaining = self.remaining_steps(sigma, q)
        if remaining == 0:
            next_epsilon = self.accountant.epsilon_if(self.delta, sigma, q)
            if self.accountant.steps == 0:
                raise ValueError(
                    f"target_epsilon={self.target_epsilon!r} cannot be met even by one step: one "
                    f"step with noise_multiplier={sigma!r} and sample_rate={q!r} already gives "
                    f"epsilon={next_epsilon:.6g} at delta={self.delta!r} "
                    f"({self.accountant.name}). Raise the noise multiplier, lower the sample "
                    "rate or raise the target"
                )
            self.stopped_by_budget = True
            trainer.should_stop = True
            rank_zero_info(
                f"PrivacyAccountantCallback: privacy budget exhausted, no step taken. The "
                f"restored {self.accountant.steps} steps spend epsilon={spent:.6g}; one more "
                f"would give {next_epsilon:.6g} > target_epsilon={self.target_epsilon}"
            )
            return
        rank_zero_info(
            f"PrivacyAccountantCallback: {remaining} more steps of noise_multiplier={sigma}, "
            f"sample_rate={q} fit in (epsilon={self.target_epsilon}, delta={self.delta}) "
            f"({self.accountant.name}; {self.accountant.steps} steps spent so far)"
        )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        sigma, q = read_dp_step(pl_module)
        self._sync_sampling(pl_module)
        self._pending = (sigma, q)
        if self.remaining_steps(sigma, q) < self._steps_per_batch:
            trainer.should_stop = True
            self.stopped_by_budget = True
            next_epsilon = self.accountant.epsilon_if(self.delta, sigma, q, self._steps_per_batch)
            raise PrivacyBudgetExceededError(
                f"the next optimizer step (noise_multiplier={sigma}, sample_rate={q}) would take "
                f"epsilon from {self.epsilon():.6g} to {next_epsilon:.6g} > target_epsilon="
                f"{self.target_epsilon} at delta={self.delta}; Lightning could not stop before "
                "it (min_steps/min_epochs, or dp_step() changed since the last step), so training "
                "is aborted before the step runs"
            )

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        stepped = trainer.global_step - self._last_global_step
        self._last_global_step = trainer.global_step
        if stepped > 0:
            sigma, q = self._pending if self._pending is not None else read_dp_step(pl_module)
            self.accountant.step(sigma, q, stepped)
            self._steps_per_batch = max(self._steps_per_batch, stepped)
            self._recorded_global_step = trainer.global_step
        self._pending = None

        next_sigma, next_q = read_dp_step(pl_module)
        if self.remaining_steps(next_sigma, next_q) < self._steps_per_batch:
            self.stopped_by_budget = True
            trainer.should_stop = True
            rank_zero_info(
                f"PrivacyAccountantCallback: stopping after {self.accountant.steps} steps at "
                f"epsilon={self.epsilon():.6g}: one more step would exceed target_epsilon="
                f"{self.target_epsilon} at delta={self.delta} ({self.accountant.name})"
            )
        if stepped > 0 and self._should_log(trainer):
            pl_module.log(
                "epsilon",
                self.epsilon(),
                prog_bar=True,
                on_step=True,
                on_epoch=False,
                batch_size=1,
            )
            pl_module.log(
                "privacy/steps",
                float(self.accountant.steps),
                on_step=True,
                on_epoch=False,
                batch_size=1,
            )

    def _should_log(self, trainer: L.Trainer) -> bool:
        every = self.log_every_n_steps
        if every is None:
            every = 1 if self.accountant.name == "rdp" else max(1, trainer.log_every_n_steps)
        return self.stopped_by_budget or self.accountant.steps % every == 0

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.log_dir broadcasts under DDP: every rank must call it, before the rank check.
        log_dir = trainer.log_dir or trainer.default_root_dir
        if not trainer.is_global_zero:
            return
        path = Path(log_dir) / self.report_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=2, sort_keys=True))

    # -- checkpoint state -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self._STATE_VERSION,
            "accountant": self.accountant.state_dict(),
            "global_step": self._recorded_global_step,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state_dict["accountant"])
        self._recorded_global_step = state_dict.get("global_step")
        self._restored_target = state_dict.get("target_epsilon")
        self._restored = True
        self._budget = None

    # -- report ---------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The privacy section of ``report.json`` (plain JSON types).

        ``sampling`` is ``"poisson"`` (adjacency ``"add_or_remove_one"``) or
        ``"without_replacement"`` (``"replace_one"``, with ``dataset_size`` and ``batch_size``;
        ``sample_rate`` is then b/n and ``epsilon_pld`` is ``None``: no PLD analysis).
        ``noise_multiplier`` / ``sample_rate`` are ``None`` when they changed during training;
        ``history`` then lists every run ``[noise_multiplier, sample_rate, steps]``. ``epsilon``
        is the driving accountant's ε; ``epsilon_<name>`` gives it under each accountant.
        """
        history = self.accountant.history
        settings = {(sigma, q) for sigma, q, _ in history}
        sigma, q = next(iter(settings)) if len(settings) == 1 else (None, None)
        epsilon = self.epsilon()
        epsilons = {f"epsilon_{self.accountant.name}": epsilon}
        for name in self.also_report:
            other = make_accountant(name)
            if self.accountant.sampling not in other.samplings:
                epsilons[f"epsilon_{name}"] = None  # e.g. no PLD for sampling w/o replacement
                continue
            other.load_state_dict(self.accountant.state_dict())
            epsilons[f"epsilon_{name}"] = other.get_epsilon(self.delta)
        try:
            library = f"dp-accounting {version('dp-accounting')}"
        except PackageNotFoundError:  # pragma: no cover - installed with the package
            library = "dp-accounting"
        return {
            "mechanism": self.accountant.mechanism,
            "adjacency": self.accountant.adjacency,
            "sampling": self.accountant.sampling,
            "dataset_size": self._swor_sizes[0],
            "batch_size": self._swor_sizes[1],
            "noise_multiplier": sigma,
            "sample_rate": q,
            "steps": self.accountant.steps,
            "history": [list(run) for run in history],
            "delta": self.delta,
            "target_epsilon": self.target_epsilon,
            "accountant": self.accountant.name,
            "epsilon": epsilon,
            **epsilons,
            "stopped_by_privacy_budget": self.stopped_by_budget,
            "accountant_settings": {
                "rdp_orders": {
                    "min": min(DEFAULT_RDP_ORDERS),
                    "max": max(DEFAULT_RDP_ORDERS),
                    "count": len(DEFAULT_RDP_ORDERS),
                },
                "pld_value_discretization_interval": DEFAULT_PLD_VALUE_DISCRETIZATION,
            },
            "library": library,
        }

    def report_section(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Hook of :class:`~lightning_dpot.callbacks.run_report.RunReport`."""
        return self.report()
