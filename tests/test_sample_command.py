"""`dpot sample`: fit a tiny run through the CLI, then sample from its checkpoint (tensor + PNG);
the model is rebuilt from the run's config.yaml and carries the trained weights."""

import json

import pytest
import torch
import yaml

from lightning_dpot.cli import main
from lightning_dpot.commands.sample import find_run_config, load_model
from lightning_dpot.nn import DCGANGenerator

TINY_RUN = {
    "seed_everything": 0,
    "trainer": {
        "max_steps": 2,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    },
    "model": {
        "class_path": "lightning_dpot.methods.EntropicWGAN",
        "init_args": {
            "generator": {
                "class_path": "lightning_dpot.nn.DCGANGenerator",
                "init_args": {"latent_dim": 4, "image_size": 8, "hidden_channels": 4},
            },
            "latent_range": [0.0, 1.0],
        },
    },
    "data": {
        "class_path": "lightning_dpot.data.PrivatizedDataModule",
        "init_args": {
            "source": {"class_path": "lightning_dpot.data.Digits"},
            "mechanism": "gaussian",
            "noise_scale": 0.5,
            "delta": 1.0e-4,
            "batch_size": 64,
        },
    },
}


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
        ["sample", "--ckpt", str(fitted_run), "--num", "10", "--output", str(out)]
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
        ["sample", "--ckpt", str(fitted_run), "--num", "4", "--grid", str(grid)]
        + ["--config", str(config)]
    )
    assert grid.is_file() and not list(tmp_path.glob("*.pt"))


def test_config_is_found_by_walking_up_from_the_checkpoint(tmp_path):
    nested = tmp_path / "run" / "project" / "version" / "checkpoints"
    nested.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("model: {}\n")
    assert find_run_config(nested / "last.ckpt") == tmp_path / "run" / "config.yaml"


def test_errors_name_what_is_missing(fitted_run, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["sample", "--ckpt", str(tmp_path / "nope.ckpt"), "--num", "2", "--grid", "x.png"])
    assert "nope.ckpt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sample", "--ckpt", str(fitted_run), "--num", "2"])
    assert "--output" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sample", "--ckpt", str(fitted_run), "--num", "0", "--grid", "x.png"])
    assert "num" in capsys.readouterr().err
    lonely = tmp_path / "lonely.ckpt"
    lonely.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="--config"):
        find_run_config(lonely)
