"""Load the ``lightning_dpot`` package of an earlier git revision beside the installed one, so a
benchmark can time the two side by side in one process (same load, same thread, interleaved).

    old = load_revision("fdae246")            # a module object: old.ot.sinkhorn.EntropicSolver
    new = importlib.import_module("lightning_dpot")

The revision's ``lightning_dpot/`` is extracted with ``git archive`` into a temporary folder and
imported under its own name; its modules are then moved aside in ``sys.modules`` (their functions
keep their own globals), and the installed package is imported as usual. Imports that an old
function makes at call time resolve to the installed package: compare solver and loss objects,
which import at module level.
"""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

PACKAGE = "lightning_dpot"
SUBMODULES = (
    "nn.dcgan",
    "ot.costs",
    "ot.dp_sinkhorn",
    "ot.entropic",
    "ot.expansion",
    "ot.sinkhorn",
    "privacy.gradient_sanitizer",
    "privacy.mechanisms.gradient_sanitizer",
)
_KEEP: list[tempfile.TemporaryDirectory] = []


def load_revision(rev: str, repo: str | Path = ".") -> ModuleType:
    """The package as of ``rev`` (any git revision of ``repo``) with those of
    ``SUBMODULES`` it has imported."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", rev, PACKAGE],
        check=True,
        capture_output=True,
    ).stdout
    folder = tempfile.TemporaryDirectory(prefix=f"{PACKAGE}-{rev}-")
    _KEEP.append(folder)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder.name, filter="data")
    current = {k: v for k, v in sys.modules.items() if k == PACKAGE or k.startswith(PACKAGE + ".")}
    for key in current:
        del sys.modules[key]
    sys.path.insert(0, folder.name)
    try:
        old = importlib.import_module(PACKAGE)
        for name in SUBMODULES:  # each revision has the modules of its own layout
            try:
                importlib.import_module(f"{PACKAGE}.{name}")
            except ModuleNotFoundError as error:
                if error.name != f"{PACKAGE}.{name}":
                    raise
    finally:
        sys.path.remove(folder.name)
        for key in [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]:
            del sys.modules[key]
        sys.modules.update(current)
    return old
