"""The ``dpot`` command: one dispatcher over the commands of :mod:`lightning_dpot.commands`
and the training runs of :mod:`lightning_dpot.training`.

* ``dpot fit | validate | test | predict`` — LightningCLI over any method module and datamodule
  (``--config configs/...yaml``); every run writes config.yaml and report.json to its log dir,
  and every private run has an accountant. A config may start from shared fragments
  (``__base__: [../_shared/...yaml]``, :func:`~lightning_dpot.config.compose_config`); the
  command line still wins.
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
parameter and the accepted range; ``DPOT_DEBUG=1`` shows the full traceback instead. Each
command's module is imported only when it runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

TRAINING_COMMANDS = ("fit", "validate", "test", "predict")
EXTRA_COMMANDS = {
    "privatize": "privatize a dataset once (local DP) and write the release file",
    "account": "privacy calculators: calibration, composition, shuffling, WDP",
    "sample": "draw samples from a trained checkpoint (tensor file and/or PNG grid)",
    "evaluate": "FID / classifier FD, downstream utility and W2 of a checkpoint (JSON)",
    "report": "print a run's report.json as a table",
    "compare": "every method of a suite on the same data at equal privacy (table, plots)",
}


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


def _top_level_help() -> str:
    lines = ["usage: dpot COMMAND [options]", "", "commands:"]
    lines += [
        f"  {c:<10} train/evaluate with LightningCLI (--config FILE)" for c in TRAINING_COMMANDS
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
    if command in EXTRA_COMMANDS:
        importlib.import_module(f"lightning_dpot.commands.{command}").main(rest)
        return
    from lightning_dpot.commands import report
    from lightning_dpot.training import run_lightning

    cli = run_lightning(argv)
    if command == "fit":
        # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
        log_dir = cli.trainer.log_dir or cli.trainer.default_root_dir
        if cli.trainer.is_global_zero:
            # stderr, like every human-facing message: stdout stays for commands' JSON.
            print(f"\ndpot fit finished\n{report.summary(log_dir)}", file=sys.stderr)


if __name__ == "__main__":
    main()
