"""Find a run's checkpoint and rebuild its LightningModule from it (shared by ``dpot sample``,
``dpot evaluate`` and ``dpot export``).

The module is instantiated from the ``model`` section of the run's ``config.yaml``; state kept
outside the ``state_dict`` is restored by the module's own ``on_load_checkpoint`` (e.g. the
particles and the cached release of a particle flow), then the ``state_dict`` is loaded.
Buffers that a module creates empty and only sizes during ``setup()`` (placeholders with no
elements, e.g. a flow's directions and cached release) are resized to the checkpoint's shapes
first. Nothing is recomputed from private data and no mechanism is called.

**Datamodule protocol.** A module whose sampling needs something its run's datamodule provides
(e.g. the public decoder of a latent flow, attached in ``setup()`` during training) defines::

    def attach_datamodule(self, datamodule) -> None: ...

``load_model`` then instantiates the ``data`` section of the same config (constructors read
no records; the datamodule is **not** set up) and calls ``model.attach_datamodule(datamodule)``
after the checkpoint is loaded. The method must take only public, post-processing state (e.g.
decoder weights) and must not read or release private records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "find_checkpoint",
    "find_run_config",
    "instantiate",
    "load_datamodule",
    "load_model",
    "materialize_placeholder_buffers",
]


def instantiate(parser: Any, config: Any) -> Any:
    """``parser.instantiate`` (jsonargparse ≥ 4.49) or ``instantiate_classes`` (older)."""
    method = getattr(parser, "instantiate", None) or parser.instantiate_classes
    return method(config)


def find_run_config(ckpt: str | Path) -> Path:
    """The nearest ``config.yaml`` in the checkpoint's folder or one of its parents."""
    ckpt = Path(ckpt).resolve()
    for folder in ckpt.parents:
        candidate = folder / "config.yaml"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no config.yaml found next to ckpt={str(ckpt)!r} or in any parent folder; pass the "
        "run's config with --config"
    )


def find_checkpoint(run_dir: str | Path) -> Path:
    """The checkpoint of the run in ``run_dir``: every ``*.ckpt`` below it, at any depth (so
    both ``<run>/checkpoints/`` and ``<run>/<project>/<id>/checkpoints/`` are found); the newest
    ``last.ckpt`` if there is one, else the newest checkpoint.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory or holds no checkpoint.
        ValueError: its checkpoints belong to more than one run (more than one ``config.yaml``
            is found above them).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} is not a directory")
    found = [path for path in run_dir.rglob("*.ckpt") if path.is_file()]
    if not found:
        raise FileNotFoundError(
            f"run_dir={str(run_dir)!r} holds no checkpoint (*.ckpt); was the run fitted with "
            "checkpointing on? Give one with --ckpt_path"
        )
    runs = {_run_config_or_none(path) for path in found}
    if len(runs) > 1:
        raise ValueError(
            f"run_dir={str(run_dir)!r} holds the checkpoints of {len(runs)} runs; give one "
            "run's directory, or a checkpoint with --ckpt_path"
        )
    last = [path for path in found if path.name == "last.ckpt"]
    return max(last or found, key=lambda path: path.stat().st_mtime)


def _run_config_or_none(ckpt: Path) -> Path | None:
    try:
        return find_run_config(ckpt)
    except FileNotFoundError:
        return None


def _read_yaml(path: str | Path) -> Any:
    """A config file with its ``__base__`` fragments merged (``compose_config``), as ``dpot fit``
    reads it; keys an earlier version wrote under another name
    (a saved run's ``config.yaml``) are read under their new names."""
    from lightning_dpot.config import compose_config

    return compose_config(path, migrate=True)


def load_datamodule(config_path: str | Path) -> Any:
    """The ``data`` section of a run config (or a YAML holding only that section), instantiated
    (constructors read no records; nothing is privatized; ``setup()`` is not called)."""
    import lightning as L
    from jsonargparse import ArgumentParser

    from lightning_dpot.config import migrate_renamed_keys

    loaded = _read_yaml(config_path)
    section = loaded.get("data", loaded) if isinstance(loaded, dict) else None
    if section is loaded:  # a YAML holding only the data section
        section = migrate_renamed_keys(section, "data")
    if not isinstance(section, dict) or "class_path" not in section:
        raise ValueError(f"data config={str(config_path)!r} has no 'data' section with class_path")
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    return instantiate(parser, parser.parse_object({"data": section})).data


def materialize_placeholder_buffers(model: torch.nn.Module, state_dict: dict) -> list[str]:
    """Resize the module's empty (``numel() == 0``) buffers to the shapes saved in
    ``state_dict`` so that ``load_state_dict`` can fill them. Buffers with elements are left
    alone (a real shape mismatch still fails in ``load_state_dict``). Returns the names."""
    resized = []
    for name, buffer in list(model.named_buffers()):
        saved = state_dict.get(name)
        if not isinstance(saved, Tensor) or buffer is None or buffer.numel() != 0:
            continue
        if saved.shape == buffer.shape:
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        setattr(owner, leaf, torch.empty_like(saved, device=buffer.device))
        resized.append(name)
    return resized


def load_model(
    ckpt: str | Path, config: str | Path | None = None, attach_datamodule: bool = True
) -> tuple[Any, Path]:
    """Rebuild the LightningModule of a run from its config's ``model`` section and load the
    checkpoint (module docstring). With ``attach_datamodule`` (default), a module defining
    ``attach_datamodule(datamodule)`` gets the run's datamodule, built from the config's
    ``data`` section and not set up. Returns ``(model, config_path)`` in eval mode."""
    import lightning as L
    from jsonargparse import ArgumentParser

    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise FileNotFoundError(f"ckpt={str(ckpt)!r}: no such checkpoint file")
    config_path = Path(config) if config is not None else find_run_config(ckpt)
    loaded = _read_yaml(config_path)
    section = loaded.get("model") if isinstance(loaded, dict) else None
    if not isinstance(section, dict):
        raise ValueError(f"config={str(config_path)!r} has no 'model' section")
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningModule, "model")
    model = instantiate(parser, parser.parse_object({"model": section})).model
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    state_dict = state.get("state_dict", state) if isinstance(state, dict) else None
    if not isinstance(state_dict, dict):
        raise ValueError(f"ckpt={str(ckpt)!r} holds no state_dict")
    model.on_load_checkpoint(state)  # module state kept outside the state_dict (e.g. particles)
    materialize_placeholder_buffers(model, state_dict)
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as error:
        detail = next((line.strip() for line in str(error).splitlines()[1:] if line.strip()), "")
        raise ValueError(
            f"ckpt={str(ckpt)!r} does not fit the {type(model).__name__} of "
            f"config={str(config_path)!r} ({detail}); give the config.yaml of the run that "
            "wrote the checkpoint, or leave --config out to use the one beside it"
        ) from None
    attach = getattr(model, "attach_datamodule", None)
    if attach_datamodule and callable(attach):
        if not isinstance(loaded.get("data"), dict):
            raise ValueError(
                f"{type(model).__name__} needs its run's datamodule to sample "
                f"(attach_datamodule), but config={str(config_path)!r} has no 'data' section"
            )
        attach(load_datamodule(config_path))
    model.eval()
    return model, config_path
