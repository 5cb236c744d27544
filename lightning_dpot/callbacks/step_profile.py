r"""What one training step dispatches, and where it would wait for a GPU.

A step on a GPU is fast only if the host queues its kernels without waiting for the device. The
host waits when it needs a value the device computes:

* ``aten::_local_scalar_dense``: ``.item()``, ``bool(t)``, ``float(t)``, ``if t.any():`` — a
  device-to-host read;
* ``aten::nonzero`` (and boolean-mask indexing, which calls it): an output whose shape depends on
  the data, known only after the device has computed it;
* ``aten::lift_fresh``: a tensor built from host data (``torch.tensor([...])``), copied to the
  device from pageable memory, which waits for the copy.

``StepProfile`` records, with ``torch.profiler``, every ``aten`` operation of a window of
training steps (from the first callback's ``on_train_batch_start`` to the last callback's
``on_train_batch_end``: the other callbacks' batch hooks, the forward, the backward with its
hooks and the optimizer step; the data loader's fetch and the transfer of the batch are outside
it) and counts the operations
dispatched from Python or autograd (``ops_per_step``, nested calls not counted again: on a GPU
each is about one kernel launch) and the waiting operations above, with the chain of operations
that called each (``host_waits``). These are properties of the code, so they can be counted on
the CPU. One exception is reported apart: the CPU kernel of the fused Adam reads each step
counter, a host tensor there (``optimizer_counter_reads``); on a GPU the counters are device
tensors and the kernel reads them on the device.

Attach it to a short run (``dpot fit ... --trainer.callbacks+=lightning_dpot.callbacks.
StepProfile``) to check a method before a long run on a GPU; the summary is printed at the end
of the fit and kept in ``StepProfile.summary``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch.profiler import ProfilerActivity, profile

from lightning_dpot.callbacks.batch_end import AfterBatch, put_last
from lightning_dpot.checks import check_nonnegative_int, check_positive_int

__all__ = ["HOST_WAITS", "StepProfile", "count_events"]

#: Operations after which the host waits for the device (module docstring).
HOST_WAITS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::lift_fresh"})
_OPTIMIZER_KERNELS = ("aten::_fused_adam", "aten::_fused_adamw")


def _callers(event: Any, depth: int = 3) -> tuple[str, ...]:
    """The names of the operations (or Python frames) that called ``event``, innermost first."""
    chain, parent = [], event.cpu_parent
    while parent is not None and len(chain) < depth:
        chain.append(parent.name)
        parent = parent.cpu_parent
    return tuple(chain)


def _is_nested(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def count_events(events: Any) -> tuple[int, Counter[str], int]:
    """Of a profile's ``events``: the ``aten`` operations dispatched from Python or autograd
    (nested calls not counted again), the host waits by ``"op <- caller <- ..."`` and the fused
    optimizer's counter reads (module docstring)."""
    ops, waits, optimizer_reads = 0, Counter[str](), 0
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        if not _is_nested(event):
            ops += 1
        if event.name in HOST_WAITS:
            callers = _callers(event)
            if any(name.startswith(_OPTIMIZER_KERNELS) for name in callers):
                optimizer_reads += 1
            else:
                waits[" <- ".join((event.name, *callers))] += 1
    return ops, waits, optimizer_reads


class StepProfile(L.Callback):
    """Profile ``steps`` training steps after ``skip`` warm-up steps (module docstring).

    Args:
        steps: training steps to record (each profiled on its own).
        skip: steps to let pass first (the first steps allocate and initialize state).

    After the window, ``summary`` holds ``steps``, ``ops_per_step``, ``host_waits_per_step``,
    ``host_waits`` (``{"op <- caller <- ...": count}`` over the window) and
    ``optimizer_counter_reads``.
    """

    def __init__(self, steps: int = 3, skip: int = 2) -> None:
        self.steps = check_positive_int("steps", steps)
        self.skip = check_nonnegative_int("skip", skip)
        self.summary: dict[str, Any] | None = None
        self._profile: profile | None = None
        self._seen = 0
        self._recorded = 0
        self._ops = 0
        self._waits: Counter[str] = Counter()
        self._optimizer_reads = 0
        self._close = AfterBatch(self._close_step)

    def _recording(self) -> bool:
        return self.skip <= self._seen < self.skip + self.steps

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Open the window before every other callback's batch start and close it after every
        other callback's batch end: this callback goes first, its closing one last."""
        trainer.callbacks = [self, *(c for c in trainer.callbacks if c is not self)]
        put_last(trainer, self._close)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._recording():
            self._profile = profile(activities=[ProfilerActivity.CPU])
            self._profile.__enter__()

    def _close_step(self, *args: Any) -> None:
        """End of a training batch, after every callback's ``on_train_batch_end``."""
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            self._count(self._profile.events())
            self._profile = None
            self._recorded += 1
        self._seen += 1
        if self._seen == self.skip + self.steps and self.summary is None:
            self.summary = self._summarize()

    def _count(self, events: Any) -> None:
        ops, waits, optimizer_reads = count_events(events)
        self._ops += ops
        self._waits.update(waits)
        self._optimizer_reads += optimizer_reads

    def _summarize(self) -> dict[str, Any]:
        steps = max(1, self._recorded)
        return {
            "steps": self._recorded,
            "ops_per_step": self._ops / steps,
            "host_waits_per_step": sum(self._waits.values()) / steps,
            "host_waits": dict(self._waits.most_common()),
            "optimizer_counter_reads": self._optimizer_reads,
        }

    def on_exception(self, trainer: L.Trainer, *args: Any) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._profile is not None:  # the fit ended inside the window
            self._profile.__exit__(None, None, None)
            self._profile = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()
        if self.summary is None and self._recorded:
            self.summary = self._summarize()
        if self.summary is not None:
            rank_zero_info(
                f"StepProfile over {self.summary['steps']} steps: "
                f"{self.summary['ops_per_step']:.0f} operations and "
                f"{self.summary['host_waits_per_step']:g} host waits per step"
            )
