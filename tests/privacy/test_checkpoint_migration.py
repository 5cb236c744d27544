"""Checkpoints written by lightning_dpot 0.3.0 (tests/checkpoints/, made by that version: one key
per method, accountant state version 2 naming its journal as [path, id]) resume and load through
the one migration table, with every earlier release composed."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data.central import CentralDPDataModule
from lightning_dpot.privacy.accounting.analysis.epsilon import subsampled_gaussian_epsilon
from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.accounting.migration import (
    ACCOUNTANT_STATE_VERSION,
    migrate_accountant_state,
    migrate_module_state,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods"))
from test_dp_merf import _digits_run  # noqa: E402
from test_dp_sinkhorn import TinyImages, tiny_module, tiny_trainer  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec).*")
        yield


def _with_journal_at(name: str, root: Path) -> Path:
    """The shipped checkpoint ``name`` and its journal copied into ``root``, the checkpoint's
    journal path pointed at the copy (as a user moving a run directory would)."""
    root.mkdir(parents=True)
    journal = shutil.copy(SHIPPED / f"{name}.jsonl", root / f"{name}.jsonl")
    checkpoint = torch.load(SHIPPED / f"{name}.ckpt", map_location="cpu", weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("PrivacyAccountant")]
    assert checkpoint["callbacks"][key]["version"] == 2  # the layout this test is about
    checkpoint["callbacks"][key]["journal"][0] = str(journal)
    path = root / f"{name}.ckpt"
    torch.save(checkpoint, path)
    return path


def test_a_dp_sinkhorn_checkpoint_of_0_3_resumes_with_its_releases(tmp_path):
    ckpt = _with_journal_at("dp_sinkhorn_0.3.0", tmp_path / "old")
    module = tiny_module(noise_multiplier=2.0)
    callback = PrivacyAccountantCallback(None, 1e-5)
    trainer = tiny_trainer(tmp_path / "new", [callback], max_steps=5)
    data = CentralDPDataModule(TinyImages(200), sample_rate=0.05, seed=None)
    trainer.fit(module, data, ckpt_path=ckpt)
    assert callback.releases == module.sanitizer.events.total == 5  # 3 restored + 2 new
    assert callback.epsilon() == pytest.approx(subsampled_gaussian_epsilon(2.0, 0.05, 5, 1e-5))
    journal = json.loads((tmp_path / "old" / "dp_sinkhorn_0.3.0.jsonl").read_text().split("\n")[0])
    assert (
        len(ReleaseJournal(tmp_path / "old" / "dp_sinkhorn_0.3.0.jsonl", journal["journal"]).read())
        == 5
    )
    state = callback.state_dict()
    assert state["version"] == ACCOUNTANT_STATE_VERSION and state["journal"]["position"] == 5


def test_a_dp_merf_checkpoint_of_0_3_loads_for_inference_and_resumes(tmp_path):
    ckpt = _with_journal_at("dp_merf_0.3.0", tmp_path / "old")
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    state = migrate_module_state(checkpoint)
    assert state is not None and state["settings"]["num_frequencies"] == 50
    model, _, _ = _digits_run(tmp_path / "new", 4, ckpt_path=str(ckpt), noise_scale=1.0,
                              num_frequencies=50)  # fmt: skip
    assert model.release.events.total == 1  # the release of 0.3.0, not a second one
    assert model.release.noise_scale == 1.0  # σ; the event's multiplier is σ/Δ = 0.5
    report = json.loads((tmp_path / "new" / "privacy_report.json").read_text())
    assert report["releases"] == 1 and report["accountant"] == "analytic"


def test_every_accountant_layout_reads_as_the_current_one():
    v1 = {"version": 1, "accountant": {"history": [[2.0, 0.1, 3]]}, "target_epsilon": 1.0,
          "delta": 1e-5}  # fmt: skip
    state = migrate_accountant_state(v1)
    assert state["version"] == ACCOUNTANT_STATE_VERSION
    assert state["composition"]["accountant"]["history"] == [[2.0, 0.1, 3]]
    assert state["journal"] is None and state["target_epsilon"] == 1.0
    callback = PrivacyAccountantCallback(delta=1e-5)
    callback.load_state_dict(v1)
    assert callback.releases == 3
    with pytest.raises(ValueError, match="newer than"):
        migrate_accountant_state({**v1, "version": ACCOUNTANT_STATE_VERSION + 1})
