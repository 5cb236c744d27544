"""The ``dpot`` command.

* ``dpot fit | validate | test | predict`` — LightningCLI over any method module and datamodule
  (``--config configs/...yaml``); every run writes config.yaml and report.json to its log dir,
  and every private run has an accountant: the config's ``PrivacyAccountantCallback``, or one
  attached that reports without a budget.
* ``dpot privatize --config FILE --output PATH`` — make a local-DP release from the ``data``
  section of a config, for a trainer that must never see raw data.
* ``dpot account ...`` — privacy calculators (``dpot account --help``).
* ``dpot sample --ckpt PATH --num N --output FILE [--grid PNG]`` — samples from a checkpoint.
* ``dpot evaluate --ckpt PATH --metrics fid,utility,w2 [--num-samples N]`` — evaluation
  metrics of a checkpoint (JSON, appended to the run's report.json).
* ``dpot report RUN_DIR`` — a run's report.json as a table.

A bad value ends any command with one line, ``dpot <command>: error: <message>``, naming the
parameter and the accepted range; ``DPOT_DEBUG=1`` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from lightning_dpot.callbacks import LDPPrivacyReport, PrivacyAccountantCallback, RunReport
from lightning_dpot.commands import account, report
from lightning_dpot.plugins import AtomicCheckpointIO
from lightning_dpot.privacy.contract import ReleasesPrivateData

EXTRA_COMMANDS = {
    "privatize": "privatize a dataset once (local DP) and write the release file",
    "account": "privacy calculators: calibration, composition, shuffling, WDP",
    "sample": "draw samples from a trained checkpoint (tensor file and/or PNG grid)",
    "evaluate": "FID / classifier FD, downstream utility and W2 of a checkpoint (JSON)",
    "report": "print a run's report.json as a table",
}


class DpotCLI(LightningCLI):
    """LightningCLI whose trainer writes checkpoints atomically unless the config names its own
    ``CheckpointIO`` plugin, and accounts every private run: a module that releases private
    data (:class:`~lightning_dpot.privacy.contract.ReleasesPrivateData`) and whose config names
    no accountant gets a reporting-only ``PrivacyAccountantCallback``. Both are added at
    instantiation, so ``config.yaml`` stays as written."""

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer_config = self._get(self.config_init, "trainer", default={}) or {}
        plugins = kwargs.pop("plugins", trainer_config.get("plugins")) or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            plugins.append(AtomicCheckpointIO())
        trainer = super().instantiate_trainer(plugins=plugins, **kwargs)
        model = getattr(self, "model", None)
        accounted = any(isinstance(cb, PrivacyAccountantCallback) for cb in trainer.callbacks)
        if isinstance(model, ReleasesPrivateData) and model.is_private and not accounted:
            # Before the checkpoint callbacks (Lightning keeps them last), so that a checkpoint
            # saved at the end of a batch holds the accountant's state after that batch.
            first = next(
                (i for i, cb in enumerate(trainer.callbacks) if isinstance(cb, Checkpoint)),
                len(trainer.callbacks),
            )
            trainer.callbacks.insert(first, PrivacyAccountantCallback())
        return trainer


def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception of a ``raise ... from`` chain (jsonargparse wraps ours)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def _run_with_one_line_errors(command: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a bad value (ValueError, TypeError, FileNotFoundError) exits with one line
    naming it, unless ``DPOT_DEBUG`` is set."""
    if os.environ.get("DPOT_DEBUG"):
        return fn()
    try:
        return fn()
    except (ValueError, TypeError, FileNotFoundError) as err:
        cause = _root_cause(err)
        print(f"dpot {command}: error: {cause}  (DPOT_DEBUG=1 for the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def run_lightning(args: Sequence[str], run: bool = True) -> LightningCLI:
    """LightningCLI over any module/datamodule; the LDP privacy report and the run report
    (report.json) are attached to every run, after the config's own callbacks, and checkpoints
    are written atomically (:class:`~lightning_dpot.plugins.AtomicCheckpointIO`). ``run=False``
    only builds the model, datamodule and trainer (``args`` then hold no subcommand)."""
    with warnings.catch_warnings():
        # Lightning warns whenever both `args` and a command line exist; ours are the same.
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended")
        return DpotCLI(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults={"callbacks": [LDPPrivacyReport(), RunReport()]},
            save_config_kwargs={"overwrite": True},
            run=run,
            args=list(args),
        )


def _datamodule_from_config(path: str) -> L.LightningDataModule:
    import yaml
    from jsonargparse import ArgumentParser

    with open(path) as fh:
        config = yaml.safe_load(fh)
    section = config.get("data", config) if isinstance(config, dict) else None
    if not isinstance(section, dict):
        raise SystemExit(f"dpot privatize: error: config={path!r} has no 'data' section")
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    init = parser.instantiate_classes(parser.parse_object({"data": section}))
    return init.data


def privatize(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="dpot privatize", description=EXTRA_COMMANDS["privatize"])
    parser.add_argument("--config", required=True, help="YAML with a `data:` section")
    parser.add_argument("--output", required=True, help="path of the release file to write")
    args = parser.parse_args(argv)
    datamodule = _datamodule_from_config(args.config)
    if not hasattr(datamodule, "write_release"):
        raise SystemExit("dpot privatize: error: the data section must be a PrivatizedDataModule")
    path = datamodule.write_release(args.output)
    print(json.dumps({"release": str(path), "privacy": datamodule.privacy_report()}, indent=2))


def account_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="dpot account",
        description="Privacy calculators. Each prints one JSON object.",
    )
    account.build_parser(parser)
    account.run(parser.parse_args(argv))


def _top_level_help() -> str:
    lines = ["usage: dpot COMMAND [options]", "", "commands:"]
    lines += [
        f"  {c:<10} train/evaluate with LightningCLI (--config FILE)"
        for c in ("fit", "validate", "test", "predict")
    ]
    lines += [f"  {c:<10} {h}" for c, h in EXTRA_COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_level_help())
        return
    command, rest = argv[0], argv[1:]
    _run_with_one_line_errors(command, lambda: _dispatch(command, rest, argv))


def _dispatch(command: str, rest: list[str], argv: list[str]) -> None:
    if command == "privatize":
        privatize(rest)
    elif command == "account":
        account_main(rest)
    elif command == "sample":
        from lightning_dpot.commands import sample

        sample.main(rest)
    elif command == "evaluate":
        from lightning_dpot.commands import evaluate

        evaluate.main(rest)
    elif command == "report":
        report.main(rest)
    else:
        cli = run_lightning(argv)
        if command == "fit":
            # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
            log_dir = cli.trainer.log_dir or cli.trainer.default_root_dir
            if cli.trainer.is_global_zero:
                # stderr, like every human-facing message: stdout stays for commands' JSON.
                print(f"\ndpot fit finished\n{report.summary(log_dir)}", file=sys.stderr)


if __name__ == "__main__":
    main()
