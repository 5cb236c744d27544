"""The package as a library: its declared dependencies are what it imports, and the configs and
callback files of the README travel with it (a wheel carries them; any directory finds them)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_dpot.config import compose_config, with_composed_configs
from lightning_dpot.resources import find_resource, resource_root

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python ≥ 3.11")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_dpot"

#: Distribution name → the module it is imported as, where the two differ.
MODULE_OF = {
    "scikit-learn": "sklearn",
    "PyWavelets": "pywt",
    "pyyaml": "yaml",
    "typing-extensions": "typing_extensions",
    "dp-accounting": "dp_accounting",
    "torch-fidelity": "torch_fidelity",
}
#: Declared for a library the package reaches through another one (pyproject.toml says which).
REACHED_THROUGH = {"torch_fidelity"}


def _declared() -> set[str]:
    """The required dependencies and the package's own optional extras (not ``dev``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    deps = [*project["dependencies"], *(d for k, v in extras.items() if k != "dev" for d in v)]
    names = (re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0] for dep in deps)
    return {MODULE_OF.get(name, name) for name in names}


def _imported() -> set[str]:
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.partition(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "lightning_dpot"}


def test_every_import_is_declared_and_every_dependency_is_used():
    declared, imported = _declared(), _imported()
    assert imported - declared == set(), "imported but not declared in pyproject.toml"
    assert declared - imported - REACHED_THROUGH == set(), "declared but never imported"


def test_every_config_and_callback_file_is_packaged():
    """pyproject.toml's package-data globs take every file of configs/ and callbacks/."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = data["package-data"]["lightning_dpot.resources"]
    root = resource_root()
    taken = {p for g in globs for p in root.glob(g)}
    for folder in ("configs", "callbacks"):
        files = {p for p in (root / folder).rglob("*") if p.is_file()}
        assert files and files <= taken, sorted(str(p) for p in files - taken)


def test_a_path_on_disk_wins_and_a_missing_one_is_found_in_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = find_resource("configs/quickstart.yaml")
    assert packaged is not None and packaged.samefile(ROOT / "configs" / "quickstart.yaml")
    assert find_resource("./callbacks/sample_grid.yaml") is not None
    for not_ours in ("configs/nope.yaml", "other/quickstart.yaml", "configs/../pyproject.toml"):
        assert find_resource(not_ours) is None
    own = tmp_path / "configs" / "quickstart.yaml"
    own.parent.mkdir()
    own.write_text("trainer: {max_steps: 1}\n")
    assert find_resource("configs/quickstart.yaml") is None  # the user's own file
    assert compose_config("configs/quickstart.yaml") == {"trainer": {"max_steps": 1}}


def test_the_readme_paths_compose_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    composed = compose_config("configs/entropic_wgan/fig1_half_circle_laplace_entropic.yaml")
    assert composed["model"]["class_path"].endswith("EntropicWGAN")
    args = with_composed_configs(
        ["--config", "configs/quickstart.yaml", "--trainer.callbacks+=callbacks/w2.yaml"]
    )
    assert Path(args[2].partition("=")[2]).samefile(ROOT / "callbacks" / "w2.yaml")


@pytest.mark.slow
def test_dpot_fit_reads_the_packaged_quickstart_outside_the_checkout(tmp_path):
    env = {**os.environ, "DPOT_LEDGER_DIR": str(tmp_path / "ledger")}
    out = subprocess.run(
        [sys.executable, "-m", "lightning_dpot.cli", "fit", "--config", "configs/quickstart.yaml",
         "--print_config"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "lightning_dpot.methods.EntropicWGAN" in out.stdout
    assert not any(tmp_path.iterdir()) or {p.name for p in tmp_path.iterdir()} <= {"ledger"}
