"""Methods: one LightningModule per method."""

from lightning_dpot.methods.autoencoder import AutoencoderModule
from lightning_dpot.methods.base import GeneratorModule
from lightning_dpot.methods.conditional import ConditionalGeneratorModule
from lightning_dpot.methods.dp_merf import DPMERF
from lightning_dpot.methods.dp_sinkhorn import DPSinkhorn
from lightning_dpot.methods.dpsw import DPSWFlow, DPSWFlowR, DPSWGen
from lightning_dpot.methods.entropic_wgan import EntropicWGAN
from lightning_dpot.methods.noisy_wgan import NoisyWGAN

__all__ = [
    "AutoencoderModule",
    "ConditionalGeneratorModule",
    "DPMERF",
    "DPSinkhorn",
    "DPSWFlow",
    "DPSWFlowR",
    "DPSWGen",
    "EntropicWGAN",
    "GeneratorModule",
    "NoisyWGAN",
]
