"""`dpot export` and the files a `dpot fit` run hands its user: tiny runs of an MLP generator
(2-D, local DP, W&B offline), a DCGAN (images, local DP), a class-conditional DP-Sinkhorn
generator (central DP) and a DPSWflow particle flow. Each run writes generator.pt; `dpot export`
rewrites it from the checkpoint; both sample with plain torch in a process that cannot import
lightning_dpot, carry the run's privacy report and config, and hold nothing but the generator
(or the released particles). The W&B artifacts are checked in the offline run's log on disk,
and central-DP runs draw epsilon.png."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tiny_runs import CONDITIONAL_GENERATOR, dcgan_run

from lightning_dpot.cli import main
from lightning_dpot.commands.checkpoint import find_checkpoint, load_datamodule, load_model
from lightning_dpot.config import compose_config
from lightning_dpot.export import export_generator, read_embedded_report
from lightning_dpot.methods import AutoencoderModule
from lightning_dpot.nn import ConvAutoencoder32
from lightning_dpot.privacy.accounting.curve import EpsilonCurve
from lightning_dpot.privacy.accounting.report import shareable_report

REPO = Path(__file__).resolve().parents[1]
QUIET = {"enable_progress_bar": False, "enable_model_summary": False}

MLP_RUN = {  # the quickstart's model and data, tiny
    "seed_everything": 0,
    "trainer": {"max_steps": 2, **QUIET},
    "model": {
        "class_path": "lightning_dpot.methods.EntropicWGAN",
        "init_args": {
            "generator": {
                "class_path": "lightning_dpot.nn.MLPGenerator",
                "init_args": {"latent_dim": 2, "output_shape": [2], "hidden": [8]},
            },
            "latent_range": [-1.0, 1.0],
            "generated_batch_size": 100,
        },
    },
    "data": {
        "class_path": "lightning_dpot.data.PrivatizedDataModule",
        "init_args": {
            "source": {"class_path": "lightning_dpot.data.HalfCircle", "init_args": {"n": 400}},
            "mechanism": "laplace",
            "epsilon": 2.5,
            "batch_size": 100,
        },
    },
}
DCGAN_RUN = dcgan_run({"max_steps": 2, **QUIET})
CONDITIONAL_RUN = {  # DP-Sinkhorn (Cao et al. 2021): class-conditional, central DP
    "seed_everything": 0,
    "trainer": {"max_steps": 3, "logger": False, **QUIET},
    "model": {
        "class_path": "lightning_dpot.methods.DPSinkhorn",
        "init_args": {
            "generator": copy.deepcopy(CONDITIONAL_GENERATOR),
            "noise_multiplier": 1.0,
            "delta": 1.0e-5,
        },
    },
    "data": {
        "class_path": "lightning_dpot.data.CentralDPDataModule",
        "init_args": {
            "source": {"class_path": "lightning_dpot.data.Digits"},
            "expected_batch_size": 20,
        },
    },
}


def _flow_run() -> dict[str, Any]:
    """DPSWflow on the 2-D toy mixture (Sebag et al. 2023, §5.4), tiny: one release."""
    config = compose_config(REPO / "configs/dpswflow/toy_5gaussians_sigma0p5.yaml")
    config["trainer"] = {"max_steps": 3, "logger": False, **QUIET}
    config["model"]["init_args"].update(num_particles=40, num_directions=10, directions_per_step=5)
    config["data"]["init_args"]["source"]["init_args"] = {"n": 100, "n_test": 30}
    return config


def _fit(config: dict[str, Any], root: Path, logger: str | None = None) -> Path:
    """``dpot fit`` of ``config`` into ``root`` (with ``logger``, a class path, saving under
    ``root/runs``); returns the run directory, where its config.yaml is."""
    config = copy.deepcopy(config)
    if config["data"]["class_path"].endswith("PrivatizedDataModule"):  # its release cache
        config["data"]["init_args"]["cache_dir"] = str(root / "cache")
    if logger is not None:
        save_dir = {"save_dir": str(root / "runs")}
        config["trainer"]["logger"] = {"class_path": logger, "init_args": save_dir}
    config["trainer"]["default_root_dir"] = str(root / "out")
    path = root / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    (config_path,) = root.rglob("config.yaml")
    return config_path.parent


@pytest.fixture(scope="module")
def wandb_dirs(tmp_path_factory):
    """W&B offline, with its staging, cache and settings folders in a temporary folder."""
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("DPOT_WANDB_ONLINE", raising=False)
        patch.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.setenv(name, str(root / name.lower()))
        yield root


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory, wandb_dirs):
    import wandb

    run_dir = _fit(MLP_RUN, tmp_path_factory.mktemp("mlp"), "lightning_dpot.loggers.WandbRunLogger")
    # `dpot fit` ends its process here: W&B finishes the run and its service writes the log out
    wandb.finish()
    wandb.teardown()
    return run_dir


@pytest.fixture(scope="module")
def dcgan_run(tmp_path_factory):
    # another logger than W&B's: the files are written all the same
    return _fit(DCGAN_RUN, tmp_path_factory.mktemp("dcgan"), "lightning.pytorch.loggers.CSVLogger")


@pytest.fixture(scope="module")
def conditional_run(tmp_path_factory):
    return _fit(CONDITIONAL_RUN, tmp_path_factory.mktemp("conditional"))


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory):
    return _fit(_flow_run(), tmp_path_factory.mktemp("flow"))


RUNS = ["mlp_run", "dcgan_run", "conditional_run", "flow_run"]
SHAPES = {"mlp_run": [2], "dcgan_run": [1, 8, 8], "conditional_run": [1, 8, 8], "flow_run": [2]}


def _report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())


def _config(run_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def _wandb_records(log: Path) -> list[bytes]:
    """The records of a W&B transaction log (``run-*.wandb``): a 7-byte file header, then
    32 KiB blocks of records, each a 7-byte header (CRC, length, kind: full, first, middle,
    last) and its bytes; a block's tail shorter than a header is padding."""
    data, block, header = log.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", header
    while pos + header <= len(data):
        if block - pos % block < header:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        pending += data[pos + header : pos + header + length]
        pos += header + length
        if kind in (1, 4):  # full or last
            records.append(pending)
            pending = b""
    return records


def _offline_artifacts(run_dir: Path) -> dict[str, Any]:
    """Artifact name → (type, {file: (md5 digest, staged copy)}) from the offline run's log."""
    from wandb.proto import wandb_internal_pb2

    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    out = {}
    for raw in _wandb_records(log):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "artifact":
            artifact = record.artifact
            entries = artifact.manifest.contents
            files = {entry.path: (entry.digest, entry.local_path) for entry in entries}
            out[artifact.name] = (artifact.type, files)
    return out


def _md5(path: Path) -> str:
    return base64.b64encode(hashlib.md5(path.read_bytes()).digest()).decode()


def test_fit_writes_the_generator_and_logs_the_run_files_as_offline_wandb_artifacts(
    mlp_run, wandb_dirs
):
    assert (mlp_run / "generator.pt").is_file()
    # local DP: ε is fixed by the release before training, so there is no curve to draw
    assert not (mlp_run / "epsilon.png").exists()
    artifacts = _offline_artifacts(mlp_run)
    (run_id,) = {name.rpartition("-")[2] for name in artifacts}
    assert set(artifacts) == {f"outputs-{run_id}", f"generator-{run_id}"}
    outputs_type, outputs = artifacts[f"outputs-{run_id}"]
    model_type, model = artifacts[f"generator-{run_id}"]
    assert (outputs_type, model_type) == ("run-outputs", "model")
    assert set(outputs) == {"report.json"} and set(model) == {"generator.pt"}
    logged = {"report.json": mlp_run / "shared" / "report.json", "generator.pt": None}
    for name, (digest, staged) in {**outputs, **model}.items():
        path = logged[name] or mlp_run / name
        assert digest == _md5(path), f"{name} was logged with other contents"
        assert Path(staged).is_relative_to(wandb_dirs), "W&B staged outside its data folder"
    # the report goes out as it may leave the machine: no ledger entry, no local path
    shared = json.loads((mlp_run / "shared" / "report.json").read_text())
    assert shared == shareable_report(_report(mlp_run))
    assert _report(mlp_run)["privacy"]["ledger"] and "ledger" not in shared["privacy"]


@pytest.mark.parametrize("run", RUNS)
def test_dpot_export_writes_a_generator_that_samples_as_the_trained_module(
    run, request, tmp_path, capsys
):
    run_dir = request.getfixturevalue(run)
    output = tmp_path / "exported.pt"
    main(["export", str(run_dir), "--output", str(output)])
    summary = json.loads(capsys.readouterr().out)
    ckpt = find_checkpoint(run_dir)
    assert summary["checkpoint"] == str(ckpt) and summary["output"] == str(output)
    assert summary["sampler"]["record_shape"] == SHAPES[run]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
        exported = torch.jit.load(str(output))
    model, _ = load_model(ckpt)
    draw = torch.Generator().manual_seed(3)
    # what the file holds, but the sampler's empty device marker
    tensors = {name: t for name, t in exported.state_dict().items() if t.numel() > 0}
    if run == "flow_run":  # the decoded particles, drawn without replacement
        particles = model.sample(model.max_samples)
        assert exported.max_samples == len(particles) == 40
        drawn = exported.sample(40, 0)
        assert torch.equal(drawn[drawn[:, 0].argsort()], particles[particles[:, 0].argsort()])
        assert set(tensors) == {"particles"}
        with pytest.raises(torch.jit.Error, match="n must be an integer >= 1 and <= 40"):
            exported.sample(41, 0)
    elif run == "conditional_run":
        x, y = exported.sample_labeled(6, 3)
        expected_x, expected_y = model.sample_labeled(6, generator=draw)
        torch.testing.assert_close(x, expected_x)
        assert torch.equal(y, expected_y) and exported.num_classes == 10
    else:
        torch.testing.assert_close(exported.sample(6, 3), model.sample(6, generator=draw))
    if run != "flow_run":  # the generator's parameters and buffers, nothing else
        state = {f"generator.{k}": v for k, v in model.generator.state_dict().items()}
        assert set(tensors) == {name for name, t in state.items() if t.numel() > 0}
        for name, value in tensors.items():
            assert torch.equal(value, state[name]), name

    embedded = read_embedded_report(output)
    expected = shareable_report(_report(run_dir)["privacy"])
    if run in ("conditional_run", "flow_run"):  # central DP: the checkpoint's own releases
        expected["journal_position"] = expected["releases"]
    assert embedded["privacy"] == expected is not None
    assert embedded["config"] == shareable_report(_config(run_dir))
    assert not {"ledger", "journal"} & set(embedded["privacy"])
    assert embedded["method"] == type(model).__name__


LOADER = """
import json, sys, warnings
sys.modules["lightning_dpot"] = None  # the exported files must not need the package
import torch

warnings.simplefilter("ignore", FutureWarning)
out = {}
for path in sys.argv[1:]:
    files = {"report.json": ""}
    generator = torch.jit.load(path, _extra_files=files)
    x = generator.sample(4, seed=0)
    report = json.loads(files["report.json"])
    entry = {"kind": generator.kind, "shape": list(x.shape), "report": report}
    if generator.num_classes > 0:
        x, y = generator.sample_labeled(4, seed=0)
        entry["labels"] = [int(label) for label in y]
    entry["same_seed_same_draw"] = bool(torch.equal(generator.sample(4, seed=0), x))
    out[path] = entry
print(json.dumps(out))
"""


def test_fitted_generators_sample_with_plain_torch_in_a_process_without_lightning_dpot(
    mlp_run, dcgan_run, conditional_run, flow_run
):
    runs = {"mlp_run": mlp_run, "dcgan_run": dcgan_run}
    runs |= {"conditional_run": conditional_run, "flow_run": flow_run}
    files = {name: str(run_dir / "generator.pt") for name, run_dir in runs.items()}
    env = {**os.environ, "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", LOADER, *files.values()],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(Path(files["mlp_run"]).parent),
        check=True,
    )
    loaded = json.loads(result.stdout)
    kinds = {"mlp_run": "generator", "dcgan_run": "generator"}
    kinds |= {"conditional_run": "conditional_generator", "flow_run": "particles"}
    for name, run_dir in runs.items():
        entry = loaded[files[name]]
        assert entry["kind"] == kinds[name] and entry["shape"] == [4, *SHAPES[name]]
        assert entry["report"]["privacy"] == shareable_report(_report(run_dir)["privacy"])
        assert entry["report"]["config"] == shareable_report(_config(run_dir))
        assert entry["same_seed_same_draw"]
    labels = loaded[files["conditional_run"]]["labels"]
    assert len(labels) == 4 and all(0 <= label < 10 for label in labels)


def _epsilon_curve_of_checkpoint(run_dir: Path) -> list[tuple[int, float]]:
    """The accountant's (step, ε) record as its checkpoint state holds it."""
    state = torch.load(find_checkpoint(run_dir), map_location="cpu", weights_only=True)
    (accountant,) = [v for k, v in state["callbacks"].items() if "PrivacyAccountant" in k]
    curve = EpsilonCurve()
    curve.load_state_dict(accountant["epsilon_curve"])
    return curve.points()


def test_a_central_dp_run_draws_epsilon_against_the_step(conditional_run, flow_run):
    for run_dir in (conditional_run, flow_run):
        assert (run_dir / "epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # DP-Sinkhorn: a subsampled Gaussian release per step; ε is recorded where it is logged
    # (every trainer.log_every_n_steps releases) and at the start and the end of training
    points = _epsilon_curve_of_checkpoint(conditional_run)
    assert [step for step, _ in points] == [0, 3]
    values = [epsilon for _, epsilon in points]
    assert values[0] == 0.0 < values[-1]
    assert values[-1] == pytest.approx(_report(conditional_run)["privacy"]["epsilon"])
    # DPSWflow: its one release is made before the first step; the steps spend nothing more
    (point,) = _epsilon_curve_of_checkpoint(flow_run)
    assert point == (0, pytest.approx(_report(flow_run)["privacy"]["epsilon"]))


def test_the_flow_file_holds_no_private_record(flow_run):
    datamodule = load_datamodule(flow_run / "config.yaml")
    datamodule.setup("fit")
    blob = (flow_run / "generator.pt").read_bytes()
    rows = [datamodule.latents, datamodule.source.load().train]
    needles = [row.numpy().tobytes() for records in rows for row in records.float()]
    assert needles and not any(needle in blob for needle in needles)


def test_the_checkpoint_is_found_in_either_run_layout(tmp_path):
    for layout in ("checkpoints", "lightning_dpot/abc123/checkpoints"):
        run = tmp_path / layout.replace("/", "_") / "run"
        (run / layout).mkdir(parents=True)
        (run / "config.yaml").write_text("model: {}\n")
        older, last = run / layout / "epoch=0-step=2.ckpt", run / layout / "last.ckpt"
        last.write_bytes(b"")
        older.write_bytes(b"")
        assert find_checkpoint(run) == last  # last.ckpt, even when older by date
        last.unlink()
        newest = run / layout / "epoch=1-step=4.ckpt"
        newest.write_bytes(b"")
        os.utime(older, (1, 1))
        assert find_checkpoint(run) == newest
    with pytest.raises(ValueError, match="checkpoints of 2 runs"):
        find_checkpoint(tmp_path)


def test_refusals_are_one_line_naming_what_is_wrong(dcgan_run, tmp_path, capsys):
    def refused(args: list[str]) -> str:
        with pytest.raises(SystemExit):
            main(["export", *args])
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("dpot export: error: "), err
        return err

    assert "is not a directory" in refused([str(tmp_path / "nothing")])
    (tmp_path / "empty").mkdir()
    assert "holds no checkpoint" in refused([str(tmp_path / "empty")])
    copied = tmp_path / "copied"  # a run directory without report.json
    shutil.copytree(dcgan_run, copied, ignore=shutil.ignore_patterns("report.json"))
    assert "no report.json" in refused([str(copied)])
    with pytest.raises(TypeError, match="AutoencoderModule cannot be exported"):
        export_generator(AutoencoderModule(ConvAutoencoder32()), tmp_path / "x.pt", privacy=None)


def test_the_export_states_the_releases_of_its_checkpoint_not_a_stale_report(
    conditional_run, tmp_path, capsys
):
    """``report.json`` may come from another process of the same run (an earlier one that
    released less, or a later one killed after the checkpoint): the export reads the
    checkpoint's own releases."""
    run_dir = tmp_path / "run"
    shutil.copytree(conditional_run, run_dir)
    report = _report(run_dir)
    stale = {**report, "privacy": {**report["privacy"], "releases": 1, "epsilon": 0.01}}
    (run_dir / "report.json").write_text(json.dumps(stale))
    main(["export", str(run_dir), "--output", str(tmp_path / "exported.pt")])
    capsys.readouterr()
    privacy = read_embedded_report(tmp_path / "exported.pt")["privacy"]
    assert privacy["releases"] == privacy["journal_position"] == 3
    assert privacy["epsilon"] == pytest.approx(report["privacy"]["epsilon"], rel=1e-12)
    assert "journal" not in privacy and "ledger" not in privacy


def test_a_dp_merf_run_loads_for_sampling_evaluation_and_export(tmp_path, capsys):
    """Loading a checkpoint for inference runs no resume check (DP-MERF's plan and kernel
    are compared only when a fit resumes)."""
    config = copy.deepcopy(CONDITIONAL_RUN)
    config["model"] = {
        "class_path": "lightning_dpot.methods.DPMERF",
        "init_args": {
            "generator": CONDITIONAL_RUN["model"]["init_args"]["generator"],
            "target_epsilon": 2.0,
            "delta": 1.0e-5,
            "num_frequencies": 50,
            "length_scale": 6.0,
        },
    }
    (tmp_path / "merf").mkdir()
    run_dir = _fit(config, tmp_path / "merf")
    ckpt = find_checkpoint(run_dir)
    main(
        [
            "sample",
            "--ckpt_path",
            str(ckpt),
            "--num_samples",
            "6",
            "--output",
            str(tmp_path / "s.pt"),
        ]
    )
    assert torch.load(tmp_path / "s.pt", weights_only=True).shape == (6, 1, 8, 8)
    main(["export", str(run_dir), "--output", str(tmp_path / "g.pt")])
    assert read_embedded_report(tmp_path / "g.pt")["privacy"]["releases"] == 1
    capsys.readouterr()
    main(["evaluate", "--ckpt_path", str(ckpt), "--metrics", "w2", "--num_samples", "20",
          "--no_report", "--no_progress"])  # fmt: skip
    assert json.loads(capsys.readouterr().out)["results"]["w2"]


def test_a_checkpoint_without_accountant_state_is_reported_from_its_release_objects(
    conditional_run, tmp_path, capsys
):
    """A fit without an accountant (Python API) leaves checkpoints whose release objects still
    record every event: the export composes those, never the run's older report."""
    run_dir = tmp_path / "run"
    shutil.copytree(conditional_run, run_dir)
    checkpoint = torch.load(find_checkpoint(run_dir), map_location="cpu", weights_only=True)
    checkpoint["callbacks"] = {
        k: v for k, v in checkpoint["callbacks"].items() if "PrivacyAccountant" not in k
    }
    torch.save(checkpoint, run_dir / "no_accountant.ckpt")
    report = _report(run_dir)
    stale = {**report, "privacy": {**report["privacy"], "releases": 1, "epsilon": 0.01}}
    (run_dir / "report.json").write_text(json.dumps(stale))
    ckpt = str(run_dir / "no_accountant.ckpt")
    main(["export", str(run_dir), "--ckpt_path", ckpt, "--output", str(tmp_path / "g.pt")])
    capsys.readouterr()
    privacy = read_embedded_report(tmp_path / "g.pt")["privacy"]
    assert privacy["releases"] == 3
    assert privacy["epsilon"] == pytest.approx(report["privacy"]["epsilon"], rel=1e-12)


def test_dpot_evaluate_enters_its_raw_held_out_split_and_refuses_released_records(tmp_path, capsys):
    """Evaluation reads its held-out split without noise: a public use in the ledger, refused
    where those records were released privately (another split of the same digits)."""
    from lightning_dpot.data.ledger_file import PrivacyLedger

    (tmp_path / "run").mkdir()
    run_dir = _fit(CONDITIONAL_RUN, tmp_path / "run")  # its releases, in this test's ledger
    ckpt = find_checkpoint(run_dir)
    config = _config(run_dir)
    config["data"]["init_args"]["source"] = {
        "class_path": "lightning_dpot.data.Digits",
        "init_args": {"split_seed": 1},
    }
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"data": config["data"]}))
    arguments = ["evaluate", "--ckpt_path", str(ckpt), "--metrics", "w2", "--num_samples", "20",
                 "--no_report", "--no_progress"]  # fmt: skip
    ledger = PrivacyLedger()
    lines = len(ledger.path.read_text().splitlines())
    main(arguments)  # the run's own held-out split, entered as a public use by the fit
    assert len(ledger.path.read_text().splitlines()) == lines
    assert json.loads(ledger.path.read_text().splitlines()[0])["use"] == "public"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*arguments, "--data_config", str(tmp_path / "other.yaml")])
    assert "were released privately before" in capsys.readouterr().err
