"""Every ready-made callback (the top-level callbacks/ folder) added with one flag to a tiny
``dpot fit`` of each method family: it does its job, or the run is refused before its first
step with one line naming the callback (or the method) and what it needs.

Families: a 2-D MLP generator (EntropicWGAN on the half-circle, local DP), an image DCGAN
(EntropicWGAN on 8×8 digits, local DP), a class-conditional generator (DP-Sinkhorn on the
digits, central DP) and a DPSW particle flow (DPSWflow-r on a 2-D Gaussian mixture).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tiny_runs import DCGAN_MODEL, DIGITS_DATA

from lightning_dpot.cli import main
from lightning_dpot.data.ledger import LEDGER_ENV

REPO = Path(__file__).resolve().parents[2]
CALLBACKS = REPO / "callbacks"
QUIET = {
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
}
FAMILIES = {
    "mlp_2d": {
        "trainer": {"max_steps": 3, **QUIET},
        "model": {
            "class_path": "lightning_dpot.methods.EntropicWGAN",
            "init_args": {
                "generator": {
                    "class_path": "lightning_dpot.nn.MLPGenerator",
                    "init_args": {"latent_dim": 2, "output_shape": [2], "hidden": [16]},
                },
            },
        },
        "data": {
            "class_path": "lightning_dpot.data.PrivatizedDataModule",
            "init_args": {
                "source": {
                    "class_path": "lightning_dpot.data.HalfCircle",
                    "init_args": {"n": 400, "n_test": 200},
                },
                "mechanism": "laplace",
                "epsilon": 5.0,
                "batch_size": 100,
            },
        },
    },
    "dcgan": {"trainer": {"max_steps": 3, **QUIET}, "model": DCGAN_MODEL, "data": DIGITS_DATA},
    "conditional": {
        "trainer": {"max_steps": 3, **QUIET},
        "model": {
            "class_path": "lightning_dpot.methods.DPSinkhorn",
            "init_args": {
                "generator": {
                    "class_path": "lightning_dpot.nn.ConditionalDCGANGenerator",
                    "init_args": {
                        "num_classes": 10,
                        "latent_dim": 4,
                        "embed_dim": 2,
                        "image_size": 8,
                        "hidden_channels": [8, 8, 8],
                    },
                },
                "noise_multiplier": 1.0,
                "delta": 1.0e-5,
                "conditional": True,
            },
        },
        "data": {
            "class_path": "lightning_dpot.data.CentralDPDataModule",
            "init_args": {
                "source": {"class_path": "lightning_dpot.data.Digits"},
                "expected_batch_size": 50,
            },
        },
    },
    "dpsw_flow_2d": {
        "trainer": {"max_steps": 3, **QUIET},
        "model": {
            "class_path": "lightning_dpot.methods.DPSWFlowR",
            "init_args": {"num_particles": 300, "num_directions": 20, "noise_scale": 30.0},
        },
        "data": {
            "class_path": "lightning_dpot.data.PrivateLatentDataModule",
            "init_args": {
                "source": {
                    "class_path": "lightning_dpot.data.GaussianMixture2D",
                    "init_args": {"n": 400, "n_test": 200},
                },
                "normalize": "ball",
                "batch_size": 100,
                "steps_per_epoch": 3,
            },
        },
    },
}
#: Smaller evaluations than the files ship with (appended after each file's flag).
SMALLER = {
    "fid_classifier": ["num_samples=100"],
    "utility_quick": ["num_samples=200", "classifiers=[logreg]"],
    "w2": ["num_samples=100", "subsample=50", "repeats=2"],
    "manifold": ["num_samples=100", "every_n_epochs=1"],
}


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _w2(out: Path) -> None:
    assert _report(out)["w2"]["final"]["w2"] > 0


def _fd(out: Path) -> None:
    assert _report(out)["fd_classifier"]["final"]["fd_classifier"] > 0


def _utility(out: Path) -> None:
    assert 0.0 <= _report(out)["utility"]["final"]["logreg"] <= 1.0


def _manifold(out: Path) -> None:
    metrics = _report(out)["metrics"]
    assert metrics["manifold_error"] >= 0 and 0 <= metrics["arc_coverage"] <= 1
    assert (out / "scatter.png").is_file()


def _samples(out: Path) -> None:
    assert (out / "samples.png").is_file() and (out / "samples_epoch0.png").is_file()


def _accounted(out: Path) -> None:
    privacy = json.loads((out / "privacy_report.json").read_text())
    assert 0 < privacy["epsilon"] <= 10.0 and privacy["delta"] == 1e-5


NO_LABELS = "held-out split has no labels"
NO_IMAGES = "FIDEvaluation compares images (records (C, H, W) with C in (1, 3))"
NO_CURVE = "ManifoldEvaluation measures the distance to a known curve"
NO_INCEPTION = "Inception weights not found: feature_extractor_weights_path=None"
LOCAL_DP = "EntropicWGAN does not subclass"

#: (family, callback file) → a check of the finished run, or the refusal's expected text.
EXPECTED: dict[tuple[str, str], Callable[[Path], None] | str] = {
    ("mlp_2d", "fid_classifier"): NO_IMAGES,
    ("mlp_2d", "fid_inception"): NO_INCEPTION,
    ("mlp_2d", "manifold"): _manifold,
    ("mlp_2d", "privacy_accountant"): LOCAL_DP,
    ("mlp_2d", "sample_grid"): _samples,
    ("mlp_2d", "utility_quick"): NO_LABELS,
    ("mlp_2d", "w2"): _w2,
    ("dcgan", "fid_classifier"): _fd,
    ("dcgan", "fid_inception"): NO_INCEPTION,
    ("dcgan", "manifold"): NO_CURVE,
    ("dcgan", "privacy_accountant"): LOCAL_DP,
    ("dcgan", "sample_grid"): _samples,
    ("dcgan", "utility_quick"): "EntropicWGAN is unconditional",
    ("dcgan", "w2"): _w2,
    ("conditional", "fid_classifier"): _fd,
    ("conditional", "fid_inception"): NO_INCEPTION,
    ("conditional", "manifold"): NO_CURVE,
    ("conditional", "privacy_accountant"): _accounted,
    ("conditional", "sample_grid"): _samples,
    ("conditional", "utility_quick"): _utility,
    ("conditional", "w2"): _w2,
    ("dpsw_flow_2d", "fid_classifier"): NO_IMAGES,
    ("dpsw_flow_2d", "fid_inception"): NO_INCEPTION,
    ("dpsw_flow_2d", "manifold"): NO_CURVE,
    ("dpsw_flow_2d", "privacy_accountant"): _accounted,
    ("dpsw_flow_2d", "sample_grid"): _samples,
    ("dpsw_flow_2d", "utility_quick"): NO_LABELS,
    ("dpsw_flow_2d", "w2"): _w2,
}


def test_every_callback_file_is_tried_with_every_family():
    files = {path.stem for path in CALLBACKS.glob("*.yaml")}
    assert set(EXPECTED) == {(family, name) for family in FAMILIES for name in files}


def _steps_run(out: Path) -> int:
    return _report(out)["global_step"] if (out / "report.json").is_file() else 0


@pytest.mark.parametrize(
    ("family", "callback"), sorted(EXPECTED), ids=[f"{f}-{c}" for f, c in sorted(EXPECTED)]
)
def test_a_ready_made_callback_does_its_job_or_refuses_the_run_before_it_starts(
    family, callback, tmp_path, capsys
):
    config, out = tmp_path / "config.yaml", tmp_path / "out"
    config.write_text(yaml.safe_dump({"seed_everything": 0, **FAMILIES[family]}))
    args = ["fit", "--config", str(config), f"--trainer.default_root_dir={out}"]
    args.append(f"--trainer.callbacks+={CALLBACKS / callback}.yaml")
    args += [f"--trainer.callbacks.init_args.{value}" for value in SMALLER.get(callback, [])]
    if callback == "fid_classifier":  # its default file is in the data's cache_dir
        args.append(f"--trainer.callbacks.init_args.classifier_path={tmp_path / 'clf.pt'}")
    if FAMILIES[family]["data"]["class_path"].endswith("PrivatizedDataModule"):
        args.append(f"--data.init_args.cache_dir={tmp_path / 'cache'}")
    expected = EXPECTED[family, callback]
    if callable(expected):
        main(args)
        expected(out)
        return
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("dpot fit: error: ") and expected in line, line
    assert _steps_run(out) == 0 and not list(out.rglob("*.png"))
    # Refused before anything was released: no release drawn, nothing charged to the ledger.
    assert not list(tmp_path.rglob("release-*")), list(tmp_path.rglob("release-*"))
    ledger = Path(os.environ[LEDGER_ENV]) / "ledger.jsonl"
    assert not ledger.is_file() or not ledger.read_text().strip()
