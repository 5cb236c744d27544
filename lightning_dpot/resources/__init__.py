"""The configs and ready-made callbacks that ship inside the package.

A source checkout keeps them at its root (``configs/``, ``callbacks/``); the wheel carries the same
files as ``lightning_dpot/resources/{configs,callbacks}``, so the commands of the README work
after ``pip install lightning_dpot-*.whl`` too, from any directory. A path on disk always wins:
``find_resource`` is asked only for a path that names no file.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The folders of ready-made YAML files, as a checkout names them.
RESOURCE_FOLDERS = ("configs", "callbacks")

_ROOT = Path(__file__).resolve().parent


def resource_root() -> Path:
    """The folder that holds ``configs/`` and ``callbacks/`` as installed."""
    return _ROOT


def find_resource(path: str | os.PathLike) -> Path | None:
    """The packaged file for ``path`` when ``path`` names no file on disk and reads as one of the
    package's own (``configs/...yaml`` or ``callbacks/...yaml``, with or without a leading
    ``./``); ``None`` otherwise.

    Example::

        >>> from lightning_dpot.resources import find_resource
        >>> find_resource("configs/quickstart.yaml").as_posix()  # from any working folder
        '.../resources/configs/quickstart.yaml'
    """
    given = Path(path)
    if given.exists() or given.is_absolute():
        return None
    parts = given.parts
    if not parts or parts[0] not in RESOURCE_FOLDERS or ".." in parts:
        return None
    packaged = _ROOT.joinpath(*parts)
    return packaged if packaged.is_file() else None


def resolve_path(path: str) -> str:
    """``path`` itself, or its packaged copy (``find_resource``) as a string."""
    packaged = find_resource(path)
    return str(packaged) if packaged is not None else path
