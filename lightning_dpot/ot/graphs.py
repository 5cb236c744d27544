r"""The fixed-budget Newton solve captured as CUDA graphs and replayed.

``semi_dual_potential`` runs the same sequence of about 1,600 small
operations for every problem of a given shape (B, N, M), whatever the data: its work is fixed
by design, so that a solve on private records reveals nothing through an iteration count, and it
reads no value back to the host. That is what a CUDA graph needs. On a GPU the operations are
tiny (N, M ≈ 50) and their launch, not their arithmetic, is the cost; a captured graph replays
the whole sequence at the cost of one launch (``torch.cuda.CUDAGraph``; Nvidia, *CUDA
Programming Guide*, §"CUDA Graphs").

``CapturedPotentials`` captures one graph per (shape, dtype, device, ε₀, λ) on its first
use: two warm-up runs on a side stream (cuBLAS/cuSOLVER handles and workspaces are created
outside the capture), then the capture, with cuSOLVER as the linear-algebra library (its
batched Cholesky is captured as device kernels; MAGMA's waits on the host). Each later call
copies the cost into the graph's input buffer, replays, and returns a copy of the output.
Poisson batches change the real batch size from step to step, so a run captures one graph per
size it meets (Binomial(N, q): a few dozen sizes), each exactly the eager computation at that
size — no padding, so the privacy analysis is unchanged. The replay computes the same kernels
on the same inputs as the eager path, so its values are the eager ones bit for bit (pinned by a
test on a GPU). On the CPU, or where a capture fails, the eager path runs; the warning says so
once and names neither the shape nor the error's message (a shape holds a batch size, which
the privacy analysis does not cover).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor

from lightning_dpot.ot.newton import semi_dual_potential

__all__ = ["CapturedPotentials"]

_Key = tuple[tuple[int, ...], torch.dtype, torch.device, float, float]


@contextlib.contextmanager
def _cusolver() -> Iterator[None]:
    previous = torch.backends.cuda.preferred_linalg_library()
    torch.backends.cuda.preferred_linalg_library("cusolver")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_linalg_library(previous)


class _Graph:
    """One captured solve: its input buffer, its graph and its output buffer."""

    def __init__(self, cost: Tensor, eps0: float, reg: float) -> None:
        self.cost = cost.clone()
        with torch.cuda.device(cost.device), _cusolver():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    semi_dual_potential(self.cost, eps0, reg)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # Only this thread's calls are checked during the capture (a data loader's or a
            # progress bar's thread may run meanwhile).
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.potential = semi_dual_potential(self.cost, eps0, reg)

    def __call__(self, cost: Tensor) -> Tensor:
        self.cost.copy_(cost)
        self.graph.replay()
        return self.potential.clone()


class CapturedPotentials:
    """``semi_dual_potential`` with one CUDA graph per problem
    shape (module docstring); the eager function on the CPU. Called like it, with a batch of
    costs ``(B, N, M)`` or one ``(N, M)``."""

    def __init__(self) -> None:
        self._graphs: dict[_Key, _Graph | None] = {}
        self._warned = False

    def __call__(self, cost: Tensor, eps0: float, reg: float) -> Tensor:
        if not cost.is_cuda:
            return semi_dual_potential(cost, eps0, reg)
        single = cost.dim() == 2
        batch = cost.detach().to(torch.float64)
        batch = (batch[None] if single else batch).contiguous()
        key = (tuple(batch.shape), batch.dtype, batch.device, float(eps0), float(reg))
        if key not in self._graphs:
            try:
                self._graphs[key] = _Graph(batch, eps0, reg)
            except RuntimeError as error:
                # Neither the shape nor the message: the shape holds a Poisson batch size.
                if not self._warned:
                    warnings.warn(
                        f"CUDA graph capture of the Newton solve failed ({type(error).__name__});"
                        " solves whose capture fails run eagerly (reported once)",
                        stacklevel=2,
                    )
                self._warned = True
                self._graphs[key] = None
        graph = self._graphs[key]
        potential = semi_dual_potential(batch, eps0, reg) if graph is None else graph(batch)
        return potential[0] if single else potential

    def __len__(self) -> int:
        """The number of shapes captured so far."""
        return sum(graph is not None for graph in self._graphs.values())

    def __getstate__(self) -> dict:
        """Graphs are device state: a pickled or deep-copied solver captures its own."""
        return {"_graphs": {}, "_warned": False}
