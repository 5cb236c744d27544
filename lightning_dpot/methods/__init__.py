"""Methods: one LightningModule per method."""

from lightning_dpot.methods.base import GeneratorModule
from lightning_dpot.methods.entropic_wgan import EntropicWGAN

__all__ = ["EntropicWGAN", "GeneratorModule"]
