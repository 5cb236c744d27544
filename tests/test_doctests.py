"""Every ``>>>`` example in the package's docstrings runs and prints what it shows.

The examples are the API's documentation; this runs each module's with :mod:`doctest`, from a
temporary working folder, with the ledger and caches there too."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_dpot"
MIN_EXAMPLES = 15


def _modules_with_examples() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in path.read_text():
            parts = ["lightning_dpot", *path.relative_to(PACKAGE).with_suffix("").parts]
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


MODULES = _modules_with_examples()


def test_the_package_documents_its_api_with_runnable_examples():
    assert len(MODULES) >= MIN_EXAMPLES, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_of_a_module_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPOT_LEDGER_DIR", str(tmp_path / "ledger"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, raise_on_error=False, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} example lines failed"


def test_docstrings_name_objects_plainly():
    # No Sphinx build renders or checks roles here: names are written as ``name``.
    role = re.compile(r":(class|func|meth|mod|attr|data|exc|obj):`")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if role.search(path.read_text())
    ]
    assert not offenders, offenders
