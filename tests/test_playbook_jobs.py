"""``benchmarks/gpu_playbook.py --single-run``: one private run continued across time-limited
jobs, on the CPU (``--tiny``, generated IDX files, in-process calls). Two jobs, the second on a
state folder moved to another path, reach the uninterrupted run's weights bit for bit and its
ε; a job that would change the run's plan is refused in one line; a job ends at its time limit
with a checkpoint."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from test_gpu_playbook import _fashion_idx, playbook  # noqa: F401 (the fixture)

CELL = Path("cells/dp_sinkhorn_4steps/fashion_mnist/eps10/seed0")
#: Public noise and Poisson seeds, so that two runs can be compared (they void the guarantee;
#: with a public Poisson seed the accountant claims no amplification). q = 1/2: two steps an
#: epoch, so that the first job ends inside an epoch.
COMPARABLE = [
    "--set", "model.init_args.noise_seed=5",
    "--set", "data.init_args.seed=3",
    "--set", "data.init_args.sample_rate=0.5",
]  # fmt: skip


def _job(playbook, data: Path, state: Path, *more: str, **kwargs) -> dict:  # noqa: F811
    argv = [
        "--data-dir", str(data), "--device", "cpu", "--tiny", "--single-run", "dp_sinkhorn",
        "--steps", "4", *COMPARABLE, "--state", str(state), *more,
    ]  # fmt: skip
    return playbook.main(argv, **kwargs)


def _generator(state: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(state / CELL / "checkpoints" / "last.ckpt", weights_only=False)
    return {k: v for k, v in checkpoint["state_dict"].items() if k.startswith("generator.")}


def _privacy(state: Path) -> dict:
    return json.loads((state / CELL / "report.json").read_text())["privacy"]


def test_two_jobs_on_a_moved_state_folder_reach_the_uninterrupted_run_bit_for_bit(
    tmp_path,
    playbook,  # noqa: F811
    capsys,
):
    data = _fashion_idx(tmp_path / "data")
    first_place, second_place = tmp_path / "machine_a" / "state", tmp_path / "machine_b" / "state"
    first = _job(playbook, data, first_place, "--job-steps", "3")
    assert first["steps_done"] == 3 and first["steps_left"] == 1 and not first["finished"]
    assert first["jobs"] == 1 and first["last_job"]["ended_by"] == "--job-steps"
    assert first["releases"] == 3 and 0 < first["epsilon"] < 10.0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "3 of 4 steps after job 1" in line and "run again to continue" in line
    assert not (first_place / "results" / "runs" / "dp_sinkhorn_4steps.json").exists()

    shutil.move(first_place, second_place)  # the next job, on another machine
    second = _job(playbook, data, second_place)
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .startswith("dp_sinkhorn_4steps: finished, 4 steps in 2 jobs")
    )
    whole = _job(playbook, data, tmp_path / "whole")
    assert second["finished"] and whole["finished"] and second["jobs"] == 2 == whole["jobs"] + 1
    assert second["steps_done"] == whole["steps_done"] == 4
    # the same weights, bit for bit, and the same accountant report: every release counted once
    jobs, uninterrupted = _generator(second_place), _generator(tmp_path / "whole")
    assert jobs.keys() == uninterrupted.keys() and len(jobs) > 2
    assert all(torch.equal(jobs[k], uninterrupted[k]) for k in jobs)
    moved, alone = _privacy(second_place), _privacy(tmp_path / "whole")
    assert moved["epsilon"] == alone["epsilon"] == second["epsilon"] <= 10.0
    assert moved["releases"] == alone["releases"] == 4
    assert moved["noise_multiplier"] == alone["noise_multiplier"] == first["noise_multiplier"]
    assert Path(moved["journal"]).parent == second_place / CELL  # continued where it moved
    assert len(Path(moved["journal"]).read_text().splitlines()) == 1 + 4
    assert second["journal"] == str(CELL / Path(moved["journal"]).name)  # relative
    # scored like the playbook's runs, once the run reached its length
    result = json.loads((second_place / "results" / "runs" / "dp_sinkhorn_4steps.json").read_text())
    assert result["steps"] == result["planned_steps"] == 4 and result["jobs"] == 2
    assert result["privacy"]["epsilon"] == moved["epsilon"]
    assert set(result["metrics"]["utility"]) == {"logreg", "mlp", "cnn"}
    assert "| dp_sinkhorn | 4 |" in (second_place / "results" / "results.md").read_text()

    # a job never changes the plan: another length or another setting is refused in one line
    with pytest.raises(SystemExit, match=r"--steps 6 but the run in .* planned for 4 steps"):
        _job(playbook, data, second_place, "--steps", "6")
    with pytest.raises(SystemExit, match=r"model\.init_args\.noise_seed differ"):
        _job(playbook, data, second_place, "--set", "model.init_args.noise_seed=6")
    again = _job(playbook, data, second_place)  # finished: nothing is trained again
    assert "nothing left to do" in capsys.readouterr().out and again["jobs"] == 2
    assert all(torch.equal(_generator(second_place)[k], jobs[k]) for k in jobs)


def test_a_job_ends_at_its_time_limit_with_a_checkpoint_and_says_what_is_left(
    tmp_path,
    playbook,  # noqa: F811
    capsys,
):
    """A job of 10 minutes with a 1-minute margin, started 9 minutes ago: its first step ends
    past the deadline, so it writes the checkpoint and stops there."""
    data = _fashion_idx(tmp_path / "data", n_train=40, n_test=20)
    state = tmp_path / "state"
    argv = ["--steps", "1000", "--job-minutes", "10", "--margin-minutes", "1"]
    progress = _job(playbook, data, state, *argv, started=time.monotonic() - 540.0)
    assert progress["last_job"]["ended_by"] == "time limit"
    assert progress["steps_done"] == 1 and progress["steps_left"] == 999
    assert progress["releases"] == 1 and not progress["finished"]
    stored = json.loads((state / "progress.json").read_text())
    assert stored["steps_done"] == 1 and stored["planned_steps"] == 1000
    assert torch.load(state / stored["checkpoint"], weights_only=False)["global_step"] == 1
    line = capsys.readouterr().out.splitlines()[-1]
    assert "1 of 1,000 steps after job 1" in line and "run again to continue" in line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--steps", "4"], "--steps go with --single-run"),
        (["--single-run", "dp_sinkhorn"], "--single-run needs --state"),
        (
            ["--single-run", "dp_sinkhorn", "--state", "s", "--work-dir", "w"],
            "--work-dir does not go with --single-run",
        ),
        (
            ["--single-run", "dp_sinkhorn", "--state", "s", "--job-minutes", "5"],
            "--margin-minutes (5) must be below --job-minutes (5)",
        ),
        (
            ["--single-run", "dp_sinkhorn", "--state", "s", "--set", "trainer.max_steps=9"],
            "--set trainer.max_steps: the run's length is --steps",
        ),
    ],
)
def test_a_bad_job_argument_is_refused_in_one_line_naming_it(
    change,
    message,
    tmp_path,
    playbook,  # noqa: F811
    capsys,
):
    data = _fashion_idx(tmp_path / "data", n_train=10, n_test=10)
    with pytest.raises(SystemExit):
        playbook.parse_args(["--data-dir", str(data), "--device", "cpu", *change])
    assert message in capsys.readouterr().err
