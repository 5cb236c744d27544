"""Privacy: what a method that touches private records owes its users, and the tools to pay it.

A method author needs the contract (``lightning_dpot.privacy.contract``): subclass
``ReleasesPrivateData``, name the release objects in ``privacy_releases()``, and let each
release object emit one event (``SubsampledGaussianStep`` per noisy step,
``GaussianRelease`` for a one-shot release) into its ``EventLog``. The accountant
callback composes exactly those events.

Subpackages: ``lightning_dpot.privacy.mechanisms`` (the code that adds noise: local
randomizers, sensitivities, DP-Sinkhorn's gradient sanitizer) and
``lightning_dpot.privacy.accounting`` (RDP / PLD accountants, calibration, the release
journal, the report, shuffling and Wasserstein DP).
"""

from lightning_dpot.privacy.contract import Release, ReleasesPrivateData
from lightning_dpot.privacy.events import (
    EventLog,
    GaussianRelease,
    PrivacyEvent,
    SubsampledGaussianStep,
)

__all__ = [
    "EventLog",
    "GaussianRelease",
    "PrivacyEvent",
    "Release",
    "ReleasesPrivateData",
    "SubsampledGaussianStep",
]
