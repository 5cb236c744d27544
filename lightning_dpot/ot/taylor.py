"""The p = 2 multiscale kernel: the softmin through the certified Taylor cluster expansion of
``lightning_dpot.ot.expansion``, with cells sized so that its relative error ρ at λ is at most
``tol``/10, and its start from the cluster means' problem solved at λ."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dpot.ot.costs import GroundCost
from lightning_dpot.ot.dense import coarse_solve
from lightning_dpot.ot.expansion import (
    CHUNK_ELEMENTS,
    Grid,
    cell_ratio,
    centroid_softmin,
    expanded_softmin,
    expansion_side,
    order_for,
    remainder,
)
from lightning_dpot.ot.loop import Target

ROUNDING_ULPS = 100  # ρ below this many ulps of the dtype is not covered by the bound
RANGE_MARGIN = 1e4  # the expansion's coefficients (2/λ)^{k+1} stay below max float / this


class TaylorKernel:
    """The p = 2 softmin through the cluster expansion, on the clouds sorted into its grid
    cells (differentiable gathers of x and y), of order
    ``order_for`` the dimension."""

    def __init__(self, x: Tensor, y: Tensor, grid_x: Grid, grid_y: Grid) -> None:
        self.grid_x, self.grid_y = grid_x, grid_y
        self.order = order_for(x.shape[1])
        self.name = f"taylor-{self.order}"
        with torch.enable_grad():
            self.x, self.y = x[grid_x.perm], y[grid_y.perm]

    def relative_error(self, eps: float) -> float:
        """ρ: every pair's weight, hence every sum of the softmin, within this relative error."""
        return remainder(2 * self.grid_x.radius * self.grid_y.radius / eps, self.order)

    def _softmin(
        self, query: Tensor, qgrid: Grid, source: Grid, h: Tensor, eps: float, grad: bool
    ) -> Tensor:
        return expanded_softmin(query, qgrid, source, h, eps, grad, self.order)

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor:
        return self._softmin(self.x, self.grid_x, self.grid_y, h_y, eps, False)

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor:
        return self._softmin(self.y, self.grid_y, self.grid_x, h_x, eps, False)

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor:
        return self._softmin(self.x, self.grid_x, self.grid_y, h_y, eps, self.x.requires_grad)

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor:
        return self._softmin(self.y, self.grid_y, self.grid_x, h_x, eps, self.y.requires_grad)


def taylor_grids(x: Tensor, y: Tensor, reg: float, tol: float) -> tuple[Grid, Grid] | None:
    """The two (centred) clouds' grids for the Taylor kernel at λ = ``reg``, or ``None`` where
    it does not apply: a bound ρ = tol/10 below the dtype's rounding (100 ulps: tol < 1.2e-4 in
    float32), which the bound does not cover; coefficients (2/λ)^{k+1} beyond a ten-thousandth
    of the dtype's range (float32, order 4: λ < 2.5e-7); more than N·M/4 kernel evaluations
    (λ wide against the spread of the clouds, where truncation would keep every cluster pair);
    more grid cubes than int64 keys tell apart. The cubes of the two grids differ by
    ``cell_ratio``. The caller checks that the cost is the
    p = 2 one."""
    rho, order, finfo = tol / 10, order_for(x.shape[1]), torch.finfo(x.dtype)
    if rho < ROUNDING_ULPS * finfo.eps or (2 / reg) ** (order + 1) > finfo.max / RANGE_MARGIN:
        return None
    x, y = x.detach(), y.detach()
    side = expansion_side(reg, x.shape[1], rho, order)
    if not (Grid.fits(x, side) and Grid.fits(y, side)):
        return None
    grid_x, grid_y = Grid(x, side), Grid(y, side)
    n, m = x.shape[0], y.shape[0]
    ratio = cell_ratio(m * len(grid_x), n * len(grid_y), x.shape[1]) ** 0.5
    if ratio != 1 and Grid.fits(x, side / ratio) and Grid.fits(y, side * ratio):
        grid_x, grid_y = Grid(x, side / ratio), Grid(y, side * ratio)
    if len(grid_x) * m + n * len(grid_y) > n * m / 4:
        return None
    return grid_x, grid_y


def taylor_start(
    cost: GroundCost,
    x: Tensor,
    y: Tensor,
    log_a: Tensor,
    grids: tuple[Grid, Grid],
    eps_list: list[float],
    target: Target,
) -> tuple[TaylorKernel, Tensor, Tensor]:
    """The Taylor kernel on the clouds' grids (``taylor_grids``) and (f, g = T(f)) on the
    points.

    The means' problem is solved to ``tol`` at λ, and the potential of the cloud of the smaller
    cubes (y on a tie) extrapolated from its means to the other cloud's points (x's f to g, then
    f = T(g); or y's g to f). Those means are of cubes of half the side where the problem's
    matrix keeps within ``CHUNK_ELEMENTS`` (2^d·K_x·K_y): the marginal error after one sweep
    falls about 3× (docs/performance.md)."""
    grid_x, grid_y = grids
    finer_x = grid_x.side < grid_y.side
    cloud, fine = (x.detach(), grid_x) if finer_x else (y.detach(), grid_y)
    small = 2 ** x.shape[1] * len(grid_x) * len(grid_y) <= CHUNK_ELEMENTS
    if small and Grid.fits(cloud, fine.side / 2):
        fine = Grid(cloud, fine.side / 2)
    coarse_x, coarse_y = (fine, grid_y) if finer_x else (grid_x, fine)
    log_ac, log_bc = coarse_x.weights.log(), coarse_y.weights.log()
    fc, gc, _ = coarse_solve(cost, coarse_x.means, coarse_y.means, log_ac, log_bc, eps_list, target)
    kernel = TaylorKernel(x, y, grid_x, grid_y)
    eps = eps_list[-1]
    if finer_x:
        g = centroid_softmin(grid_y, coarse_x.means, log_ac + fc / eps, eps)
        f = kernel.softmin_x(eps, g / eps - math.log(y.shape[0]))
    else:
        f = centroid_softmin(grid_x, coarse_y.means, log_bc + gc / eps, eps)
    return kernel, f, kernel.softmin_y(eps, log_a + f / eps)
