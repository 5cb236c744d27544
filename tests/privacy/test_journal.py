"""The release journal: durable, ordered per process, named, read back exactly, and written
before an event is counted (a resumed run composing it:
tests/callbacks/test_privacy_accountant.py)."""

from __future__ import annotations

import json

import pytest

from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.events import EventLog, GaussianRelease, SubsampledGaussianStep

STEP = SubsampledGaussianStep(2.0, 0.1)


def test_appended_events_are_read_back_in_order(tmp_path):
    journal = ReleaseJournal(tmp_path / "run" / "journal.jsonl")
    journal.start()
    events = [(0, STEP), (1, GaussianRelease(3.0)), (0, SubsampledGaussianStep(1.0, 0.5))]
    for index, event in events:
        journal.append(index, event)
    assert ReleaseJournal(journal.path, journal.id).read() == events
    lines = [json.loads(line) for line in journal.path.read_text().splitlines()]
    assert lines[0] == {"journal": journal.id}
    assert [line["seq"] for line in lines[1:]] == [0, 1, 2]


def test_a_resumed_process_appends_to_the_same_journal(tmp_path):
    """Each process numbers its own lines, so a resume (or two resumes of one checkpoint)
    continues the run's one journal, and every branch is read back."""
    first = ReleaseJournal(tmp_path / "journal.jsonl")
    first.start([(0, STEP)])
    first.append(0, STEP)
    second = ReleaseJournal(first.path, first.id)
    second.append(0, GaussianRelease(1.0))
    first.append(0, STEP)
    assert len(ReleaseJournal(first.path, first.id).read()) == 4


def test_an_interrupted_last_append_is_ignored_and_a_damaged_line_refused(tmp_path):
    journal = ReleaseJournal(tmp_path / "journal.jsonl")
    journal.start([(0, STEP), (0, STEP)])
    complete = journal.path.read_text()
    journal.path.write_text(complete + '{"process": "a", "se')  # killed inside os.write
    assert len(journal.read()) == 2
    header, first, second = complete.splitlines()
    journal.path.write_text("\n".join([header, second, first]) + "\n")
    with pytest.raises(ValueError, match="line 2 has seq=1 .* expected 0"):
        journal.read()
    journal.path.write_text("\n".join([header, first, "not json"]) + "\n")
    with pytest.raises(ValueError, match="line 3 is not a release record"):
        journal.read()


def test_another_runs_journal_is_refused(tmp_path):
    journal = ReleaseJournal(tmp_path / "journal.jsonl")
    journal.start([(0, STEP)])
    with pytest.raises(ValueError, match="is not the journal"):
        ReleaseJournal(journal.path, "another-run").read()


def test_an_event_log_journals_each_event_before_counting_it(tmp_path):
    journal = ReleaseJournal(tmp_path / "journal.jsonl")
    journal.start()
    log = EventLog()
    log.journal = journal.writer(0)
    log.emit(STEP)
    assert journal.read() == [(0, STEP)] and log.total == 1

    def full_disk(event):
        raise OSError("no space left on device")

    log.journal = full_disk
    with pytest.raises(OSError):
        log.emit(STEP)
    assert log.total == 1 and len(log.pending) == 1  # nothing counted that was not journaled


def test_a_journal_is_held_by_one_process_at_a_time(tmp_path):
    first = ReleaseJournal(tmp_path / "journal.jsonl")
    first.start()
    first.acquire()
    second = ReleaseJournal(first.path, first.id)
    with pytest.raises(RuntimeError, match="in use by another process"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


def test_a_short_write_is_cut_off_and_refused(tmp_path, monkeypatch):
    """A full disk can write part of a line and return: the part is removed and the append
    raises, so the caller draws no noise for a release the journal would not hold."""
    import lightning_dpot.privacy.accounting.journal as journal_module

    journal = ReleaseJournal(tmp_path / "journal.jsonl")
    journal.start([(0, STEP)])
    before = journal.path.read_bytes()
    real_write = journal_module.os.write
    monkeypatch.setattr(journal_module.os, "write", lambda fd, data: real_write(fd, data[:10]))
    with pytest.raises(OSError, match="wrote 10 of"):
        journal.append(0, STEP)
    monkeypatch.setattr(journal_module.os, "write", real_write)
    assert journal.path.read_bytes() == before and journal.count == 1
    journal.append(0, STEP)
    assert len(journal.read()) == 2
