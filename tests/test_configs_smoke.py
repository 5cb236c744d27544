"""Every image config in configs/entropic_wgan (Reshetova et al. 2024, Figs. 3, 6, 7, 11–14)
parses and trains two steps through the `dpot` CLI on tiny data (a few generated digits in the
MNIST format, small batches, a narrow generator), and the privacy report holds the ε/σ its header
comment states. The manifold
configs (``fig1_*``/``fig2_*``) are covered by tests/test_configs_manifolds.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_dpot.cli import main
from lightning_dpot.config import compose_config

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "entropic_wgan"
CONFIGS = sorted(c for c in CONFIG_DIR.glob("*.yaml") if not c.name.startswith(("fig1_", "fig2_")))

# What each image config's header promises (ε for ε-stated runs, σ where the paper states σ).
EXPECTED_PRIVACY = {
    "mnist_fig3_gaussian": ("epsilon", 35.0),
    "mnist_fig3_laplace": ("noise_scale", 8.0),
    "mnist_fig12_laplace_b3": ("epsilon", 1568 / 3),
    "fashion_fig11_laplace_b7": ("epsilon", 224.0),
    "fashion_fig13_laplace_dct_l1radius350": ("epsilon", 100.0),
    "fashion_fig13_laplace_dct_l1radius275": ("epsilon", 550 / 7),
    "fashion_fig14_gaussian_l2radius20_eps35": ("noise_scale", 7.247),
    "fashion_fig14_gaussian_l2radius20_eps25": ("noise_scale", 9.174),
}


def _model_overrides(model: dict) -> list[str]:
    generator = model["init_args"]["generator"]["class_path"].rsplit(".", 1)[-1]
    if generator == "DCGANGenerator":
        return ["--model.init_args.generator.init_args.hidden_channels=8"]
    return []


def _source_overrides(source: dict, idx_dir: Path) -> list[str]:
    """Shrink the data source: MNIST and Fashion-MNIST read 64 generated digits of their format
    (the t10k files) from ``idx_dir``."""
    cls = source["class_path"].rsplit(".", 1)[-1]
    prefix = "--data.init_args.source.init_args"
    if cls in ("MNIST", "FashionMNIST"):
        return [f"{prefix}.idx_dir={idx_dir}", f"{prefix}.limit=64", f"{prefix}.split=test-only"]
    pytest.fail(f"no tiny-data override known for source {cls}; extend _source_overrides")


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_trains_two_steps_on_tiny_data(config: Path, tmp_path, digit_idx_dir):
    loaded = compose_config(config)  # the file with its __base__ fragments
    assert loaded["trainer"]["logger"]["class_path"] == "lightning_dpot.loggers.WandbRunLogger"
    out = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_steps=2",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={out}",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            "--data.init_args.batch_size=16",
            "--trainer.callbacks.init_args.num_samples=4",
            *_model_overrides(loaded["model"]),
            *_source_overrides(loaded["data"]["init_args"]["source"], digit_idx_dir),
        ]
    )
    report = json.loads((out / "report.json").read_text())
    assert report["global_step"] == 2
    assert report["metrics"]["train/loss"] == report["metrics"]["train/loss"]  # finite
    for prefix, (key, value) in EXPECTED_PRIVACY.items():
        if config.stem.startswith(prefix):
            assert report["privacy"][key] == pytest.approx(value, rel=1e-3)


def test_every_image_figure_has_a_config():
    names = {c.stem for c in CONFIGS}
    for prefix in EXPECTED_PRIVACY:
        assert any(n.startswith(prefix) for n in names), prefix
    for stem in ("mnist_fig6_w2_vs_sigma_entropic", "mnist_fig7_w2_vs_n_entropic"):
        assert stem in names
