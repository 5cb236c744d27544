"""Privacy: what a method that touches private records owes its users, and the tools to pay it.

A method author needs the contract (:mod:`~lightning_dpot.privacy.contract`): subclass
:class:`ReleasesPrivateData`, name the release objects in ``privacy_releases()``, and let each
release object emit one event (:class:`SubsampledGaussianStep` per noisy step,
:class:`GaussianRelease` for a one-shot release) into its :class:`EventLog`. The accountant
callback composes exactly those events.

Subpackages: :mod:`~lightning_dpot.privacy.mechanisms` (the code that adds noise: local
randomizers, sensitivities, DP-Sinkhorn's gradient sanitizer) and
:mod:`~lightning_dpot.privacy.accounting` (RDP / PLD accountants, calibration, the release
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
