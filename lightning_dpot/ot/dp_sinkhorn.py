r"""The semi-debiased Sinkhorn loss of DP-Sinkhorn (Cao et al. 2021, §4.2, Def. 4.3, App. C–D.3).

Ground cost (Cao et al. 2021, §5 "Architectures & Hyperparameters", App. D.3)::

    c_m(x, y) = ‖x − y‖₂² + m · ‖x − y‖₁            (m = 1 MNIST, m = 3 Fashion-MNIST),

computed as ``squared_euclidean_cost + m · l1_cost`` (``lightning_dpot.ot.costs``): no
``N × M × D`` intermediate. For class-conditional generation each record is replaced by
``[x, α_c · onehot(l)]`` (App. D.3, α_c = 15), so pairs of different classes pay an extra
``2α_c² + 2mα_c`` and the transport plan is pushed towards class-matched pairs.

Entropic OT (App. C, Algorithm 3) between uniform point clouds, temperature λ in cost units::

    f_i ← −λ LSE_k(log ν_k + (g_k − C_ik)/λ),   g_j ← −λ LSE_k(log μ_k + (f_k − C_kj)/λ),
    Ŵ_λ(X, Y) = ⟨μ, f⟩ + ⟨ν, g⟩,

solved by ``EntropicSolver`` with this cost. The paper's
solves (50 × 70 points, λ = 0.05 against a cost bound D² ≈ 5,000: λ/D² ≈ 10⁻⁵) are where
Sinkhorn crawls — geomloss' ε-scaling, which Cao et al. (2021, App. D.3) used, stops after one
sweep at the target with a marginal violation of 0.1–0.5, and sweeping on to a tolerance of
10⁻³ takes 18,000–31,000 sweeps. ``auto`` therefore solves them with the ``newton`` backend
(``lightning_dpot.ot.newton``): a fixed-budget predictor–corrector path from D² to λ, whose
work depends on the sizes, λ and D only. With ``fixed_budget`` (private runs) that is all it
does: no convergence statistic of a solve on real records is computed or kept. The path starts
at ``diameter²``, which must bound the cost: the public bound ``mixed_cost_diameter`` of the
declared data range, never a value estimated from the data.

Semi-debiased Sinkhorn loss (Def. 4.3, eq. 6), for ``n + n'`` generated rows X, ``n' = ⌊n·p⌋``,
and real rows Y::

    Ŝ_{c,λ,p}(X, Y) = 2 Ŵ_λ(X[0:n], Y) − Ŵ_λ(X[0:n], X[n':n+n']).

p = 0 recovers the biased loss (eq. 4, second argument = X[0:n]), p = 1 the debiased one (eq. 5,
disjoint halves). The real–real term −Ŵ_λ(Y, Y') is omitted: it has no generator gradient.
Rows X[n:n+n'] appear only in the second term, so ∇_{X[n:n+n']} Ŝ does not depend on Y (the
fact the privacy analysis uses, §4.3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_dpot.checks import check_nonnegative, check_positive
from lightning_dpot.ot.costs import MixedL2L1Cost
from lightning_dpot.ot.precision import full_precision
from lightning_dpot.ot.sinkhorn import Backend, EntropicSolver, SinkhornInfo

__all__ = [
    "MixedL2L1Cost",
    "SemiDebiasedSinkhorn",
    "class_conditional_features",
    "debias_rows",
    "mixed_cost_diameter",
]


def mixed_cost_diameter(
    dim: int, value_range: float, l1_weight: float, class_weight: float = 0.0
) -> float:
    """Public bound ``D`` with ``D² ≥ max c_m`` over the declared support (geomloss' diameter).

    Records in a box of side ``value_range`` (e.g. 2 for pixels in [−1, 1]) in ``dim``
    dimensions: ‖x − y‖₂² ≤ dim·r², ‖x − y‖₁ ≤ dim·r; the class features add at most
    2α_c² + 2mα_c. Returns ``sqrt(dim·r² + m·dim·r + 2α_c² + 2mα_c)``.
    """
    dim_f = float(dim)
    r = check_positive("value_range", value_range)
    m = check_nonnegative("l1_weight", l1_weight)
    a = check_nonnegative("class_weight", class_weight)
    return float((dim_f * r * r + m * dim_f * r + 2 * a * a + 2 * m * a) ** 0.5)


def class_conditional_features(
    x: Tensor, labels: Tensor | None, num_classes: int | None, class_weight: float
) -> Tensor:
    """Flattened records ``(N, D)``, with ``[x, α_c·onehot(l)]`` when labels are given (D.3).
    The one-hot code is a comparison with ``arange(L)``: ``one_hot`` would read the labels'
    range back to the host (a synchronization on a GPU); labels are validated at setup."""
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))
    if labels is None or num_classes is None:
        return flat
    classes = torch.arange(num_classes, device=labels.device)
    onehot = (labels.long()[:, None] == classes).to(flat.dtype)
    return torch.cat([flat, class_weight * onehot], dim=1)


def debias_rows(n: int, debias_fraction: float) -> int:
    """n' = ⌊n·p⌋ (Def. 4.3), the generated rows drawn in addition to the n cross rows."""
    if not 0.0 <= float(debias_fraction) <= 1.0:
        raise ValueError(f"debias_fraction must lie in [0, 1], got {debias_fraction!r}")
    # The small tolerance keeps e.g. 50·0.4 = 20.000000000000004 → 20 and 10·0.3 → 3.
    return int(n * float(debias_fraction) + 1e-9)


class SemiDebiasedSinkhorn(nn.Module):
    """Ŝ_{c,λ,p}(X, Y) = 2 Ŵ_λ(X[0:n], Y) − Ŵ_λ(X[0:n], X[n':n+n']) (module docstring).

    Args:
        entropic_reg: λ > 0, the temperature in cost units (paper: 0.05 MNIST/Fashion, 5 CelebA).
        l1_weight: m ≥ 0 of the cost c_m.
        debias_fraction: p ∈ [0, 1] (paper 0.4; official code 0.2).
        num_classes: number of labels for class conditioning, or ``None`` (unconditional).
        class_weight: α_c of the one-hot class features (paper 15).
        diameter: public bound D with D² ≥ the largest cost (``mixed_cost_diameter``).
        scaling: ε-scaling ratio in (0, 1) of the Sinkhorn backends; 0.5 is geomloss' default,
            which the paper kept ("all other hyperparameters are kept at their default values",
            D.3). It only sets the annealing: every solve then iterates at λ until ``tol``.
        tol: tolerance on the marginal violation ‖π1 − a‖₁ of each solve (non-private).
        max_iter: cap on the sweeps (Newton steps) at λ (non-private).
        backend: ``auto`` | ``newton`` | ``tensorized`` | ``online`` (KeOps, O(N + M)
            memory); ``auto`` takes ``newton`` for these small solves.
        fixed_budget: every solve does the ``newton`` backend's fixed work and nothing else: no
            stopping test, iteration count or marginal error, which would be facts about the real
            records (private runs). ``last_info`` stays ``None``.
        cuda_graphs: on a GPU, replay each solve's fixed path as a captured CUDA graph
            (``lightning_dpot.ot.graphs``); no effect on the CPU.
    """

    def __init__(
        self,
        entropic_reg: float = 0.05,
        l1_weight: float = 1.0,
        debias_fraction: float = 0.4,
        num_classes: int | None = None,
        class_weight: float = 15.0,
        diameter: float = 100.0,
        scaling: float = 0.5,
        tol: float = 1e-3,
        max_iter: int = 2000,
        backend: Backend = "auto",
        fixed_budget: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        super().__init__()
        self.entropic_reg = check_positive("entropic_reg", entropic_reg)
        self.cost = MixedL2L1Cost(l1_weight)
        debias_rows(1, debias_fraction)  # validates p
        self.debias_fraction = float(debias_fraction)
        self.num_classes = num_classes
        self.class_weight = check_nonnegative("class_weight", class_weight)
        self.diameter = check_positive("diameter", diameter)
        self.solver = EntropicSolver(
            self.cost,
            2,
            self.entropic_reg,
            self.diameter,
            scaling,
            tol,
            max_iter,
            backend,
            fixed_budget=fixed_budget,
            cuda_graphs=cuda_graphs,
        )
        self.last_info: SinkhornInfo | None = None

    def entropic_ot(self, x: Tensor, y: Tensor) -> Tensor:
        """Ŵ_λ(x, y) for feature clouds ``(N, D)``, ``(M, D)`` with uniform weights; the solve's
        ``SinkhornInfo`` is kept in ``last_info`` (after ``forward``: the cross
        term's)."""
        value, self.last_info = self.solver(x, y)
        return value

    @full_precision
    def forward(
        self,
        x: Tensor,
        y: Tensor,
        num_cross: int,
        x_labels: Tensor | None = None,
        y_labels: Tensor | None = None,
    ) -> Tensor:
        """Ŝ over generated ``x`` (``n + n'`` rows, any trailing shape), real ``y`` (m rows),
        ``num_cross`` = n; labels are required when ``num_classes`` is set. Computed outside
        autocast, in at least float32 (``lightning_dpot.ot.precision``).

        An empty ``y`` (an empty Poisson batch) has no cross term; the debias term needs no real
        data and is still computed, so the gradient's debias rows are what they are with data
        (released as exact zeros they would reveal that the batch was empty)."""
        n = int(num_cross)
        n_prime = x.shape[0] - n
        if not 1 <= n <= x.shape[0] or n_prime != debias_rows(n, self.debias_fraction):
            raise ValueError(
                f"x must have n + floor(n*p) rows for num_cross n={n} and p="
                f"{self.debias_fraction}, got {x.shape[0]} rows"
            )
        if self.num_classes is not None and (x_labels is None or y_labels is None):
            raise ValueError(
                f"num_classes={self.num_classes}: x_labels and y_labels are required "
                "(class-conditional cost)"
            )
        fx = class_conditional_features(x, x_labels, self.num_classes, self.class_weight)
        fy = class_conditional_features(y, y_labels, self.num_classes, self.class_weight)
        fy = fy.to(fx.dtype)
        pairs = [(fx[:n], fx[n_prime : n + n_prime])]
        if fy.shape[0] > 0:
            pairs.append((fx[:n], fy))
        # One call: on the newton backend both solves share one batched path where sizes agree.
        solves = self.solver.solve_many(pairs)
        (debias, self.last_info), *cross = solves
        if not cross:
            return -debias
        cross_value, self.last_info = cross[0]
        return 2.0 * cross_value - debias
