"""The `dpot` command: a tiny fit of the quickstart config, privatize, account calibrate."""

import json
from pathlib import Path

import pytest
import yaml

from lightning_dpot.cli import main

REPO = Path(__file__).resolve().parents[1]


def _tiny_fit_args(tmp_path, config="configs/quickstart.yaml"):
    return [
        "fit",
        "--config",
        str(REPO / config),
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--data.init_args.source.init_args.n=2000",
        "--data.init_args.batch_size=500",
        f"--data.init_args.cache_dir={tmp_path / 'cache'}",
    ]


def test_quickstart_fit_writes_report_with_privacy_and_manifold_error(
    tmp_path, monkeypatch, capsys, recwarn
):
    monkeypatch.setenv("WANDB_SILENT", "true")
    main(_tiny_fit_args(tmp_path))
    assert not [w for w in recwarn if "args parameter is intended" in str(w.message)]
    out = capsys.readouterr().err
    assert "dpot fit finished" in out  # the end-of-run summary (stderr: stdout is for data)
    assert "privacy: local DP, ε=5, δ=0.0001 per record (gaussian)" in out
    assert "report.json" in out and "final metrics: " in out and "manifold_error=" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["method"] == "EntropicWGAN"
    assert report["privacy"]["mechanism"] == "gaussian"
    assert report["privacy"]["epsilon"] == 5.0
    assert report["privacy"]["sensitivity_l2"] == 2.0
    assert report["loss"]["regularization"] == "entropic"
    assert report["loss"]["entropic_reg"] == pytest.approx(
        2 * report["privacy"]["noise_scale"] ** 2
    )
    assert report["metrics"]["manifold_error"] >= 0
    assert Path(report["config_path"]).is_file()
    assert (run_dir / "scatter.png").is_file()
    main(["report", str(run_dir)])  # the report as a table, one dotted key per line
    table = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["privacy.epsilon", "5"] for line in table)
    assert any(line.startswith("metrics.manifold_error ") for line in table)


def test_a_bad_value_ends_in_one_line_naming_it(capsys, monkeypatch):
    args = ["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--data.init_args.epsilon=-3"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("dpot fit: error: epsilon must be a finite number > 0, got -3.0")
    )
    assert "Traceback" not in err and "Union subtypes" not in err
    monkeypatch.setenv("DPOT_DEBUG", "1")  # the traceback on request
    with pytest.raises(ValueError):
        main(args)
    with pytest.raises(SystemExit, match="2"):
        main(["report", "/nonexistent/run"])


def test_privatize_writes_a_release_a_trainer_can_use(tmp_path, capsys):
    config = tmp_path / "data.yaml"
    quick = yaml.safe_load((REPO / "configs/quickstart.yaml").read_text())
    quick["data"]["init_args"]["source"]["init_args"]["n"] = 1000
    quick["data"]["init_args"]["cache_dir"] = str(tmp_path / "cache")
    config.write_text(yaml.safe_dump({"data": quick["data"]}))
    main(["privatize", "--config", str(config), "--output", str(tmp_path / "release.pt")])
    out = json.loads(capsys.readouterr().out)
    assert out["privacy"]["n_released"] == 1000
    assert (tmp_path / "release.pt").is_file()


def test_account_calibrate_gaussian_prints_sigma(capsys):
    main(
        [
            "account",
            "calibrate",
            "--mechanism",
            "gaussian",
            "--epsilon",
            "25",
            "--delta",
            "1e-4",
            "--sensitivity",
            "40",
        ]
    )
    assert json.loads(capsys.readouterr().out)["sigma"] == pytest.approx(9.17, abs=0.01)


def test_account_calibrate_laplace_prints_scale(capsys):
    main(
        [
            "account",
            "calibrate",
            "--mechanism",
            "laplace",
            "--epsilon",
            "196",
            "--sensitivity",
            "1568",
        ]
    )
    assert json.loads(capsys.readouterr().out)["scale"] == pytest.approx(8.0)


def test_account_calibrate_zhao_and_classical(capsys):
    main(
        [
            "account",
            "calibrate",
            "--mechanism",
            "gaussian",
            "--epsilon",
            "0.5",
            "--delta",
            "1e-5",
            "--sensitivity",
            "1",
            "--method",
            "classical",
        ]
    )
    assert json.loads(capsys.readouterr().out)["sigma"] == pytest.approx(9.6896, abs=1e-3)


def test_account_calibrate_refuses_bad_input_with_the_parameter_name():
    with pytest.raises(SystemExit, match="delta must lie in the open interval"):
        main(
            [
                "account",
                "calibrate",
                "--mechanism",
                "gaussian",
                "--epsilon",
                "1",
                "--delta",
                "2",
                "--sensitivity",
                "1",
            ]
        )
    with pytest.raises(SystemExit, match="epsilon must be < 1"):
        main(
            [
                "account",
                "calibrate",
                "--mechanism",
                "gaussian",
                "--epsilon",
                "3",
                "--delta",
                "1e-5",
                "--sensitivity",
                "1",
                "--method",
                "classical",
            ]
        )


def test_top_level_help_lists_commands(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    for command in ("fit", "privatize", "account"):
        assert command in out


def test_every_ready_made_callback_is_added_with_one_flag(capsys):
    """The top-level callbacks/ folder: each file is added to any run with
    --trainer.callbacks+=FILE, and a value can be overridden right after it."""
    from lightning_dpot.cli import run_lightning

    files = sorted((REPO / "callbacks").glob("*.yaml"))
    assert {f.stem for f in files} == {
        "fid_classifier", "fid_inception", "manifold", "privacy_accountant", "sample_grid",
        "utility_quick", "w2",
    }  # fmt: skip
    usable = [f for f in files if f.stem != "fid_inception"]  # needs its weights file
    args = ["--config", str(REPO / "configs/quickstart.yaml"), "--trainer.logger=false"]
    args += [f"--trainer.callbacks+={f}" for f in usable]
    args += [f"--trainer.callbacks+={REPO / 'callbacks/w2.yaml'}", "--trainer.callbacks.repeats=5"]
    callbacks = run_lightning(args, run=False).trainer.callbacks
    names = {type(cb).__name__ for cb in callbacks}
    assert {"FIDEvaluation", "ManifoldEvaluation", "PrivacyAccountantCallback", "SampleGrid",
            "UtilityEvaluation", "W2Evaluation"} <= names  # fmt: skip
    assert [cb.repeats for cb in callbacks if type(cb).__name__ == "W2Evaluation"] == [10, 5]
    inception = ["fit", "--config", str(REPO / "configs/quickstart.yaml")]
    inception.append(f"--trainer.callbacks+={REPO / 'callbacks/fid_inception.yaml'}")
    with pytest.raises(SystemExit):  # FID needs its weights: one line naming the parameter
        main(inception)
    assert "error: Inception weights not found: feature_extractor_weights_path=None" in (
        capsys.readouterr().err
    )
