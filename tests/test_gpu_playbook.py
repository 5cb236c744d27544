"""``benchmarks/gpu_playbook.py`` end to end on the CPU (``--tiny``: 200 generated images in
Fashion-MNIST's IDX format, small models, both methods at two run lengths), with the libraries
the GPU machine lacks (wandb, pykeops, PyWavelets, torch-fidelity) made unimportable; then a
second call that reuses every run; the ladder planner; and the command line's errors."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_playbook.py"

#: Run in the child before the playbook: the modules are unimportable and their distributions
#: invisible to ``importlib.metadata`` (as where they are not installed: Lightning and
#: torchmetrics decide from the metadata whether to import them).
WITHOUT_GPU_MACHINE_LACKS = """
import importlib.metadata as metadata, runpy, sys
for name in ("wandb", "pykeops", "pywt", "torch_fidelity"):
    sys.modules[name] = None
ABSENT = {"wandb", "pykeops", "pywavelets", "pywt", "torch-fidelity", "torch_fidelity"}
def _hidden(real):
    def lookup(name, *args, **kwargs):
        if name.lower() in ABSENT:
            raise metadata.PackageNotFoundError(name)
        return real(name, *args, **kwargs)
    return lookup
metadata.distribution = _hidden(metadata.distribution)
metadata.version = _hidden(metadata.version)
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def playbook():
    spec = importlib.util.spec_from_file_location("gpu_playbook", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file as Fashion-MNIST ships it: magic 0 0 8 ndim, big-endian sizes, uint8 data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">i", s) for s in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def _fashion_idx(folder: Path, n_train: int = 200, n_test: int = 100) -> Path:
    """28x28 uint8 images of 10 classes (a bright bar whose height depends on the class)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 40, (n, 28, 28))
        for image, label in zip(images, labels, strict=True):
            image[2 * label : 2 * label + 8, 4:24] += 200
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return folder


def test_the_playbook_fits_its_budget_without_the_libraries_the_gpu_lacks_and_resumes(
    tmp_path, playbook
):
    data, out, work = _fashion_idx(tmp_path / "data"), tmp_path / "out", tmp_path / "work"
    argv = [
        "--data-dir", str(data), "--out", str(out), "--work-dir", str(work), "--device", "cpu",
        "--tiny", "--budget-minutes", "2", "--probe-steps", "2", "--max-steps", "4",
        "--rungs", "1", "--ratio", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", WITHOUT_GPU_MACHINE_LACKS, str(SCRIPT), *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    names = ["dp_sinkhorn_2steps", "dp_sinkhorn_4steps", "dpswflow_r_2steps", "dpswflow_r_4steps"]
    assert [run["run"] for run in summary["runs"]] == names
    assert summary["reused_runs"] == [] and summary["skipped_runs"] == []
    assert summary["device"].startswith("cpu") and summary["torch"]
    assert summary["within_budget"] and summary["wall_seconds"] <= 120
    plan = summary["plan"]
    assert plan["ladders"] == {"dp_sinkhorn": [2, 4], "dpswflow_r": [2, 4]}
    assert sum(plan["predicted_seconds"].values()) <= plan["seconds_for_ladders"]
    assert 1 <= plan["autoencoder_epochs"] <= 30
    assert all(seconds > 0 for seconds in summary["step_seconds"].values())
    sigma = {}
    for run in summary["runs"]:
        privacy = run["privacy"]
        report = json.loads((Path(run["cell_dir"]) / "report.json").read_text())["privacy"]
        assert privacy["epsilon"] == report["epsilon"]  # the run's own accountant
        assert 0 < privacy["epsilon"] <= run["target_epsilon"] == 10.0
        assert privacy["accountant"] == "rdp" and "exceeds_target" not in privacy
        assert run["steps"] == run["planned_steps"]
        assert run["step_seconds"] > 0 and run["metrics"]["fd_classifier"] >= 0
        sigma[run["run"]] = run["noise_multiplier"]
        if run["method"] == "dp_sinkhorn":  # conditional: the downstream classifiers
            assert set(run["metrics"]["utility"]) == {"logreg", "mlp", "cnn"}
            assert all(0 <= acc <= 1 for acc in run["metrics"]["utility"].values())
        else:
            assert run["metrics"]["utility"] is None
        assert (out / "samples" / f"{run['run']}.png").read_bytes()[:4] == b"\x89PNG"
    # σ is calibrated for each run's length: the longer run needs more noise for the same ε
    assert 0 < sigma["dp_sinkhorn_2steps"] < sigma["dp_sinkhorn_4steps"]
    assert 0 < sigma["dpswflow_r_2steps"] < sigma["dpswflow_r_4steps"]
    assert (out / "accuracy_vs_steps.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "results.md").read_text()
    assert "| dp_sinkhorn | 4 |" in table and "| dpswflow_r | 2 |" in table
    # the suites' one published table, beside the longest run of each method
    cnn = summary["runs"][1]["metrics"]["utility"]["cnn"]
    assert (
        f"| dp_sinkhorn | Cao et al. 2021, Table 1 | 10 | CNN accuracy | 0.711 | {cnn:.3g} |"
        in table
    )
    assert (
        "| dpswflow_r | Sebag et al. 2023, Table 1 | 10 | FID (Inception) | 88 | not measured |"
        in table
    )

    written = {path: path.read_bytes() for path in (out / "runs").glob("*.json")}
    again = playbook.main(argv)
    assert again["reused_runs"] == names and again["runs"] == summary["runs"]
    assert {path: path.read_bytes() for path in (out / "runs").glob("*.json")} == written


def test_the_ladder_fits_its_share_grows_geometrically_and_stops_at_the_papers_budget(playbook):
    timing = playbook.Timing(step_seconds=0.04, setup_seconds=10.0, evaluate_seconds=40.0)
    steps = playbook.ladder(timing, 600.0, probe_steps=50, cap=280_000, ratio=4.0, rungs=3)
    assert len(steps) == 3 and steps[0] >= 100
    assert all(3.5 < b / a < 4.5 for a, b in zip(steps, steps[1:], strict=False))
    assert playbook.ladder_seconds(timing, steps) <= 600.0
    assert playbook.ladder(timing, 1e9, 50, 280_000, 4.0, 3)[-1] == 280_000
    assert playbook.ladder(timing, 52.0, 50, 280_000, 4.0, 3) == []  # no run fits
    # 135 s: two runs would reach 680 steps, one reaches 2,100; the one longer run is chosen
    assert playbook.ladder(timing, 135.0, 50, 280_000, 4.0, 3) == [2100]

    cheap = playbook.Timing(step_seconds=0.001, setup_seconds=5.0, evaluate_seconds=5.0)
    caps = {"slow": 280_000, "cheap": 4200}
    plans = playbook.allocate(1000.0, {"slow": timing, "cheap": cheap}, 50, caps, 4.0, 3)
    assert plans["cheap"][-1] == 4200  # capped: the rest of its half goes to the other
    assert playbook.ladder_seconds(timing, plans["slow"]) > 500.0
    costs = {"slow": timing, "cheap": cheap}
    assert sum(playbook.ladder_seconds(t, plans[m]) for m, t in costs.items()) <= 1000.0
    # 100 s: an equal half (50 s) would leave the slow method out; each method is given its
    # shortest useful run (54 s, 10.1 s) first, the rest is shared, and the cheap one's ladder,
    # capped, leaves the remainder to the slow one
    assert playbook.ladder(timing, 50.0, 50, 280_000, 4.0, 3) == []
    plans = playbook.allocate(100.0, costs, 50, caps, 4.0, 3)
    assert plans == {"slow": [620], "cheap": [1000, 4200]}
    assert playbook.allocate(60.0, costs, 50, caps, 4.0, 3)["slow"] == []  # only cheap fits
    assert playbook.autoencoder_epochs(1e6, 235, 0.01) == 30
    assert playbook.autoencoder_epochs(10.0, 235, 0.01) == 4
    assert playbook.round_steps(1475.9) == 1400 and playbook.round_steps(262) == 260


def test_a_failed_run_is_listed_and_a_run_that_no_longer_fits_is_skipped(
    tmp_path, playbook, monkeypatch
):
    """Orchestration only (training replaced): DPSWflow-r's first run fails, DP-Sinkhorn's
    ladder goes on; its first rung overruns its prediction by 500 s, so the next ones no longer
    fit the budget and are skipped, not started."""

    def run(self, method, steps, epochs):
        if method == "dpswflow_r":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if steps > 50 and not self.runs.keys() - {"dp_sinkhorn_50steps"}:
            self.start -= 500.0  # the first rung took far longer than predicted
        name = f"{method}_{steps}steps"
        self.runs[name] = playbook.PlaybookRun(
            run=name, method=method, method_class="DPSinkhorn", planned_steps=steps, steps=steps,
            target_epsilon=10.0, noise_multiplier=0.5, epsilon_pld=None,
            privacy={"epsilon": 9.99, "accountant": "rdp", "adjacency": "add_or_remove_one"},
            metrics={"fd_classifier": 100.0, "utility": {"logreg": 0.5, "mlp": 0.5, "cnn": 0.5}},
            step_seconds=0.01, setup_seconds=1.0, evaluate_seconds=1.0,
            fit_seconds=1.0 + 0.01 * steps, device="cpu", torch="", tiny=True, fingerprint="",
            cell_dir="",
        )  # fmt: skip
        return self.runs[name]

    monkeypatch.setattr(playbook.Playbook, "run", run)
    monkeypatch.setattr(
        playbook.Playbook,
        "time_autoencoder",
        lambda self: {"step_seconds": 0.01, "setup_seconds": 1.0, "steps_per_epoch": 10},
    )
    data, out = _fashion_idx(tmp_path / "data", 10, 10), tmp_path / "out"
    summary = playbook.main(
        ["--data-dir", str(data), "--out", str(out), "--work-dir", str(tmp_path / "work"),
         "--device", "cpu", "--budget-minutes", "10"]
    )  # fmt: skip
    assert summary["failed_runs"] == [
        {
            "run": "dpswflow_r_50steps",
            "error": "RuntimeError: CUDA error: an illegal memory access was encountered",
        }
    ]
    assert "illegal memory access" in (out / "errors" / "dpswflow_r_50steps.txt").read_text()
    ladder = summary["plan"]["ladders"]["dp_sinkhorn"]
    assert list(summary["plan"]["ladders"]) == ["dp_sinkhorn"] and len(ladder) == 4
    assert [run["steps"] for run in summary["runs"]] == ladder[:2]
    assert [s["run"] for s in summary["skipped_runs"]] == [
        f"dp_sinkhorn_{t}steps" for t in ladder[2:]
    ]
    assert not (out / "plan.json").exists()  # a method is missing: the next call measures again
    table = (out / "results.md").read_text()
    assert "Failed: dpswflow_r_50steps: RuntimeError" in table and "Skipped" in table


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--budget-minutes", "0"], "--budget-minutes must be a finite number > 0, got '0'"),
        (["--probe-steps", "1.5"], "--probe-steps must be an integer >= 1, got '1.5'"),
        (["--ratio", "1"], "--ratio must be a finite number > 1, got '1'"),
        (["--max-steps", "60"], "--max-steps must be >= 2 × --probe-steps = 100"),
        (["--data-dir", "/nonexistent"], "--data-dir='/nonexistent' lacks train-images-idx3"),
        (
            ["--feature_extractor_weights_path", "/nonexistent/inception.pth"],
            "--feature_extractor_weights_path: feature_extractor_weights_path="
            "'/nonexistent/inception.pth' is not an existing file",
        ),
    ],
)
def test_a_bad_argument_is_refused_in_one_line_naming_it(
    change, message, tmp_path, playbook, capsys
):
    data = _fashion_idx(tmp_path / "data", n_train=10, n_test=10)
    with pytest.raises(SystemExit):
        playbook.parse_args(["--data-dir", str(data), "--device", "cpu", *change])
    assert message in capsys.readouterr().err
