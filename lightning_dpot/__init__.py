"""lightning_dpot: differentially private generative models with optimal-transport losses.

The classes a script needs are importable from here; each is imported on first use, so
``import lightning_dpot`` stays fast (no Lightning, torch or KeOps until a class is asked for)::

    from lightning_dpot import EntropicWGAN, HalfCircle, MLPGenerator, PrivatizedDataModule
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_dpot._version import __version__

#: Public name → the module that defines it.
_EXPORTS = {
    # methods
    "DPMERF": "lightning_dpot.methods",
    "DPSinkhorn": "lightning_dpot.methods",
    "DPSWFlow": "lightning_dpot.methods",
    "DPSWFlowR": "lightning_dpot.methods",
    "DPSWGen": "lightning_dpot.methods",
    "EntropicWGAN": "lightning_dpot.methods",
    "GeneratorModule": "lightning_dpot.methods",
    "NoisyWGAN": "lightning_dpot.methods",
    # data
    "CentralDPDataModule": "lightning_dpot.data",
    "PrivateLatentDataModule": "lightning_dpot.data",
    "PrivatizedDataModule": "lightning_dpot.data",
    "Digits": "lightning_dpot.data",
    "Ellipse": "lightning_dpot.data",
    "FashionMNIST": "lightning_dpot.data",
    "GaussianMixture2D": "lightning_dpot.data",
    "HalfCircle": "lightning_dpot.data",
    "ImageFolder": "lightning_dpot.data",
    "LedgerSettings": "lightning_dpot.data",
    "MNIST": "lightning_dpot.data",
    "Rectangle": "lightning_dpot.data",
    "TensorFile": "lightning_dpot.data",
    # networks
    "ConditionalDCGANGenerator": "lightning_dpot.nn",
    "DCGANGenerator": "lightning_dpot.nn",
    "MLPGenerator": "lightning_dpot.nn",
    # privacy, callbacks, metrics
    "PrivacyAccountantCallback": "lightning_dpot.callbacks",
    "ReleasesPrivateData": "lightning_dpot.privacy",
    "MetricSelection": "lightning_dpot.metrics.selection",
    # optimal transport
    "EntropicOT": "lightning_dpot.ot",
    "EntropicSolver": "lightning_dpot.ot",
    # configs, runs and exports
    "compose_config": "lightning_dpot.config",
    "export_generator": "lightning_dpot.export",
    "run_lightning": "lightning_dpot.training",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lightning_dpot' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
