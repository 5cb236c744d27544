"""Methods: one LightningModule per method."""

from lightning_dpot.methods.base import GeneratorModule
from lightning_dpot.methods.entropic_wgan import EntropicWGAN
from lightning_dpot.methods.noisy_wgan import NoisyWGAN

__all__ = ["EntropicWGAN", "GeneratorModule", "NoisyWGAN"]
