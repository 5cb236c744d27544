"""Composed YAML configs: a config may start from shared fragments (``__base__``).

``compose_config(path)`` returns the merged mapping; ``with_composed_configs(args)`` rewrites a
command line's ``--config FILE`` so that LightningCLI reads the composed config (the arguments
after it still override it). A ``configs/...`` or ``callbacks/...`` path that names no file on
disk is read from the copy installed with the package (``lightning_dpot.resources``). Both
refuse a key of ``RENAMED_KEYS`` or ``MOVED_DATA_KEYS`` with one line naming its new place.
Plain YAML, no Lightning: this module sits below everything that runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_dpot.resources import resolve_path

BASE_KEY = "__base__"

#: Keys renamed so that one quantity has one name everywhere: an absolute noise standard
#: deviation or scale is ``noise_scale`` (``noise_multiplier`` is always σ/Δ) and the ε-scaling
#: ratio of a Sinkhorn solve is ``scaling``.
RENAMED_KEYS = {"noise_sigma": "noise_scale", "sinkhorn_scaling": "scaling"}

#: Data-module arguments gathered into a group (``LedgerSettings``, ``WaveletDenoising``):
#: the old key → where it is now, relative to the data module's arguments.
MOVED_DATA_KEYS = {
    "privacy_budget": "ledger.budget",
    "exceed_privacy_budget": "ledger.exceed_budget",
    "ledger_dir": "ledger.dir",
    "public_reuse": "ledger.public_reuse",
    "denoise_wavelet": "denoise.init_args.wavelet",
}
#: The ``LedgerSettings`` field → the data-module argument it was.
_LEDGER_FIELDS = {
    new.partition(".")[2]: old for old, new in MOVED_DATA_KEYS.items() if new.startswith("ledger.")
}
#: ``denoise: wavelet`` as it was written before the denoiser became an object.
DENOISER = "lightning_dpot.data.WaveletDenoising"


def check_renamed_keys(config: Any, source: str = "", where: str = "") -> None:
    """Refuse any key of ``RENAMED_KEYS`` in ``config`` (nested mappings and lists), and in a
    data module's arguments (``where`` names the mapping's place) any key of
    ``MOVED_DATA_KEYS`` or ``denoise: wavelet``, naming the file (``source``), where the key is
    and what it is called now.

    Raises:
        ValueError: ``[config=FILE: ]<path.to.key> was renamed to <new key>`` or ``… moved to
            <its place in the group>``.
    """
    if isinstance(config, dict):
        prefix = f"config={source!r}: " if source else ""
        data_args = _is_data_arguments(where)
        for key, value in config.items():
            here = f"{where}.{key}" if where else str(key)
            if key in RENAMED_KEYS:
                raise ValueError(f"{prefix}{here} was renamed to {RENAMED_KEYS[key]}")
            if data_args and key in MOVED_DATA_KEYS:
                raise ValueError(f"{prefix}{here} moved to {where}.{MOVED_DATA_KEYS[key]}")
            if data_args and key == "denoise" and value == "wavelet":
                raise ValueError(f"{prefix}{_denoise_moved(here, config.get('denoise_wavelet'))}")
            check_renamed_keys(value, source, here)
    elif isinstance(config, list):
        for index, value in enumerate(config):
            check_renamed_keys(value, source, f"{where}[{index}]")


def _is_data_arguments(where: str) -> bool:
    """Whether the mapping at ``where`` (dotted keys) holds a data module's arguments."""
    keys = where.split(".")
    return keys[-1] == "data" or keys[-2:] == ["data", "init_args"]


def _denoise_moved(here: str, wavelet: Any) -> str:
    """The refusal of ``denoise: wavelet``, the spelling before the denoiser was an object."""
    return (
        f"{here}: the denoiser is an object now, {here}: {{class_path: WaveletDenoising, "
        f"init_args: {{wavelet: {wavelet or 'db4'}}}}}"
    )


def earlier_spelling(config: Any, where: str = "") -> Any:
    """``config`` with its data modules' grouped arguments spelled as before they were grouped
    (the inverse of ``migrate_renamed_keys`` for ``MOVED_DATA_KEYS``): the fingerprint of work
    done before the move, which then resumes under the new spelling."""
    if isinstance(config, list):
        return [earlier_spelling(v, where) for v in config]
    if not isinstance(config, dict):
        return config
    out = {k: earlier_spelling(v, f"{where}.{k}" if where else str(k)) for k, v in config.items()}
    if not _is_data_arguments(where):
        return out
    ledger = out.pop("ledger", None)
    if isinstance(ledger, dict):
        out |= {_LEDGER_FIELDS[k]: v for k, v in ledger.items() if k in _LEDGER_FIELDS}
    elif ledger is not None:
        out["ledger"] = ledger
    denoise = out.get("denoise")
    if isinstance(denoise, dict) and str(denoise.get("class_path", "")).endswith(
        "WaveletDenoising"
    ):
        wavelet = (denoise.get("init_args") or {}).get("wavelet", "db4")
        out["denoise"] = "wavelet"
        if wavelet != "db4":  # the default then went unwritten
            out["denoise_wavelet"] = wavelet
    return out


def migrate_renamed_keys(config: Any, where: str = "") -> Any:
    """``config`` with every key of ``RENAMED_KEYS`` under its new name and every key of
    ``MOVED_DATA_KEYS`` in its group: for reading the ``config.yaml`` a run of an earlier
    version saved (a new config is refused instead)."""
    if isinstance(config, list):
        return [migrate_renamed_keys(v, where) for v in config]
    if not isinstance(config, dict):
        return config
    out = {
        RENAMED_KEYS.get(k, k): migrate_renamed_keys(v, f"{where}.{k}" if where else str(k))
        for k, v in config.items()
    }
    if not _is_data_arguments(where):
        return out
    wavelet = out.pop("denoise_wavelet", "db4")
    if out.get("denoise") == "wavelet":
        out["denoise"] = {"class_path": DENOISER, "init_args": {"wavelet": wavelet}}
    ledger = {new: out.pop(old) for new, old in _LEDGER_FIELDS.items() if old in out}
    if ledger:
        out["ledger"] = {**(out.get("ledger") or {}), **ledger}
    return out


def compose_config(path: str | os.PathLike, *, migrate: bool = False) -> dict[str, Any]:
    """The config in ``path`` with the fragments named by its ``__base__`` merged beneath it.

    ``__base__`` is a path or a list of paths, relative to the file that names them; fragments
    may name their own. The fragments are merged in order, then the file itself on top: mappings
    merge key by key; anything else (a number, a string, a list such as ``trainer.callbacks``)
    replaces what is beneath; a mapping whose ``class_path`` differs from the one beneath
    replaces it whole (no init_args carry over to another class). A file without ``__base__``
    comes back as loaded. Files are read with jsonargparse's YAML loader, as ``--config`` is.
    A renamed key (``RENAMED_KEYS``) is refused, or with ``migrate`` (reading what a run of
    an earlier version saved) renamed (``migrate_renamed_keys``).

    Raises:
        ValueError: on a ``__base__`` loop, a file that is not a mapping, or a renamed key
            (``check_renamed_keys``).
        FileNotFoundError: when a file is missing.

    Example::

        >>> import pathlib, tempfile
        >>> from lightning_dpot.config import compose_config
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "base.yaml").write_text("trainer: {max_epochs: 10, accelerator: cpu}\\n")
        >>> _ = (d / "run.yaml").write_text("__base__: base.yaml\\ntrainer: {max_epochs: 2}\\n")
        >>> compose_config(d / "run.yaml")
        {'trainer': {'max_epochs': 2, 'accelerator': 'cpu'}}
    """
    config = _compose(Path(resolve_path(os.fspath(path))), ())
    if migrate:
        return migrate_renamed_keys(config)
    check_renamed_keys(config, str(path))
    return config


def _compose(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    from jsonargparse import get_loader

    here = path.resolve()
    if here in chain:
        loop = " -> ".join(str(p) for p in (*chain, here))
        raise ValueError(f"config={str(path)!r}: {BASE_KEY} loop {loop}")
    config = get_loader("yaml")(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"config={str(path)!r} must be a mapping, got {type(config).__name__}")
    bases = config.pop(BASE_KEY, [])
    composed: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        composed = _merge(composed, _compose(path.parent / base, (*chain, here)))
    return _merge(composed, config)


def _merge(base: Any, top: Any) -> Any:
    """``top`` over ``base`` by the rules of ``compose_config``."""
    if not (isinstance(base, dict) and isinstance(top, dict)):
        return top
    if "class_path" in base and "class_path" in top and base["class_path"] != top["class_path"]:
        return top
    merged = {**base, **{k: _merge(base[k], v) if k in base else v for k, v in top.items()}}
    if "class_path" in merged:  # written first, as in every config
        merged = {"class_path": merged.pop("class_path"), **merged}
    return merged


def with_composed_configs(args: Sequence[str]) -> list[str]:
    """``args`` with each ``--config FILE`` (``-c FILE``, ``--config=FILE``) whose file names
    ``__base__`` replaced by the composed config as a YAML string, which jsonargparse reads as
    it reads the file; the arguments after it still override it."""
    import yaml
    from jsonargparse import get_loader

    def composed(value: str) -> str:
        value = resolve_path(value)
        if not os.path.isfile(value):
            return value  # a YAML string, or a missing file for jsonargparse to report
        loaded = get_loader("yaml")(Path(value).read_text())
        if not isinstance(loaded, dict):
            what = "empty" if loaded is None else f"a {type(loaded).__name__}, not a mapping"
            raise ValueError(
                f"config={value!r} is {what}: a config maps sections (trainer, model, data) to "
                "their settings; start from one in configs/ (configs/README.md)"
            )
        if BASE_KEY not in loaded:
            check_renamed_keys(loaded, value)
            return value
        return yaml.safe_dump(compose_config(value), sort_keys=False)

    out = list(args)
    for arg in out:
        flag = arg.partition("=")[0]
        where, _, key = flag.removeprefix("--").rpartition(".")
        if arg.startswith("--") and key in RENAMED_KEYS:
            raise ValueError(f"{flag} was renamed to {RENAMED_KEYS[key]}")
        if arg.startswith("--") and _is_data_arguments(where) and key in MOVED_DATA_KEYS:
            raise ValueError(f"{flag} moved to --{where}.{MOVED_DATA_KEYS[key]}")
    for flag, value in zip(out, [*out[1:], ""], strict=True):
        name, eq, given = flag.partition("=")
        where, _, key = name.removeprefix("--").rpartition(".")
        if name.startswith("--") and _is_data_arguments(where) and key == "denoise":
            if (given if eq else value) == "wavelet":
                raise ValueError(_denoise_moved(name, None))
    for i, arg in enumerate(out):  # a packaged callback file: --trainer.callbacks+=callbacks/…
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("--") and value.endswith((".yaml", ".yml")):
            out[i] = f"{flag}={resolve_path(value)}"
        elif not arg.startswith("-") and arg.endswith((".yaml", ".yml")):
            out[i] = resolve_path(arg)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = composed(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + composed(arg.removeprefix("--config="))
    return out
