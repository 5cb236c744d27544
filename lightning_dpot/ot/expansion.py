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
:func:`expansion_side`, chosen so that ρ stays below a target at the solve's ε.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

ORDER = 2
MAX_BOX_CELLS = 2**62
CHUNK_ELEMENTS = 2**20  # largest temporary of a chunked pass, in elements (4 MB in float32)


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


class Grid:
    """A cloud sorted into the cubes of side ``side``: each cell's points contiguous.

    Attributes:
        perm: the sorting permutation (``points = cloud[perm]``).
        sizes: points per cell, in order (a Python list, for slicing).
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
        key, self.perm = torch.sort(((cells - low) * cells.new_tensor(strides)).sum(1))
        keys, counts = torch.unique_consecutive(key, return_counts=True)
        self.sizes = counts.tolist()
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

    @staticmethod
    def fits(cloud: Tensor, side: float) -> bool:
        """Whether the cloud's bounding box spans fewer than :data:`MAX_BOX_CELLS` cubes (the
        cell keys are int64)."""
        extent = torch.floor(cloud.amax(0) / side) - torch.floor(cloud.amin(0) / side) + 1
        return bool(torch.isfinite(extent).all()) and float(extent.double().prod()) < MAX_BOX_CELLS

    def __len__(self) -> int:
        return len(self.sizes)


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


def expanded_softmin(
    query: Tensor, qgrid: Grid, source: Grid, h: Tensor, eps: float, with_grad: bool
) -> Tensor:
    """f_i = −ε LSE_j(h_j − ‖q_i − s_j‖²/ε) through the expansion of order :data:`ORDER`.

    ``query`` holds the sorted points of ``qgrid``; ``h`` is indexed by the sorted source points.
    With ``with_grad`` the result is differentiable in ``query`` with the gradient
    2(q_i − Ê[s | q_i]) (module docstring); no graph through the sums is kept.
    """
    q = query.detach()
    dim = q.shape[1]
    alphas = multi_indices(dim, ORDER + int(with_grad))
    base = int((alphas.sum(1) <= ORDER).sum())  # α with |α| ≤ k come first
    coefficients = torch.tensor(
        [(2 / eps) ** int(a.sum()) / math.prod(math.factorial(int(e)) for e in a) for a in alphas]
    ).to(q)
    powers = monomials(source.offsets, alphas)
    v = source.offsets
    own = h - ((v * v).sum(1) + 2 * (source.centres[source.labels] * v).sum(1)) / eps
    # Indices of α + e_r in ``alphas``, for the first moments Σ_j w_j P(t_ij) v_j.
    index = {tuple(a.tolist()): i for i, a in enumerate(alphas)}
    shifted = [
        [index[tuple((a + torch.eye(dim, dtype=a.dtype)[r]).tolist())] for a in alphas[:base]]
        for r in range(dim)
    ] if with_grad else []  # fmt: skip
    f = torch.empty(len(q), dtype=q.dtype, device=q.device)
    grad = torch.empty_like(q) if with_grad else None
    starts = [0, *itertools.accumulate(qgrid.sizes)]
    rows_per_chunk = max(1, CHUNK_ELEMENTS // len(source))
    cells_per_block = max(1, CHUNK_ELEMENTS // (len(source) * len(alphas)))
    for k0 in range(0, len(qgrid), cells_per_block):
        cells = range(k0, min(len(qgrid), k0 + cells_per_block))
        moments, log_mass = _moments(qgrid.centres[k0 : cells.stop], source, own, eps, powers)
        for k in cells:
            for lo in range(starts[k], starts[k + 1], rows_per_chunk):
                hi = min(starts[k + 1], lo + rows_per_chunk)
                u = monomials(qgrid.offsets[lo:hi], alphas[:base]) * coefficients[:base]
                ratio0 = u @ moments[k - k0, :, :base].T  # Σ_j w P(t) / Σ_j w, per source cell
                expo = log_mass[k - k0] - squared_distances(q[lo:hi], source.centres) / eps
                expo += ratio0.log()
                lse = torch.logsumexp(expo, 1)
                f[lo:hi] = -eps * lse
                if with_grad:  # Ê[s | q] = Σ_L share_L (c_L + Σ_j w P(t) v_j / Σ_j w P(t))
                    share = (expo - lse[:, None]).exp_()
                    mean = share @ source.centres
                    share /= ratio0
                    for r, idx in enumerate(shifted):
                        mean[:, r] += (share * (u @ moments[k - k0, :, idx].T)).sum(1)
                    grad[lo:hi] = 2 * (q[lo:hi] - mean)
    if not with_grad:
        return f
    with torch.enable_grad():  # the solver's sweeps run under no_grad
        return _WithGradient.apply(query, f, grad)


def _moments(centres: Tensor, source: Grid, own: Tensor, eps: float, powers: Tensor):
    """For query cells of ``centres`` a_K and each source cell L: the normalized moments
    Σ_j w_Kj v_j^α / Σ_j w_Kj ``(K, L, A)`` and log Σ_j w_Kj ``(K, L)``, with
    w_Kj = e^{own_j + 2⟨a_K, v_j⟩/ε}, own_j = h_j − (‖v_j‖² + 2⟨c_L, v_j⟩)/ε; one source cell
    (a contiguous slice of the sorted points) at a time."""
    v = source.offsets
    scaled_centres = (2 / eps) * centres
    sums = powers.new_empty(len(centres), len(source), powers.shape[1])
    top = powers.new_empty(len(centres), len(source))
    start = 0
    for cell, size in enumerate(source.sizes):
        cut = slice(start, start + size)
        step = max(1, CHUNK_ELEMENTS // size)
        for lo in range(0, len(centres), step):
            rows = slice(lo, lo + step)
            logw = torch.addmm(own[None, cut], scaled_centres[rows], v[cut].T)
            top[rows, cell] = logw.amax(1)
            sums[rows, cell] = (logw - top[rows, cell, None]).exp_() @ powers[cut]
        start += size
    return sums / sums[:, :, :1], top + sums[:, :, 0].log()
