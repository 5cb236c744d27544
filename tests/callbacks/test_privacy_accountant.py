"""PrivacyAccountantCallback with a real (tiny, CPU) Trainer: composes exactly the events the
module's release objects emitted, stops before the target is exceeded, resumes exactly from
checkpoints, reports, and refuses what it cannot account."""

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
from lightning_dpot.privacy.accounting.analysis.epsilon import subsampled_gaussian_epsilon
from lightning_dpot.privacy.accounting.analysis.schemes import WITHOUT_REPLACEMENT
from lightning_dpot.privacy.accounting.calibration import largest_count_within, max_steps
from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.privacy.events import EventLog, SubsampledGaussianStep
from lightning_dpot.privacy.guards import planned_releases

SIGMA, Q, DELTA, TARGET = 2.0, 0.1, 1e-5, 1.5  # 10 Poisson steps per epoch over 100 records


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        yield


class ToyRelease:
    """A release object (lightning_dpot.privacy.contract): each call emits one SGM step."""

    def __init__(self, step: dict | None, delta: float | None = None) -> None:
        self.step = step
        self.events = EventLog()
        self.is_private = step is not None
        self.delta = delta

    @property
    def event(self) -> SubsampledGaussianStep | None:
        return None if self.step is None else SubsampledGaussianStep(**self.step)

    def facts(self) -> dict:
        return {"releases": self.events.total}

    def __call__(self) -> None:
        if self.event is not None:
            self.events.emit(self.event)


class ToyDPModule(ReleasesPrivateData, L.LightningModule):
    """One scalar weight; each batch 'releases' an SGM step of (noise_multiplier, sample_rate)."""

    def __init__(
        self,
        noise_multiplier: float | None = SIGMA,
        sample_rate: float = Q,
        crash_at_step: int | None = None,
        num_records: int = 100,
    ) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.sample_rate = sample_rate
        self.crash_at_step = crash_at_step
        self.num_records = num_records
        self.seen: list[list[int]] = []
        step = {"noise_multiplier": noise_multiplier, "sample_rate": sample_rate}
        self.release = ToyRelease(None if noise_multiplier is None else self.declare(step))

    def declare(self, step: dict) -> dict:
        return step

    def privacy_releases(self) -> list[ToyRelease]:
        return [self.release]

    def training_step(self, batch, batch_idx):
        (x,) = batch
        if self.crash_at_step is not None and self.global_step == self.crash_at_step:
            raise RuntimeError("simulated crash")
        self.release()
        self.seen.append(x[:, 0].long().tolist())
        return (self.weight - x.sum()).pow(2).sum()  # empty batch: still a step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        data = TensorDataset(torch.arange(self.num_records).float().unsqueeze(1))
        return poisson_dataloader(data, self.sample_rate, seed=0)

    def on_save_checkpoint(self, checkpoint):
        checkpoint["toy_release"] = self.release.events.state_dict()

    def on_load_checkpoint(self, checkpoint):
        self.release.events.load_state_dict(checkpoint["toy_release"])


class NotPrivate(L.LightningModule):
    """A trainable module outside the contract (no release objects)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch)
        return self.weight.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)


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
    expected = max_steps(SIGMA, Q, TARGET, DELTA)
    assert expected == 31  # mid-epoch: the stop is not an epoch boundary
    assert trainer.global_step == callback.accountant.steps == len(module.seen) == expected
    assert callback.epsilon() <= TARGET < callback.accountant.epsilon_if(DELTA, SIGMA, Q)
    assert callback.epsilon() == pytest.approx(
        subsampled_gaussian_epsilon(SIGMA, Q, expected, DELTA)
    )
    assert callback.stopped_by_budget
    assert trainer.progress_bar_metrics["epsilon"] == pytest.approx(callback.epsilon())
    assert trainer.progress_bar_metrics["delta"] == pytest.approx(DELTA)
    assert trainer.logged_metrics["privacy/releases"] == expected


def test_empty_poisson_batches_are_steps_and_are_accounted(tmp_path):
    callback = PrivacyAccountantCallback(TARGET, DELTA)
    module = ToyDPModule(num_records=5)  # P(empty batch) = 0.9^5 = 0.59
    make_trainer(tmp_path, [callback]).fit(module)
    assert sum(len(batch) == 0 for batch in module.seen) > 5
    assert callback.accountant.steps == len(module.seen) == max_steps(SIGMA, Q, TARGET, DELTA)


def test_report_is_written_and_lists_every_accountant(finished_run):
    trainer, _, callback, _ = finished_run
    report = json.loads((Path(trainer.log_dir) / "privacy_report.json").read_text())
    assert report == json.loads(json.dumps(callback.report()))
    assert report["mechanism"] == "poisson_subsampled_gaussian"
    assert report["adjacency"] == "add_or_remove_one"
    assert (report["noise_multiplier"], report["sample_rate"]) == (SIGMA, Q)
    assert report["releases"] == 31 and report["delta"] == DELTA
    assert report["events"] == {"SubsampledGaussianStep": 31}
    assert report["assumptions"] and "dataset size N is public" in report["assumptions"][0]
    step = {"event": "SubsampledGaussianStep", "noise_multiplier": SIGMA, "sample_rate": Q,
            "sampling": "poisson", "dataset_size": None, "batch_size": None}  # fmt: skip
    assert report["module"]["releases"] == [{"releases": 31, "emitted": [[step, 31]]}]
    assert report["accountant"] == "rdp" and report["epsilon"] == report["epsilon_rdp"]
    assert report["epsilon_pld"] == pytest.approx(
        subsampled_gaussian_epsilon(SIGMA, Q, 31, DELTA, "pld")
    )
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
    with pytest.warns(UserWarning, match="target_epsilon changed on resume from 1.5 to 2.0"):
        trainer.fit(ToyDPModule(), ckpt_path=checkpoint)
    assert trainer.global_step == raised.accountant.steps == max_steps(SIGMA, Q, 2.0, DELTA)

    lowered = PrivacyAccountantCallback(1.0, DELTA)
    with pytest.raises(ValueError, match=r"target_epsilon=1\.0 is already exceeded"):
        make_trainer(tmp_path, [lowered]).fit(ToyDPModule(), ckpt_path=checkpoint)


def test_pld_driven_run_stops_at_the_pld_budget(tmp_path):
    callback = PrivacyAccountantCallback(
        1.4, DELTA, accountant="pld", also_report=["rdp"], log_every_n_steps=10
    )
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(ToyDPModule())
    assert trainer.global_step == max_steps(SIGMA, Q, 1.4, DELTA, "pld")
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
    step = SubsampledGaussianStep(SIGMA, Q)
    assert other.remaining_steps(step) == max_steps(SIGMA, Q, 3.0, DELTA) - 7


@pytest.mark.parametrize(
    ("module", "kwargs", "error", "match"),
    [
        (NotPrivate(), {}, TypeError, "does not subclass .*ReleasesPrivateData"),
        (ToyDPModule(noise_multiplier=None), {}, ValueError, "not private"),
        (ToyDPModule(noise_multiplier=-1.0), {}, ValueError, "noise_multiplier must be"),
        (ToyDPModule(noise_multiplier=0.3), {}, ValueError, "cannot be met even by one step"),
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

    def declare(self, step: dict) -> dict:
        return {
            **step,
            "sampling": "without_replacement",
            "dataset_size": N_SWOR,
            "batch_size": B_SWOR,
        }

    def train_dataloader(self):
        data = TensorDataset(torch.arange(self.num_records).float().unsqueeze(1))
        return torch.utils.data.DataLoader(data, batch_size=B_SWOR, shuffle=True)


def test_without_replacement_run_stops_at_the_replace_one_budget_and_resumes(tmp_path):
    callback = PrivacyAccountantCallback(TARGET, DELTA, also_report=("pld",))
    module = SworToyModule()
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(module)
    q = B_SWOR / N_SWOR
    expected = largest_count_within(
        lambda k: subsampled_gaussian_epsilon(SIGMA, q, k, DELTA, sampling=WITHOUT_REPLACEMENT),
        TARGET,
    )
    assert callback.accountant.steps == len(module.seen) == expected > 0
    assert callback.epsilon() == pytest.approx(
        subsampled_gaussian_epsilon(SIGMA, q, expected, DELTA, sampling=WITHOUT_REPLACEMENT),
        rel=1e-9,
    )
    report = callback.report()
    assert report["sampling"] == "without_replacement" and report["adjacency"] == "replace_one"
    assert report["dataset_size"] == N_SWOR and report["batch_size"] == B_SWOR
    assert report["epsilon_pld"] is None
    state = json.loads(json.dumps(callback.state_dict()))
    assert state["composition"]["accountant"]["sampling"] == "without_replacement"
    # a restored replace-one history cannot be continued by Poisson (add/remove) steps
    other = PrivacyAccountantCallback(2 * TARGET, DELTA)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot be composed"):
        other.compose([SubsampledGaussianStep(SIGMA, Q)])


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


# -- the event contract: what is composed is what was emitted -----------------------------------


def test_gradient_accumulation_composes_every_micro_batch_release(tmp_path):
    """With accumulate_grad_batches = 2 each optimizer step spans two batches, each of which
    releases: the accountant composes both and still stops in budget."""
    callback = PrivacyAccountantCallback(TARGET, DELTA)
    module = ToyDPModule()
    trainer = make_trainer(tmp_path, [callback], accumulate_grad_batches=2)
    trainer.fit(module)
    releases = len(module.seen)
    assert callback.releases == callback.accountant.steps == releases == module.releases_emitted()
    assert releases == 2 * trainer.global_step
    assert callback.epsilon() == pytest.approx(
        subsampled_gaussian_epsilon(SIGMA, Q, releases, DELTA)
    )
    assert callback.epsilon() <= TARGET


def test_a_release_the_accountant_did_not_see_is_an_error(tmp_path):
    """If the module's own count and the composed events drift apart, training stops instead
    of reporting a wrong ε."""

    class Leaky(ToyDPModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            if self.global_step == 3:
                self.release.events.total += 1  # a release that emitted no event
            return loss

    with pytest.raises(RuntimeError, match="composed 4 privacy events .* made 5 releases"):
        make_trainer(tmp_path, [PrivacyAccountantCallback(TARGET, DELTA)]).fit(Leaky())


@pytest.fixture
def ten_unaccounted_steps(tmp_path):
    """A checkpoint after 10 private steps trained without an accountant."""
    trainer = make_trainer(tmp_path, [], max_steps=10)
    trainer.fit(ToyDPModule())
    trainer.save_checkpoint(tmp_path / "unaccounted.ckpt")
    return tmp_path / "unaccounted.ckpt"


def test_resume_without_accountant_state_is_refused(tmp_path, ten_unaccounted_steps):
    """A resume without accountant state would leave the earlier steps unaccounted: refused
    before any step."""
    module = ToyDPModule()
    trainer = make_trainer(tmp_path, [PrivacyAccountantCallback(TARGET, DELTA)], max_steps=20)
    with pytest.raises(ValueError, match="10 earlier release.*would go unaccounted"):
        trainer.fit(module, ckpt_path=ten_unaccounted_steps)
    assert module.seen == []


def test_declared_earlier_releases_are_composed(tmp_path, ten_unaccounted_steps):
    callback = PrivacyAccountantCallback(
        target_epsilon=None, delta=DELTA, earlier_releases="as_configured"
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=20)
    trainer.fit(ToyDPModule(), ckpt_path=ten_unaccounted_steps)
    assert trainer.global_step == 20 and callback.releases == 20
    assert callback.report()["releases"] == 20
    assert callback.epsilon() == pytest.approx(subsampled_gaussian_epsilon(SIGMA, Q, 20, DELTA))


def test_without_a_target_the_callback_reports_and_never_stops(tmp_path):
    callback = PrivacyAccountantCallback(delta=DELTA)
    trainer = make_trainer(tmp_path, [callback], max_steps=60)
    trainer.fit(ToyDPModule())
    assert trainer.global_step == 60 > max_steps(SIGMA, Q, TARGET, DELTA)
    assert callback.report()["epsilon"] == pytest.approx(
        subsampled_gaussian_epsilon(SIGMA, Q, 60, DELTA)
    )
    assert not callback.stopped_by_budget


def test_a_release_count_never_goes_down_within_a_process():
    """Lightning's tuner restores its temporary checkpoint after lr_find: releases made in
    between must not be forgotten, so the accountant's check fails instead."""
    log = EventLog()
    saved = log.state_dict()
    for _ in range(8):
        log.emit(SubsampledGaussianStep(SIGMA, Q))
    log.load_state_dict(saved)
    assert log.total == 8 and log.pending == []


def test_the_modules_own_target_is_the_budget_of_a_callback_without_one(tmp_path):
    """A module that calibrated its noise to ``target_epsilon`` has it enforced by the accountant
    ``dpot fit`` attaches (no target of its own); the callback's looser target loses to it."""
    for callback in (PrivacyAccountantCallback(delta=DELTA), PrivacyAccountantCallback(9.0, DELTA)):
        module = ToyDPModule()
        module.target_epsilon = TARGET
        make_trainer(tmp_path, [callback]).fit(module)
        assert callback.target_epsilon == TARGET and callback.stopped_by_budget
        assert callback.accountant.steps == max_steps(SIGMA, Q, TARGET, DELTA)
        assert callback.epsilon() <= TARGET
        assert callback.report()["module"]["calibrated_for"]["target_epsilon"] == TARGET


def test_a_callback_delta_other_than_the_release_objects_is_refused(tmp_path):
    module = ToyDPModule()
    module.release.delta = 1e-5
    with pytest.raises(ValueError, match=r"delta=1e-06\) differs from delta=1e-05"):
        make_trainer(tmp_path, [PrivacyAccountantCallback(delta=1e-6)]).fit(module)
    callback = PrivacyAccountantCallback()  # no delta: the release objects' one
    make_trainer(tmp_path, [callback], max_steps=2).fit(module)
    assert callback.delta == 1e-5 and callback.report()["delta"] == 1e-5


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"max_steps": 30}, 30),
        ({"max_steps": 30, "accumulate_grad_batches": 2}, 60),
        ({"max_epochs": 2}, 20),
        ({"max_epochs": 2, "max_steps": 30}, 20),  # Lightning stops at the first limit
        ({"max_epochs": 5, "max_steps": 30}, 30),
    ],
)
def test_planned_releases_is_the_first_limit_lightning_reaches(tmp_path, limits, expected):
    options = {"max_epochs": None, "max_steps": -1, **limits}
    trainer = make_trainer(tmp_path, [], **options)
    assert planned_releases(trainer, steps_per_epoch=10) == expected


# -- the release journal ------------------------------------------------------------------------


def _journal(root: Path) -> ReleaseJournal:
    (path,) = root.glob("privacy_journal-*.jsonl")
    journal_id = json.loads(path.read_text().splitlines()[0])["journal"]
    return ReleaseJournal(path, journal_id)


def _crash_after_a_checkpoint(root: Path, crash_at_step: int, **kwargs) -> Path:
    """A run checkpointing every 5 steps that crashes at ``crash_at_step``; its checkpoints."""
    checkpoints = root / "ckpt"
    keep = ModelCheckpoint(checkpoints, save_top_k=-1, every_n_train_steps=5)
    trainer = make_trainer(
        root / "a", [PrivacyAccountantCallback(delta=DELTA), keep], enable_checkpointing=True,
        **kwargs,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.fit(ToyDPModule(crash_at_step=crash_at_step))
    return checkpoints


def test_a_resume_composes_the_releases_made_after_the_checkpoint(tmp_path):
    """Checkpoint at step 5; the process goes on releasing (and logging) steps 5, 6 and 7, then
    dies. Resuming from the step-5 checkpoint composes all 8 releases of the journal, plus the
    steps it makes again: 8 + 7 for 12 steps, not 12."""
    checkpoints = _crash_after_a_checkpoint(tmp_path, 8)
    assert len(_journal(tmp_path / "a").read()) == 8

    callback = PrivacyAccountantCallback(delta=DELTA)
    trainer = make_trainer(tmp_path / "b", [callback], max_steps=12)
    trainer.fit(ToyDPModule(), ckpt_path=checkpoints / "epoch=0-step=5.ckpt")
    assert trainer.global_step == 12 and callback.releases == 15
    assert callback.accountant.history == [(SIGMA, Q, 15)]
    assert callback.epsilon() == pytest.approx(subsampled_gaussian_epsilon(SIGMA, Q, 15, DELTA))
    journal = _journal(tmp_path / "a")  # the run's one journal, continued by the resume
    assert len(journal.read()) == 15 and callback.report()["journal"] == str(journal.path)


def test_two_crashes_in_a_row_count_the_releases_of_both(tmp_path):
    """Crash at step 8, resume from step 5 and crash at step 9 (no checkpoint in between),
    resume from step 5 again: 8 + 4 + 7 = 19 releases for 12 steps."""
    checkpoints = _crash_after_a_checkpoint(tmp_path, 8)
    second = make_trainer(tmp_path / "b", [PrivacyAccountantCallback(delta=DELTA)], max_steps=12)
    with pytest.raises(RuntimeError, match="simulated crash"):
        second.fit(ToyDPModule(crash_at_step=9), ckpt_path=checkpoints / "epoch=0-step=5.ckpt")
    callback = PrivacyAccountantCallback(delta=DELTA)
    third = make_trainer(tmp_path / "c", [callback], max_steps=12)
    third.fit(ToyDPModule(), ckpt_path=checkpoints / "epoch=0-step=5.ckpt")
    assert third.global_step == 12 and callback.releases == 19
    assert len(_journal(tmp_path / "a").read()) == 19


def test_a_resume_without_the_checkpoints_journal_is_refused(tmp_path):
    checkpoints = _crash_after_a_checkpoint(tmp_path, 7)
    for journal in (tmp_path / "a").glob("privacy_journal-*.jsonl"):
        journal.unlink()
    module = ToyDPModule()
    trainer = make_trainer(tmp_path / "b", [PrivacyAccountantCallback(delta=DELTA)], max_steps=9)
    with pytest.raises(FileNotFoundError, match="release journal .* is missing"):
        trainer.fit(module, ckpt_path=checkpoints / "epoch=0-step=5.ckpt")
    assert module.seen == []
    assert not (tmp_path / "b" / "privacy_report.json").exists()  # no count it cannot know


def test_a_checkpoint_naming_no_journal_starts_one_with_its_releases(tmp_path):
    """A checkpoint whose accountant state names no journal: the new journal begins with the
    checkpoint's releases, so a later resume from a newer checkpoint still counts them."""
    checkpoints = _crash_after_a_checkpoint(tmp_path, 7)
    checkpoint = torch.load(checkpoints / "epoch=0-step=5.ckpt", weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("PrivacyAccountantCallback")]
    checkpoint["callbacks"][key]["journal"] = None
    torch.save(checkpoint, tmp_path / "no_journal.ckpt")
    callback = PrivacyAccountantCallback(delta=DELTA)
    trainer = make_trainer(tmp_path / "b", [callback], max_steps=8)
    trainer.fit(ToyDPModule(), ckpt_path=tmp_path / "no_journal.ckpt")
    assert callback.releases == 8 and len(_journal(tmp_path / "b").read()) == 8


# -- restored releases, the schedule of accumulation, reports on failure -------------------------


def test_declared_earlier_releases_are_composed_at_the_noise_they_were_made_with(tmp_path):
    """10 steps at σ = 1 without an accountant, resumed at σ = 2: the 10 earlier releases are
    composed at the σ the checkpoint stores for them, not at the resumed run's σ."""
    first = make_trainer(tmp_path, [], max_steps=10)
    first.fit(ToyDPModule(noise_multiplier=1.0))
    first.save_checkpoint(tmp_path / "sigma1.ckpt")
    callback = PrivacyAccountantCallback(delta=DELTA, earlier_releases="as_configured")
    trainer = make_trainer(tmp_path, [callback], max_steps=16)
    trainer.fit(ToyDPModule(noise_multiplier=2.0), ckpt_path=tmp_path / "sigma1.ckpt")
    assert callback.accountant.history == [(1.0, Q, 10), (2.0, Q, 6)]
    emitted = callback.report()["module"]["releases"][0]["emitted"]
    assert [(entry["noise_multiplier"], count) for entry, count in emitted] == [(1.0, 10), (2.0, 6)]


def test_a_gradient_accumulation_schedule_is_refused_with_a_target(tmp_path):
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    schedule = GradientAccumulationScheduler({0: 1, 1: 3})
    module = ToyDPModule()
    trainer = make_trainer(tmp_path, [PrivacyAccountantCallback(TARGET, DELTA), schedule])
    with pytest.raises(ValueError, match="GradientAccumulationScheduler changes"):
        trainer.fit(module)
    assert module.seen == []
    with pytest.raises(ValueError, match="GradientAccumulationScheduler changes"):
        planned_releases(make_trainer(tmp_path, [schedule], max_steps=12), 10)


@pytest.mark.parametrize("crash", ["budget", "error"])
def test_a_run_ended_by_an_exception_after_releasing_leaves_both_reports(tmp_path, crash):
    from lightning_dpot.callbacks import RunReport

    callback = PrivacyAccountantCallback(TARGET, DELTA)
    if crash == "budget":  # min_steps keeps Lightning from stopping at the target
        module, kwargs, error = ToyDPModule(), {"min_steps": 40}, PrivacyBudgetExceededError
    else:
        module, kwargs, error = ToyDPModule(crash_at_step=7), {}, RuntimeError
    trainer = make_trainer(tmp_path, [RunReport(), callback], **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(error):
            trainer.fit(module)
    releases = len(module.seen)
    assert releases == (31 if crash == "budget" else 7)
    privacy = json.loads((tmp_path / "privacy_report.json").read_text())
    run = json.loads((tmp_path / "report.json").read_text())
    assert privacy["releases"] == run["privacy"]["releases"] == releases
    assert privacy["ended_by"] == run["privacy"]["ended_by"] == run["ended_by"] == error.__name__
    assert privacy["epsilon"] == pytest.approx(
        subsampled_gaussian_epsilon(SIGMA, Q, releases, DELTA)
    )


def test_the_report_says_what_lies_outside_the_guarantee(finished_run):
    _, _, callback, _ = finished_run
    outside = callback.report()["outside_the_guarantee"]
    assert any("other releases of the same people" in line for line in outside)


def test_a_failing_look_ahead_loses_no_release():
    """``privacy_update`` asks for the next batch's events before it drains anything: if that
    raises, the releases already made are still there to be composed."""
    module = ToyDPModule()
    module.release()
    module.release()

    def broken():
        raise RuntimeError("look-ahead failed")

    module.next_step_events = broken
    with pytest.raises(RuntimeError, match="look-ahead failed"):
        module.privacy_update()
    del module.next_step_events
    update = module.privacy_update()
    assert len(update.events) == 2 and update.releases_emitted == 2
