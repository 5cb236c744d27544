"""What a data module saves in checkpoints, so that a resume on different data is refused.

Lightning stores ``datamodule.state_dict()`` in every checkpoint and hands it to
``load_state_dict`` on resume, after ``setup``. The private data modules save a *fingerprint*:
the privacy-relevant configuration and a hash of what training consumes (the LDP release, or the
size and split of the private set; never a plain hash of private records). On resume the
fingerprint of the current run must be identical. Otherwise training would continue on
different data or under a different mechanism, and the run's report would describe neither run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check_fingerprint"]


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any], owner: str) -> None:
    """Raise ``ValueError`` naming every entry that differs between the checkpoint's fingerprint
    and this run's."""
    keys = sorted(set(saved) | set(current))
    diffs = [
        f"{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}"
        for key in keys
        if saved.get(key) != current.get(key)
    ]
    if diffs:
        raise ValueError(
            f"the checkpoint was written for different data or privacy settings of {owner}; "
            "resuming would continue training on something else. Resume with the run's own "
            "configuration and cache (or start a new run). Differences:\n  " + "\n  ".join(diffs)
        )
