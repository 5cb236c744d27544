"""The `dpot` command: a tiny fit of the quickstart config, privatize, account calibrate."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_dpot.cli import argument_error_line, main
from lightning_dpot.config import compose_config

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
        "--model.init_args.generated_batch_size=500",
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
    assert "privacy: local DP, ε=2.5 per record (laplace)" in out
    assert "report.json" in out and "final metrics: " in out and "manifold_error=" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["method"] == "EntropicWGAN"
    assert report["privacy"]["mechanism"] == "laplace"
    assert report["privacy"]["epsilon"] == 2.5
    # the arc's ℓ1 diameter
    assert report["privacy"]["sensitivity_l1"] == pytest.approx(1 + math.sqrt(2))
    assert report["privacy"]["noise_scale"] == pytest.approx((1 + math.sqrt(2)) / 2.5)
    assert report["loss"]["regularization"] == "entropic"
    assert report["loss"]["p"] == 1  # Theorem 1: the ℓ1 cost for Laplace noise, λ = b
    assert report["loss"]["entropic_reg"] == pytest.approx(report["privacy"]["noise_scale"])
    assert report["metrics"]["manifold_error"] >= 0
    assert Path(report["config_path"]).is_file()
    assert (run_dir / "scatter.png").is_file()
    # scatter.png plots the raw held-out split: the report says it is outside the guarantee
    outside = report["privacy"]["outside_the_guarantee"]
    assert any(line.startswith("the raw held-out split") for line in outside)
    assert report["ended_by"] is None
    main(["report", str(run_dir)])  # the summary first
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("method: EntropicWGAN; data: HalfCircle; steps: ")
    assert lines[2].startswith("privacy: local DP, ε=2.5")
    assert lines[-1] == f"the full report: dpot report {run_dir} --all"
    main(["report", str(run_dir), "--all"])  # the report as a table, one dotted key per line
    table = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["privacy.epsilon", "2.5"] for line in table)
    assert any(line.startswith("metrics.manifold_error ") for line in table)


def test_a_bad_value_ends_in_one_line_naming_it(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the config's runs/ directory is relative
    args = ["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--data.init_args.epsilon=-3"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert not any(tmp_path.iterdir()), "a refused run must leave nothing behind"
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
    with pytest.raises(FileNotFoundError, match="holds no report.json"):
        main(["report", "/nonexistent/run"])


@pytest.mark.parametrize(
    ("old", "new"), [("noise_sigma", "noise_scale"), ("sinkhorn_scaling", "scaling")]
)
def test_a_renamed_key_is_refused_with_its_new_name(tmp_path, capsys, old, new):
    """In a config file, in a fragment a config composes, and on the command line."""
    fragment = tmp_path / "fragment.yaml"
    fragment.write_text(yaml.safe_dump({"model": {"init_args": {old: 0.5}}}))
    composed = tmp_path / "composed.yaml"
    composed.write_text(yaml.safe_dump({"__base__": "fragment.yaml", "trainer": {}}))
    for args in (
        ["fit", "--config", str(fragment)],
        ["fit", "--config", str(composed)],
        ["fit", f"--model.init_args.{old}=0.5"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"model.init_args.{old} was renamed to {new}" in line, line
    with pytest.raises(ValueError, match=f"renamed to {new}"):
        compose_config(composed)
    # What a run of an earlier version saved is read under the new names.
    assert compose_config(composed, migrate=True)["model"]["init_args"] == {new: 0.5}


@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("privacy_budget", 4.0, "ledger.budget"),
        ("exceed_privacy_budget", True, "ledger.exceed_budget"),
        ("ledger_dir", "/tmp/ledger", "ledger.dir"),
        ("public_reuse", "allow", "ledger.public_reuse"),
        ("denoise_wavelet", "haar", "denoise.init_args.wavelet"),
    ],
)
def test_a_data_argument_moved_into_its_group_is_refused_with_its_new_place(
    tmp_path, capsys, old, value, new
):
    """In a config file, in a fragment a config composes, and on the command line; a saved
    run's config is read with the key in its group."""
    fragment = tmp_path / "fragment.yaml"
    fragment.write_text(yaml.safe_dump({"data": {"init_args": {old: value}}}))
    composed = tmp_path / "composed.yaml"
    composed.write_text(yaml.safe_dump({"__base__": "fragment.yaml", "trainer": {}}))
    for args, line_has in (
        (["fit", "--config", str(fragment)], f"data.init_args.{old} moved to data.init_args.{new}"),
        (["fit", "--config", str(composed)], f"data.init_args.{old} moved to data.init_args.{new}"),
        (["fit", f"--data.init_args.{old}={value}"], f"moved to --data.init_args.{new}"),
        (["fit", f"--data.{old}", str(value)], f"--data.{old} moved to --data.{new}"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line_has in line, line
    group, _, key = new.partition(".")
    migrated = compose_config(composed, migrate=True)["data"]["init_args"]
    assert old not in migrated
    if group == "ledger":
        assert migrated == {"ledger": {key: value}}
    else:  # denoise_wavelet alone (without denoise) is dropped: it named no denoiser
        assert migrated == {}


def test_work_done_before_the_keys_moved_keeps_its_fingerprint():
    """A suite cell or prepare step fingerprinted under the earlier spelling resumes: its
    digest is the digest of the same settings spelled as before; other settings do not match."""
    from lightning_dpot.compare.runner import _digest, digest_matches
    from lightning_dpot.config import earlier_spelling, migrate_renamed_keys

    parts = {
        "config": {"data": {"init_args": {
            "ledger": {"public_reuse": "allow", "budget": 8.0},
            "denoise": {"class_path": "lightning_dpot.data.WaveletDenoising",
                        "init_args": {"wavelet": "haar"}},
        }}},
        "prepare": {"ae": {"config": {"data": {"init_args": {"ledger": {"dir": "/l"}}}}}},
    }  # fmt: skip
    earlier = earlier_spelling(parts)
    assert earlier["config"]["data"]["init_args"] == {
        "public_reuse": "allow", "privacy_budget": 8.0, "denoise": "wavelet",
        "denoise_wavelet": "haar",
    }  # fmt: skip
    assert earlier["prepare"]["ae"]["config"]["data"]["init_args"] == {"ledger_dir": "/l"}
    assert migrate_renamed_keys(earlier) == parts
    assert digest_matches(_digest(earlier), parts) and digest_matches(_digest(parts), parts)
    other = earlier_spelling(parts)
    other["config"]["data"]["init_args"]["privacy_budget"] = 9.0
    assert not digest_matches(_digest(other), parts) and not digest_matches(None, parts)
    metadata = {"metadata": {"init_args": {"public_reuse": "allow"}}}  # not a data section
    assert migrate_renamed_keys(metadata) == metadata


def test_a_ledger_or_denoise_mistake_names_the_grouped_key(capsys):
    for args, expected in (
        (
            ["--data.ledger.budgett", "1"],
            "data.init_args.ledger.budgett is not an argument of lightning_dpot.data."
            "LedgerSettings; did you mean 'budget'?",
        ),
        (["--data.ledger.budget", "true"], "data.init_args.ledger.budget: expected float or"),
        (["--data.denoise", "wavelet"], "--data.denoise: the denoiser is an object now"),
    ):
        with pytest.raises(SystemExit):
            main(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), *args])
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert expected in line, line
    assert argument_error_line(
        'Parser key "data":\n  Parser key "ledger":\n    Option \'budgett\' is not accepted '
        "class_path 'lightning_dpot.data.PrivatizedDataModule'"
    ) == (
        "data.init_args.ledger.budgett is not an argument of lightning_dpot.data.LedgerSettings"
        "; did you mean 'budget'?"
    )


def test_a_data_section_alone_is_migrated_when_read_back_and_refused_when_privatized(
    tmp_path, capsys
):
    from lightning_dpot.commands.checkpoint import load_datamodule

    section = tmp_path / "data.yaml"
    section.write_text(yaml.safe_dump({
        "class_path": "lightning_dpot.data.PrivatizedDataModule",
        "init_args": {
            "source": {"class_path": "lightning_dpot.data.HalfCircle", "init_args": {"n": 50}},
            "mechanism": "laplace", "epsilon": 1.0, "privacy_budget": 3.0,
            "cache_dir": str(tmp_path / "cache"),
        },
    }))  # fmt: skip
    assert load_datamodule(section).ledger_settings.budget == 3.0  # a saved run's section
    with pytest.raises(SystemExit):
        main(["privatize", "--config", str(section), "--output", str(tmp_path / "r.pt")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data.init_args.privacy_budget moved to data.init_args.ledger.budget" in line, line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "r.pt").exists()


def test_a_saved_denoise_string_is_read_as_the_denoiser_object(tmp_path, capsys):
    saved = tmp_path / "config.yaml"
    saved.write_text(
        yaml.safe_dump({"data": {"init_args": {"denoise": "wavelet", "denoise_wavelet": "haar"}}})
    )
    assert compose_config(saved, migrate=True)["data"]["init_args"] == {
        "denoise": {
            "class_path": "lightning_dpot.data.WaveletDenoising",
            "init_args": {"wavelet": "haar"},
        }
    }
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(saved)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data.init_args.denoise: the denoiser is an object now" in line, line


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--data.init_args.epsilon=abc"],
            "data.init_args.epsilon: expected float or null, got 'abc'",
        ),
        (["--data.init_args.epsilonn=2"], "did you mean 'epsilon'?"),
        (
            ["--trainer.max_stepz=3"],
            "unrecognized argument --trainer.max_stepz; did you mean 'max_steps'?",
        ),
        (
            ["--model", "lightning_dpot.methods.Nope"],
            "model: module 'lightning_dpot.methods' has no",
        ),
        (["--config", "/nonexistent.yaml"], "config: File does not exist: '/nonexistent.yaml'"),
        (
            ["--model.init_args.optimizer=sgd"],
            "model.init_args.optimizer: expected one of 'adam', 'rmsprop', got 'sgd'",
        ),
    ],
)
def test_every_bad_argument_ends_in_one_line_naming_it(
    capsys, monkeypatch, tmp_path, extra, expected
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dpot fit: error: "), err
    assert expected in err, err
    assert not any(tmp_path.iterdir())


def test_the_top_level_help_needs_no_lightning_and_the_calculators_no_torch():
    """``dpot --help`` dispatches without importing Lightning or a command's module, and
    ``dpot account`` / ``dpot report`` run without torch (they start in well under a second)."""
    code = (
        "import sys; from lightning_dpot.cli import main; main(['--help']); "
        "assert 'lightning' not in sys.modules and 'lightning_dpot.commands' not in sys.modules; "
        "main(['account', 'calibrate', '--mechanism', 'gaussian', '--epsilon', '1', "
        "'--delta', '1e-5', '--sensitivity', '2']); "
        "assert 'torch' not in sys.modules, 'dpot account imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_privatize_writes_a_release_a_trainer_can_use(tmp_path, capsys):
    config = tmp_path / "data.yaml"
    quick = compose_config(REPO / "configs/quickstart.yaml")
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
    assert "predict" not in out  # no method defines a predict (validate, test) step


@pytest.mark.parametrize(
    ("command", "expected"),
    [("predict", "the methods define no predict step"), ("fitt", "did you mean 'fit'?")],
)
def test_a_command_that_does_not_apply_is_refused_in_one_line(capsys, command, expected):
    with pytest.raises(SystemExit):
        main([command, "--config", "x.yaml"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_every_ready_made_callback_is_added_with_one_flag(capsys, monkeypatch, tmp_path):
    """The top-level callbacks/ folder: each file is added to any run with
    --trainer.callbacks+=FILE, and a value can be overridden right after it."""
    from lightning_dpot.training import run_lightning

    monkeypatch.chdir(tmp_path)  # the config's runs/ directory is relative

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


def test_a_config_is_composed_from_the_fragments_its_base_names(tmp_path):
    """``__base__`` fragments (paths relative to the file naming them, nested) merge beneath the
    file: mappings merge, values and lists are replaced, another class_path replaces the whole
    mapping; a loop is an error."""
    shared, experiments = tmp_path / "_shared", tmp_path / "method"
    shared.mkdir(), experiments.mkdir()
    (shared / "logger.yaml").write_text("trainer: {logger: {class_path: L, init_args: {a: 1}}}")
    (shared / "source.yaml").write_text("data: {init_args: {source: {class_path: S}}}")
    (shared / "recipe.yaml").write_text(
        "__base__: logger.yaml\n"
        "trainer: {max_epochs: 3, callbacks: [{class_path: Grid}]}\n"
        "model: {class_path: M, init_args: {lr: 1, net: {class_path: G, init_args: {w: 8}}}}\n"
    )
    config = experiments / "run.yaml"
    config.write_text(
        "__base__: [../_shared/recipe.yaml, ../_shared/source.yaml]\n"
        "trainer: {logger: {init_args: {name: run}}, callbacks: [{class_path: Accountant}]}\n"
        "model: {init_args: {lr: 2, net: {class_path: H}}}\n"
        "data: {class_path: D}\n"
    )
    composed = compose_config(config)
    assert composed == {
        "trainer": {
            "logger": {"class_path": "L", "init_args": {"a": 1, "name": "run"}},
            "max_epochs": 3,
            "callbacks": [{"class_path": "Accountant"}],
        },
        "model": {"class_path": "M", "init_args": {"lr": 2, "net": {"class_path": "H"}}},
        "data": {"class_path": "D", "init_args": {"source": {"class_path": "S"}}},
    }
    assert list(composed["data"]) == ["class_path", "init_args"]  # written as configs are
    loop = tmp_path / "loop.yaml"
    loop.write_text("__base__: loop.yaml\n")
    with pytest.raises(ValueError, match="__base__ loop"):
        compose_config(loop)


def test_fit_reads_a_composed_config_and_the_command_line_still_wins(tmp_path, capsys):
    """`dpot fit --config` composes the file (--print_config shows the result, as a flat file
    gives it) and arguments after it override the file and its fragments."""
    config = REPO / "configs/entropic_wgan/mnist_fig3_gaussian_entropic.yaml"
    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump(compose_config(config), sort_keys=False))
    printed = []
    for path in (config, flat):
        with pytest.raises(SystemExit):
            main(["fit", "--config", str(path), "--model.init_args.lr=0.5", "--print_config"])
        printed.append(yaml.safe_load(capsys.readouterr().out))
    assert printed[0] == printed[1]
    assert printed[0]["model"]["init_args"]["lr"] == 0.5
    assert printed[0]["trainer"]["logger"]["init_args"]["name"] == config.stem
    assert printed[0]["data"]["init_args"]["source"]["class_path"] == "lightning_dpot.data.MNIST"


def test_every_experiment_names_its_run_after_its_file_and_every_fragment_is_used():
    configs = REPO / "configs"
    experiments = [p for p in configs.rglob("*.yaml") if "_shared" not in p.parts]
    for path in experiments:
        logger = (compose_config(path).get("trainer") or {}).get("logger")
        if isinstance(logger, dict) and logger["class_path"].endswith("WandbRunLogger"):
            # the templates for a user's data leave the name to the run (method and data)
            name = (logger.get("init_args") or {}).get("name")
            assert name.endswith(path.stem) if "your_data" not in path.parts else name is None

    def bases(path):
        names = yaml.safe_load(path.read_text()).get("__base__", [])
        for name in [names] if isinstance(names, str) else names:
            yield (path.parent / name).resolve()
            yield from bases(path.parent / name)

    used = {base for path in experiments for base in bases(path)}
    assert {p.resolve() for p in (configs / "_shared").rglob("*.yaml")} <= used


def test_the_summary_names_delta_only_for_approximate_dp():
    from lightning_dpot.commands.report import _privacy_line

    local = {"kind": "local", "epsilon": 5.0, "mechanism": "gaussian", "delta": 1e-4}
    assert _privacy_line({"privacy": local}) == (
        "privacy: local DP, ε=5, δ=0.0001 per record (gaussian)"
    )
    pure = {**local, "mechanism": "laplace", "delta": None}
    assert _privacy_line({"privacy": pure}) == "privacy: local DP, ε=5 per record (laplace)"


def test_the_summary_announces_the_privacy_ledger(tmp_path):
    from lightning_dpot.commands.report import summary

    ledger = {"path": "/somewhere/ledger/ledger.jsonl", "all_releases_of_these_records": None}
    privacy = {"kind": "local", "epsilon": 2.5, "mechanism": "laplace", "ledger": ledger}
    (tmp_path / "report.json").write_text(json.dumps({"privacy": privacy}))
    lines = summary(tmp_path).splitlines()
    announced = [line for line in lines if line.startswith("privacy ledger: /somewhere/ledger/")]
    assert len(announced) == 1 and "DPOT_LEDGER_DIR" in announced[0]
