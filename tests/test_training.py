"""`dpot fit` as a user runs it (a subprocess in a fresh folder, the W&B run logger of the
quickstart): no third-party noise in its output while the package's own warnings still show,
checkpoints in ``runs/<run>/checkpoints/``, a resume from there, and ``dpot sample`` finding the
run's config from the checkpoint."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from lightning_utilities.core import rank_zero

from lightning_dpot.cli import main
from lightning_dpot.commands.checkpoint import find_run_config
from lightning_dpot.training import quiet_dependencies

REPO = Path(__file__).resolve().parents[1]
#: What Lightning, W&B, torch and KeOps printed on every `dpot fit` before they were silenced.
NOISE = (
    "💡 Tip",
    "litlogger",
    "litmodels",
    "The anonymous setting has no effect",
    "configure_optimizers` will be overridden",
    "LeafSpec",
    "[KeOps]",
)
#: The quickstart, tiny; the unequal batches make ExactOT fall back to entropic OT with a
#: warning of the package's own, which must still show.
TINY = [
    "--config",
    str(REPO / "configs/quickstart.yaml"),
    "--data.init_args.source.init_args.n=1000",
    "--data.init_args.batch_size=200",
    "--model.init_args.generated_batch_size=100",
    "--model.init_args.regularization=none",
    "--trainer.callbacks.init_args.num_samples=200",
]


def _fit(folder: Path, *extra: str) -> str:
    """``dpot fit`` of :data:`TINY` in a subprocess with ``folder`` as its working directory
    and ledger; its stdout and stderr."""
    env = {**os.environ, "DPOT_LEDGER_DIR": str(folder / "ledger")}
    command = [sys.executable, "-m", "lightning_dpot.cli", "fit", *TINY, *extra]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, str]:
    """A 3-step run in a fresh folder: (that folder, what the run printed)."""
    folder = tmp_path_factory.mktemp("fit")
    return folder, _fit(folder, "--trainer.max_steps=3")


def test_dpot_fit_prints_no_third_party_noise_and_still_the_packages_warnings(fitted):
    _, output = fitted
    assert [noise for noise in NOISE if noise in output] == []
    assert "ExactOT: batch sizes 100 and 200 are unequal" in output
    assert "dpot fit finished" in output


def test_checkpoints_are_written_to_the_run_directory(fitted):
    folder, output = fitted
    (run_dir,) = (folder / "runs").iterdir()
    assert [p.relative_to(run_dir) for p in run_dir.rglob("*.ckpt")] == [
        Path("checkpoints/epoch=0-step=3.ckpt")
    ]
    assert "files: checkpoints/epoch=0-step=3.ckpt" in output
    assert find_run_config(run_dir / "checkpoints/epoch=0-step=3.ckpt") == run_dir / "config.yaml"


def test_a_run_resumes_from_its_checkpoint_and_samples_from_it(fitted, tmp_path, capsys):
    folder, _ = fitted
    (first,) = (folder / "runs").iterdir()
    ckpt = first / "checkpoints/epoch=0-step=3.ckpt"
    _fit(folder, "--trainer.max_steps=5", f"--ckpt_path={ckpt}")
    (resumed,) = (run for run in (folder / "runs").iterdir() if run != first)
    assert json.loads((resumed / "report.json").read_text())["global_step"] == 5
    assert (resumed / "checkpoints/epoch=0-step=5.ckpt").is_file()
    out = tmp_path / "samples.pt"
    main(["sample", "--ckpt_path", str(ckpt), "--num_samples", "7", "--output", str(out)])
    assert torch.load(out, weights_only=True).shape == (7, 2)


def test_quiet_dependencies_drops_only_the_named_messages():
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    rank_zero.log.addHandler(handler)
    level = rank_zero.log.level
    rank_zero.log.setLevel(logging.INFO)
    leafspec = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(...)` instead."
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_dependencies():
                warnings.warn(leafspec, FutureWarning, stacklevel=1)
                warnings.warn("ExactOT: batch sizes 1 and 2 are unequal", UserWarning, stacklevel=1)
                warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
                rank_zero.log.info("💡 Tip: For seamless cloud logging, try installing litlogger")
                rank_zero.log.info("GPU available: False, used: False")
            warnings.warn(leafspec, FutureWarning, stacklevel=1)  # outside the block: shown
    finally:
        rank_zero.log.removeHandler(handler)
        rank_zero.log.setLevel(level)
    assert [str(w.message) for w in caught] == [
        "ExactOT: batch sizes 1 and 2 are unequal",
        "another FutureWarning",
        leafspec,
    ]
    assert seen == ["GPU available: False, used: False"]


def test_the_keops_import_notice_goes_to_the_debug_log_not_the_output():
    """pykeops prints a CUDA notice on import (here: no CUDA libraries); stdout stays for the
    commands' JSON and stderr for the run's own messages."""
    code = (
        "from lightning_dpot.ot.keops import keops_import_error\n"
        "assert keops_import_error() is None\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "[KeOps]" not in done.stderr
