"""lightning_dpot: differentially private generative models with optimal-transport losses."""

__version__ = "0.1.0"
