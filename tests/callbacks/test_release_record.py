"""The record of a run's releases (journal, checkpoint, ledger) and the framework's own checks:
a step that consumed a private batch released, a resume from another folder finds its journal,
a run moved elsewhere continues its journal there (and only its own, whole), a torn journal
heals once, a checkpoint and a logged ε are committed before they leave, and a
ledger entry is never settled below what was emitted."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from test_privacy_accountant import DELTA, SIGMA, ToyDPModule, make_trainer

import lightning_dpot.privacy.accounting.journal as journal_module
from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.events import SubsampledGaussianStep


@pytest.fixture(autouse=True)
def _quiet_lightning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(workers|log_every_n_steps|LeafSpec).*")
        yield


class ForgetsItsRelease(ToyDPModule):
    """Trains on its private batches but never calls its release object."""

    def training_step(self, batch, batch_idx):
        (x,) = batch
        self.seen.append(x[:, 0].long().tolist())
        return (self.weight - x.sum()).pow(2).sum()


class ReleasesNothing(ToyDPModule):
    """Declares no per-step events and makes no release before training."""

    def next_step_events(self):
        return []

    def training_step(self, batch, batch_idx):
        return (self.weight - batch[0].sum()).pow(2).sum()


def test_a_method_that_forgets_its_release_fails_before_its_first_update(tmp_path):
    module = ForgetsItsRelease()
    callback = PrivacyAccountantCallback(delta=DELTA)
    with pytest.raises(RuntimeError, match="emitted 0 privacy event.* must call its release"):
        make_trainer(tmp_path, [callback], max_steps=5).fit(module)
    assert torch.equal(module.weight.detach(), torch.zeros(1))  # no optimizer step was taken
    assert len(module.seen) == 1 and callback.releases == 0


class EmitsOtherNoise(ToyDPModule):
    """Announces σ = 2 to the look-ahead but releases with σ = 0.5."""

    def training_step(self, batch, batch_idx):
        self.release.events.emit(SubsampledGaussianStep(0.5, 0.1))
        return (self.weight - batch[0].sum()).pow(2).sum()


class ReleasesUnannounced(ToyDPModule):
    """Releases every step but announces nothing."""

    def next_step_events(self):
        return []

    def on_fit_start(self):
        self.release()  # something released before training, as a one-shot method would


def test_a_batch_must_emit_the_events_it_announced_not_only_as_many(tmp_path):
    for module in (EmitsOtherNoise(), ReleasesUnannounced()):
        with pytest.raises(RuntimeError, match="look-ahead announced"):
            make_trainer(tmp_path, [PrivacyAccountantCallback(delta=DELTA)], max_steps=3).fit(
                module
            )
        assert torch.equal(module.weight.detach(), torch.zeros(1))  # refused before the update


def test_a_method_whose_steps_and_start_release_nothing_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="release nothing and it made no release"):
        make_trainer(tmp_path, [PrivacyAccountantCallback(delta=DELTA)], max_steps=3).fit(
            ReleasesNothing()
        )


def _checkpointed_run(root: Path, steps: int, ckpt_path: str | None = None):
    callback = PrivacyAccountantCallback(delta=DELTA)
    saver = ModelCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=1, save_top_k=-1)
    trainer = make_trainer(root, [callback, saver], max_steps=steps, enable_checkpointing=True)
    trainer.fit(ToyDPModule(), ckpt_path=ckpt_path)
    return callback


def test_a_resume_from_another_working_directory_finds_the_journal(tmp_path, monkeypatch):
    """The checkpoint names its journal by absolute path: a resume started elsewhere composes
    it, and two resumes of one checkpoint count both branches."""
    (tmp_path / "first").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    _checkpointed_run(Path("run"), 4)  # a relative log directory
    ckpt = tmp_path / "first" / "run" / "checkpoints" / "epoch=0-step=3.ckpt"
    state = torch.load(ckpt, weights_only=True)
    (kept,) = [v for k, v in state["callbacks"].items() if k.startswith("PrivacyAccountant")]
    assert Path(kept["journal"]["path"]).is_absolute() and kept["journal"]["position"] == 3
    (tmp_path / "second").mkdir()
    monkeypatch.chdir(tmp_path / "second")
    again = _checkpointed_run(Path("run"), 6, ckpt_path=str(ckpt))
    assert again.releases == 4 + 3  # the 4 of the first process, 3 more from step 3
    third = _checkpointed_run(Path("run"), 6, ckpt_path=str(ckpt))
    assert third.releases == 7 + 3
    journal = ReleaseJournal(kept["journal"]["path"], kept["journal"]["id"])
    assert len(journal.read()) == 10


def test_a_torn_last_line_is_cut_once_with_a_warning(tmp_path):
    """A power loss can leave a half-written last line; the next holder cuts it off, so its
    own appends start on a line of their own and every later read succeeds."""
    journal = ReleaseJournal(tmp_path / "journal.jsonl")
    journal.start()
    step = ToyDPModule().release.event
    journal.append(0, step)
    journal.release()
    with open(journal.path, "a") as fh:
        fh.write('{"process": "x", "se')
    resumed = ReleaseJournal(journal.path, journal.id)
    with pytest.warns(UserWarning, match="interrupted line .* cut off"):
        resumed.acquire()
    assert len(resumed.read()) == 1
    resumed.append(0, step)
    resumed.release()
    assert len(ReleaseJournal(journal.path, journal.id).read()) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to cut the second time
        ReleaseJournal(journal.path, journal.id).acquire()


def test_releases_are_committed_in_groups_and_before_a_checkpoint(tmp_path, monkeypatch):
    synced = []
    real_fsync = journal_module.os.fsync
    monkeypatch.setattr(journal_module.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    callback = PrivacyAccountantCallback(delta=DELTA, log_every_n_steps=10)
    trainer = make_trainer(tmp_path, [callback], max_steps=40, log_every_n_steps=10)
    trainer.fit(ToyDPModule(num_records=1000))
    assert callback.releases == 40
    assert len(synced) < 15  # four epochs of ten batches: a group per log step and epoch end
    journal = callback.record.journal
    assert journal is not None and len(journal.read()) == 40
    journal.append(0, ToyDPModule().release.event)  # a release after the last commit
    assert callback.state_dict()["journal"]["position"] == 41
    assert journal.commit() == 0  # the checkpoint state committed it


def test_a_ledger_entry_is_not_settled_below_what_was_emitted(tmp_path):
    """Releases emitted but never composed (the accountant's check then aborts the run) leave
    the ledger entry at the ε it was opened at."""
    from lightning_dpot.callbacks.privacy_record import RunRecord
    from lightning_dpot.data import LedgerSettings

    settled = []

    class Ledger:
        def settle(self, entry, epsilon, delta):
            settled.append(epsilon)

        def total(self):
            return type("Total", (), {"as_dict": lambda self: {"epsilon": 9.0}})()

        keying, settings = "content", LedgerSettings()
        book = type("L", (), {"path": tmp_path / "ledger"})()

    datamodule = type("D", (), {"run_ledger": Ledger()})()
    trainer = type("T", (), {"is_global_zero": True, "datamodule": datamodule})()
    record = RunRecord()
    record.ledger_entry = ("entry", 4.35)
    with pytest.warns(UserWarning, match="2 release.* not composed.* stays at epsilon=4.35"):
        record.settle_ledger_entry(trainer, 0.0, DELTA, unaccounted=2)
    assert settled == [] and record.ledger is not None
    record.ledger = None
    record.settle_ledger_entry(trainer, 1.5, DELTA, unaccounted=0)
    assert settled == [1.5]


def test_the_report_names_the_journal_and_its_position(tmp_path):
    callback = PrivacyAccountantCallback(delta=DELTA)
    make_trainer(tmp_path, [callback], max_steps=5).fit(ToyDPModule(noise_multiplier=SIGMA))
    report = json.loads((tmp_path / "privacy_report.json").read_text())
    assert report["releases"] == 5 and Path(report["journal"]).is_absolute()
    assert callback.state_dict()["journal"]["position"] == 5


def test_dpot_report_says_when_the_journal_outgrew_the_report_and_reads_a_checkpoint(
    tmp_path, capsys
):
    """A later process of the run released after report.json was written: `dpot report` says
    so; `dpot report --ckpt_path` states the releases the checkpoint itself holds."""
    from lightning_dpot.cli import main

    callback = PrivacyAccountantCallback(delta=DELTA)
    trainer = make_trainer(tmp_path, [callback], max_steps=4)
    trainer.fit(ToyDPModule())
    trainer.save_checkpoint(tmp_path / "step4.ckpt")
    report = {"privacy": json.loads((tmp_path / "privacy_report.json").read_text())}
    (tmp_path / "report.json").write_text(json.dumps(report))
    journal = ReleaseJournal(report["privacy"]["journal"], callback.record.journal.id)
    journal.append(0, ToyDPModule().release.event)  # a later process's release
    journal.close()
    main(["report", str(tmp_path)])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("note: the run's release journal") and "holds 5 releases" in first
    main(["report", "--ckpt_path", str(tmp_path / "step4.ckpt")])
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert rows["privacy.releases"] == "4" and rows["privacy.journal_position"] == "4"


def test_a_checkpoint_written_before_the_batch_is_drained_composes_its_releases(tmp_path):
    """A checkpoint callback listed before the accountant saves at the end of a batch whose
    release the accountant has not drained yet: the saved state composes it anyway, so the
    checkpoint (and an export of it) states every release its weights saw."""
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    callback = PrivacyAccountantCallback(delta=DELTA)
    trainer = make_trainer(tmp_path, [saver, callback], max_steps=3, enable_checkpointing=True)
    trainer.fit(ToyDPModule())
    for step in (1, 2, 3):
        state = torch.load(tmp_path / "ckpt" / f"epoch=0-step={step}.ckpt", weights_only=True)
        (kept,) = [v for k, v in state["callbacks"].items() if k.startswith("PrivacyAccountant")]
        assert kept["composition"]["accountant"]["history"] == [[SIGMA, 0.1, step]]
        assert state["toy_release"]["total"] == step  # the module's own count agrees


def test_a_method_listing_the_lightning_module_first_is_refused(tmp_path):
    import lightning as L

    from lightning_dpot.privacy.contract import ReleasesPrivateData

    toy = ToyDPModule()

    class LightningFirst(L.LightningModule, ReleasesPrivateData):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.release = toy.release

        def privacy_releases(self):
            return [self.release]

        training_step = ToyDPModule.training_step
        configure_optimizers = ToyDPModule.configure_optimizers

        def train_dataloader(self):
            return toy.train_dataloader()

    with pytest.raises(TypeError, match=r"lists LightningModule before ReleasesPrivateData"):
        make_trainer(tmp_path, [PrivacyAccountantCallback(delta=DELTA)]).fit(LightningFirst())


def test_a_progress_bar_that_prints_commits_first(tmp_path, monkeypatch):
    """The bar prints what a method logs (a loss of released data): the journal is committed
    at every refresh, and only then."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    committed = []
    real_commit = journal_module.ReleaseJournal.commit

    def counted(self):
        count = real_commit(self)
        if count:
            committed.append(count)
        return count

    monkeypatch.setattr(journal_module.ReleaseJournal, "commit", counted)
    bar = TQDMProgressBar(refresh_rate=5)
    callback = PrivacyAccountantCallback(delta=DELTA, log_every_n_steps=1000)
    trainer = make_trainer(
        tmp_path, [callback, bar], max_steps=20, log_every_n_steps=1000, enable_progress_bar=True
    )
    trainer.fit(ToyDPModule(num_records=1000))
    assert committed[:4] == [5, 5, 5, 5]  # one group per refresh, before it prints


def test_a_callback_that_stops_mid_epoch_has_the_journal_committed_before_the_logger_writes(
    tmp_path,
):
    """A callback listed after the accountant ends training mid-epoch (as ``EarlyStopping`` or a
    ``Timer`` may): the logger then writes that step's metrics, derived from its release. The
    journal is committed first, and the ε logged with them is the run's."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    class LogsLoss(ToyDPModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss.detach(), on_step=True, batch_size=1)
            return loss

    accountant = PrivacyAccountantCallback(delta=DELTA)
    writes = []

    class Spy(CSVLogger):
        def log_metrics(self, metrics, step=None):
            writes.append((dict(metrics), accountant.record.journal._uncommitted))
            super().log_metrics(metrics, step)

    class StopAtSeven(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.should_stop or trainer.global_step == 7

    trainer = make_trainer(
        tmp_path,
        [accountant, StopAtSeven()],
        max_steps=50,
        log_every_n_steps=50,
        logger=Spy(tmp_path),
    )
    trainer.fit(LogsLoss())
    ((metrics, uncommitted),) = [w for w in writes if "loss" in w[0]]
    assert uncommitted == 0
    assert metrics["epsilon"] == pytest.approx(accountant.epsilon())
    assert metrics["privacy/releases"] == accountant.releases == 7


def test_a_journal_cut_below_the_checkpoints_position_is_refused(tmp_path):
    _checkpointed_run(tmp_path, 4)
    ckpt = tmp_path / "checkpoints" / "epoch=0-step=1.ckpt"  # position 2 (the checkpoint)
    state = torch.load(ckpt, weights_only=True)
    (kept,) = [v for k, v in state["callbacks"].items() if k.startswith("PrivacyAccountant")]
    path = Path(kept["journal"]["path"])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: 1 + kept["journal"]["position"] - 1]))  # one release lost
    with pytest.raises(ValueError, match="was cut short"):
        _checkpointed_run(tmp_path / "resume", 6, ckpt_path=str(ckpt))


def _resume(root: Path, ckpt: Path, journal_path: Path | None = None) -> PrivacyAccountantCallback:
    callback = PrivacyAccountantCallback(delta=DELTA, journal_path=journal_path)
    make_trainer(root, [callback], max_steps=4).fit(ToyDPModule(), ckpt_path=str(ckpt))
    return callback


def test_a_run_moved_with_its_journal_resumes_there_and_a_wrong_journal_is_refused(tmp_path):
    """A run folder moved elsewhere (another machine): ``journal_path`` names its journal where
    it lies now, and the checks of the checkpoint's own journal apply to it. Every release
    counts, also those after the checkpoint; another run's journal, one cut short and a missing
    one are refused; later checkpoints name the new place."""
    _checkpointed_run(tmp_path / "a" / "run", 4)  # 4 releases, a checkpoint after each
    _checkpointed_run(tmp_path / "other", 2)  # another run, another journal id
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "run").rename(tmp_path / "b" / "run")
    run = tmp_path / "b" / "run"
    ckpt = run / "checkpoints" / "epoch=0-step=2.ckpt"  # position 2; the journal holds 4
    (journal,) = run.glob("privacy_journal-*.jsonl")
    with pytest.raises(FileNotFoundError, match="which is missing"):
        _resume(tmp_path / "r1", ckpt)  # the path the checkpoint names is gone
    with pytest.raises(FileNotFoundError, match="journal_path=.* is missing"):
        _resume(tmp_path / "r2", ckpt, tmp_path / "nowhere.jsonl")
    (other,) = (tmp_path / "other").glob("privacy_journal-*.jsonl")
    with pytest.raises(ValueError, match="is not the journal"):
        _resume(tmp_path / "r3", ckpt, other)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(journal.read_text().splitlines(keepends=True)[:2]))  # 1 release
    with pytest.raises(ValueError, match="was cut short"):
        _resume(tmp_path / "r4", ckpt, short)
    with pytest.raises(ValueError, match="restores no checkpoint naming a journal"):
        callback = PrivacyAccountantCallback(delta=DELTA, journal_path=journal)
        make_trainer(tmp_path / "r5", [callback], max_steps=2).fit(ToyDPModule())

    resumed = _resume(tmp_path / "r6", ckpt, journal)
    assert resumed.releases == 4 + 2  # the 4 of the first process, 2 more from step 2
    assert len(ReleaseJournal(journal, resumed.record.journal.id).read()) == 6
    assert resumed.record.moved_from == str(tmp_path / "a" / "run" / journal.name)
    assert resumed.state_dict()["journal"]["path"] == str(journal)
    assert resumed.report()["journal"] == str(journal)


def test_a_copy_beside_the_run_is_not_taken_for_its_moved_journal(tmp_path):
    """While the journal the checkpoint names exists, a copy of it (a stale snapshot of the run's
    folder, which lacks the later releases) is refused; a link to the journal itself is the
    same journal, not a move, and shares its lock."""
    import shutil

    _checkpointed_run(tmp_path / "run", 4)
    ckpt = tmp_path / "run" / "checkpoints" / "epoch=0-step=2.ckpt"
    (journal,) = (tmp_path / "run").glob("privacy_journal-*.jsonl")
    copy = tmp_path / "copy" / journal.name
    copy.parent.mkdir()
    shutil.copy(journal, copy)
    with pytest.raises(ValueError, match="still exists, and a run continues in one place"):
        _resume(tmp_path / "r1", ckpt, copy)
    link = tmp_path / "link.jsonl"
    link.symlink_to(journal)
    resumed = _resume(tmp_path / "r2", ckpt, link)
    assert resumed.record.moved_from is None
    assert resumed.releases == 4 + 2
    assert resumed.state_dict()["journal"]["path"] == str(journal)
