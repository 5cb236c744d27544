"""Networks: generators and autoencoders."""

from lightning_dpot.nn.dcgan import ConditionalDCGANGenerator, DCGANGenerator
from lightning_dpot.nn.mlp import MLPGenerator

__all__ = ["ConditionalDCGANGenerator", "DCGANGenerator", "MLPGenerator"]
