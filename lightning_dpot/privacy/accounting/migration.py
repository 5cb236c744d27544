"""Checkpoint layouts of this package's privacy state, and the one table that upgrades every
earlier layout to the current one (as Lightning's ``utilities/migration`` does for its own keys).

Two pieces of a checkpoint carry privacy state:

* the **module's**: ``checkpoint["privacy"]`` (``PRIVACY_KEY``), written by
  ``ReleasesPrivateData`` for every method alike:
  ``{"version", "releases": [state of each release object], "plan", "settings", "facts"}``. Earlier
  layouts kept one key per method (``privacy_releases`` for DP-Sinkhorn, ``merf_release`` and
  ``merf_kernel`` for DP-MERF, ``dpsw_release`` for the DPSW methods) beside ``privacy_plan``;
* the **accountant's** callback state (``PrivacyAccountantCallback``): ``{"version", "composition",
"journal": {"path", "id",
  "position"}, ...}``. Version 1 kept only the accountant's history; version 2 kept the
  one-shot release apart and named the journal as ``[path, id]``, without the position.

Each migration takes one version to the next; ``migrate_module_state`` and
``migrate_accountant_state`` apply them in order, so a checkpoint of any earlier version is
read by one code path. A layout newer than this package's is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "ACCOUNTANT_STATE_VERSION",
    "PRIVACY_KEY",
    "PRIVACY_STATE_VERSION",
    "migrate_accountant_state",
    "migrate_module_state",
]

#: The module's privacy state in a checkpoint.
PRIVACY_KEY = "privacy"
PRIVACY_STATE_VERSION = 3
ACCOUNTANT_STATE_VERSION = 3

#: The per-method keys of layouts before version 3, and the release state each one held.
_LEGACY_RELEASE_KEYS = ("privacy_releases", "merf_release", "dpsw_release")


def _module_v2_to_v3(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """One key per method → the one ``privacy`` section."""
    releases = []
    for key in _LEGACY_RELEASE_KEYS:
        if key in checkpoint:
            state = checkpoint[key]
            # DP-Sinkhorn stored its sanitizer's event log alone.
            releases.append({"events": state} if key == "privacy_releases" else state)
    return {
        "version": 3,
        "releases": releases,
        "plan": checkpoint.get("privacy_plan"),
        "settings": checkpoint.get("merf_kernel"),
        "facts": None,  # the report's facts were not kept before version 3
    }


def _accountant_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "one_shot": [],
        "one_shot_adjacency": [],
        "swor_sizes": [None, None],
        "privacy_plan": None,
        "journal": None,
        "ledger_entry": None,
        **state,
        "version": 2,
    }


def _accountant_v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    one_shot = [
        {"event": "GaussianRelease", "noise_multiplier": sigma, "adjacency": adjacency}
        for sigma, adjacency in zip(state["one_shot"], state["one_shot_adjacency"], strict=True)
    ]
    journal = state.get("journal")
    return {
        "version": 3,
        "composition": {
            "accountant": state["accountant"],
            "one_shot": one_shot[0] if one_shot else None,
            "swor_sizes": list(state["swor_sizes"]),
        },
        "target_epsilon": state.get("target_epsilon"),
        "delta": state.get("delta"),
        "privacy_plan": state.get("privacy_plan"),
        # Version 2 did not record the journal's length at the checkpoint.
        "journal": None
        if journal is None
        else {"path": str(journal[0]), "id": str(journal[1]), "position": None},
        "ledger_entry": state.get("ledger_entry"),
        "epsilon_curve": state.get("epsilon_curve"),
        "stopped_by_budget": False,  # not kept before version 3
    }


_ACCOUNTANT_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _accountant_v1_to_v2,
    2: _accountant_v2_to_v3,
}


def migrate_module_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The module's privacy section of ``checkpoint`` in the current layout (``None``: the
    checkpoint holds no privacy state, e.g. a non-private module's).

    Raises:
        ValueError: a layout newer than this package reads.
    """
    if PRIVACY_KEY in checkpoint:
        state = checkpoint[PRIVACY_KEY]
        _check_version("the module's privacy state", state["version"], PRIVACY_STATE_VERSION)
        return state
    if any(key in checkpoint for key in _LEGACY_RELEASE_KEYS):
        return _module_v2_to_v3(checkpoint)
    return None


def migrate_accountant_state(state: dict[str, Any]) -> dict[str, Any]:
    """The accountant's callback state in the current layout.

    Raises:
        ValueError: a layout newer than this package reads.
    """
    version = int(state.get("version", 1))
    _check_version("PrivacyAccountantCallback state", version, ACCOUNTANT_STATE_VERSION)
    while version < ACCOUNTANT_STATE_VERSION:
        state = _ACCOUNTANT_MIGRATIONS[version]({**state, "version": version})
        version = int(state["version"])
    return state


def _check_version(what: str, version: int, current: int) -> None:
    if int(version) > current:
        raise ValueError(
            f"{what} has layout version {version}, newer than the {current} this lightning_dpot "
            "reads: load the checkpoint with the version of the package that wrote it"
        )
