"""Networks: generators and autoencoders."""

from lightning_dpot.nn.autoencoder import (
    ConvAutoencoder32,
    DCGANAutoencoder64,
    DecoderGenerator,
)
from lightning_dpot.nn.dcgan import ConditionalDCGANGenerator, DCGANGenerator
from lightning_dpot.nn.mlp import MLPGenerator

__all__ = [
    "ConvAutoencoder32",
    "DCGANAutoencoder64",
    "DecoderGenerator",
    "ConditionalDCGANGenerator",
    "DCGANGenerator",
    "MLPGenerator",
]
