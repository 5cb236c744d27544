r"""Certified Taylor expansion of the clustered p = 2 softmin (the multiscale backend's kernel
where λ is wide against the clusters, so that truncation would keep every cluster pair).

For the cost ‖q − s‖², query points q_i = a_K + u_i in grid cell K and source points
s_j = c_L + v_j in cell L (a, c: cell centres),

    ‖q_i − s_j‖² = ‖q_i − c_L‖² + ‖v_j‖² − 2⟨a_K − c_L, v_j⟩ − 2⟨u_i, v_j⟩,

so e^{h_j − ‖q_i − s_j‖²/ε} = e^{−‖q_i − c_L‖²/ε} · w_Kj · e^{2⟨u_i, v_j⟩/ε} with
w_Kj = e^{h_j − (‖v_j‖² − 2⟨a_K − c_L, v_j⟩)/ε}. Only the last factor couples a query point with
a source point. Its Taylor polynomial of order k (the Fast Gauss Transform's idea, Greengard &
Strain 1991),

    e^{2⟨u, v⟩/ε} ≈ Σ_{|α| ≤ k} (2/ε)^{|α|} u^α v^α / α!,

turns the softmin f_i = −ε LSE_j(h_j − ‖q_i − s_j‖²/ε) into the moments
M_KLα = Σ_{j ∈ L} w_Kj v_j^α (K·M kernel evaluations) and a sum over source cells (N·L), instead
of N·M. With T = 2 max‖u‖ max‖v‖/ε, every pair's weight keeps a relative remainder of at most

    ρ = T^{k+1}/(k+1)! · e^T,

so every sum over j does too: |f̂ − f|/ε ≤ −log(1 − ρ), and the conditional mean E_π[s | q_i],
which gives the gradient ∂f_i/∂q_i = 2(q_i − E_π[s | q_i]), is a mean under weights within a
relative ρ of the exact ones (its moments need order k + 1 in v). Cells are cubes of side
``expansion_side``, chosen so that ρ stays below a target at the solve's ε; T depends on the
product of the two clouds' radii only, so their cubes may differ (``cell_ratio``).

The order is k = 4 (2 in 1-D, ``order_for``): at ρ = 10⁻⁴, T = 0.37 against 0.083 at k = 2,
cubes 2.1× wider, and in 3-D 9× fewer cells outweigh 3.5× more moments per pair of cells
(20,000 × 20,000 points in [−1, 1]³ against a noisy sphere: 0.19 s against 0.84 s a solve).

All pairs of (query cell, source cell) are computed in batched products, without a loop over
cells: the cells, sorted by size, are cut into a few ranges padded to a common size
(``Grid.groups``); the moments are one product (query cells × padded points)·(padded points ×
α) per source cell, the queries one product (padded points × source cells)·(source cells × α)
per query cell; no temporary exceeds ``CHUNK_ELEMENTS`` but a single cell's points.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

ORDER = 4
MAX_BOX_CELLS = 2**62
CHUNK_ELEMENTS = 2**20  # largest temporary of a chunked pass, in elements (4 MB in float32)
GROUP_COST = 2**14  # one batch's fixed cost in padded elements: ~10 calls of ~5 µs, ~3 ns each
SIZE_BITS = 3  # cell sizes rounded to 4 significant bits before batching (≤ 12.5% padding)


def remainder(t: float, order: int = ORDER) -> float:
    """ρ = T^{k+1}/(k+1)! · e^T: the relative remainder of e^t's Taylor polynomial for |t| ≤ T."""
    return t ** (order + 1) / math.factorial(order + 1) * math.exp(t)


def expansion_side(eps: float, dim: int, rho: float, order: int = ORDER) -> float:
    """The cube side whose cells keep ρ ≤ ``rho`` at ``eps``: a cell's radius around its centre
    is at most side·√d/2, so T ≤ side²·d/(2ε); T is found by bisection on the increasing ρ(T)."""
    low, high = 0.0, 1.0
    while remainder(high, order) < rho:
        high *= 2
    for _ in range(100):  # 2^-100 of the bracket: exact in double precision
        mid = (low + high) / 2
        low, high = (mid, high) if remainder(mid, order) < rho else (low, mid)
    return math.sqrt(2 * eps * low / dim)


def order_for(dim: int) -> int:
    """The solver's order k in dimension ``dim``: ``ORDER``, but 2 in 1-D, where the wider
    cells of order 4 cut the work little (cells ∝ side^{−1}) and left a value 8× less accurate on
    the 1-D contract test (2.9e-4 against 3.7e-5, at λ = diameter², within the bound)."""
    return 2 if dim == 1 else ORDER


def cell_ratio(work_x: float, work_y: float, dim: int) -> float:
    """r for the cube sides side/√r (x) and side·√r (y) of the two clouds' grids: their radii
    keep the product (side√d/2)² of equal sides, hence T and ρ.

    A solve's work grows like M·K_x + N·K_y (K: occupied cells; moments K_x·M, queries N·K_y,
    and the other direction alike); where a cloud fills its cells, K ∝ side^{−d}, and the work
    is least at r^d = N·K_y/(M·K_x): ``work_y`` = N·K_y and ``work_x`` = M·K_x counted at equal
    sides. r is rounded to a power of 4 (sides halved or doubled) within [1/16, 16]: 20,000
    points in [−1, 1]³ against a noisy sphere (σ = 1.59) take r = 4: a solve in 0.19 s against
    0.49 s at r = 1 (one CPU thread; one sweep at λ against two)."""
    power = round(math.log(work_y / work_x) / (dim * math.log(4)))
    return 4.0 ** min(2, max(-2, power))


def multi_indices(dim: int, order: int) -> Tensor:
    """All α ∈ ℕ^dim with |α| ≤ order, by degree, as an ``(A, dim)`` integer tensor."""
    alphas = [a for a in itertools.product(range(order + 1), repeat=dim) if sum(a) <= order]
    return torch.tensor(sorted(alphas, key=lambda a: (sum(a), [-e for e in a])))


def squared_distances(z: Tensor, centres: Tensor) -> Tensor:
    """‖z_i − c_k‖² ``(n, K)``, summed coordinate by coordinate (d ≤ 3 here): exact where the
    matmul form ‖z‖² + ‖c‖² − 2⟨z, c⟩ cancels in float32, and faster than ``torch.cdist``."""
    out = (z[:, None, 0] - centres[None, :, 0]).square_()
    for r in range(1, z.shape[1]):
        out += (z[:, None, r] - centres[None, :, r]).square_()
    return out


def monomials(z: Tensor, alphas: Tensor) -> Tensor:
    """z^α for each row of ``z`` (n, d) and each α of ``alphas`` (A, d, by degree): ``(n, A)``,
    each column one product from a column of lower degree."""
    out = z.new_empty(len(z), len(alphas))
    out[:, 0] = 1
    index = {tuple(a): i for i, a in enumerate(alphas.tolist())}
    for i, alpha in enumerate(alphas.tolist()[1:], 1):
        r = next(r for r, e in enumerate(alpha) if e)
        lower = index[tuple(e - (k == r) for k, e in enumerate(alpha))]
        torch.mul(out[:, lower], z[:, r], out=out[:, i])
    return out


def _size_class(size: int) -> int:
    """``size`` rounded up to SIZE_BITS + 1 significant bits (at most 1/2^SIZE_BITS more)."""
    shift = max(0, size.bit_length() - 1 - SIZE_BITS)
    return ((size - 1 >> shift) + 1) << shift


def _partition(sizes: list[int], other: int) -> list[tuple[int, int]]:
    """Ranges ``[c0, c1)`` of the cells (``sizes`` ascending), each to be padded to its largest
    size, minimizing Σ_ranges GROUP_COST + other·(c1 − c0)·size_{c1−1}: dynamic programming over
    the runs of equal ``_size_class``."""
    ends = [c + 1 for c in range(len(sizes)) if c + 1 == len(sizes)
            or _size_class(sizes[c + 1]) != _size_class(sizes[c])]  # fmt: skip
    bounds = [0, *ends]
    best, cut = [0.0], [0]
    for i in range(1, len(bounds)):
        top = other * sizes[bounds[i] - 1]
        cost, j = min((best[j] + GROUP_COST + top * (bounds[i] - bounds[j]), j) for j in range(i))
        best.append(cost)
        cut.append(j)
    ranges, i = [], len(bounds) - 1
    while i:
        ranges.append((bounds[cut[i]], bounds[i]))
        i = cut[i]
    return ranges[::-1]


class Grid:
    """A cloud sorted into the cubes of side ``side``: each cell's points contiguous, the cells
    by increasing size (so that cells of similar sizes pad into one batch).

    Attributes:
        side: the cube side.
        perm: the sorting permutation (``points = cloud[perm]``).
        sizes: points per cell, in order (a Python list).
        starts: ``(K,)`` index of each cell's first sorted point.
        labels: the cell of each sorted point, in ``[0, K)``.
        centres: ``(K, d)`` cube centres, the expansion points.
        offsets: ``(n, d)`` sorted points minus their cell's centre.
        radius: max ‖offset‖ (≤ side·√d/2).
        means, weights: ``(K, d)`` mean point and share of points of each cell (the coarse
            problem's cloud).
    """

    def __init__(self, cloud: Tensor, side: float) -> None:
        if not Grid.fits(cloud, side):
            raise ValueError(f"the cloud spans more than {MAX_BOX_CELLS} cubes of side {side}")
        cells = torch.floor(cloud / side).long()
        low = cells.amin(0)
        extent = (cells.amax(0) - low + 1).tolist()
        strides = [math.prod(extent[r + 1 :]) for r in range(len(extent))]
        key, perm = torch.sort(((cells - low) * cells.new_tensor(strides)).sum(1))
        keys, cell, counts = torch.unique_consecutive(key, return_inverse=True, return_counts=True)
        order = torch.sort(counts, stable=True)[1]  # cells by size
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device)
        self.perm = perm[torch.sort(rank[cell], stable=True)[1]]
        keys, counts = keys[order], counts[order]
        self.sizes = counts.tolist()
        self.starts = counts.cumsum(0) - counts
        self.labels = torch.repeat_interleave(torch.arange(len(keys), device=key.device), counts)
        coords = torch.stack([keys // st % ex for st, ex in zip(strides, extent, strict=True)], 1)
        points = cloud[self.perm]
        self.centres = ((coords + low).to(cloud.dtype) + 0.5) * side
        self.offsets = points - self.centres[self.labels]
        self.radius = float(self.offsets.norm(dim=1).max())
        shares = counts.to(cloud.dtype)
        self.means = torch.zeros_like(self.centres).index_add_(0, self.labels, points)
        self.means /= shares[:, None]
        self.weights = shares / len(cloud)
        self.side = side
        self._groups: dict[int, list[tuple[int, int, Tensor]]] = {}

    @staticmethod
    def fits(cloud: Tensor, side: float) -> bool:
        """Whether the cloud's bounding box spans fewer than ``MAX_BOX_CELLS`` cubes (the
        cell keys are int64)."""
        extent = torch.floor(cloud.amax(0) / side) - torch.floor(cloud.amin(0) / side) + 1
        return bool(torch.isfinite(extent).all()) and float(extent.double().prod()) < MAX_BOX_CELLS

    def __len__(self) -> int:
        return len(self.sizes)

    def groups(self, other: int) -> list[tuple[int, int, Tensor]]:
        """The cells in ranges ``[c0, c1)`` of ``_partition`` (each cell's work ∝ ``other``
        times its padded size), with the ``(c1 − c0, S)`` index of their points padded to the
        largest size S (the pad index is n, one past the last point)."""
        if other not in self._groups:
            groups = []
            for c0, c1 in _partition(self.sizes, other):
                span = torch.arange(self.sizes[c1 - 1], device=self.starts.device)
                index = self.starts[c0:c1, None] + span
                index[span >= self.starts.new_tensor(self.sizes[c0:c1])[:, None]] = len(self.labels)
                groups.append((c0, c1, index))
            self._groups[other] = groups
        return self._groups[other]


class _WithGradient(torch.autograd.Function):
    """``f`` as a function of ``q`` whose Jacobian is diagonal with the rows of ``grad``."""

    @staticmethod
    def forward(ctx, q: Tensor, f: Tensor, grad: Tensor) -> Tensor:
        ctx.save_for_backward(grad)
        return f

    @staticmethod
    def backward(ctx, out: Tensor):
        (grad,) = ctx.saved_tensors
        return out[:, None] * grad, None, None


def _pad(values: Tensor, fill: float) -> Tensor:
    """``values`` with one more row of ``fill``, at the pad index ``len(values)`` of
    ``Grid.groups``."""
    return torch.cat([values, values.new_full((1, *values.shape[1:]), fill)])


def _tiles(qgrid: Grid, other: int, k0: int, k1: int):
    """The padded points of the query cells in ``[k0, k1)``, in tiles of at most
    max(1, ``CHUNK_ELEMENTS`` // ``other``) points: pairs of the tile's first cell minus
    ``k0`` and its ``(G, S)`` index (``Grid.groups``)."""
    for c0, c1, index in qgrid.groups(other):
        lo, hi = max(c0, k0), min(c1, k1)
        size = index.shape[1]
        cells = max(1, CHUNK_ELEMENTS // (size * other))
        rows = size if cells > 1 else max(1, CHUNK_ELEMENTS // other)
        for g in range(lo, hi, cells):
            for s in range(0, size, rows):
                yield g - k0, index[g - c0 : min(hi, g + cells) - c0, s : s + rows]


def _exponentials(bias: Tensor, scaled: Tensor, centres_t: Tensor) -> tuple[Tensor, Tensor]:
    """e^{B_iL − t_i} ``(G, S, L)`` and t_i = max_L B_iL ``(G, S, 1)`` for
    B_iL = bias_KL + ⟨scaled_i, c_L⟩: ``bias`` ``(G, L)`` per query cell, ``scaled`` ``(G, S, d)``
    per padded query point, ``centres_t`` the contiguous ``(d, L)`` c_Lᵀ (a transposed view
    makes the product 10× slower)."""
    expo = torch.baddbmm(bias[:, None, :], scaled, centres_t.expand(len(bias), -1, -1))
    top = expo.amax(-1, keepdim=True)
    return expo.sub_(top).exp_(), top


def _finish(qgrid: Grid, sums: Tensor, eps: float) -> Tensor:
    """f_i = ‖u_i‖² + 2⟨u_i, a_K⟩ − ε·``sums``_i (the terms of ‖q_i − s‖² that do not depend on
    s), on the sorted points of ``qgrid``."""
    u = qgrid.offsets
    return (u * (u + 2 * qgrid.centres[qgrid.labels])).sum(1) - eps * sums


def centroid_softmin(qgrid: Grid, points: Tensor, h: Tensor, eps: float) -> Tensor:
    """f_i = −ε LSE_l(h_l − ‖q_i − z_l‖²/ε), exactly, for the sorted points q_i = a_K + u_i of
    ``qgrid`` and few ``points`` z_l: with B_il = h_l − ‖a_K − z_l‖²/ε + 2⟨u_i, z_l⟩/ε,
    f_i = ‖u_i‖² + 2⟨u_i, a_K⟩ − ε LSE_l B_il (the extrapolation of centroid potentials)."""
    scaled, points_t = _pad((2 / eps) * qgrid.offsets, 0), points.T.contiguous()
    lse = points.new_empty(len(scaled))
    block = max(1, CHUNK_ELEMENTS // len(points))
    for k0 in range(0, len(qgrid), block):
        bias = h - squared_distances(qgrid.centres[k0 : k0 + block], points) / eps
        for g, tile in _tiles(qgrid, len(points), k0, k0 + block):
            weights, top = _exponentials(bias[g : g + len(tile)], scaled[tile], points_t)
            lse.index_copy_(0, tile.flatten(), (weights.sum(-1).log_() + top[..., 0]).flatten())
    return _finish(qgrid, lse[:-1], eps)


def expanded_softmin(
    query: Tensor,
    qgrid: Grid,
    source: Grid,
    h: Tensor,
    eps: float,
    with_grad: bool,
    order: int = ORDER,
) -> Tensor:
    """f_i = −ε LSE_j(h_j − ‖q_i − s_j‖²/ε) through the expansion of order ``order``.

    ``query`` holds the sorted points of ``qgrid``; ``h`` is indexed by the sorted source points.
    With ``with_grad`` the result is differentiable in ``query`` with the gradient
    2(q_i − Ê[s | q_i]) (module docstring); no graph through the sums is kept.

    For q_i = a_K + u_i, with B_iL = log m_KL − ‖a_K − c_L‖²/ε + 2⟨u_i, c_L⟩/ε (m_KL = M_KL0,
    ``_moments``) and U_iα = (2/ε)^{|α|} u_i^α/α!,

        f_i = ‖u_i‖² + 2⟨u_i, a_K⟩ − ε log Σ_L e^{B_iL} Σ_α U_iα M_KLα / m_KL,
        Ê[s_r | q_i] = Σ_L e^{B_iL} Σ_α U_iα (c_Lr M_KLα + M_KL(α+e_r)) / m_KL / (the sum in f_i),

    for blocks of query cells (moments of at most ``CHUNK_ELEMENTS``), on the points of
    cells of similar sizes padded into batches (``Grid.groups``).
    """
    q = query.detach()
    dim = q.shape[1]
    alphas = multi_indices(dim, order + int(with_grad))
    base = int((alphas.sum(1) <= order).sum())  # α with |α| ≤ k come first
    coefficients = q.new_tensor(  # (2/ε)^{|α|}/α!, rounded in the query's dtype only
        [(2 / eps) ** sum(a) / math.prod(map(math.factorial, a)) for a in alphas[:base].tolist()]
    )
    terms = _pad(monomials(qgrid.offsets, alphas[:base]) * coefficients, 0)  # U_iα
    v = source.offsets
    own = _pad(
        h - ((v * v).sum(1) + 2 * (source.centres[source.labels] * v).sum(1)) / eps, -math.inf
    )
    powers, v = _pad(monomials(v, alphas), 0), _pad(v, 0)
    sources = [
        (c0, own[index], v[index].mT.contiguous(), powers[index])
        for c0, _, index in source.groups(len(qgrid))
    ]
    if with_grad:  # the columns α + e_r of the moments, for α of degree ≤ k
        index = {tuple(a): i for i, a in enumerate(alphas.tolist())}
        shifted = torch.tensor(
            [[index[tuple(a)] for a in (alphas[:base] + e).tolist()] for e in torch.eye(dim).long()]
        )
    width = base * (1 + dim * int(with_grad))
    sums = q.new_empty(len(terms), width // base)  # log Σ_L …, then Ê[s | q_i]; pad row last
    block = max(1, CHUNK_ELEMENTS // (len(source) * width))
    centres_t = source.centres.T.contiguous()
    for k0 in range(0, len(qgrid), block):
        moments, log_mass = _moments(qgrid.centres[k0 : k0 + block], sources, len(source), eps)
        weights = moments[..., :base]  # (L, Kb, base)
        if with_grad:  # c_Lr M_KLα + M_KL(α+e_r): (L, Kb, d, base)
            first = moments[..., shifted] + source.centres[:, None, :, None] * weights[..., None, :]
            weights = torch.cat([weights, first.flatten(-2)], -1)
        weights = weights.transpose(0, 1).contiguous()  # (Kb, L, width)
        bias = log_mass.T - squared_distances(qgrid.centres[k0 : k0 + block], source.centres) / eps
        for g, tile in _tiles(qgrid, len(source), k0, k0 + block):
            u = terms[tile]  # (G, S, base); U_{e_r} = 2u_r/ε
            cells = slice(g, g + len(tile))
            expo, top = _exponentials(bias[cells], u[..., 1 : dim + 1], centres_t)
            total = torch.bmm(expo, weights[cells]).unflatten(-1, (-1, base))
            total = (total * u[..., None, :]).sum(-1)
            total[..., 1:] /= total[..., :1]
            total[..., 0] = total[..., 0].log() + top[..., 0]
            sums.index_copy_(0, tile.flatten(), total.flatten(0, 1))
    f = _finish(qgrid, sums[:-1, 0], eps)
    if not with_grad:
        return f
    grad = 2 * (q - sums[:-1, 1:])
    with torch.enable_grad():  # the solver's sweeps run under no_grad
        return _WithGradient.apply(query, f, grad)


def _moments(
    centres: Tensor, sources: list[tuple[int, Tensor, Tensor, Tensor]], cells: int, eps: float
) -> tuple[Tensor, Tensor]:
    """For query cells of ``centres`` a_K and each source cell L: the normalized moments
    M_KLα/m_KL ``(L, K, A)`` and log m_KL ``(L, K)``, where M_KLα = Σ_{j∈L} w_Kj v_j^α,
    m_KL = M_KL0, w_Kj = e^{own_j + 2⟨a_K, v_j⟩/ε}, own_j = h_j − (‖v_j‖² + 2⟨c_L, v_j⟩)/ε; each
    pair's largest w factored out. ``sources``: per group of source cells, its first cell and
    own_j ``(G, S)``, v_jᵀ ``(G, d, S)`` and v_j^α ``(G, S, A)`` on its padded points (own = −∞
    on the padding), ``cells`` source cells in all."""
    scaled = (2 / eps) * centres
    sums = centres.new_empty(cells, len(centres), sources[0][3].shape[-1])
    top = centres.new_empty(cells, len(centres))
    for c0, own, vt, powers in sources:
        count, size = own.shape
        group = max(1, min(count, CHUNK_ELEMENTS // (size * len(centres))))
        rows = max(1, CHUNK_ELEMENTS // (size * group))
        for g in range(0, count, group):
            part, n = slice(g, g + group), min(group, count - g)
            for k in range(0, len(centres), rows):
                logw = torch.baddbmm(
                    own[part, None, :], scaled[None, k : k + rows].expand(n, -1, -1), vt[part]
                )  # (G, K, S)
                peak = logw.amax(-1, keepdim=True)
                top[c0 + g : c0 + g + n, k : k + rows] = peak[..., 0]
                sums[c0 + g : c0 + g + n, k : k + rows] = torch.bmm(
                    logw.sub_(peak).exp_(), powers[part]
                )
    return sums / sums[..., :1], top + sums[..., 0].log()
