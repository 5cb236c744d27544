"""Fault tolerance: SIGKILL a private run at a random step, resume from its last checkpoint, and
compare with an uninterrupted run (the child process is tests/fault_tolerance_child.py).

What must hold after a kill and a resume:
* the same LDP release, bit for bit (loaded from the cache, never redrawn);
* every release the killed process made is composed, also those after its last checkpoint
  (from the run's release journal), and the final step count is the uninterrupted run's;
* for the flow, the same particles;
* the checkpoint on disk is complete (written atomically), and a truncated one is refused.
"""

from __future__ import annotations

import json
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
from lightning_dpot.privacy.accounting.journal import ReleaseJournal

CHILD = Path(__file__).with_name("fault_tolerance_child.py")
STEPS = 12


def _journal_count(root: Path, method: str) -> int:
    """Releases in the run's one journal (a resume continues it)."""
    (path,) = (root / method).glob("privacy_journal-*.jsonl")
    journal_id = json.loads(path.read_text().splitlines()[0])["journal"]
    return len(ReleaseJournal(path, journal_id).read())


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

    if method == "dpswflow_r":
        journaled = _journal_count(tmp_path, method)
        assert kill_step <= journaled <= kill_step + 1  # killed while journaling the next one

    assert _run(tmp_path, "--resume") == 0
    resumed, full = _result(tmp_path, method), _result(uninterrupted, method)
    assert resumed["global_step"] == full["global_step"] == STEPS
    if method == "dpswflow_r":
        # Public subset seed (research mode): the subsets are known, so no amplification is
        # claimed and each release is accounted at rate 1 (b of b). The releases the killed
        # process made after its checkpoint count too: the resumed run repeats those steps.
        assert full["history"] == [(pytest.approx(1.4626, abs=1e-4), 1.0, STEPS)]
        repeated = journaled - saved_step
        assert resumed["history"] == [(full["history"][0][0], 1.0, STEPS + repeated)]
        assert resumed["epsilon"] >= full["epsilon"]
        torch.testing.assert_close(resumed["particles"], full["particles"], rtol=0, atol=0)
    else:
        # The release (secret seed) comes back from the killed run's cache, bit for bit; the
        # uninterrupted run, with its own secret seed, made a different one.
        assert resumed["release_sha256"] == killed_release != full["release_sha256"]
        assert len(list((tmp_path / "cache").glob("release-*.pt"))) == 1


def test_sigkill_between_checkpoints_counts_every_release_whose_output_left(tmp_path):
    """Checkpoints every 5 steps; the child prints a line after every step's release (its
    output leaves the process) and is killed after step 8's. The resumed run restarts from the
    step-5 checkpoint, and its report composes the 8 (or 9) releases the killed process made
    plus the 7 it makes again, not the 12 steps of the checkpointed history."""
    every, kill_step = 5, 8
    code = _run(tmp_path, "--every", str(every), "--flow-only", kill=("dpswflow_r", kill_step))
    assert code == -signal.SIGKILL
    last = tmp_path / "dpswflow_r" / "ckpt" / "last.ckpt"
    assert AtomicCheckpointIO().load_checkpoint(last)["global_step"] == every
    journaled = _journal_count(tmp_path, "dpswflow_r")
    assert kill_step <= journaled <= kill_step + 1

    assert _run(tmp_path, "--resume", "--every", str(every), "--flow-only") == 0
    resumed = _result(tmp_path, "dpswflow_r")
    assert resumed["global_step"] == STEPS
    assert resumed["releases"] == journaled + STEPS - every >= kill_step + STEPS - every
    assert resumed["history"][0][2] == resumed["releases"]
    assert _journal_count(tmp_path, "dpswflow_r") == resumed["releases"]


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
