"""PrivacyAccountantCallback with a real (tiny, CPU) Trainer: stops before the target is exceeded,
resumes exactly from checkpoints, reports, and refuses what it cannot account."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset

from lightning_dpot.callbacks.privacy_accountant import (
    PrivacyAccountantCallback,
    PrivacyBudgetExceededError,
)
from lightning_dpot.data.poisson import poisson_dataloader
from lightning_dpot.privacy.accountants import (
    largest_count_within,
    sgm_epsilon,
    sgm_max_steps,
    swor_gaussian_epsilon,
)

SIGMA, Q, DELTA, TARGET = 2.0, 0.1, 1e-5, 1.5  # 10 Poisson steps per epoch over 100 records


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        yield


class ToyDPModule(L.LightningModule):
    """One scalar weight; each step 'releases' an SGM step of (noise_multiplier, sample_rate)."""

    def __init__(
        self,
        noise_multiplier: float | None = SIGMA,
        sample_rate: float = Q,
        crash_at_step: int | None = None,
        num_records: int = 100,
    ) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.noise_multiplier = noise_multiplier
        self.sample_rate = sample_rate
        self.crash_at_step = crash_at_step
        self.num_records = num_records
        self.seen: list[list[int]] = []

    def dp_step(self) -> dict | None:
        if self.noise_multiplier is None:
            return None
        return {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate}

    def training_step(self, batch, batch_idx):
        (x,) = batch
        if self.crash_at_step is not None and self.global_step == self.crash_at_step:
            raise RuntimeError("simulated crash")
        self.seen.append(x[:, 0].long().tolist())
        return (self.weight - x.sum()).pow(2).sum()  # empty batch: still a step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        data = TensorDataset(torch.arange(self.num_records).float().unsqueeze(1))
        return poisson_dataloader(data, self.sample_rate, seed=0)


class NoDPStep(ToyDPModule):
    dp_step = None


def make_trainer(root: Path, callbacks: list, **kwargs) -> L.Trainer:
    options = {
        "default_root_dir": root,
        "max_epochs": 1000,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 1,
    }
    options.update(kwargs)
    return L.Trainer(callbacks=callbacks, **options)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """An uninterrupted run to the budget, with a CSV logger, and its final checkpoint."""
    root = tmp_path_factory.mktemp("finished")
    callback = PrivacyAccountantCallback(TARGET, DELTA)
    module = ToyDPModule()
    trainer = make_trainer(root, [callback], logger=CSVLogger(root))
    trainer.fit(module)
    checkpoint = root / "final.ckpt"
    trainer.save_checkpoint(checkpoint)
    return trainer, module, callback, checkpoint


def test_training_stops_before_the_step_that_would_exceed_the_target(finished_run):
    trainer, module, callback, _ = finished_run
    expected = sgm_max_steps(SIGMA, Q, TARGET, DELTA)
    assert expected == 31  # mid-epoch: the stop is not an epoch boundary
    assert trainer.global_step == callback.accountant.steps == len(module.seen) == expected
    assert callback.epsilon() <= TARGET < callback.accountant.epsilon_if(DELTA, SIGMA, Q)
    assert callback.epsilon() == pytest.approx(sgm_epsilon(SIGMA, Q, expected, DELTA))
    assert callback.stopped_by_budget
    assert trainer.progress_bar_metrics["epsilon"] == pytest.approx(callback.epsilon())
    assert trainer.logged_metrics["privacy/steps"] == expected


def test_empty_poisson_batches_are_steps_and_are_accounted(tmp_path):
    callback = PrivacyAccountantCallback(TARGET, DELTA)
    module = ToyDPModule(num_records=5)  # P(empty batch) = 0.9^5 = 0.59
    make_trainer(tmp_path, [callback]).fit(module)
    assert sum(len(batch) == 0 for batch in module.seen) > 5
    assert callback.accountant.steps == len(module.seen) == sgm_max_steps(SIGMA, Q, TARGET, DELTA)


def test_report_is_written_and_lists_every_accountant(finished_run):
    trainer, _, callback, _ = finished_run
    report = json.loads((Path(trainer.log_dir) / "privacy_report.json").read_text())
    assert report == json.loads(json.dumps(callback.report()))
    assert report["mechanism"] == "poisson_subsampled_gaussian"
    assert report["adjacency"] == "add_or_remove_one"
    assert (report["noise_multiplier"], report["sample_rate"]) == (SIGMA, Q)
    assert report["steps"] == 31 and report["delta"] == DELTA
    assert report["accountant"] == "rdp" and report["epsilon"] == report["epsilon_rdp"]
    assert report["epsilon_pld"] == pytest.approx(sgm_epsilon(SIGMA, Q, 31, DELTA, "pld"))
    assert report["epsilon_pld"] < report["epsilon_rdp"] <= TARGET
    assert report["stopped_by_privacy_budget"] is True
    assert callback.report_section(trainer, None) == callback.report()


def test_resumed_run_ends_at_the_same_step_epsilon_and_batches(tmp_path, finished_run):
    _, uninterrupted, reference, _ = finished_run
    checkpoints = tmp_path / "ckpt"

    def checkpointing() -> ModelCheckpoint:
        return ModelCheckpoint(checkpoints, save_last=True, save_top_k=0, every_n_train_steps=1)

    crashed = ToyDPModule(crash_at_step=13)  # killed mid-epoch (10 steps per epoch)
    trainer = make_trainer(
        tmp_path,
        [PrivacyAccountantCallback(TARGET, DELTA), checkpointing()],
        enable_checkpointing=True,
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.fit(crashed)
    assert len(crashed.seen) == 13

    callback = PrivacyAccountantCallback(TARGET, DELTA)
    resumed = ToyDPModule()
    trainer = make_trainer(tmp_path, [callback, checkpointing()], enable_checkpointing=True)
    trainer.fit(resumed, ckpt_path=checkpoints / "last.ckpt")
    assert trainer.global_step == reference.accountant.steps == 31
    assert callback.accountant.history == reference.accountant.history
    assert callback.epsilon() == reference.epsilon()
    # the Poisson masks continue where the killed run stopped: no replay, no skip
    assert crashed.seen + resumed.seen == uninterrupted.seen


def test_target_may_change_on_resume_and_counts_the_restored_steps(tmp_path, finished_run):
    _, _, _, checkpoint = finished_run

    same = PrivacyAccountantCallback(TARGET, DELTA)
    module = ToyDPModule()
    trainer = make_trainer(tmp_path, [same])
    trainer.fit(module, ckpt_path=checkpoint)  # budget exhausted: ends without a step
    assert trainer.global_step == 31 and module.seen == [] and same.stopped_by_budget

    raised = PrivacyAccountantCallback(2.0, DELTA)
    trainer = make_trainer(tmp_path, [raised])
    trainer.fit(ToyDPModule(), ckpt_path=checkpoint)
    assert trainer.global_step == raised.accountant.steps == sgm_max_steps(SIGMA, Q, 2.0, DELTA)

    lowered = PrivacyAccountantCallback(1.0, DELTA)
    with pytest.raises(ValueError, match=r"target_epsilon=1\.0 is already exceeded"):
        make_trainer(tmp_path, [lowered]).fit(ToyDPModule(), ckpt_path=checkpoint)


def test_pld_driven_run_stops_at_the_pld_budget(tmp_path):
    callback = PrivacyAccountantCallback(
        1.4, DELTA, accountant="pld", also_report=["rdp"], log_every_n_steps=10
    )
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(ToyDPModule())
    assert trainer.global_step == sgm_max_steps(SIGMA, Q, 1.4, DELTA, "pld")
    report = callback.report()
    assert report["epsilon"] == report["epsilon_pld"] <= 1.4 < report["epsilon_rdp"]


def test_safety_net_raises_before_an_overshooting_step_when_lightning_cannot_stop(tmp_path):
    callback = PrivacyAccountantCallback(TARGET, DELTA)
    module = ToyDPModule()
    trainer = make_trainer(tmp_path, [callback], min_steps=40)
    with pytest.warns(UserWarning, match="min_steps"), pytest.raises(PrivacyBudgetExceededError):
        trainer.fit(module)
    assert callback.accountant.steps == len(module.seen) == 31
    assert callback.epsilon() <= TARGET


def test_state_dict_is_plain_json():
    callback = PrivacyAccountantCallback(TARGET, DELTA)
    callback.accountant.step(SIGMA, Q, 7)
    state = json.loads(json.dumps(callback.state_dict()))
    other = PrivacyAccountantCallback(3.0, DELTA)
    other.load_state_dict(state)
    assert other.accountant.history == [(SIGMA, Q, 7)]
    assert other.remaining_steps(SIGMA, Q) == sgm_max_steps(SIGMA, Q, 3.0, DELTA) - 7


@pytest.mark.parametrize(
    ("module", "kwargs", "error", "match"),
    [
        (NoDPStep(), {}, TypeError, "has no dp_step"),
        (ToyDPModule(noise_multiplier=None), {}, ValueError, "not private"),
        (ToyDPModule(noise_multiplier=-1.0), {}, ValueError, r"noise_multiplier'\] must be"),
        (ToyDPModule(noise_multiplier=0.3), {}, ValueError, "cannot be met even by one step"),
        (ToyDPModule(), {"accumulate_grad_batches": 2}, ValueError, "accumulate_grad_batches"),
    ],
)
def test_unaccountable_setups_are_refused_before_any_step(tmp_path, module, kwargs, error, match):
    trainer = make_trainer(tmp_path, [PrivacyAccountantCallback(TARGET, DELTA)], **kwargs)
    with pytest.raises(error, match=match):
        trainer.fit(module)
    assert module.seen == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_epsilon": 0.0}, r"target_epsilon must be a finite number > 0, got 0\.0"),
        ({"delta": 1.0}, r"delta must lie in the open interval \(0, 1\), got 1\.0"),
        ({"accountant": "moments"}, r"accountant must be one of \['rdp', 'pld'\]"),
        ({"also_report": ["prv"]}, r"also_report entries must be in \['rdp', 'pld'\]"),
        ({"log_every_n_steps": 0}, "log_every_n_steps must be an integer >= 1"),
    ],
)
def test_bad_callback_arguments_are_refused(kwargs, match):
    arguments = {"target_epsilon": TARGET, "delta": DELTA}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        PrivacyAccountantCallback(**arguments)


# -- fixed-size sampling without replacement (replace-one) -------------------------------------

N_SWOR, B_SWOR = 100, 10


class SworToyModule(ToyDPModule):
    """Declares fixed-size batches of B_SWOR of N_SWOR records drawn without replacement."""

    def __init__(self, sample_rate: float = B_SWOR / N_SWOR, **kwargs) -> None:
        super().__init__(sample_rate=sample_rate, **kwargs)

    def dp_step(self) -> dict | None:
        release = super().dp_step()
        release.update(sampling="without_replacement", dataset_size=N_SWOR, batch_size=B_SWOR)
        return release

    def train_dataloader(self):
        data = TensorDataset(torch.arange(self.num_records).float().unsqueeze(1))
        return torch.utils.data.DataLoader(data, batch_size=B_SWOR, shuffle=True)


def test_without_replacement_run_stops_at_the_replace_one_budget_and_resumes(tmp_path):
    callback = PrivacyAccountantCallback(TARGET, DELTA, also_report=("pld",))
    module = SworToyModule()
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(module)
    expected = largest_count_within(
        lambda k: swor_gaussian_epsilon(SIGMA, N_SWOR, B_SWOR, k, DELTA), TARGET
    )
    assert callback.accountant.steps == len(module.seen) == expected > 0
    assert callback.epsilon() == pytest.approx(
        swor_gaussian_epsilon(SIGMA, N_SWOR, B_SWOR, expected, DELTA), rel=1e-9
    )
    report = callback.report()
    assert report["sampling"] == "without_replacement" and report["adjacency"] == "replace_one"
    assert report["dataset_size"] == N_SWOR and report["batch_size"] == B_SWOR
    assert report["epsilon_pld"] is None
    state = json.loads(json.dumps(callback.state_dict()))
    assert state["accountant"]["sampling"] == "without_replacement"
    # a restored replace-one history cannot be continued by a Poisson (add/remove) module
    other = PrivacyAccountantCallback(2 * TARGET, DELTA)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot be composed"):
        make_trainer(tmp_path / "poisson", [other]).fit(ToyDPModule())


@pytest.mark.parametrize(
    ("module", "kwargs", "match"),
    [
        (SworToyModule(), {"accountant": "pld"}, "not supported by the 'pld' accountant"),
        (SworToyModule(sample_rate=0.2), {}, r"must equal batch_size/dataset_size"),
    ],
)
def test_unaccountable_without_replacement_setups_are_refused(tmp_path, module, kwargs, match):
    callback = PrivacyAccountantCallback(TARGET, DELTA, **kwargs)
    with pytest.raises(ValueError, match=match):
        make_trainer(tmp_path, [callback]).fit(module)
    assert module.seen == []
