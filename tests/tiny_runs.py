"""The tiny image run the command tests fit through the CLI: EntropicWGAN with a small DCGAN
generator on the 8×8 digits (scikit-learn, shipped), privatized by the Gaussian mechanism. A few
CPU steps; each test adds its trainer settings."""

from __future__ import annotations

import copy
from typing import Any

DCGAN_MODEL = {
    "class_path": "lightning_dpot.methods.EntropicWGAN",
    "init_args": {
        "generator": {
            "class_path": "lightning_dpot.nn.DCGANGenerator",
            "init_args": {"latent_dim": 4, "image_size": 8, "hidden_channels": 4},
        },
        "latent_range": [0.0, 1.0],
    },
}
CONDITIONAL_GENERATOR = {  # the class-conditional DCGAN of the tiny central-DP runs
    "class_path": "lightning_dpot.nn.ConditionalDCGANGenerator",
    "init_args": {
        "num_classes": 10,
        "latent_dim": 4,
        "image_size": 8,
        "hidden_channels": [4, 4, 4],
    },
}
DIGITS_DATA = {
    "class_path": "lightning_dpot.data.PrivatizedDataModule",
    "init_args": {
        "source": {"class_path": "lightning_dpot.data.Digits"},
        "mechanism": "gaussian",
        "noise_scale": 0.5,
        "delta": 1.0e-4,
        "batch_size": 64,
    },
}


def dcgan_run(trainer: dict[str, Any], **data: Any) -> dict[str, Any]:
    """A fresh config of the tiny DCGAN run with ``trainer`` and extra data ``init_args``."""
    config = {
        "seed_everything": 0,
        "trainer": copy.deepcopy(trainer),
        "model": copy.deepcopy(DCGAN_MODEL),
        "data": copy.deepcopy(DIGITS_DATA),
    }
    config["data"]["init_args"].update(data)
    return config
