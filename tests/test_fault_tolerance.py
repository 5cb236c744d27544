"""Fault tolerance: SIGKILL a private run at a random step, resume from its last checkpoint, and
compare with an uninterrupted run (the child process is tests/fault_tolerance_child.py).

What must hold after a kill and a resume:
* the same LDP release, bit for bit (loaded from the cache, never redrawn);
* the same accountant history, ε and final step count (no lost or double-counted step);
* for the flow, the same particles;
* the checkpoint on disk is complete (written atomically), and a truncated one is refused.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_dpot.data.release import Release, tensor_sha256
from lightning_dpot.plugins import AtomicCheckpointIO

CHILD = Path(__file__).with_name("fault_tolerance_child.py")
STEPS = 12


def _run(root: Path, *extra: str, kill: tuple[str, int] | None = None) -> int:
    """Run the child; with ``kill=(method, step)`` SIGKILL it as soon as it reports that step."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(STEPS), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert child.stdout is not None
    for line in child.stdout:
        if kill is not None and line.split() == ["STEP", kill[0], str(kill[1])]:
            os.kill(child.pid, signal.SIGKILL)
            break
    child.stdout.close()
    return child.wait(timeout=300)


def _result(root: Path, method: str) -> dict:
    return torch.load(root / method / "result.pt", weights_only=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uninterrupted")
    assert _run(root) == 0
    return root


@pytest.mark.parametrize("method", ["dpswflow_r", "entropic_wgan"])
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted, method):
    kill_step = random.Random(f"{method}-0").randint(2, STEPS - 2)
    assert _run(tmp_path, kill=(method, kill_step)) == -signal.SIGKILL
    last = tmp_path / method / "ckpt" / "last.ckpt"
    saved_step = AtomicCheckpointIO().load_checkpoint(last)["global_step"]
    assert kill_step - 1 <= saved_step <= kill_step  # killed right after, or while, saving
    if method == "entropic_wgan":
        (cached,) = (tmp_path / "cache").glob("release-*.pt")
        killed_release = tensor_sha256(Release.load(cached).data)

    assert _run(tmp_path, "--resume") == 0
    resumed, full = _result(tmp_path, method), _result(uninterrupted, method)
    assert resumed["global_step"] == full["global_step"] == STEPS
    if method == "dpswflow_r":
        # Public subset seed (research mode): the subsets are known, so no amplification is
        # claimed and each of the 12 releases is accounted at rate 1 (b of b).
        assert resumed["history"] == full["history"] == [(pytest.approx(1.4626, abs=1e-4), 1.0, 12)]
        assert resumed["epsilon"] == full["epsilon"]
        torch.testing.assert_close(resumed["particles"], full["particles"], rtol=0, atol=0)
    else:
        # The release (secret seed) comes back from the killed run's cache, bit for bit; the
        # uninterrupted run, with its own secret seed, made a different one.
        assert resumed["release_sha256"] == killed_release != full["release_sha256"]
        assert len(list((tmp_path / "cache").glob("release-*.pt"))) == 1


def test_truncated_checkpoint_is_refused_with_a_clear_error(tmp_path, uninterrupted):
    good = uninterrupted / "dpswflow_r" / "ckpt" / "last.ckpt"
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated\.ckpt'? is not a readable checkpoint"):
        AtomicCheckpointIO().load_checkpoint(bad)


def test_atomic_save_never_leaves_a_partial_file(tmp_path):
    io = AtomicCheckpointIO()
    target = tmp_path / "deep" / "x.ckpt"
    io.save_checkpoint({"a": torch.arange(5)}, target)
    io.save_checkpoint({"a": torch.arange(6)}, target)  # replaced in one rename
    assert torch.equal(io.load_checkpoint(target)["a"], torch.arange(6))
    assert [p.name for p in target.parent.iterdir()] == ["x.ckpt"]  # no staging file left


def _ldp_fit(root: Path, cache: Path, epsilon: float, ckpt_path: str | None = None):
    import lightning as L

    from lightning_dpot.data import HalfCircle, PrivatizedDataModule
    from lightning_dpot.methods import EntropicWGAN
    from lightning_dpot.nn import MLPGenerator

    dm = PrivatizedDataModule(
        HalfCircle(n=200, n_test=10), "gaussian", epsilon=epsilon, delta=1e-4, batch_size=50,
        cache_dir=str(cache),
    )  # fmt: skip
    trainer = L.Trainer(
        max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root, plugins=[AtomicCheckpointIO()],
    )  # fmt: skip
    trainer.fit(EntropicWGAN(MLPGenerator(2, (2,), (8,))), dm, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize(
    ("cache", "epsilon", "match"),
    [
        ("other", 5.0, r"release_sha256: checkpoint '[0-9a-f]{64}', this run '[0-9a-f]{64}'"),
        ("same", 2.0, r"epsilon: checkpoint 5\.0, this run 2\.0"),
    ],
)
def test_resume_on_another_release_or_budget_is_refused(tmp_path, cache, epsilon, match):
    first = _ldp_fit(tmp_path / "a", tmp_path / "same", 5.0)
    checkpoint = tmp_path / "a.ckpt"
    first.save_checkpoint(checkpoint)
    _ldp_fit(tmp_path / "ok", tmp_path / "same", 5.0, str(checkpoint))  # same release: fine
    with pytest.raises(ValueError, match=match):
        _ldp_fit(tmp_path / "b", tmp_path / cache, epsilon, str(checkpoint))
