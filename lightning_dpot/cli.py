"""The ``dpot`` command.

* ``dpot fit | validate | test | predict`` — LightningCLI over any method module and datamodule
  (``--config configs/...yaml``); every run writes config.yaml and report.json to its log dir,
  and every private run has an accountant: the config's ``PrivacyAccountantCallback``, or one
  attached that enforces the method's own budget. A config may start from shared fragments
  (``__base__: [../_shared/...yaml]``, :func:`compose_config`); the command line still wins.
* ``dpot privatize --config FILE --output PATH`` — make a local-DP release from the ``data``
  section of a config, for a trainer that must never see raw data.
* ``dpot account ...`` — privacy calculators (``dpot account --help``).
* ``dpot sample --ckpt PATH --num N --output FILE [--grid PNG]`` — samples from a checkpoint.
* ``dpot evaluate --ckpt PATH --metrics fid,utility,w2 [--num-samples N]`` — evaluation
  metrics of a checkpoint (JSON, appended to the run's report.json).
* ``dpot report RUN_DIR`` — a run's report.json as a table.
* ``dpot compare --config configs/compare/SUITE.yaml`` — methods × ε × seeds on one data set
  with one evaluator set: comparison.json, a table grouped by privacy notion, plots.

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
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from lightning_dpot.callbacks import LDPPrivacyReport, PrivacyAccountantCallback, RunReport
from lightning_dpot.commands import account, report
from lightning_dpot.data.protocols import LocalDPRelease, satisfies
from lightning_dpot.plugins import AtomicCheckpointIO
from lightning_dpot.privacy.contract import ReleasesPrivateData

EXTRA_COMMANDS = {
    "privatize": "privatize a dataset once (local DP) and write the release file",
    "account": "privacy calculators: calibration, composition, shuffling, WDP",
    "sample": "draw samples from a trained checkpoint (tensor file and/or PNG grid)",
    "evaluate": "FID / classifier FD, downstream utility and W2 of a checkpoint (JSON)",
    "report": "print a run's report.json as a table",
    "compare": "every method of a suite on the same data at equal privacy (table, plots)",
}


class DpotCLI(LightningCLI):
    """LightningCLI whose trainer writes checkpoints atomically unless the config names its own
    ``CheckpointIO`` plugin, and accounts every private run: a module that releases private
    data (:class:`~lightning_dpot.privacy.contract.ReleasesPrivateData`) and whose config names
    no accountant gets a ``PrivacyAccountantCallback()``, which enforces the module's own
    ``target_epsilon`` at its release objects' δ (if it has one). Both are added at
    instantiation, so ``config.yaml`` stays as written. A ``--config`` file that names
    ``__base__`` fragments is composed first (:func:`compose_config`)."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        if isinstance(args, (list, tuple)):
            args = _with_composed_configs(args)
        super().parse_arguments(parser, args)

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


BASE_KEY = "__base__"


def compose_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config in ``path`` with the fragments named by its ``__base__`` merged beneath it.

    ``__base__`` is a path or a list of paths, relative to the file that names them; fragments
    may name their own. The fragments are merged in order, then the file itself on top: mappings
    merge key by key; anything else (a number, a string, a list such as ``trainer.callbacks``)
    replaces what is beneath; a mapping whose ``class_path`` differs from the one beneath
    replaces it whole (no init_args carry over to another class). A file without ``__base__``
    comes back as loaded. Files are read with jsonargparse's YAML loader, as ``--config`` is."""
    return _compose(Path(path), ())


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
    """``top`` over ``base`` by the rules of :func:`compose_config`."""
    if not (isinstance(base, dict) and isinstance(top, dict)):
        return top
    if "class_path" in base and "class_path" in top and base["class_path"] != top["class_path"]:
        return top
    merged = {**base, **{k: _merge(base[k], v) if k in base else v for k, v in top.items()}}
    if "class_path" in merged:  # written first, as in every config
        merged = {"class_path": merged.pop("class_path"), **merged}
    return merged


def _with_composed_configs(args: Sequence[str]) -> list[str]:
    """``args`` with each ``--config FILE`` (``-c FILE``, ``--config=FILE``) whose file names
    ``__base__`` replaced by the composed config as a YAML string, which jsonargparse reads as
    it reads the file; the arguments after it still override it."""
    import yaml
    from jsonargparse import get_loader

    def composed(value: str) -> str:
        if not os.path.isfile(value):
            return value  # a YAML string, or a missing file for jsonargparse to report
        loaded = get_loader("yaml")(Path(value).read_text())
        if not (isinstance(loaded, dict) and BASE_KEY in loaded):
            return value
        return yaml.safe_dump(compose_config(value), sort_keys=False)

    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = composed(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + composed(arg.removeprefix("--config="))
    return out


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
    from jsonargparse import ArgumentParser

    config = compose_config(path)
    section = config.get("data", config)
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
    if not satisfies(datamodule, LocalDPRelease):
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
    elif command == "compare":
        from lightning_dpot.commands import compare

        compare.main(rest)
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
