"""`dpot evaluate`: fit a tiny run through the CLI, evaluate its checkpoint (classifier FD,
utility, W₂), append to report.json; the offline Inception error; the reference rows; the
progress bar on a terminal's stderr, with the JSON alone on stdout."""

from __future__ import annotations

import copy
import io
import json
import sys
from collections.abc import Iterator

import pytest
import torch
import yaml
from threadpoolctl import threadpool_limits
from tiny_runs import dcgan_run

from lightning_dpot.cli import main
from lightning_dpot.metrics.fid import INCEPTION_WEIGHTS_FILENAME

TINY_RUN = dcgan_run(
    {
        "max_steps": 2,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": [  # the evaluation callbacks, configured from YAML as a user would
            {
                "class_path": "lightning_dpot.callbacks.FIDEvaluation",
                "init_args": {
                    "feature_extractor": "classifier",
                    "num_samples": 200,
                    "classifier_epochs": 1,
                },
            },
            {
                "class_path": "lightning_dpot.callbacks.W2Evaluation",
                "init_args": {"num_samples": 100, "subsample": 50, "repeats": 3},
            },
        ],
    },
    seed=0,
)

SMALL = ["--num_samples", "300", "--w2_subsample", "50", "--w2_repeats", "3"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    config = root / "tiny.yaml"
    run = copy.deepcopy(TINY_RUN)
    run["trainer"]["callbacks"][0]["init_args"]["classifier_path"] = str(root / "fit_clf.pt")
    config.write_text(yaml.safe_dump(run))
    main(
        ["fit", "--config", str(config), f"--trainer.default_root_dir={root / 'out'}"]
        + [f"--data.init_args.cache_dir={root / 'cache'}"]
    )
    (ckpt,) = (root / "out").rglob("*.ckpt")
    return ckpt, root


def test_callbacks_from_the_yaml_config_write_their_report_sections(fitted_run) -> None:
    ckpt, _ = fitted_run
    report = json.loads((ckpt.parents[1] / "report.json").read_text())
    assert report["fd_classifier"]["final"]["fd_classifier"] > 0
    assert report["w2"]["final"]["w2"] > 0
    assert report["metrics"]["fd_classifier"] == report["fd_classifier"]["final"]["fd_classifier"]


def test_evaluate_prints_json_and_appends_to_the_run_report(fitted_run, capsys) -> None:
    ckpt, root = fitted_run
    classifier = root / "feature_classifier.pt"
    argv = ["evaluate", "--ckpt_path", str(ckpt), "--metrics", "fid,utility,w2", *SMALL]
    argv += ["--feature_extractor", "classifier", "--classifier_path", str(classifier)]
    main(argv)
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    results = record["results"]
    assert "fid" not in results  # the classifier FD is never reported as FID
    assert results["fd_classifier"]["fd_classifier"] > 0
    assert "not FID" in results["fd_classifier"]["feature_extractor"]
    assert results["fd_classifier"]["num_generated"] == 300 and classifier.is_file()
    assert results["w2"]["w2"] > 0 and results["w2"]["w2_stderr"] >= 0
    assert "unconditional" in results["utility"]["skipped"]
    assert "utility skipped" in captured.err
    report_path = ckpt.parents[1] / "report.json"
    assert record["report"] == str(report_path)

    main(["evaluate", "--ckpt_path", str(ckpt), "--metrics", "w2", *SMALL])
    evaluations = json.loads(report_path.read_text())["evaluate"]
    assert [list(e["results"]) for e in evaluations] == [["fd_classifier", "utility", "w2"], ["w2"]]
    assert evaluations[1]["results"]["w2"] == pytest.approx(results["w2"])  # seeded


def test_inception_fid_offline_without_weights_names_the_parameter_and_file(
    fitted_run, tmp_path, capsys
) -> None:
    ckpt, _ = fitted_run
    missing = tmp_path / INCEPTION_WEIGHTS_FILENAME
    with pytest.raises(SystemExit):
        main(
            ["evaluate", "--ckpt_path", str(ckpt), "--metrics", "fid", "--feature_extractor"]
            + ["inception", "--feature_extractor_weights_path", str(missing)]
        )
    err = capsys.readouterr().err
    assert "feature_extractor_weights_path" in err and str(missing) in err


def test_reference_rows_raw_training_data_and_the_privatized_release(fitted_run, capsys) -> None:
    ckpt, root = fitted_run
    config = ckpt.parents[1] / "config.yaml"
    main(
        ["evaluate", "--samples", "raw-train", "--data_config", str(config), "--metrics"]
        + ["utility,w2", "--utility_mode", "quick", "--no_report", *SMALL]
    )
    raw = json.loads(capsys.readouterr().out)["results"]
    assert raw["utility"]["logreg"] > 0.85 and raw["utility"]["mode"] == "quick"
    main(
        ["evaluate", "--samples", "privatized", "--data_config", str(config), "--metrics"]
        + ["utility,w2", "--no_report", *SMALL]
    )
    private = json.loads(capsys.readouterr().out)["results"]
    assert "skipped" in private["utility"]  # no labels are released
    # Gaussian noise σ = 0.5 per pixel moves the release away from the raw held-out data.
    assert private["w2"]["w2"] > raw["w2"]["w2"]


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_is_drawn_on_a_terminal_stderr_and_stdout_stays_json(
    fitted_run, capsys, monkeypatch
) -> None:
    ckpt, _ = fitted_run
    argv = ["evaluate", "--ckpt_path", str(ckpt), "--metrics", "w2", "--no_report", *SMALL]
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    main(argv)
    assert json.loads(capsys.readouterr().out)["results"]["w2"]["w2"] > 0
    bar = terminal.getvalue()
    assert "dpot evaluate" in bar and "/2 [" in bar  # two stages: the samples, then w2
    assert "samples" in bar and "w2" in bar

    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    main([*argv, "--no_progress"])
    assert json.loads(capsys.readouterr().out)["results"]["w2"]["w2"] > 0
    assert quiet.getvalue() == ""


def test_no_progress_bar_without_a_terminal(fitted_run, capsys) -> None:
    ckpt, _ = fitted_run
    main(["evaluate", "--ckpt_path", str(ckpt), "--metrics", "w2", "--no_report", *SMALL])
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"]["w2"]["w2"] > 0
    assert "dpot evaluate" not in captured.err
