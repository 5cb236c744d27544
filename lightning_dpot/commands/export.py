"""``dpot export RUN_DIR``: a fitted run's generator as one TorchScript file for plain torch.

The checkpoint is found below ``RUN_DIR`` at any depth (``<run>/checkpoints/`` and the older
``<run>/<project>/<id>/checkpoints/`` alike; the newest ``last.ckpt``, else the newest ``*.ckpt``;
``--ckpt_path`` names one), the module is rebuilt from the run's ``config.yaml``
(``lightning_dpot.commands.checkpoint``) and written by
``export_generator`` with its privacy report and the run's config
embedded. For a central-DP run the report is that of the releases the checkpoint holds
(``report_of_checkpoint``), not
the run's ``report.json``, which another process of the same run may have written before or
after it. ``dpot fit`` writes the same file, ``generator.pt``, at the end of every run whose
method can be exported. Loading and sampling need torch only::

    import torch
    generator = torch.jit.load("runs/<run>/generator.pt")
    x = generator.sample(16, seed=0)

A generator network is exported with its latent law (``sample(n, seed)`` draws z and returns
G(z); conditional generators also ``sample_labeled``); a particle flow (DPSWFlow, DPSWFlowR) as
its N particles and public decoder (``sample(n)`` draws n ≤ N of them without replacement).
Exporting is post-processing of the trained model: it costs no privacy, and no data are read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lightning_dpot.commands.flags import refuse_old_spellings

DESCRIPTION = "write a run's generator as one TorchScript file that samples with plain torch"


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="directory of a fitted run")
    parser.add_argument(
        "--ckpt_path",
        dest="ckpt",
        help="checkpoint to export (default: below RUN_DIR, the newest last.ckpt if any, else "
        "the newest *.ckpt, e.g. checkpoints/epoch=4-step=2000.ckpt)",
    )
    parser.add_argument(
        "--output", help="file to write (default: generator.pt beside the run's config.yaml)"
    )
    refuse_old_spellings(parser, {"--ckpt": "--ckpt_path"})
    return parser


def run(args: argparse.Namespace) -> dict:
    """Export and return the JSON summary the CLI prints."""
    import yaml

    from lightning_dpot.commands.checkpoint import find_checkpoint, load_model
    from lightning_dpot.export import export_generator

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"RUN_DIR={str(run_dir)!r} is not a directory")
    ckpt = Path(args.ckpt) if args.ckpt is not None else find_checkpoint(run_dir)
    model, config_path = load_model(ckpt)
    report_path = config_path.parent / "report.json"
    if not report_path.is_file():
        raise FileNotFoundError(
            f"no report.json beside {str(config_path)!r}: the export embeds the run's privacy "
            "report, which dpot fit writes when the run ends"
        )
    report = json.loads(report_path.read_text())
    output = Path(args.output) if args.output is not None else config_path.parent / "generator.pt"
    embedded = export_generator(
        model,
        output,
        privacy=checkpoint_privacy(ckpt, report.get("privacy")),
        config=yaml.safe_load(config_path.read_text()),
    )
    return {
        "checkpoint": str(ckpt),
        "config": str(config_path),
        "output": str(output),
        "method": embedded["method"],
        "sampler": embedded["sampler"],
    }


def checkpoint_privacy(ckpt: Path, run_privacy: dict | None) -> dict | None:
    """The privacy section for the exported weights: for a central-DP run, the report of the
    releases the checkpoint itself holds (``report.json`` may come from another process of the
    same run, before or after this checkpoint), keeping what the run's report says lies outside
    the guarantee; otherwise the run's own section (a local-DP release's guarantee does not
    change with training)."""
    import torch

    from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback

    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    delta = None if run_privacy is None else run_privacy.get("delta")
    privacy = PrivacyAccountantCallback.report_of_checkpoint(checkpoint, delta)
    if privacy is None:
        return run_privacy
    if run_privacy is not None:
        privacy["outside_the_guarantee"] = run_privacy.get("outside_the_guarantee", [])
    return privacy


def main(argv: list[str]) -> None:
    parser = build_parser(argparse.ArgumentParser(prog="dpot export", description=DESCRIPTION))
    # A bad value raises: `dpot` turns it into one line naming it (lightning_dpot.cli).
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
