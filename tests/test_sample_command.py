"""`dpot sample`: fit tiny runs through the CLI, then sample from their checkpoints (tensor, npz,
a folder of PNGs, a grid); the model is rebuilt from the run's config.yaml and carries the
trained weights; a class-conditional generator writes its labels."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tiny_runs import CONDITIONAL_GENERATOR, dcgan_run

from lightning_dpot.cli import main
from lightning_dpot.commands.checkpoint import find_run_config, load_model
from lightning_dpot.nn import DCGANGenerator

REPO = Path(__file__).resolve().parents[1]
TINY_RUN = dcgan_run(
    {"max_steps": 2, "logger": False, "enable_progress_bar": False, "enable_model_summary": False}
)


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_RUN))
    main(
        [
            "fit",
            "--config",
            str(config),
            f"--trainer.default_root_dir={root / 'out'}",
            f"--data.init_args.cache_dir={root / 'cache'}",
        ]
    )
    (ckpt,) = (root / "out").rglob("*.ckpt")
    return ckpt


def test_sample_writes_a_tensor_file_and_a_grid_from_the_trained_weights(
    fitted_run, tmp_path, capsys
):
    out, grid = tmp_path / "samples.pt", tmp_path / "grid.png"
    main(
        ["sample", "--ckpt_path", str(fitted_run), "--num_samples", "10", "--output", str(out)]
        + ["--grid", str(grid), "--seed", "0"]
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["shape"] == [10, 1, 8, 8] and summary["config"].endswith("config.yaml")
    samples = torch.load(out, weights_only=True)
    assert samples.shape == (10, 1, 8, 8) and samples.abs().max() <= 1.0
    assert grid.is_file() and grid.stat().st_size > 0

    # The same samples from the checkpoint's generator weights and the same latent draws.
    state = torch.load(fitted_run, map_location="cpu", weights_only=True)["state_dict"]
    generator = DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4)
    generator.load_state_dict(
        {k.removeprefix("generator."): v for k, v in state.items() if k.startswith("generator.")}
    )
    generator.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        expected = generator(torch.rand(10, 4))
    assert torch.allclose(samples, expected)


def test_load_model_rebuilds_the_configured_module(fitted_run):
    model, config_path = load_model(fitted_run)
    assert type(model).__name__ == "EntropicWGAN"
    assert config_path == find_run_config(fitted_run)
    assert model.latent_range == (0.0, 1.0) and model.generator.latent_dim == 4


def test_grid_only_and_explicit_config(fitted_run, tmp_path):
    grid = tmp_path / "only.png"
    config = find_run_config(fitted_run)
    main(
        ["sample", "--ckpt_path", str(fitted_run), "--num_samples", "4", "--grid", str(grid)]
        + ["--config", str(config)]
    )
    assert grid.is_file() and not list(tmp_path.glob("*.pt"))


def test_config_is_found_by_walking_up_from_the_checkpoint(tmp_path):
    nested = tmp_path / "run" / "project" / "version" / "checkpoints"
    nested.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("model: {}\n")
    assert find_run_config(nested / "last.ckpt") == tmp_path / "run" / "config.yaml"


def test_errors_name_what_is_missing_in_one_line(fitted_run, tmp_path, capsys):
    for args, named in (
        (
            ["--ckpt_path", str(tmp_path / "nope.ckpt"), "--num_samples", "2", "--grid", "x.png"],
            "nope.ckpt",
        ),
        (["--ckpt_path", str(fitted_run), "--num_samples", "2"], "--output"),
        (["--ckpt_path", str(fitted_run), "--num_samples", "0", "--grid", "x.png"], "num"),
    ):
        with pytest.raises(SystemExit):
            main(["sample", *args])
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("dpot sample: error: "), err
        assert named in err
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no report.json" in err
    lonely = tmp_path / "lonely.ckpt"
    lonely.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="--config"):
        find_run_config(lonely)


CONDITIONAL_RUN = {  # DP-Sinkhorn with a class-conditional generator (Cao et al. 2021)
    "seed_everything": 0,
    "trainer": {
        "max_steps": 2,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    },
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
POINTS_RUN = {  # 2-D records: an MLP generator on the half circle
    **TINY_RUN,
    "model": {
        "class_path": "lightning_dpot.methods.EntropicWGAN",
        "init_args": {
            "generator": {
                "class_path": "lightning_dpot.nn.MLPGenerator",
                "init_args": {"latent_dim": 2, "output_shape": [2], "hidden": [8]},
            },
        },
    },
    "data": {
        "class_path": "lightning_dpot.data.PrivatizedDataModule",
        "init_args": {
            "source": {"class_path": "lightning_dpot.data.HalfCircle", "init_args": {"n": 200}},
            "mechanism": "laplace",
            "epsilon": 2.5,
            "batch_size": 100,
        },
    },
}


def _fit(config: dict, root) -> object:
    path = root / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["fit", "--config", str(path), f"--trainer.default_root_dir={root / 'out'}"]
    if config["data"]["class_path"].endswith("PrivatizedDataModule"):
        args.append(f"--data.init_args.cache_dir={root / 'cache'}")
    main(args)
    (ckpt,) = (root / "out").rglob("*.ckpt")
    return ckpt


@pytest.fixture(scope="module")
def conditional_run(tmp_path_factory):
    return _fit(CONDITIONAL_RUN, tmp_path_factory.mktemp("conditional"))


@pytest.fixture(scope="module")
def points_run(tmp_path_factory):
    return _fit(POINTS_RUN, tmp_path_factory.mktemp("points"))


def _sample(ckpt, capsys, *args: str) -> dict:
    """``dpot sample`` with seed 0; its JSON summary."""
    main(["sample", "--ckpt_path", str(ckpt), "--seed", "0", *args])
    return json.loads(capsys.readouterr().out)


def _png_pixels(folder, name: str) -> torch.Tensor:
    """The pixels of a PNG file, ``(channels, height, width)``."""
    from PIL import Image

    with Image.open(folder / name) as image:
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def test_npz_and_png_dir_hold_the_draw_of_the_tensor_file(fitted_run, tmp_path, capsys):
    _sample(fitted_run, capsys, "--num_samples", "5", "--output", str(tmp_path / "s.pt"))
    for fmt, output in (("npz", "s.npz"), ("png-dir", "png")):
        args = ["--num_samples", "5", "--format", fmt, "--output", str(tmp_path / output)]
        summary = _sample(fitted_run, capsys, *args)
        assert summary["format"] == fmt and summary["labels"] is False
    samples = torch.load(tmp_path / "s.pt", weights_only=True)
    arrays = np.load(tmp_path / "s.npz")
    assert set(arrays.files) == {"samples"}  # an unconditional generator draws no labels
    assert np.array_equal(arrays["samples"], samples.numpy())
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == [f"{i:06d}.png" for i in range(5)]  # one file per image, no labels.csv
    for i, name in enumerate(names):  # [-1, 1] → 8-bit pixels (within rounding), gray as RGB
        expected = (samples[i] + 1) / 2 * 255
        pixels = _png_pixels(tmp_path / "png", name)
        assert pixels.shape == (3, 8, 8) and (pixels - expected).abs().max() <= 0.51


def test_a_conditional_generator_writes_its_labels(conditional_run, tmp_path, capsys):
    npz, folder = tmp_path / "s.npz", tmp_path / "png"
    for fmt, output in (("npz", npz), ("png-dir", folder)):
        args = ["--num_samples", "12", "--format", fmt, "--output", str(output)]
        assert _sample(conditional_run, capsys, *args)["labels"] is True
    arrays = np.load(npz)
    assert arrays["samples"].shape == (12, 1, 8, 8) and arrays["labels"].shape == (12,)
    model, _ = load_model(conditional_run)
    x, y = model.sample_labeled(12, generator=torch.Generator().manual_seed(0))
    assert np.array_equal(arrays["labels"], y.numpy()) and set(y.tolist()) <= set(range(10))
    assert np.allclose(arrays["samples"], x.numpy())
    rows = (folder / "labels.csv").read_text().splitlines()
    assert rows[0] == "file,label"
    assert rows[1:] == [f"{i:06d}.png,{label}" for i, label in enumerate(y.tolist())]
    assert len(list(folder.glob("*.png"))) == 12


def test_png_dir_is_refused_for_points_and_for_a_folder_in_use(
    points_run, fitted_run, tmp_path, capsys
):
    npz, folder = tmp_path / "s.npz", tmp_path / "png"
    _sample(points_run, capsys, "--num_samples", "4", "--format", "npz", "--output", str(npz))
    assert np.load(npz)["samples"].shape == (4, 2)
    with pytest.raises(SystemExit):
        _sample(
            points_run, capsys, "--num_samples", "4", "--format", "png-dir", "--output", str(folder)
        )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--format png-dir" in err and "records of shape (2,)" in err
    assert "accepted --format for this model: pt, npz  (DPOT_DEBUG" in err
    assert not folder.exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("")
    with pytest.raises(SystemExit):
        _sample(
            fitted_run, capsys, "--num_samples", "2", "--format", "png-dir", "--output", str(used)
        )
    assert "is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in used.iterdir()] == ["keep.txt"]


def test_a_checkpoint_sampled_with_another_runs_config_is_refused_in_one_line(
    fitted_run, tmp_path, capsys
):
    other = REPO / "configs" / "dp_merf" / "fashion_mnist_eps10.yaml"
    argv = [
        "sample",
        "--ckpt_path",
        str(fitted_run),
        "--num_samples",
        "2",
        "--output",
        str(tmp_path / "x.pt"),
    ]
    with pytest.raises(SystemExit):
        main([*argv, "--config", str(other)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "does not fit the DPMERF of config=" in line and "give the config.yaml" in line
