"""Every manifold config (Reshetova et al. 2024, Figs. 1–2) parses and trains a few steps through
the CLI (tiny data)."""

from pathlib import Path

import pytest

from lightning_dpot.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs" / "entropic_wgan").glob("fig[12]_*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_manifold_config_runs(config, tmp_path):
    main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_steps=2",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.callbacks.init_args.num_samples=200",
            "--data.init_args.source.init_args.n=400",
            "--data.init_args.batch_size=100",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert (tmp_path / "report.json").is_file()
