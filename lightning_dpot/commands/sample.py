"""``dpot sample``: draw samples from a trained generator checkpoint.

The model is rebuilt from the ``model`` section of the run's ``config.yaml`` (the one LightningCLI
saved in the run directory; found by walking up from the checkpoint, or given with ``--config``),
the checkpoint's ``state_dict`` is loaded, and ``model.sample(N)`` is written as a tensor file
(``torch.save``, shape ``(N, *sample_shape)``, images in [−1, 1]) and/or a PNG grid. Sampling is
post-processing of the trained generator: it costs no privacy. No data are read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from lightning_dpot.privacy.validation import check_positive_int

DESCRIPTION = "draw samples from a trained generator checkpoint (tensor file and/or PNG grid)"


def instantiate(parser, config):
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


def load_model(ckpt: str | Path, config: str | Path | None = None):
    """Rebuild the LightningModule of a run from its config's ``model`` section and load the
    checkpoint's weights. Returns ``(model, config_path)``."""
    import lightning as L
    import yaml
    from jsonargparse import ArgumentParser

    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise FileNotFoundError(f"ckpt={str(ckpt)!r}: no such checkpoint file")
    config_path = Path(config) if config is not None else find_run_config(ckpt)
    with open(config_path) as fh:
        loaded = yaml.safe_load(fh)
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
    model.load_state_dict(state_dict)
    model.eval()
    return model, config_path


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) of a fitted run")
    parser.add_argument("--num", type=int, required=True, help="number of samples N")
    parser.add_argument("--output", help="tensor file to write (torch.save of (N, ...))")
    parser.add_argument("--grid", help="PNG file for a grid of the first --grid-size samples")
    parser.add_argument("--grid-size", type=int, default=64, help="images in the grid")
    parser.add_argument("--config", help="the run's config.yaml (default: found from --ckpt)")
    parser.add_argument("--seed", type=int, help="seed torch's RNG for reproducible samples")
    parser.add_argument("--batch-size", type=int, default=10_000, help="generation batch size")
    return parser


def run(args: argparse.Namespace) -> dict:
    """Sample and write the files; returns the JSON summary the CLI prints."""
    from torchvision.utils import save_image

    from lightning_dpot.callbacks.samples import images_to_grid

    num = check_positive_int("num", args.num)
    batch_size = check_positive_int("batch_size", args.batch_size)
    grid_size = check_positive_int("grid_size", args.grid_size)
    if args.output is None and args.grid is None:
        raise ValueError("give --output (tensor file) and/or --grid (PNG file)")
    model, config_path = load_model(args.ckpt, args.config)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    samples = model.sample(num, batch_size=batch_size)
    summary: dict = {
        "checkpoint": str(args.ckpt),
        "config": str(config_path),
        "num": num,
        "shape": list(samples.shape),
    }
    if args.output is not None:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        torch.save(samples, args.output)
        summary["output"] = str(args.output)
    if args.grid is not None:
        Path(args.grid).parent.mkdir(parents=True, exist_ok=True)
        save_image(images_to_grid(samples[:grid_size]), args.grid)
        summary["grid"] = str(args.grid)
    return summary


def main(argv: list[str]) -> None:
    parser = build_parser(argparse.ArgumentParser(prog="dpot sample", description=DESCRIPTION))
    args = parser.parse_args(argv)
    try:
        summary = run(args)
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    print(json.dumps(summary, indent=2))
