"""Child process of tests/test_fault_tolerance.py: a tiny private run that prints every step.

    python tests/fault_tolerance_child.py ROOT MAX_STEPS [--resume] [--every N] [--flow-only]

``--resume`` continues each method from its ``last.ckpt`` where there is one; ``--every N``
checkpoints every N steps instead of every step; ``--flow-only`` runs DPSWFlowR alone.

Runs DPSWFlowR (per-step releases, PrivacyAccountantCallback) and then the entropic WGAN on a
cached LDP release, checkpointing atomically under ROOT/<method>/ckpt. Public seeds (research
mode) so that an uninterrupted and a resumed run can be compared bit for bit. Prints
``STEP <method> <global_step>`` after each step (an output of that step's release) and writes
ROOT/<method>/result.pt.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data import (
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
)
from lightning_dpot.data.release import tensor_sha256
from lightning_dpot.methods import DPSWFlowR, EntropicWGAN
from lightning_dpot.nn import MLPGenerator
from lightning_dpot.plugins import AtomicCheckpointIO


class _PrintStep(Callback):
    def __init__(self, name: str) -> None:
        self.name = name

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        print(f"STEP {self.name} {trainer.global_step}", flush=True)


def _fit(name, root: Path, max_steps: int, resume: bool, every: int, model, datamodule, callbacks):
    ckpt = root / name / "ckpt"
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root / name,
        plugins=[AtomicCheckpointIO()],
        callbacks=[
            *callbacks,
            _PrintStep(name),
            ModelCheckpoint(ckpt, save_last=True, save_top_k=0, every_n_train_steps=every),
        ],
    )
    last = ckpt / "last.ckpt"
    trainer.fit(model, datamodule, ckpt_path=str(last) if resume and last.exists() else None)
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--flow-only", action="store_true")
    args = parser.parse_args()
    root, max_steps, resume, every = args.root, args.max_steps, args.resume, args.every
    torch.set_num_threads(1)

    accountant = PrivacyAccountantCallback(target_epsilon=50.0, delta=1e-5, also_report=())
    flow = DPSWFlowR(num_particles=48, num_directions=12, noise_scale=10.0, noise_seed=3)
    latents = PrivateLatentDataModule(
        GaussianMixture2D(n=300, n_test=50), normalize="ball", batch_size=90, seed=4,
        steps_per_epoch=5,
    )  # fmt: skip
    trainer = _fit("dpswflow_r", root, max_steps, resume, every, flow, latents, [accountant])
    torch.save(
        {
            "particles": flow.particles.clone(),
            "history": accountant.accountant.history,
            "epsilon": accountant.epsilon(),
            "releases": accountant.releases,
            "global_step": trainer.global_step,
        },
        root / "dpswflow_r" / "result.pt",
    )
    if args.flow_only:
        return

    L.seed_everything(0)
    release = PrivatizedDataModule(
        HalfCircle(n=400, n_test=20), "gaussian", epsilon=5.0, delta=1e-4, batch_size=50,
        cache_dir=str(root / "cache"),
    )  # fmt: skip
    gan = EntropicWGAN(MLPGenerator(2, (2,), (16,)))
    trainer = _fit("entropic_wgan", root, max_steps, resume, every, gan, release, [])
    torch.save(
        {
            "release_sha256": tensor_sha256(release.release),
            "global_step": trainer.global_step,
        },
        root / "entropic_wgan" / "result.pt",
    )


if __name__ == "__main__":
    main()
