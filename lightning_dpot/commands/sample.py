"""``dpot sample``: draw samples from a trained generator checkpoint.

The model is rebuilt from the ``model`` section of the run's ``config.yaml`` (the one LightningCLI
saved in the run directory; found by walking up from the checkpoint, or given with ``--config``),
the checkpoint's ``state_dict`` is loaded, and ``model.sample(N)`` is written as a tensor file
(``torch.save``, shape ``(N, *sample_shape)``, images in [−1, 1]) and/or a PNG grid. Sampling is
post-processing of the trained generator: it costs no privacy. No data are read.

Particle flows (``DPSWFlow``, ``DPSWFlowR``) work too: their particles and cached release come
back from the checkpoint (``on_load_checkpoint``; no mechanism is called), and a module that
needs its run's datamodule to sample (the public decoder of a latent flow) gets it through
``attach_datamodule`` (:mod:`lightning_dpot.commands.checkpoint`). A flow returns its first
``N`` particles, decoded; ``N`` may not exceed the number of particles.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from lightning_dpot.checks import check_positive_int
from lightning_dpot.commands.checkpoint import find_run_config, instantiate, load_model
from lightning_dpot.generative import require_generative

__all__ = ["build_parser", "find_run_config", "instantiate", "load_model", "main", "run"]

DESCRIPTION = "draw samples from a trained generator checkpoint (tensor file and/or PNG grid)"


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) of a fitted run")
    parser.add_argument("--num", type=int, required=True, help="number of samples N")
    parser.add_argument("--output", help="tensor file to write (torch.save of (N, ...))")
    parser.add_argument("--grid", help="PNG file for a grid of the first --grid-size samples")
    parser.add_argument("--grid-size", type=int, default=64, help="images in the grid")
    parser.add_argument("--config", help="the run's config.yaml (default: found from --ckpt)")
    parser.add_argument("--seed", type=int, help="seed of the draw, for reproducible samples")
    return parser


def run(args: argparse.Namespace) -> dict:
    """Sample and write the files; returns the JSON summary the CLI prints."""
    from torchvision.utils import save_image

    from lightning_dpot.grids import images_to_grid

    num = check_positive_int("num", args.num)
    grid_size = check_positive_int("grid_size", args.grid_size)
    if args.output is None and args.grid is None:
        raise ValueError("give --output (tensor file) and/or --grid (PNG file)")
    model, config_path = load_model(args.ckpt, args.config)
    generator = None if args.seed is None else torch.Generator().manual_seed(args.seed)
    samples = require_generative(model).sample(num, generator=generator)
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
