"""lightning_dpot: differentially private generative models with optimal-transport losses."""

from lightning_dpot._version import __version__

__all__ = ["__version__"]
