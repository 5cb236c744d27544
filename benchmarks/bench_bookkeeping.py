"""Cost of the privacy bookkeeping per training step, and whether it grows with the step count.

Two real Lightning fits on the CPU (one thread), each with the ``lightning_dpot.callbacks.
PrivacyAccountantCallback`` that ``dpot fit`` attaches and its release journal:

* ``toy``: a module whose training step does nothing but call a toy release object (one
  Poisson-subsampled Gaussian event per step), so the step is bookkeeping; ``--releases``
  (default 100,000) steps under a target ε that the run does not reach (the budget's
  look-ahead is checked every step). Timed per step: the release call (its event and journal
  line) plus the accountant's hooks (``on_train_batch_start``, ``on_before_optimizer_step``,
  ``on_train_batch_end``: draining, composing, the budget decision, ε logged every
  ``trainer.log_every_n_steps`` and the journal's group commits).
* ``dp_sinkhorn``: private DP-Sinkhorn (Cao et al. 2021) on the 8×8 digits with a small
  conditional DCGAN, ``--steps`` (default 3,000) Poisson steps; timed per step: the whole
  training step (start of one batch to the start of the next) and the accountant's hooks.

Reported per fit: medians (ms) of the first and last tenth of the steps and their ratio, the
95th percentile, the medians of every tenth, and the journal's ``fsync`` calls; the toy fit also
times a fixed piece of Python work in every step (``control``), so drift of the machine itself
over the run can be told from growth of the bookkeeping.

    python benchmarks/bench_bookkeeping.py --fit toy --releases 100000
    python benchmarks/bench_bookkeeping.py --fit dp_sinkhorn --steps 3000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")


def _timed_hooks(callback: Any, spent: list[float]) -> None:
    """Add the time of each accountant hook to ``spent[-1]`` (one entry per step)."""
    for name in HOOKS:
        hook = getattr(callback, name)

        def timed(*args: Any, _hook: Any = hook, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _hook(*args, **kwargs)
            finally:
                spent[-1] += time.perf_counter() - start

        setattr(callback, name, timed)


def _summary(times: list[float]) -> dict[str, float]:
    tenth = max(1, len(times) // 10)
    first, last = statistics.median(times[:tenth]), statistics.median(times[-tenth:])
    ordered = sorted(times)
    return {
        "steps": len(times),
        "median_ms": 1e3 * statistics.median(times),
        "first_tenth_median_ms": 1e3 * first,
        "last_tenth_median_ms": 1e3 * last,
        "last_over_first": last / first,
        "p95_ms": 1e3 * ordered[int(0.95 * (len(ordered) - 1))],
        "tenth_medians_ms": [
            1e3 * statistics.median(times[i * tenth : (i + 1) * tenth]) for i in range(10)
        ],
    }


def _control_work() -> None:
    """A fixed piece of Python work of the bookkeeping's size, timed in the same steps: how
    much the machine itself drifts over the run (a VM's neighbours, the CPU clock)."""
    for _ in range(40):
        json.dumps({"event": "SubsampledGaussianStep", "noise_multiplier": 3.0, "q": 1e-3})


def _count_fsyncs() -> list[int]:
    import lightning_dpot.privacy.accounting.journal as journal

    calls: list[int] = []
    real = journal.os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    journal.os.fsync = counted  # type: ignore[attr-defined]
    return calls


def toy_fit(releases: int, root: Path) -> dict[str, Any]:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_dpot.callbacks import PrivacyAccountantCallback
    from lightning_dpot.privacy.contract import ReleasesPrivateData
    from lightning_dpot.privacy.events import EventLog, SubsampledGaussianStep

    class ToyRelease:
        is_private, delta = True, 1e-5

        def __init__(self) -> None:
            self.events = EventLog()
            self.event = SubsampledGaussianStep(3.0, 1e-3)

        def facts(self) -> dict:
            return {"releases": self.events.total}

        def __call__(self) -> None:
            self.events.emit(self.event)

    spent: list[float] = [0.0]
    control: list[float] = []

    class Toy(ReleasesPrivateData, L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.release = ToyRelease()

        def privacy_releases(self) -> list[ToyRelease]:
            return [self.release]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            start = time.perf_counter()
            _control_work()
            control.append(time.perf_counter() - start)
            start = time.perf_counter()
            self.release()
            spent[-1] += time.perf_counter() - start
            return self.weight.sum()

        def on_train_batch_end(self, *args: Any) -> None:
            spent.append(0.0)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(torch.zeros(releases, 1)), batch_size=1)

    callback = PrivacyAccountantCallback(target_epsilon=20.0, delta=1e-5)
    _timed_hooks(callback, spent)
    fsyncs = _count_fsyncs()
    trainer = _trainer(root, callback, max_steps=releases)
    trainer.fit(Toy())
    times = spent[:-1]  # the module's hook opens the next step's entry; drop the open last one
    assert callback.releases == releases and not callback.stopped_by_budget
    kept, fixed = _summary(times), _summary(control)
    drift = fixed["last_over_first"]
    return {"fit": "toy", "epsilon": callback.epsilon(), "fsyncs": len(fsyncs),
            "bookkeeping": kept, "control": fixed,
            "last_over_first_over_control": kept["last_over_first"] / drift}  # fmt: skip


def dp_sinkhorn_fit(steps: int, root: Path) -> dict[str, Any]:
    import lightning as L

    from lightning_dpot.callbacks import PrivacyAccountantCallback
    from lightning_dpot.data import CentralDPDataModule, Digits
    from lightning_dpot.methods import DPSinkhorn
    from lightning_dpot.nn import ConditionalDCGANGenerator

    hooks: list[float] = [0.0]
    starts: list[float] = []

    control: list[float] = []

    class StepClock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            start = time.perf_counter()
            _control_work()
            control.append(time.perf_counter() - start)
            starts.append(time.perf_counter())
            hooks.append(0.0)

    generator = ConditionalDCGANGenerator(10, latent_dim=8, image_size=8, hidden_channels=(8, 8, 8))
    module = DPSinkhorn(generator, noise_multiplier=1.5, num_cross=10, lr=1e-3, delta=1e-5)
    data = CentralDPDataModule(Digits(), expected_batch_size=10, seed=None)
    callback = PrivacyAccountantCallback(delta=1e-5)
    _timed_hooks(callback, hooks)
    fsyncs = _count_fsyncs()
    trainer = _trainer(root, callback, max_steps=steps, extra=[StepClock()])
    trainer.fit(module, data)
    # start to start, less the control work timed inside
    step_times = [b - a - c for a, b, c in zip(starts, starts[1:], control[1:], strict=False)]
    step, fixed = _summary(step_times), _summary(control)
    return {"fit": "dp_sinkhorn", "releases": callback.releases, "epsilon": callback.epsilon(),
            "fsyncs": len(fsyncs), "step": step, "accountant_hooks": _summary(hooks[1:-1]),
            "control": fixed,
            "step_last_over_first_over_control": step["last_over_first"]
            / fixed["last_over_first"]}  # fmt: skip


def _trainer(root: Path, callback: Any, max_steps: int, extra: list | None = None) -> Any:
    import lightning as L

    return L.Trainer(
        max_steps=max_steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, callbacks=[*(extra or []), callback],
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", choices=["toy", "dp_sinkhorn"], default="toy")
    parser.add_argument("--releases", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=3_000)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as directory:
        os.environ.setdefault("DPOT_LEDGER_DIR", str(Path(directory) / "ledger"))
        start = time.perf_counter()
        if args.fit == "toy":
            result = toy_fit(args.releases, Path(directory))
        else:
            result = dp_sinkhorn_fit(args.steps, Path(directory))
        result["wall_s"] = time.perf_counter() - start
    result["load_average"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
