"""RunArtifacts under 2-process CPU DDP (``ddp_spawn``): a particle flow's generator.pt holds the
particles of both ranks (gathered by every rank, written by rank 0), with the run's privacy
report embedded, and the accountant draws epsilon.png; with no logger nothing else is needed."""

from __future__ import annotations

import json
import warnings

import lightning as L
import pytest
import torch

from lightning_dpot.callbacks import PrivacyAccountantCallback, RunArtifacts, RunReport
from lightning_dpot.data import GaussianMixture2D, PrivateLatentDataModule
from lightning_dpot.export import read_embedded_report
from lightning_dpot.methods import DPSWFlow
from lightning_dpot.privacy.accounting.report import shareable_report


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*torch.jit")
        yield


def test_a_flow_under_ddp_exports_the_particles_of_every_rank(tmp_path):
    model = DPSWFlow(num_particles=32, num_directions=10, directions_per_step=5, noise_scale=1.0)
    data = PrivateLatentDataModule(
        GaussianMixture2D(n=240, n_test=40), normalize="ball", steps_per_epoch=5
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[PrivacyAccountantCallback(also_report=()), RunReport(), RunArtifacts()],
    )
    trainer.fit(model, data)

    exported = torch.jit.load(str(tmp_path / "generator.pt"))
    assert exported.max_samples == 32  # both shards of 16
    rank_zero = torch.load(tmp_path / "particles.pt", weights_only=True)  # the flow's own file
    assert rank_zero.shape == (16, 2) and torch.equal(exported.particles[:16], rank_zero)
    assert not torch.equal(exported.particles[16:], rank_zero)
    report = json.loads((tmp_path / "report.json").read_text())
    embedded = read_embedded_report(tmp_path / "generator.pt")
    assert embedded["privacy"] == shareable_report(report["privacy"])
    assert report["privacy"]["releases"] == embedded["privacy"]["releases"] == 1
    # What leaves the machine carries no ledger, no journal and no local path.
    assert report["privacy"]["journal"] and "journal" not in embedded["privacy"]
    assert "ledger" not in embedded["privacy"]
    assert str(tmp_path) not in json.dumps(embedded) and str(tmp_path) in json.dumps(report)
    assert (tmp_path / "epsilon.png").read_bytes()[:4] == b"\x89PNG"
