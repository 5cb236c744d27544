"""``dpot compare``: the grid runner end to end on a tiny suite (seconds per cell), resume after
a kill, privacy per cell from the run's own report, and the grouping by privacy notion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny_runs import CONDITIONAL_GENERATOR

from lightning_dpot.cli import main
from lightning_dpot.compare import load_suite
from lightning_dpot.compare.results import CELLS_NOTE, NOTION_NOTE, aggregate, markdown_table
from lightning_dpot.compare.runner import cell_fingerprint, cell_privacy, run_cell, run_prepare
from lightning_dpot.generative import Generative
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.training import run_lightning

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "configs" / "compare" / "two_d"

TINY = {"trainer.max_steps": 3}
LOCAL = {  # Laplace (pure ε-LDP), so that the shuffled release's central ε applies
    "data.init_args.mechanism": "laplace",
    "data.init_args.epsilon": "{epsilon}",
    "data.init_args.delta": None,
    "data.init_args.shuffle_delta": "{delta}",
    "data.init_args.source": "{source}",
    "data.init_args.cache_dir": "{cell_dir}/cache",
    "data.init_args.batch_size": 100,
    **TINY,
}
CENTRAL = {
    "model.init_args.target_epsilon": "{epsilon}",
    "model.init_args.delta": "{delta}",
    "data.init_args.source": "{source}",
    "model.init_args.num_particles": 200,
    "data.init_args.batch_size": 50,
    **TINY,
}


def _suite(tmp_path: Path, methods: dict, epsilons=(2.0, 8.0), seeds=(0, 1)) -> Path:
    suite = {
        "name": "tiny",
        "epsilons": list(epsilons),
        "delta": 1e-5,
        "seeds": list(seeds),
        "sources": {
            "half_circle": {
                "class_path": "lightning_dpot.data.HalfCircle",
                "init_args": {"n": 400, "n_test": 200},
            }
        },
        "methods": methods,
        "evaluation": {
            "num_samples": 200,
            "w2": {"subsample": 50, "repeats": 2},
            "manifold": True,
            "grid": 200,
        },
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _methods(*names: str) -> dict:
    table = {
        "entropic_wgan": {"config": str(TEMPLATES / "entropic_wgan.yaml"), "set": LOCAL},
        "dpswflow_r": {"config": str(TEMPLATES / "dpswflow_r.yaml"), "set": CENTRAL},
    }
    return {name: table[name] for name in names}


def test_a_tiny_suite_writes_the_table_plots_and_json_with_each_cells_own_privacy(tmp_path, capsys):
    suite = _suite(tmp_path, _methods("entropic_wgan", "dpswflow_r"))
    out = tmp_path / "out"
    main(["compare", "--config", str(suite), "--output", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert summary["cells"] == 8 and summary["resumed_finished_cells"] == 0
    comparison = json.loads((out / "comparison.json").read_text())
    assert len(comparison["cells"]) == 8 and len(comparison["rows"]) == 4
    for cell in comparison["cells"]:
        report = json.loads(Path(cell["report"]).read_text())
        assert cell["privacy"]["epsilon"] == pytest.approx(float(report["privacy"]["epsilon"]))
        assert cell["metrics"]["w2"] > 0 and 0 <= cell["metrics"]["arc_coverage"] <= 1
        if cell["method"] == "entropic_wgan":
            assert cell["privacy"]["notion"] == "local"
            assert cell["privacy"]["epsilon"] == cell["target_epsilon"]
            assert cell["privacy"]["shuffled_central_epsilon"] > 0
        else:  # the accountant's ε of what ran: within the target, not copied from the suite
            assert cell["privacy"]["notion"] == "central"
            assert cell["privacy"]["accountant"] == "rdp" and cell["privacy"]["releases"] == 3
            assert 0.5 * cell["target_epsilon"] < cell["privacy"]["epsilon"]
            assert cell["privacy"]["epsilon"] < cell["target_epsilon"]
    table = (out / "comparison.md").read_text()
    local_at, central_at = table.index("### Local DP"), table.index("### Central DP")
    assert NOTION_NOTE in table
    assert "entropic_wgan" in table[local_at:central_at]
    assert "entropic_wgan" not in table[central_at:] and "dpswflow_r" in table[central_at:]
    plots = {Path(p).name for p in summary["plots"]}
    assert {"half_circle_w2.png", "half_circle_samples.png"} <= plots
    assert all(Path(p).stat().st_size > 1000 for p in summary["plots"])


def test_a_killed_run_resumes_without_redoing_finished_cells(tmp_path, capsys):
    suite = _suite(tmp_path, _methods("dpswflow_r"), epsilons=(2.0, 4.0, 8.0), seeds=(0,))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "lightning_dpot.cli", "compare", "--config", str(suite)]
    proc = subprocess.Popen(
        [*command, "--output", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while not list(out.glob("cells/**/cell.json")):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = {p: p.read_bytes() for p in out.glob("cells/**/cell.json")}
    assert 1 <= len(finished) < 3
    main(["compare", "--config", str(suite), "--output", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert summary["resumed_finished_cells"] == len(finished)
    for path, content in finished.items():
        assert path.read_bytes() == content  # read back, not redone
    assert len(list(out.glob("cells/**/cell.json"))) == 3


def test_cells_report_their_notion_and_mixed_notions_are_refused():
    local = {"privacy": {"notion": "local", "epsilon": 5.0, "delta": 1e-5, "mechanism": "g"}}
    central = {
        "privacy": {
            "notion": "central",
            "epsilon": 4.2,
            "delta": 1e-5,
            "accountant": "rdp",
            "adjacency": "replace-one",
            "releases": 7,
        }
    }
    assert cell_privacy(local)["adjacency"].startswith("any two values")
    assert cell_privacy(central)["accountant"] == "rdp"
    with pytest.raises(ValueError, match="notion"):
        cell_privacy({"privacy": {"epsilon": 1.0}})
    with pytest.raises(ValueError, match="private runs only"):
        cell_privacy({"privacy": None})

    def cell(privacy, seed):
        return {
            "source": "s", "method": "m", "method_class": "M", "target_epsilon": 5.0,
            "seed": seed, "privacy": cell_privacy(privacy), "metrics": {"w2": 0.1},
            "fit_seconds": 1.0,
        }  # fmt: skip

    with pytest.raises(ValueError, match="mixed privacy notions"):
        aggregate([cell(local, 0), cell(central, 1)])
    rows = aggregate([cell(local, 0), cell(local, 1)])
    assert rows[0]["notion"] == "local" and rows[0]["epsilon"] == (5.0, 0.0)
    other_delta = {"privacy": {**central["privacy"], "delta": 1e-6}}
    with pytest.raises(ValueError, match="different privacy delta"):
        aggregate([cell(central, 0), cell(other_delta, 1)])
    public = {"privacy": {**central["privacy"], "module": {"poisson_seed_is_public": True}}}
    assert cell_privacy(public)["sampling_seed_is_public"] is True
    with pytest.raises(ValueError, match="different privacy sampling_seed_is_public"):
        aggregate([cell(central, 0), cell(public, 1)])


def test_suite_errors_name_the_key_and_the_accepted_values(tmp_path):
    good = yaml.safe_load(_suite(tmp_path, _methods("dpswflow_r")).read_text())
    for change, message in (
        ({"epsilons": [0, 1]}, "epsilons must hold finite numbers > 0"),
        ({"seeds": [-1]}, "seeds must be a non-empty list of integers >= 0"),
        ({"delta": 2}, r"delta must lie in \(0, 1\)"),
        ({"colour": "red"}, "unknown keys"),
        ({"evaluation": {"fid_at_home": 1}}, "evaluation has unknown keys"),
        ({"published": [{"method": "gan", "reference": "x", "epsilon": 1, "metrics": {"fid": 1}}]},
         r"published\[0\]\.method='gan' is not a method of the suite"),
        ({"published": [{"method": "dpswflow_r", "reference": "x", "epsilon": 1,
                         "metrics": {"inception_score": 9}}]},
         r"published\[0\]\.metrics\.inception_score: unknown metric"),
        ({"differences": [["size", "28"]]}, r"differences must be a list of \[aspect"),
    ):  # fmt: skip
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({**good, **change}))
        with pytest.raises(ValueError, match=message):
            load_suite(path)
    no_epsilon = {**good, "methods": {"m": {"config": good["methods"]["dpswflow_r"]["config"]}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(no_epsilon))
    with pytest.raises(ValueError, match=r"must map a config key to '\{epsilon\}'"):
        load_suite(path)


@pytest.mark.parametrize(
    "name",
    ["two_d", "mnist_shipped", "fashion_cpu", "fashion_cpu_recipes", "fashion_cpu_steps",
     "fashion_full", "fashion_gpu_playbook"],
)  # fmt: skip
def test_every_method_of_the_shipped_suites_builds_with_the_cells_overrides(name, tmp_path):
    if name.startswith("fashion") and not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    suite = load_suite(REPO / "configs" / "compare" / f"{name}.yaml")
    assert sorted(path.stem for path in (REPO / "configs" / "compare").glob("*.yaml")) == [
        "fashion_cpu", "fashion_cpu_recipes", "fashion_cpu_steps", "fashion_full",
        "fashion_gpu_playbook", "mnist_shipped", "two_d",
    ]  # fmt: skip
    for method, spec in suite.methods.items():
        cell = next(c for c in suite.cells() if c.method == method)
        values = suite.values(tmp_path, cell, tmp_path / "cell")
        args = ["--config", str(spec.config), *suite.overrides(spec.set, values)]
        cli = run_lightning([*args, "--trainer.logger=false"], run=False)
        assert isinstance(cli.model, Generative), method
        privacy = cli.model if isinstance(cli.model, ReleasesPrivateData) else cli.datamodule
        assert privacy.is_private if privacy is cli.model else cli.datamodule.mechanism, method
    for prepare in suite.prepare.values():
        args = ["--config", str(prepare.config), *suite.overrides(prepare.set, values)]
        run_lightning([*args, "--trainer.logger=false"], run=False)


def test_published_numbers_sit_beside_the_same_metric_only(tmp_path):
    suite = load_suite(REPO / "configs" / "compare" / "fashion_cpu.yaml")
    row = {
        "source": "fashion_mnist", "method": "dp_sinkhorn", "notion": "central",
        "target_epsilon": 10.0, "epsilon": (9.99, 0.0), "delta": 1e-5, "accountant": "rdp",
        "adjacency": "add/remove-one", "shuffled_central_epsilon": None, "seeds": [0, 1, 2],
        "metrics": {"utility_cnn": (0.42, 0.03), "fd_classifier": (300.0, 5.0)},
        "fit_seconds": 3.0, "sampling_seed_is_public": False, "exceeds_target": False,
    }  # fmt: skip
    table = markdown_table(suite, [row])
    cao = "Cao et al. 2021, Table 1"
    assert f"| dp_sinkhorn | {cao} | 10 | CNN accuracy | 0.711 | 0.42 ± 0.03 |" in table
    # the published FID is never set beside the classifier FD
    assert "| FID (Inception) | 128.3 | not measured |" in table
    merf = f"| dp_merf | {cao} (DP-MERF run by Cao et al.) | 10 | CNN accuracy | 0.754 |"
    assert f"{merf} not run |" in table
    assert "| image size |" in table


def test_a_row_over_fewer_seeds_than_the_suites_says_so():
    suite = load_suite(REPO / "configs" / "compare" / "fashion_cpu.yaml")
    row = {
        "source": "fashion_mnist", "method": "dp_merf", "notion": "central",
        "target_epsilon": 10.0, "epsilon": (9.9, 0.0), "delta": 1e-5, "accountant": "rdp",
        "adjacency": "replace-one", "shuffled_central_epsilon": None, "seeds": [0, 2],
        "metrics": {"utility_cnn": (0.7, 0.01)}, "fit_seconds": 3.0,
        "sampling_seed_is_public": False, "exceeds_target": False,
    }  # fmt: skip
    table = markdown_table(suite, [row])
    assert "fewer seeds than the suite's (their other cells failed): dp_merf / " in table
    assert "ε = 10: seeds [0, 2]" in table
    assert "fewer seeds" not in markdown_table(suite, [{**row, "seeds": [0, 1, 2]}])


def test_the_table_names_the_feature_classifier_and_warns_when_cells_used_different_ones():
    suite = load_suite(REPO / "configs" / "compare" / "fashion_cpu.yaml")

    def cell(method, seed, weights):
        metrics = {"fd_classifier": 100.0 + seed}
        if weights is not None:
            metrics["fd_classifier_weights"] = weights
        return {
            "source": "fashion_mnist", "method": method, "method_class": "M",
            "target_epsilon": 10.0, "seed": seed, "fit_seconds": 1.0, "metrics": metrics,
            "privacy": {"notion": "central", "epsilon": 9.9, "delta": 1e-5},
        }  # fmt: skip

    one = markdown_table(suite, aggregate([cell("a", 0, "ab12"), cell("b", 0, "ab12")]))
    assert "one feature classifier for these cells, weights sha256 ab12" in one
    assert "⚠ FD (classifier)" not in one
    two = markdown_table(suite, aggregate([cell("a", 0, "ab12"), cell("a", 1, "cd34")]))
    assert "⚠ FD (classifier)" in two and "ab12, cd34" in two
    old = markdown_table(suite, aggregate([cell("a", 0, "ab12"), cell("b", 0, None)]))
    assert "⚠ FD (classifier)" in old and "ab12, unrecorded" in old
    unscored = aggregate([{**cell("a", 0, None), "metrics": {"w2": 1.0}}])
    assert "FD (classifier)" not in markdown_table(suite, unscored)
    other = {**cell("b", 0, "cd34"), "source": "mnist"}  # its own split, its own classifier
    two_sources = markdown_table(suite, aggregate([cell("a", 0, "ab12"), other]))
    assert "⚠" not in two_sources and two_sources.count("one feature classifier") == 2


def test_the_suites_read_one_published_table_each_for_its_own_methods(tmp_path):
    from lightning_dpot.compare.published import load_published

    table = load_published("configs/compare/published/fashion_mnist.yaml")
    suites = [
        load_suite(REPO / "configs" / "compare" / f"{name}.yaml")
        for name in ("fashion_cpu", "fashion_full", "fashion_gpu_playbook")
    ]
    for suite in suites:
        assert suite.published == tuple(e for e in table if e.method in suite.methods)
    assert [e.method for e in suites[2].published] == ["dp_sinkhorn", "dpswflow_r"]
    assert {e.method: e.steps for e in table if e.steps} == {
        "dp_sinkhorn": 280_000, "dpswflow_r": 4_200,
    }  # fmt: skip
    bad = tmp_path / "published.yaml"
    bad.write_text(
        "published: [{method: m, reference: R, epsilon: 1, metrics: {fid: 1}, steps: 0}]\n"
    )
    with pytest.raises(ValueError, match=r"published\[0\].steps must be a whole number > 0"):
        load_published(bad)
    with pytest.raises(ValueError, match="must be a file with a `published:` list"):
        load_published(tmp_path / "missing.yaml")


def test_markdown_groups_by_notion_with_the_reason(tmp_path):
    suite = load_suite(REPO / "configs" / "compare" / "two_d.yaml")
    row = {
        "source": "half_circle", "method": "dp_sinkhorn", "notion": "central",
        "target_epsilon": 5.0, "epsilon": (4.9, 0.0), "delta": 1e-5, "accountant": "rdp",
        "adjacency": "add/remove-one", "shuffled_central_epsilon": None, "seeds": [0],
        "metrics": {"w2": (0.2, 0.01)}, "fit_seconds": 3.0, "sampling_seed_is_public": False,
        "exceeds_target": False,
    }  # fmt: skip
    table = markdown_table(suite, [row])
    assert "### Central DP" in table and "### Local DP" not in table
    assert "rdp, add/remove-one" in table and NOTION_NOTE in table
    assert CELLS_NOTE in table  # every cell is another release of the same people
    assert "above target" not in table and "no amplification" not in table
    flagged = {**row, "exceeds_target": True, "sampling_seed_is_public": True}
    table = markdown_table(suite, [flagged])
    assert "dp_sinkhorn ⚠ ε above target" in table and "not at equal privacy" in table
    assert "public sampling seed (no amplification)" in table


def test_a_changed_suite_is_refused_on_rerun_and_a_moved_run_directory_resumes(tmp_path, capsys):
    path = _suite(tmp_path, _methods("dpswflow_r"), epsilons=(4.0,), seeds=(0,))
    out = tmp_path / "out"
    main(["compare", "--config", str(path), "--output", str(out)])
    capsys.readouterr()
    moved = tmp_path / "moved"
    out.rename(moved)
    main(["compare", "--config", str(path), "--output", str(moved)])
    assert json.loads(capsys.readouterr().out)["resumed_finished_cells"] == 1
    suite = yaml.safe_load(path.read_text())
    suite["methods"]["dpswflow_r"]["set"]["trainer.max_steps"] = 4
    suite["evaluation"]["w2"]["repeats"] = 3
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(ValueError, match=r"its overrides, evaluation changed since it ran"):
        run_cell(load_suite(path), load_suite(path).cells()[0], moved)


def test_every_cell_is_scored_on_the_same_count_or_refused_before_training(tmp_path):
    path = _suite(tmp_path, _methods("dpswflow_r"), epsilons=(4.0,), seeds=(0,))
    suite = yaml.safe_load(path.read_text())
    suite["evaluation"]["num_samples"] = 201  # the flow holds 200 particles
    path.write_text(yaml.safe_dump(suite))
    loaded = load_suite(path)
    with pytest.raises(ValueError, match=r"num_samples=201 but DPSWFlowR can draw at most"):
        run_cell(loaded, loaded.cells()[0], tmp_path / "out")
    assert not list((tmp_path / "out").glob("cells/**/*.ckpt"))
    assert not list((tmp_path / "out").glob("cells/**/report.json"))
    suite["evaluation"]["num_samples"] = 200  # fixed: the cell runs (nothing ran before)
    path.write_text(yaml.safe_dump(suite))
    loaded = load_suite(path)
    record = run_cell(loaded, loaded.cells()[0], tmp_path / "out")
    assert record["metrics"]["num_samples"] == 200


def test_a_failing_cell_is_listed_with_its_traceback_and_the_others_go_on(tmp_path, capsys):
    methods = _methods("entropic_wgan", "dpswflow_r")
    methods["dpswflow_r"]["set"] = {**CENTRAL, "model.init_args.num_particles": 150}  # < 200
    path = _suite(tmp_path, methods, epsilons=(4.0,), seeds=(0,))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--config", str(path), "--output", str(out)])
    assert exit_info.value.code == 1
    failed = "dpswflow_r/half_circle/eps4/seed0"
    summary = json.loads(capsys.readouterr().out)
    assert [f["run"] for f in summary["failed_cells"]] == [failed]
    assert summary["failed_cells"][0]["error"].startswith("ValueError: evaluation.num_samples=200")
    comparison = json.loads((out / "comparison.json").read_text())
    assert [cell["method"] for cell in comparison["cells"]] == ["entropic_wgan"]
    assert comparison["failed_cells"] == summary["failed_cells"]
    assert "Traceback" in (out / "errors" / f"{failed}.txt").read_text()
    assert f"Failed: {failed}: ValueError" in (out / "comparison.md").read_text()


def test_a_prepare_step_is_reused_only_under_its_own_fingerprint(tmp_path):
    """A finished prepare step (e.g. the DPSW autoencoder) is reused as it is only when its config
    and overrides are unchanged; otherwise the cells that use it would mix two versions."""
    suite = load_suite(REPO / "configs" / "compare" / "mnist_shipped.yaml")
    run_dir = tmp_path / "prepare" / "autoencoder"
    run_dir.mkdir(parents=True)
    digest = cell_fingerprint(suite, suite.cells()[0])["parts"]["prepare"]["autoencoder"]
    (run_dir / "done.json").write_text(json.dumps({"digest": "0" * 16}))
    with pytest.raises(ValueError, match="prepare step 'autoencoder': its config or overrides"):
        run_prepare(suite, "autoencoder", tmp_path)
    assert digest["set"] == suite.prepare["autoencoder"].set


@pytest.fixture(scope="module")
def stand_in_inception_weights(tmp_path_factory) -> Path:
    """A file of the torch-fidelity InceptionV3 weights' keys and shapes with random values (the
    real file cannot be downloaded here): FID runs end to end on it, with meaningless values."""
    import torch
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    original = fidelity.FeatureExtractorInceptionV3.load_state_dict
    fidelity.FeatureExtractorInceptionV3.load_state_dict = lambda self, state: None
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fidelity, "load_state_dict_from_url", lambda *a, **k: {})
            network = fidelity.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    finally:
        fidelity.FeatureExtractorInceptionV3.load_state_dict = original
    path = tmp_path_factory.mktemp("inception") / "weights-inception-2015-12-05-6726825d.pth"
    torch.save(network.state_dict(), path)
    return path


def test_with_inception_weights_a_suite_sets_fid_beside_the_published_fid(
    tmp_path, capsys, stand_in_inception_weights
):
    method = {
        "seed_everything": 0,
        "trainer": {"max_steps": 2, "accelerator": "cpu", "logger": False,
                    "enable_progress_bar": False, "callbacks": []},
        "model": {"class_path": "lightning_dpot.methods.DPMERF",
                  "init_args": {"generator": CONDITIONAL_GENERATOR, "num_frequencies": 50}},
        "data": {"class_path": "lightning_dpot.data.CentralDPDataModule",
                 "init_args": {"expected_batch_size": 50, "steps_per_epoch": 2}},
    }  # fmt: skip
    (tmp_path / "dp_merf.yaml").write_text(yaml.safe_dump(method))
    suite = {
        "name": "tiny_fid",
        "epsilons": [10],
        "delta": 1e-5,
        "seeds": [0],
        "sources": {"digits": {"class_path": "lightning_dpot.data.Digits",
                               "init_args": {"test_fraction": 0.02}}},
        "methods": {"dp_merf": {"config": str(tmp_path / "dp_merf.yaml"), "set": {
            "model.init_args.target_epsilon": "{epsilon}", "model.init_args.delta": "{delta}",
            "data.init_args.source": "{source}"}}},
        "evaluation": {"num_samples": 20, "frechet": {"feature_extractor": "classifier"},
                       "grid": 20},
        "published": [{"method": "dp_merf", "reference": "Cao et al. 2021, Table 1",
                       "epsilon": 10, "metrics": {"fid": 132.6}}],
    }  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    out = tmp_path / "out"
    missing = tmp_path / "missing.pth"
    with pytest.raises(SystemExit):
        main(["compare", "--config", str(path), "--output", str(out),
              "--feature_extractor_weights_path", str(missing)])  # fmt: skip
    assert f"feature_extractor_weights_path='{missing}' is not an existing file" in (
        capsys.readouterr().err
    )
    assert not out.exists()  # refused before anything trained

    weights = str(stand_in_inception_weights)
    main(["compare", "--config", str(path), "--output", str(out),
          "--feature_extractor_weights_path", weights])  # fmt: skip
    (cell,) = json.loads((out / "comparison.json").read_text())["cells"]
    assert "fd_classifier" not in cell["metrics"] and cell["metrics"]["fid"] > 0
    table = (out / "comparison.md").read_text()
    assert f"| FID (Inception) | 132.6 | {cell['metrics']['fid']:.3g}" in table

    moved = tmp_path / "elsewhere" / Path(weights).name  # the same file at another path
    moved.parent.mkdir()
    moved.write_bytes(Path(weights).read_bytes())
    capsys.readouterr()
    main(["compare", "--config", str(path), "--output", str(out),
          "--feature_extractor_weights_path", str(moved)])  # fmt: skip
    assert json.loads(capsys.readouterr().out)["resumed_finished_cells"] == 1


def test_fid_is_refused_for_a_suite_without_a_frechet_distance():
    from lightning_dpot.compare.suite import with_inception_weights

    suite = load_suite(REPO / "configs" / "compare" / "two_d.yaml")
    assert "frechet" not in suite.evaluation
    with pytest.raises(ValueError, match="measures no Fréchet distance"):
        with_inception_weights(suite, "weights.pth")
