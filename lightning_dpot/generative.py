"""The generation protocol every method implements, and every callback and command uses.

A trained method is a distribution G over records. Drawing from it is post-processing of the
trained model: it costs no privacy. ``Generative`` fixes how:

* ``sample(n, *, generator=None) -> x`` — ``n`` records ``(n, *record_shape)`` on the CPU. With a
  seeded ``torch.Generator`` the draw is reproducible and leaves the global RNG alone (the fixed
  latent codes of a sample grid); without one it uses the global RNG.
* ``sample_labeled(n, *, generator=None) -> (x, y)`` — class-conditional methods draw labels
  y ~ Unif{0, …, L−1} and x ~ G(· | y); the others raise ``NotConditionalError``.
  ``conditional`` says which without trying.
* ``max_samples`` — ``None`` for a generator network (any n), the number of particles this rank
  holds for a particle flow (Sebag et al. 2023: the flow moves a fixed set of particles; more
  samples need a new flow).

Methods subclass ``Generative`` after ``LightningModule`` (``class M(L.LightningModule,
Generative)``) and get the defaults; an outside model that has the members also passes
``isinstance(model, Generative)``.
"""

from __future__ import annotations

import warnings
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive_int

__all__ = ["Generative", "NotConditionalError", "draw", "record_shape", "require_generative"]


class NotConditionalError(ValueError):
    """The method is unconditional: it generates no labels."""


@runtime_checkable
class Generative(Protocol):
    """A trained generative method: ``sample``, ``sample_labeled``, ``conditional``,
    ``max_samples`` (see the module docstring)."""

    conditional: bool = False

    @property
    def max_samples(self) -> int | None:
        """Most samples one call can return on this rank; ``None``: unbounded."""
        return None

    def sample(self, n: int, *, generator: torch.Generator | None = None) -> Tensor:
        """``n`` generated records on the CPU."""
        ...

    def sample_labeled(
        self, n: int, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """``n`` generated records with their labels, on the CPU (conditional methods)."""
        raise NotConditionalError(
            f"{type(self).__name__} is an unconditional generator: it draws no labels"
        )


def require_generative(model: object) -> Generative:
    """``model`` itself, after checking it implements ``Generative``."""
    if not isinstance(model, Generative):
        raise TypeError(
            f"{type(model).__name__} does not implement lightning_dpot.generative.Generative "
            "(sample, sample_labeled, conditional, max_samples); evaluation and sampling need it"
        )
    return model


@torch.no_grad()
def draw(
    model: Generative,
    n: int,
    *,
    labelled: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``n`` samples of ``model`` (CPU), with labels when ``labelled`` and the model is
    conditional, else ``(x, None)``.

    A particle flow returns at most its ``max_samples`` particles (with a warning naming both
    numbers); one that holds none raises, since its particles exist only inside a training run
    or after ``lightning_dpot.commands.checkpoint.load_model`` restores them.
    """
    require_generative(model)
    n = check_positive_int("n", n)
    limit = model.max_samples
    if limit is not None:
        if limit == 0:
            raise ValueError(
                f"{type(model).__name__} holds no particles: a particle flow must be sampled "
                "inside its training run (callbacks) or after restoring its particles and "
                "decoder (`lightning_dpot.commands.checkpoint.load_model` does both)"
            )
        if n > limit:
            warnings.warn(
                f"{type(model).__name__} holds {limit} particles on this rank; using those "
                f"instead of the requested {n} samples",
                stacklevel=2,
            )
            n = limit
    if labelled and model.conditional:
        x, y = model.sample_labeled(n, generator=generator)
        return x.detach().cpu(), y.detach().cpu()
    return model.sample(n, generator=generator).detach().cpu(), None


def record_shape(model: Generative) -> tuple[int, ...]:
    """The shape of one record of ``model``: one draw from a seeded ``torch.Generator`` (the
    global RNG is neither read nor advanced)."""
    x, _ = draw(model, 1, generator=torch.Generator().manual_seed(0))
    return tuple(x.shape[1:])
