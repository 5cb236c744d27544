"""``dpot sample``: draw samples from a trained generator checkpoint.

The model is rebuilt from the ``model`` section of the run's ``config.yaml`` (the one LightningCLI
saved in the run directory; found by walking up from the checkpoint, or given with ``--config``),
the checkpoint's ``state_dict`` is loaded, and N samples are written to ``--output`` in the
``--format``

* ``pt`` (default): ``torch.save`` of ``model.sample(N)``, shape ``(N, *sample_shape)``, images in
  [−1, 1];
* ``npz``: ``numpy.savez`` with the array ``samples`` and, for a class-conditional generator
  (``model.conditional``, e.g. DP-Sinkhorn with a ``ConditionalDCGANGenerator``), ``labels``:
  the draw of ``model.sample_labeled(N)``, y ~ Unif{0, …, L−1};
* ``png-dir``: a new (or empty) folder with one 8-bit RGB PNG per image, ``000000.png``, …
  (pixels mapped from [−1, 1] to 0…255; a gray image has three equal channels), and
  ``labels.csv`` (``file,label``) for a class-conditional generator; refused for records that
  are not images (C, H, W) with C in (1, 3);
* ``csv``: rows of the run's table (a ``Table`` source): each generated record decoded to the
  declared columns (numeric values in their declared range, each categorical column its
  category), with the label column for a class-conditional generator; only the run config's
  declared schema is read, no record,

and/or a PNG grid (``--grid``). Sampling is post-processing of the trained generator: it costs
no privacy. No data are read.

Particle flows (``DPSWFlow``, ``DPSWFlowR``) work too: their particles and cached release come
back from the checkpoint (``on_load_checkpoint``; no mechanism is called), and a module that
needs its run's datamodule to sample (the public decoder of a latent flow) gets it through
``attach_datamodule`` (``lightning_dpot.commands.checkpoint``). A flow returns its first
``N`` particles, decoded; ``N`` may not exceed the number of particles.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_dpot.checks import check_positive_int
from lightning_dpot.commands.flags import refuse_old_spellings

if TYPE_CHECKING:
    from torch import Tensor

# torch and the model loader are imported when a command runs, so that --help prints at once.
__all__ = ["FORMATS", "build_parser", "main", "run"]

DESCRIPTION = "draw samples from a trained generator checkpoint (tensor file and/or PNG grid)"
#: What ``--output`` can hold (module docstring).
FORMATS = ("pt", "npz", "png-dir", "csv")


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--ckpt_path", dest="ckpt", required=True, help="checkpoint (.ckpt) of a fitted run"
    )
    parser.add_argument("--num_samples", dest="num", type=int, required=True, help="samples N")
    parser.add_argument("--output", help="file (pt, npz) or folder (png-dir) to write")
    parser.add_argument(
        "--format",
        default="pt",
        choices=FORMATS,
        help="pt: torch.save of (N, ...); npz: samples (and labels); png-dir: one PNG per "
        "image; csv: rows of the run's table in its columns' units",
    )
    parser.add_argument("--grid", help="PNG file for a grid of the first --grid_size samples")
    parser.add_argument("--grid_size", type=int, default=64, help="images in the grid")
    parser.add_argument("--config", help="the run's config.yaml (default: found from --ckpt_path)")
    parser.add_argument("--seed", type=int, help="seed of the draw, for reproducible samples")
    refuse_old_spellings(parser, {"--ckpt": "--ckpt_path", "--num": "--num_samples"})
    return parser


def run(args: argparse.Namespace) -> dict:
    """Sample and write the files; returns the JSON summary the CLI prints."""
    import torch
    from torchvision.utils import save_image

    from lightning_dpot.commands.checkpoint import load_model
    from lightning_dpot.generative import require_generative
    from lightning_dpot.grids import images_to_grid, is_image_batch

    num = check_positive_int("num", args.num)
    grid_size = check_positive_int("grid_size", args.grid_size)
    if args.output is None and args.grid is None:
        raise ValueError("give --output (tensor file) and/or --grid (PNG file)")
    if args.output is None and args.format != "pt":
        raise ValueError(f"--format {args.format} writes to --output: give --output")
    if args.format == "png-dir":
        _check_empty_folder(Path(args.output))
    model, config_path = load_model(args.ckpt, args.config)
    generator = None if args.seed is None else torch.Generator().manual_seed(args.seed)
    model = require_generative(model)
    labels = None
    if args.format != "pt" and model.conditional:
        samples, labels = model.sample_labeled(num, generator=generator)
    else:
        samples = model.sample(num, generator=generator)
    if args.format == "png-dir" and not is_image_batch(samples):
        raise ValueError(
            f"--format png-dir writes images (N, C, H, W) with C in (1, 3), but "
            f"{type(model).__name__} draws records of shape {tuple(samples.shape[1:])}; "
            "accepted --format for this model: pt, npz"
        )
    summary: dict = {
        "checkpoint": str(args.ckpt),
        "config": str(config_path),
        "num": num,
        "shape": list(samples.shape),
    }
    if args.output is not None and args.format == "csv":
        _table_source(config_path).write_csv(Path(args.output), samples, labels)
        summary |= {"output": args.output, "format": "csv", "labels": labels is not None}
    elif args.output is not None:
        WRITERS[args.format](Path(args.output), samples, labels)
        summary |= {"output": args.output, "format": args.format, "labels": labels is not None}
    if args.grid is not None:
        Path(args.grid).parent.mkdir(parents=True, exist_ok=True)
        save_image(images_to_grid(samples[:grid_size]), args.grid)
        summary["grid"] = str(args.grid)
    return summary


def _table_source(config_path: Path) -> Any:
    """The run's ``Table`` source (its declared schema decodes the records; nothing is read)."""
    from lightning_dpot.commands.checkpoint import load_datamodule

    source = getattr(load_datamodule(config_path), "source", None)
    if not hasattr(source, "write_csv"):
        raise ValueError(
            f"--format csv writes rows of a table, but this run's data source is "
            f"{type(source).__name__}; accepted --format for this run: pt, npz, png-dir"
        )
    return source


def _check_empty_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(
            f"--output {str(folder)!r} exists and is not an empty folder; --format png-dir "
            "writes into a new or empty folder"
        )


def _write_pt(path: Path, samples: Tensor, labels: Tensor | None) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(samples, path)


def _write_npz(path: Path, samples: Tensor, labels: Tensor | None) -> None:
    import numpy as np

    arrays = {"samples": samples.numpy()}
    if labels is not None:
        arrays["labels"] = labels.numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:  # a file object: numpy appends no ".npz" to the name
        np.savez(file, **arrays)


def _write_png_dir(folder: Path, samples: Tensor, labels: Tensor | None) -> None:
    from torchvision.utils import save_image

    from lightning_dpot.grids import images_to_unit_range

    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{i:06d}.png" for i in range(len(samples))]
    for name, image in zip(names, images_to_unit_range(samples), strict=True):
        save_image(image, folder / name)  # 8-bit RGB; a gray image has three equal channels
    if labels is not None:
        rows = [f"{name},{int(label)}" for name, label in zip(names, labels, strict=True)]
        (folder / "labels.csv").write_text("\n".join(["file,label", *rows]) + "\n")


WRITERS = {"pt": _write_pt, "npz": _write_npz, "png-dir": _write_png_dir}


def main(argv: list[str]) -> None:
    parser = build_parser(argparse.ArgumentParser(prog="dpot sample", description=DESCRIPTION))
    # A bad value raises: `dpot` turns it into one line naming it (lightning_dpot.cli).
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
