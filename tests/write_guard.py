"""The suite writes nowhere but temporary folders.

``conftest.py`` imports this module before the package: every location where a dependency
writes by default under ``$HOME`` or the working directory (W&B, matplotlib, the torch hub,
KeOps' builds, the XDG cache/config/data folders) is pointed at one temporary folder for the
test run, :data:`SCRATCH_DIR`, removed at exit (the privacy ledger gets a temporary folder per
test, from ``conftest.py``). The test run then fails if a test wrote into the repository or into
the user's caches: :class:`WriteGuard` compares the files there at the end with those at the
start.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["HOME_CACHES", "REDIRECTED", "REPO", "SCRATCH_DIR", "WriteGuard"]

REPO = Path(__file__).resolve().parents[1]
SCRATCH_DIR = Path(tempfile.mkdtemp(prefix="dpot-tests-"))
# Removed at exit, after the dependencies' own exit handlers (registered later, run earlier)
# have written their caches there (KeOps does).
atexit.register(shutil.rmtree, SCRATCH_DIR, ignore_errors=True)

#: Environment variable → its folder under :data:`SCRATCH_DIR`.
REDIRECTED = {
    "WANDB_DIR": "wandb",
    "WANDB_CACHE_DIR": "wandb/cache",
    "WANDB_CONFIG_DIR": "wandb/config",
    "WANDB_DATA_DIR": "wandb/data",
    "WANDB_ARTIFACT_DIR": "wandb/artifacts",
    "MPLCONFIGDIR": "matplotlib",
    "TORCH_HOME": "torch",
    "KEOPS_CACHE_FOLDER": "keops",
    "XDG_CACHE_HOME": "xdg/cache",
    "XDG_CONFIG_HOME": "xdg/config",
    "XDG_DATA_HOME": "xdg/data",
}
for _variable, _folder in REDIRECTED.items():
    os.environ[_variable] = str(SCRATCH_DIR / _folder)

#: Where the dependencies and the package write under ``$HOME`` when nothing redirects them.
HOME_CACHES = (
    ".cache/wandb",
    ".cache/matplotlib",
    ".cache/torch",
    ".cache/keops*",
    ".config/wandb",
    ".config/matplotlib",
    ".local/share/wandb",
    ".local/share/lightning_dpot",
)
#: Folders of the working tree that tools write, not tests.
TOOL_FOLDERS = frozenset({".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"})


def _files(root: Path) -> dict[Path, int]:
    """Every file below ``root`` (outside :data:`TOOL_FOLDERS`) → its modification time (ns)."""
    out = {}
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in TOOL_FOLDERS]
        for name in names:
            path = Path(folder) / name
            try:
                out[path] = path.stat().st_mtime_ns
            except FileNotFoundError:  # removed while listed
                continue
    return out


def _tracked(repo: Path) -> set[Path] | None:
    """The files git tracks in ``repo``; ``None`` outside a git work tree."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {repo / name for name in listing.decode().split("\0") if name}


def _untracked_files(repo: Path) -> set[Path]:
    """The working tree's files that git does not track (untracked or ignored): where a test's
    output would land (``runs/``, ``.dpot_cache/``, ``lightning_logs/``, ``report.json``)."""
    tracked = _tracked(repo)
    if tracked is None:
        return set()
    return {path for path in _files(repo) if path not in tracked}


def _home_cache_files(home: Path) -> dict[Path, int]:
    out: dict[Path, int] = {}
    for pattern in HOME_CACHES:
        for folder in home.glob(pattern):
            out.update(_files(folder))
    return out


class WriteGuard:
    """Lists, at construction, the files of ``repo`` that git does not track and the files in
    ``home``'s :data:`HOME_CACHES`; :meth:`written` names the repository files that appeared
    since and the cache files that appeared or changed (a ledger appended to). Untracked
    repository files that were there already are not watched: a person may be editing them
    while the tests run."""

    def __init__(self, repo: Path = REPO, home: Path | None = None) -> None:
        self.repo = repo
        self.home = Path.home() if home is None else home
        self.repo_before = _untracked_files(repo)
        self.home_before = _home_cache_files(self.home)

    def written(self) -> list[Path]:
        """The new repository files and the new or modified cache files, sorted."""
        new = _untracked_files(self.repo) - self.repo_before
        changed = {
            path
            for path, mtime in _home_cache_files(self.home).items()
            if self.home_before.get(path) != mtime
        }
        return sorted(new | changed)
