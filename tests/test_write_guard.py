"""The suite's own isolation (tests/write_guard.py, tests/conftest.py): every cache location
points into the temporary folder, module-scoped fixtures see a temporary ledger too, and the
guard names a ``runs/`` folder written into a repository and a file written into a home cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from write_guard import REDIRECTED, SCRATCH_DIR, WriteGuard

from lightning_dpot.data.ledger import LEDGER_ENV


@pytest.fixture(scope="module")
def ledger_seen_by_a_module_fixture() -> str:
    return os.environ[LEDGER_ENV]


def test_every_cache_location_is_in_the_temporary_folder():
    for variable in REDIRECTED:
        assert Path(os.environ[variable]).is_relative_to(SCRATCH_DIR), variable


def test_module_fixtures_write_to_a_temporary_ledger(ledger_seen_by_a_module_fixture, tmp_path):
    home_ledger = Path.home() / ".local" / "share" / "lightning_dpot"
    ledger = Path(ledger_seen_by_a_module_fixture)
    assert not ledger.is_relative_to(home_ledger)
    assert ledger.parent == tmp_path.parent  # pytest's temporary folder of this run


def _git_repo(path: Path) -> Path:
    path.mkdir()
    (path / "tracked.py").write_text("x = 1\n")
    (path / "draft.md").write_text("a file someone is writing\n")
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "tracked.py"], cwd=path, check=True)
    return path


def test_the_guard_names_new_repository_files_and_changed_cache_files(tmp_path):
    repo, home = _git_repo(tmp_path / "repo"), tmp_path / "home"
    ledger = home / ".local/share/lightning_dpot/ledger/ledger.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text("{}\n")
    guard = WriteGuard(repo, home)
    assert guard.written() == []

    (repo / "tracked.py").write_text("x = 2\n")  # an edit of the code
    (repo / "draft.md").write_text("edited while the tests ran\n")  # an edit of a new file
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "tracked.cpython-311.pyc").write_bytes(b"")  # the interpreter's
    assert guard.written() == []

    (repo / "runs" / "quickstart").mkdir(parents=True)
    (repo / "runs" / "quickstart" / "report.json").write_text("{}")
    with ledger.open("a") as appended:
        appended.write("{}\n")
    (home / ".cache" / "keops2.3").mkdir(parents=True)
    (home / ".cache" / "keops2.3" / "build.so").write_bytes(b"")
    assert guard.written() == [
        home / ".cache/keops2.3/build.so",
        ledger,
        repo / "runs/quickstart/report.json",
    ]
