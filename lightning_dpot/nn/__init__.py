"""Networks: generators and autoencoders."""

from lightning_dpot.nn.autoencoder import (
    ConvAutoencoder32,
    DCGANAutoencoder64,
    DecoderGenerator,
)
from lightning_dpot.nn.dcgan import ConditionalDCGANGenerator, DCGANGenerator
from lightning_dpot.nn.mlp import MLPGenerator
from lightning_dpot.nn.upsampling import ConditionalUpsamplingGenerator

__all__ = [
    "ConvAutoencoder32",
    "DCGANAutoencoder64",
    "DecoderGenerator",
    "ConditionalDCGANGenerator",
    "ConditionalUpsamplingGenerator",
    "DCGANGenerator",
    "MLPGenerator",
]
