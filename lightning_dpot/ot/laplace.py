r"""Exact softmin of the ℓ1 cost in d ≤ 2 without touching all N·M pairs.

The multiscale backend's kernel for p = 1 (``lightning_dpot.ot.sinkhorn``): for queries q_i
and sources s_j with log-weights h_j,

    f_i = −ε LSE_j(h_j − ‖q_i − s_j‖₁/ε),

exact up to float64 rounding, for both directions of a pair of clouds (x → y and y → x).

**Quadrants.** The ℓ1 Gibbs kernel factorizes over the coordinates, and each factor is
separable once the sign of q_k − s_k is known: for σ ∈ {±1}^d and s in the quadrant
σ_k(q_k − s_k) > 0 of q (every k),

    e^{−‖q − s‖₁/ε} = e^{−⟨σ, q⟩/ε} · e^{⟨σ, s⟩/ε},

so the sum over a quadrant's sources is e^{−⟨σ, q⟩/ε} times a dominance sum of the weights
e^{h_j + ⟨σ, s_j⟩/ε}: in 1-D, prefix and suffix sums over the sorted sources (the classic exact
evaluation of the Laplace kernel), in 2-D, prefix sums over a grid.

**Grid.** Each coordinate is cut into half-open blocks, the same for both clouds: at the ends of
the clouds' overlap and, inside it, at B quantiles taken half from each cloud, B =
``BLOCKS_SCALE`` · (n·m)^{1/3} with n, m the points of each cloud inside the overlap (in
1-D: at every value and just above it, one block per distinct value). A source in a block below
(above) the query's along axis k has s_k < q_k (s_k > q_k), strictly. A far pair, in different
blocks along every axis, therefore has a known quadrant: its sum is read from 2^d tables over
the grid cells, each cell's sum of weights then exclusive cumulative sums along every axis
(towards the blocks below for σ_k = +1, above for σ_k = −1). A near pair, in the same block
along some axis (a slab through the query), is summed on its own; the near pairs are listed once
per kernel and serve both directions. Per pass: 2^d tables of B^d cells, about d·n·m/B near
pairs, O(N + M) lookups. The 2,000 × 400,000 points of Reshetova et al. (2024), Fig. 1: 473 ×
485 blocks and 1.5 million near pairs instead of 8·10⁸ pairs. In 1-D only exact ties are near.

**Rounding.** All sums are of positive terms in float64, the result is cast to the input dtype.
With R = max h − min h + D/ε ≤ ``LINEAR_RANGE`` (D: the ℓ1 diameter of both clouds) every
term e^{h_j − C_ij/ε − max h} and every factor lies in [e^{−R}, e^{R}], normal floats, and the
tables are plain cumulative sums; otherwise (small ε, extreme potentials) they are cumulative
LSEs (``torch.logcumsumexp``) with each cell's and each query's largest term taken out. Either
way the kernel's ``relative_error`` is 0.

**Gradient.** ∂f_i/∂q_i = Σ_j π_ij sign(q_i − s_j), π_ij = e^{h_j − C_ij/ε}/Σ_j' e^{h_j' − C_ij'/ε}
the row-normalized plan: the sign is σ for a far source of quadrant σ, so the backward of
``_Softmin`` weighs the same 2^d quadrant sums and near pairs its forward kept. A near pair
with q_k = s_k (a tie) contributes sign 0 along k, as the autograd of |q_k − s_k| in
``l1_cost`` (``torch.cdist``) does. The softmin is differentiable
in the queries only: the Sinkhorn solver passes detached potentials.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from lightning_dpot.ot.costs import GroundCost, LpCost
from lightning_dpot.ot.dense import coarse_solve
from lightning_dpot.ot.loop import Target, anneal, coarse_then_fine

LINEAR_RANGE = 650.0  # e^{-650} is a normal float64 and e^{650} is finite
QUANTILE_SAMPLE = 2**16  # block cuts come from at most this many evenly spaced points
BLOCKS_SCALE = 0.7  # blocks per axis over (n·m)^{1/3}: the fastest of 0.5, 0.7, 1 at paper scale
MAX_NEAR = 0.25  # at most this share of the N·M pairs near, else the truncated KeOps kernel


def _cuts(a: Tensor, b: Tensor, per_value: bool) -> Tensor:
    """Sorted cut values of one coordinate of two clouds ``a``, ``b``: the ends of their
    overlap and, inside it, B = ``BLOCKS_SCALE``·(n·m)^{1/3} quantiles taken half from each
    cloud (n, m: the points of ``a``, ``b`` in the overlap, both estimated on even samples of
    at most ``QUANTILE_SAMPLE`` points); with ``per_value``, every value and the next float
    above it (blocks of one value each). Blocks outside the overlap hold points of one cloud
    only."""
    up = a.new_tensor(torch.inf)
    if per_value:
        values = torch.cat([a, b])
        return torch.unique(torch.cat([values, torch.nextafter(values, up)]))
    low, high = torch.maximum(a.min(), b.min()), torch.minimum(a.max(), b.max())
    samples, inside = [], []
    for values in (a, b):
        stride = max(1, len(values) // QUANTILE_SAMPLE)
        sample = values[::stride]
        sample = sample[(sample >= low) & (sample <= high)].sort().values
        samples.append(sample)
        inside.append(len(sample) * stride)
    half = max(1, (round(BLOCKS_SCALE * (inside[0] * inside[1]) ** (1 / 3)) + 1) // 2)
    inner = [
        sample[(torch.arange(1, half, device=a.device) * len(sample)) // half]
        for sample in samples
        if len(sample)
    ]
    return torch.unique(torch.cat([low[None], torch.nextafter(high, up)[None], *inner]))


def _sorted_runs(key: Tensor, bins: int) -> tuple[Tensor, Tensor]:
    """The order sorting ``key`` (values in [0, bins)) and each value's run [b[k], b[k + 1])."""
    bounds = key.new_zeros(bins + 1)
    bounds[1:] = torch.bincount(key, minlength=bins).cumsum(0)
    return torch.argsort(key, stable=True), bounds


def _near_runs(block_x: list[Tensor], block_y: list[Tensor], shape: list[int]):
    """For each x_i, the runs of sorted y in the same block along some axis, each pair once:
    along axis 0 the y of x_i's block (y sorted by block); in 2-D also, along axis 1, the y of
    x_i's block but not of its grid cell (y sorted by axis-1 block, then axis-0 block: the cell's
    run lies inside the block's). Returns the runs' starts, ends and the y orders they index."""
    order, bounds = _sorted_runs(block_y[0], shape[0])
    starts, ends, orders = [bounds[block_x[0]]], [bounds[block_x[0] + 1]], [order]
    if len(shape) == 2:
        order, bounds = _sorted_runs(block_y[1] * shape[0] + block_y[0], shape[1] * shape[0])
        bounds += len(order)  # positions in the concatenated orders
        row = block_x[1] * shape[0]
        cell = row + block_x[0]
        starts += [bounds[row], bounds[cell + 1]]
        ends += [bounds[cell], bounds[row + shape[0]]]
        orders.append(order)
    return torch.stack(starts, 1).view(-1), torch.stack(ends, 1).view(-1), orders


def _near_pairs(
    block_x: list[Tensor], block_y: list[Tensor], shape: list[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """The near pairs (i, j) of ``_near_runs``, each once and by i, and the number of pairs
    of each i. Only runs of sorted y are listed; no pair is tested."""
    starts, ends, orders = _near_runs(block_x, block_y, shape)
    counts = ends - starts
    per_x = counts.view(len(block_x[0]), -1).sum(1)
    i = torch.repeat_interleave(torch.arange(len(per_x), device=counts.device), per_x)
    position = torch.repeat_interleave(starts - (counts.cumsum(0) - counts), counts)
    position += torch.arange(len(position), device=counts.device)
    return i, torch.cat(orders).index_select(0, position), per_x


def _segment_lse(values: Tensor, index: Tensor, size: int) -> Tensor:
    """LSE of the rows of ``values`` (n, r) grouped by ``index`` into ``size`` rows (−inf where
    empty): ``(size, r)``."""
    top = values.new_full((size, values.shape[1]), -torch.inf)
    top.scatter_reduce_(0, index[:, None].expand_as(values), values, "amax")
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.zeros_like(top).index_add_(0, index, (values - top.index_select(0, index)).exp_())
    return total.log_().add_(top)


def _exclusive_(scan, part: Tensor, dim: int, reverse: bool, pad: float) -> None:
    """Replace ``part`` along ``dim`` by its exclusive cumulative ``scan``: part[b] ← the scan
    over b' < b (b' > b with ``reverse``), ``pad`` where there is none."""
    n = part.shape[dim]
    if reverse:
        done = scan(part.narrow(dim, 1, n - 1).flip(dim), dim).flip(dim)
        part.narrow(dim, 0, n - 1).copy_(done)
        part.narrow(dim, n - 1, 1).fill_(pad)
    else:
        done = scan(part.narrow(dim, 0, n - 1), dim)
        part.narrow(dim, 1, n - 1).copy_(done)
        part.narrow(dim, 0, 1).fill_(pad)


class _Cloud:
    """A cloud on the grid: its coordinates ``points`` ``(d, n)`` (float64), block per axis,
    grid cell, and ⟨σ, p⟩ per quadrant ``(n, 2^d)``."""

    def __init__(self, points: Tensor, cuts: list[Tensor], signs: Tensor) -> None:
        self.points = points
        self.blocks = [
            torch.searchsorted(c, p, right=True) for c, p in zip(cuts, self.points, strict=True)
        ]
        self.cell = self.blocks[0]
        for k in range(1, len(cuts)):
            self.cell = self.cell * (len(cuts[k]) + 1) + self.blocks[k]
        self.proj = self.points.T @ signs.T


class SoftminPlan:
    """f_i = −ε LSE_j(h_j − ‖q_i − s_j‖₁/ε) for queries and sources on a common grid: the
    grid's ``shape``, the quadrants ``signs`` (2^d, d, in the order of
    ``itertools.product((1, −1), repeat=d)``), and the near pairs (``pair_query``,
    ``pair_source``, cost, sign(q − s) as int8 (d, P)) with e^{−C/ε} cached per ε."""

    def __init__(
        self,
        queries: _Cloud,
        sources: _Cloud,
        shape: list[int],
        signs: Tensor,
        pairs: tuple[Tensor, Tensor, Tensor, Tensor],
        diameter: float,
    ) -> None:
        self.queries, self.sources, self.shape, self.signs = queries, sources, shape, signs
        self.pair_query, self.pair_source, self.pair_cost, self.pair_sign = pairs
        self.cells, self.diameter = math.prod(shape), diameter
        self.top_proj = sources.proj.amax(0)  # c_σ = max_j ⟨σ, s_j⟩
        self._factors: tuple[float, Tensor, Tensor, Tensor] | None = None

    def factors(self, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        """e^{(⟨σ, s⟩ − c_σ)/ε} (S, 2^d), e^{(c_σ − ⟨σ, q⟩)/ε} (Q, 2^d) and e^{−C/ε} of the
        near pairs, for the last ε asked."""
        if self._factors is None or self._factors[0] != eps:
            self._factors = (
                eps,
                ((self.sources.proj - self.top_proj) / eps).exp_(),
                ((self.top_proj - self.queries.proj) / eps).exp_(),
                (self.pair_cost / -eps).exp_(),
            )
        return self._factors[1:]

    def weights(self, eps: float, h: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The terms e^{h_j − C_ij/ε − m_i} of LSE_j(h_j − C_ij/ε), summed per far quadrant
        ``(Q, 2^d)`` and one per near pair ``(P,)``, their sums over j ``(Q,)`` and the shifts
        m ``(Q,)``: LSE_i = m_i + log(sum_i).

        With R = max h − min h + diameter/ε ≤ ``LINEAR_RANGE``, every term lies in
        [e^{−R}, 1] for m = max h, a normal float64: the tables are plain cumulative sums.
        Otherwise they are cumulative LSEs and m_i is each query's largest term."""
        h = h.detach().double()
        top = h.max()
        if float(top - h.min()) + self.diameter / eps <= LINEAR_RANGE:
            src_factor, query_factor, pair_kernel = self.factors(eps)
            w = (h - top).exp_()
            table = w.new_zeros(self.cells, len(self.signs))
            table.index_add_(0, self.sources.cell, src_factor * w[:, None])
            self._sweep_(table, torch.cumsum, 0.0)
            far = table.index_select(0, self.queries.cell).mul_(query_factor)
            near = w.index_select(0, self.pair_source).mul_(pair_kernel)
            shift = top.expand(len(far))
        else:
            weights = h[:, None] + self.sources.proj / eps
            table = _segment_lse(weights, self.sources.cell, self.cells)
            self._sweep_(table, torch.logcumsumexp, -torch.inf)
            far = table.index_select(0, self.queries.cell).sub_(self.queries.proj / eps)
            near = h.index_select(0, self.pair_source).sub_(self.pair_cost / eps)
            shift = far.amax(1).scatter_reduce_(0, self.pair_query, near, "amax")
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
            far = far.sub_(shift[:, None]).exp_()
            near = near.sub_(shift.index_select(0, self.pair_query)).exp_()
        total = far.sum(1).index_add_(0, self.pair_query, near)
        return far, near, total, shift

    def _sweep_(self, table: Tensor, scan, pad: float) -> None:
        """In place, per quadrant σ, the exclusive cumulative ``scan`` of the cell ``table``
        (cells, 2^d) along every axis k, towards the blocks below (σ_k = +1) or above
        (σ_k = −1)."""
        dim = len(self.shape)
        grid = table.view(*self.shape, *(2,) * dim)  # a quadrant's index: its d signs
        for k in range(dim):
            for side in (0, 1):
                _exclusive_(scan, grid.select(dim + k, side), k, reverse=bool(side), pad=pad)

    def sign_means(self, far: Tensor, near: Tensor, total: Tensor) -> Tensor:
        """Σ_j π_ij sign(q_i − s_j) ``(Q, d)`` from ``weights``: π_ij = term / sum_i."""
        grad = (far / total[:, None]) @ self.signs
        weight = near / total.index_select(0, self.pair_query)
        for k in range(grad.shape[1]):
            grad[:, k].index_add_(0, self.pair_query, weight * self.pair_sign[k])
        return grad


def _softmin(plan: SoftminPlan, eps: float, h: Tensor) -> Tensor:
    """−ε LSE_j(h_j − C_ij/ε) in float64, without autograd."""
    _, _, total, shift = plan.weights(eps, h)
    return -eps * (total.log_() + shift)


class _Softmin(torch.autograd.Function):
    """f = −ε LSE as a function of the queries, with the sign-mean gradient in backward."""

    @staticmethod
    def forward(ctx, q: Tensor, plan: SoftminPlan, eps: float, h: Tensor) -> Tensor:
        far, near, total, shift = plan.weights(eps, h)
        ctx.plan, ctx.terms = plan, (far, near, total)
        return (-eps * (total.log() + shift)).to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, out: Tensor):
        grad = ctx.plan.sign_means(*ctx.terms)
        return out[:, None] * grad.to(out.dtype), None, None, None


def cube_means(points: Tensor, side: float) -> tuple[Tensor, Tensor]:
    """The coarse cloud of ``points`` (n, d): the mean point and share of points of each
    non-empty cube of side ``side`` (where the solver anneals before using the kernel)."""
    cubes = torch.floor(points.detach() / side).long()
    cubes -= cubes.amin(0)
    key = cubes[:, 0]
    for k in range(1, points.shape[1]):
        key = key * (int(cubes[:, k].max()) + 1) + cubes[:, k]
    _, cube, counts = torch.unique(key, return_inverse=True, return_counts=True)
    sums = points.detach().new_zeros(len(counts), points.shape[1]).index_add_(0, cube, points)
    shares = counts.to(points.dtype)
    return sums / shares[:, None], shares / len(points)


def _grid(x: Tensor, y: Tensor):
    """The shared grid of two clouds (d ≤ 2): float64 coordinates ``(d, n)``, cuts, block
    counts per axis and quadrant signs."""
    dim = x.shape[1]
    quadrants = list(itertools.product((1.0, -1.0), repeat=dim))
    signs = torch.tensor(quadrants, dtype=torch.float64, device=x.device)
    px, py = (p.detach().double().T.contiguous() for p in (x, y))  # (d, n)
    cuts = [_cuts(a, b, per_value=dim == 1) for a, b in zip(px, py, strict=True)]
    return px, py, cuts, [len(c) + 1 for c in cuts], signs


def near_pair_count(x: Tensor, y: Tensor) -> int:
    """How many pairs ``LaplaceKernel`` would list as near, without listing them (its
    memory grows with it: ~66 bytes per pair). Ties defeat the blocks: points on a line, or on a
    few values of a coordinate, make most pairs near."""
    px, py, cuts, shape, _ = _grid(x, y)
    blocks = [[torch.searchsorted(c, p, right=True) for c, p in zip(cuts, q, strict=True)]
              for q in (px, py)]  # fmt: skip
    starts, ends, _ = _near_runs(blocks[0], blocks[1], shape)
    return int((ends - starts).sum())


class LaplaceKernel:
    """The softmin of the ℓ1 cost C_ij = ‖x_i − y_j‖₁ between clouds in d ≤ 2, exact up to
    float64 rounding (module docstring): a ``SoftminKernel`` with
    ``relative_error`` 0."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        dim = x.shape[1]
        if dim not in (1, 2) or y.shape[1] != dim:
            raise ValueError(
                f"LaplaceKernel is for d = 1 or 2, got {tuple(x.shape)}, {tuple(y.shape)}"
            )
        self.x, self.y, self.name = x, y, f"laplace-{dim}"
        px, py, cuts, shape, signs = _grid(x, y)
        cx, cy = _Cloud(px, cuts, signs), _Cloud(py, cuts, signs)
        i, j, per_x = _near_pairs(cx.blocks, cy.blocks, shape)
        diff = [
            a.repeat_interleave(per_x).sub_(b.index_select(0, j))
            for a, b in zip(px, py, strict=True)
        ]
        cost = sum(d.abs() for d in diff)
        sign = torch.stack([d.sign_() for d in diff]).to(torch.int8)  # (d, P)
        low = torch.minimum(cx.points.amin(1), cy.points.amin(1))
        diameter = float((torch.maximum(cx.points.amax(1), cy.points.amax(1)) - low).sum())
        self.plan_x = SoftminPlan(cx, cy, shape, signs, (i, j, cost, sign), diameter)
        self.plan_y = SoftminPlan(cy, cx, shape, signs, (j, i, cost, -sign), diameter)

    def relative_error(self, eps: float) -> float:
        return 0.0

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor:
        """f_i = −ε LSE_j(h_y[j] − C_ij/ε)."""
        return _softmin(self.plan_x, eps, h_y).to(self.x.dtype)

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor:
        """g_j = −ε LSE_i(h_x[i] − C_ij/ε)."""
        return _softmin(self.plan_y, eps, h_x).to(self.y.dtype)

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor:
        """``softmin_x``, differentiable in x (also under ``torch.no_grad``)."""
        with torch.enable_grad():
            return _Softmin.apply(self.x, self.plan_x, eps, h_y)

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor:
        """``softmin_y``, differentiable in y (also under ``torch.no_grad``)."""
        with torch.enable_grad():
            return _Softmin.apply(self.y, self.plan_y, eps, h_x)


def is_l1_kernel_cost(cost: GroundCost, dim: int) -> bool:
    """Whether the exact kernel is for this cost and dimension: the ℓ1 cost (p = 1), d ≤ 2."""
    return isinstance(cost, LpCost) and cost.p == 1 and dim <= 2


def laplace_applies(cost: GroundCost, x: Tensor, y: Tensor) -> bool:
    """Whether the multiscale backend runs the exact kernel on these clouds:
    ``is_l1_kernel_cost`` and at most ``MAX_NEAR`` of the N·M pairs near
    (``near_pair_count``); otherwise the truncated KeOps kernel runs."""
    if not is_l1_kernel_cost(cost, x.shape[1]):
        return False
    return near_pair_count(x, y) <= MAX_NEAR * x.shape[0] * y.shape[0]


def laplace_start(
    cost: GroundCost,
    x: Tensor,
    y: Tensor,
    log_a: Tensor,
    log_b: Tensor,
    eps_list: list[float],
    p: int,
    scale: float,
    target: Target,
) -> tuple[LaplaceKernel, Tensor, Tensor]:
    """The exact kernel on the points and (f, g = T(f)) at λ there: the problem of the means
    of the cubes of side ``scale`` annealed while ε > scale^p (solved to ``tol`` when
    λ > scale^p), its g extrapolated to f on the points (exactly, by the same kernel from the
    weighted means), then the rest of the schedule annealed on the points."""
    (xc, ac), (yc, bc) = cube_means(x, scale), cube_means(y, scale)
    coarse_eps, fine_eps = coarse_then_fine(eps_list, scale, p)
    _, gc, _ = coarse_solve(cost, xc, yc, ac.log(), bc.log(), coarse_eps, target)
    eps = coarse_eps[-1]
    f = LaplaceKernel(x.detach(), yc).softmin_x(eps, bc.log() + gc / eps)
    kernel = LaplaceKernel(x, y)
    g = kernel.softmin_y(eps, log_a + f / eps)
    return (kernel, *anneal(kernel, log_a, log_b, f, g, [eps, *fine_eps]))
