"""Full precision for the transport math under mixed-precision training.

With ``Trainer(precision="bf16-mixed")`` (or ``"16-mixed"``) Lightning runs every training step
inside ``torch.autocast``, which runs matrix products in bfloat16 (8 significant bits: a relative
error of 2⁻⁸ ≈ 4·10⁻³ on every product) and hands the loss bfloat16 generator outputs. A
squared-Euclidean cost ‖x‖² + ‖y‖² − 2⟨x, y⟩ computed so loses its small entries, and a
Sinkhorn solve at λ/diameter^p = 10⁻⁵ (DP-Sinkhorn) needs far more than 8 bits. The functions
here let the OT code leave autocast and work in at least float32; the networks keep the
trainer's precision, and gradients flow back through the casts to their dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["autocast_disabled", "full_precision", "upcast"]

F = TypeVar("F", bound=Callable[..., Any])


def upcast(x: Tensor) -> Tensor:
    """``x`` in float32 if it is in a lower floating precision (bfloat16, float16); float32,
    float64 and integer tensors are returned as they are. Differentiable."""
    if x.is_floating_point() and torch.finfo(x.dtype).bits < 32:
        return x.to(torch.float32)
    return x


@contextmanager
def autocast_disabled(*tensors: Tensor) -> Iterator[None]:
    """Leave ``torch.autocast`` on the devices of ``tensors`` for the duration of the block."""
    with ExitStack() as stack:
        for device_type in sorted({t.device.type for t in tensors}):
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def full_precision(fn: F) -> F:
    """Run ``fn`` outside autocast (on the devices of its tensor arguments), with its bfloat16 /
    float16 tensor arguments upcast to float32 (``upcast``); its other arguments, and
    float32 or float64 tensors, are passed as they are."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        args = tuple(upcast(a) if isinstance(a, Tensor) else a for a in args)
        kwargs = {k: upcast(v) if isinstance(v, Tensor) else v for k, v in kwargs.items()}
        with autocast_disabled(*tensors):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
