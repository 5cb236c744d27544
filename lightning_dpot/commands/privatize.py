"""``dpot privatize --config FILE --output PATH``: a local-DP release from the ``data`` section
of a config, written once, for a trainer that must never see raw data."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

DESCRIPTION = "privatize a dataset once (local DP) and write the release file"


def _datamodule_from_config(path: str) -> Any:
    import lightning as L
    from jsonargparse import ArgumentParser

    from lightning_dpot.config import check_renamed_keys, compose_config

    config = compose_config(path)
    section = config.get("data", config)
    if not isinstance(section, dict):
        raise SystemExit(f"dpot privatize: error: config={path!r} has no 'data' section")
    if section is config:  # a YAML holding only the data section
        check_renamed_keys(section, path, "data")
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    init = parser.instantiate_classes(parser.parse_object({"data": section}))
    return init.data


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="dpot privatize", description=DESCRIPTION)
    parser.add_argument("--config", required=True, help="YAML with a `data:` section")
    parser.add_argument("--output", required=True, help="path of the release file to write")
    args = parser.parse_args(argv)  # before the imports: --help prints at once
    from lightning_dpot.data.protocols import LocalDPRelease, satisfies

    datamodule = _datamodule_from_config(args.config)
    if not satisfies(datamodule, LocalDPRelease):
        raise SystemExit("dpot privatize: error: the data section must be a PrivatizedDataModule")
    path = datamodule.write_release(args.output)
    print(json.dumps({"release": str(path), "privacy": datamodule.privacy_report()}, indent=2))
