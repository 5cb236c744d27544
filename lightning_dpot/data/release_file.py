"""A release written by ``dpot privatize``, read back for training: its metadata fixes the
mechanism, ε, δ and every other privatization setting, and a given argument that differs from
it is refused (training on the file spends exactly what it was made with)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lightning_dpot.data.release import Release
from lightning_dpot.privacy.mechanisms.additive import make_mechanism
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import RecordTransform, make_transform


def load_release_file(path: Path) -> tuple[Release, RecordTransform, LocalRandomizer]:
    """The release at ``path``, with the record transform and the randomizer its metadata
    describes (their public settings: no noise is drawn from them)."""
    release = Release.load(path)
    meta = release.metadata
    privacy = meta["privacy"]
    transform = make_transform(
        privacy["transform"], tuple(meta["sample_shape"]), privacy.get("dct_keep")
    )
    mechanism = make_mechanism(
        privacy["name"],
        privacy["sensitivity"],
        noise_scale=privacy["noise_scale"],
        delta=privacy["delta"] or None,
        calibration=privacy.get("calibration", "analytic"),
    )
    low, high = privacy["declared_bounds"]
    randomizer = LocalRandomizer(
        mechanism, transform, low, high, privacy["l1_radius"], privacy["l2_radius"]
    )
    return release, transform, randomizer


def _same(given: Any, recorded: Any) -> bool:
    """Equal, numbers up to rounding (a file's ε may be derived from its noise scale)."""
    numbers = (int, float)
    if isinstance(given, numbers) and isinstance(recorded, numbers):
        if isinstance(given, bool) or isinstance(recorded, bool):
            return given is recorded
        return math.isclose(given, recorded, rel_tol=1e-9, abs_tol=0.0)
    return given == recorded


def check_given_matches_release(
    given: dict[str, Any], metadata: dict[str, Any], release_path: Path
) -> None:
    """Refuse every given privatization argument that differs from the release file's
    metadata, naming the parameter, the given value and the file's value: the release was
    made once, under its own settings, and training on it spends exactly those."""
    privacy = metadata["privacy"]
    recorded = {
        "mechanism": privacy["name"],
        "epsilon": privacy["epsilon"],
        "delta": privacy["delta"],
        "noise_scale": privacy["noise_scale"],
        "calibration": privacy.get("calibration"),
        "l1_radius": privacy["l1_radius"],
        "l2_radius": privacy["l2_radius"],
        "transform": privacy["transform"],
        "dct_keep": privacy.get("dct_keep"),
        "seed": metadata["seed"] if metadata["seed_is_public"] else "secret (not recorded)",
        "secure_rng": metadata.get("secure_rng", False),
    }
    differ = [
        f"{name}={value!r} is given but the release file has {name}={recorded[name]!r}"
        for name, value in given.items()
        if value is not None and not _same(value, recorded[name])
    ]
    if differ:
        raise ValueError(
            f"release_path={str(release_path)!r}: " + "; ".join(differ) + ". A "
            "release's privatization is fixed when it is made: drop these arguments or "
            "make a new release with `dpot privatize`"
        )
