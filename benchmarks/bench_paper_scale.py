"""Seconds per training step of shipped configs, run as ``dpot fit`` runs them.

Each config is parsed by the project's CLI (``run_lightning``: same classes, same defaults), the
Trainer gets ``max_steps`` = warm-up + timed steps, no logger and no checkpoints, and a callback
times every optimizer step (``torch.cuda.synchronize`` around it on a GPU). The release is drawn
and cached by the data module exactly as in a real run. Reported per config: the median and
min/max step time after the warm-up steps, the first step (KeOps compile, allocator warm-up),
the last Sinkhorn solve (backend, sweeps, converged) and the peak GPU memory.

    python benchmarks/bench_paper_scale.py --accelerator gpu --steps 10 \\
        --out docs/results/bench_paper_scale_h100.json \\
        configs/entropic_wgan/fig1_half_circle_gaussian_entropic.yaml \\
        configs/entropic_wgan/fig1_half_circle_laplace_entropic.yaml

Further ``--section.key value`` arguments are passed to the CLI as config overrides (e.g.
``--model.init_args.scaling 0.99``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import lightning as L
import torch

from lightning_dpot.training import run_lightning


class StepTimer(L.Callback):
    """Wall time of each training batch (forward, loss, backward, optimizer step)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        self.seconds.append(time.perf_counter() - self._start)


def time_config(
    config: str, steps: int, warmup: int, accelerator: str, root: str, extra: list[str]
) -> dict:
    cli = run_lightning(
        [
            "--config", config,
            "--trainer.max_steps", str(warmup + steps),
            "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false",
            "--trainer.accelerator", accelerator,
            "--trainer.devices", "1",
            "--trainer.default_root_dir", root,
            *extra,
        ],
        run=False,
    )  # fmt: skip
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    if accelerator == "gpu":
        torch.cuda.reset_peak_memory_stats()
    cli.trainer.fit(cli.model, cli.datamodule)
    timed = timer.seconds[warmup:]
    info = getattr(cli.model, "last_sinkhorn", None)
    return {
        "config": config,
        "device": torch.cuda.get_device_name() if accelerator == "gpu" else "cpu",
        "torch_threads": torch.get_num_threads(),
        "release_size": len(getattr(cli.datamodule, "release", ())) or None,
        "steps_timed": len(timed),
        "seconds_first": timer.seconds[0],
        "seconds_median": statistics.median(timed),
        "seconds_min": min(timed),
        "seconds_max": max(timed),
        "gpu_peak_allocated_mb": (
            torch.cuda.max_memory_allocated() / 2**20 if accelerator == "gpu" else None
        ),
        "sinkhorn": info.as_dict() if info is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--out", help="write the results here (JSON)")
    args, extra = parser.parse_known_args()
    rows = []
    for config in args.configs:
        with tempfile.TemporaryDirectory() as root:
            row = time_config(config, args.steps, args.warmup, args.accelerator, root, extra)
        row["overrides"] = extra
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
