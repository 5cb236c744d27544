"""The ``dpot`` command: one dispatcher over the commands of ``lightning_dpot.commands``
and the training runs of ``lightning_dpot.training``.

* ``dpot fit`` — LightningCLI over any method module and datamodule
  (``--config configs/...yaml``); every run writes config.yaml and report.json to its log dir,
  and every private run has an accountant. A config may start from shared fragments
  (``__base__: [../_shared/...yaml]``, ``compose_config``); the
  command line still wins.
* ``dpot privatize --config FILE --output PATH`` — make a local-DP release from the ``data``
  section of a config, for a trainer that must never see raw data.
* ``dpot account ...`` — privacy calculators (``dpot account --help``).
* ``dpot sample --ckpt_path PATH --num_samples N --output FILE [--format pt|npz|png-dir|csv]
  [--grid PNG]`` — samples from a checkpoint (with labels for a class-conditional generator).
* ``dpot evaluate --ckpt_path PATH --metrics fid,utility,w2 [--num_samples N]`` — evaluation
  metrics of a checkpoint (JSON, appended to the run's report.json).
* ``dpot export RUN_DIR [--ckpt_path PATH] [--output FILE]`` — the run's generator as one
  TorchScript file that samples with plain torch, its privacy report embedded (``dpot fit``
  writes it too, as ``generator.pt``).
* ``dpot report RUN_DIR`` — a run's summary (method, data, ε/δ, metrics, files; ``--all``: its
  report.json as a table; ``--ckpt_path CKPT``: the releases of a checkpoint).
* ``dpot compare --config configs/compare/SUITE.yaml`` — methods × ε × seeds on one data set
  with one evaluator set: comparison.json, a table grouped by privacy notion, plots.

Flags are spelled as Lightning's (``--ckpt_path``, ``--num_samples``) in every command; an earlier
spelling (``--ckpt``, ``--num-samples``) is refused naming the new one. A bad value ends any
command with one line, ``dpot <command>: error: <message>``, naming the parameter and the
accepted range; ``DPOT_DEBUG=1`` shows the full traceback instead. Each
command's module is imported only when it runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

TRAINING_COMMANDS = ("fit",)
#: Lightning's other entry points: no method defines their steps, so they are refused.
NOT_OFFERED = ("validate", "test", "predict")
EXTRA_COMMANDS = {
    "privatize": "privatize a dataset once (local DP) and write the release file",
    "account": "privacy calculators: calibration, composition, shuffling, WDP",
    "sample": "draw samples from a trained checkpoint (tensor file and/or PNG grid)",
    "evaluate": "FID / classifier FD, utility, W2 and leakage of a checkpoint (JSON)",
    "export": "a run's generator as one TorchScript file for plain torch (generator.pt)",
    "report": "a run's summary: method, data, privacy, metrics, files (--all: every entry)",
    "compare": "every method of a suite on the same data at equal privacy (table, plots)",
}


def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception of a ``raise ... from`` chain (jsonargparse wraps ours) that has
    a message (an ``EOFError()`` below ours says nothing)."""
    while err.__cause__ is not None and str(err.__cause__).strip():
        err = err.__cause__
    return err


def _parameters(class_path: str) -> list[str]:
    """The constructor arguments of ``class_path`` (empty if it cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return list(inspect.signature(cls).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        return []


def _nearest(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


#: Arguments that are groups (dataclasses): their keys nest without ``init_args``.
_GROUPS = {"ledger": "lightning_dpot.data.LedgerSettings"}


def _key_path(keys: Sequence[str]) -> str:
    """``data.init_args.ledger.budget`` from the parser keys ``data``, ``ledger``, ``budget``."""
    path = keys[0] if keys else ""
    for previous, key in zip(keys, keys[1:], strict=False):
        path += ("." if previous in _GROUPS else ".init_args.") + key
    return path


def argument_error_line(message: str) -> str | None:
    """One line from jsonargparse's nested message: the parameter's full key, what it accepts and
    what it got, or the nearest valid name for an unknown key (``None``: no known pattern)."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    path = _key_path(keys)
    section = re.search(
        r"(?:option '|unrecognized arguments: --)(optimizer|lr_scheduler)\b", message
    )
    if section:
        return (
            f"{section.group(1)}: dpot fit takes no {section.group(1)} section; every method "
            "builds its optimizer from its own arguments (model.init_args.lr, and "
            "model.init_args.optimizer where the method has one)"
        )
    unknown = re.search(r"Option '([^']+)' is not accepted", message)
    if unknown:
        class_path = re.search(r"class_path '([^']+)'", message)
        owner = class_path.group(1) if class_path else ""
        where = f"{path}.init_args." if path else ""
        if keys and keys[-1] in _GROUPS:
            owner, where = _GROUPS[keys[-1]], f"{path}."
        return (
            f"{where}{unknown.group(1)} is not an argument of {owner or 'this class'}"
            + _nearest(unknown.group(1), _parameters(owner) if owner else [])
        )
    unrecognized = re.search(r"unrecognized arguments: (\S+)", message)
    if unrecognized:
        key = unrecognized.group(1).removeprefix("--").partition("=")[0]
        group, _, name = key.rpartition(".")
        known = _parameters("lightning.pytorch.Trainer") if group == "trainer" else []
        return f"unrecognized argument --{key}" + _nearest(name, known)
    import_error = re.search(
        r"(Expected a dot import path string: .*|module '[^']+' has no attribute .*|"
        r"No module named .*)",
        message,
    )
    if import_error:
        path = path or next(iter(re.findall(r"--(\w+)\.help", message)), "")
        return (
            f"{path or 'class'}: {import_error.group(1).strip()}; give an importable class, e.g. "
            "lightning_dpot.methods.EntropicWGAN"
        )
    literal = re.search(r"Expected a typing\.Literal\[(.*?)\]\. Got value: (.*)", message)
    if keys and literal:
        return f"{path}: expected one of {literal.group(1)}, got {literal.group(2).strip()!r}"
    given = re.search(r"Given value: (.*)", message)
    expected = re.findall(r"Expected a <class '([^']+)'>", message)
    if keys and given and expected:
        accepted = " or ".join(dict.fromkeys(t.replace("NoneType", "null") for t in expected))
        return f"{path}: expected {accepted}, got {given.group(1).strip()!r}"
    if keys:
        detail = message.rsplit(f'Parser key "{keys[-1]}":', 1)[1].strip().splitlines()
        return f"{path}: {detail[0].strip()}" if detail else None
    return None


def _run_with_one_line_errors(command: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a bad value (ValueError, TypeError, FileNotFoundError, a bad argument) exits
    with one line naming it, unless ``DPOT_DEBUG`` is set."""
    if os.environ.get("DPOT_DEBUG"):
        return fn()
    try:
        return fn()
    except argparse.ArgumentError as err:
        line = argument_error_line(str(err)) or str(_root_cause(err)).splitlines()[0]
        print(f"dpot {command}: error: {line}  (DPOT_DEBUG=1 for the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, TypeError, FileNotFoundError) as err:
        cause = _root_cause(err)
        print(f"dpot {command}: error: {cause}  (DPOT_DEBUG=1 for the traceback)", file=sys.stderr)
        raise SystemExit(2) from None


def _top_level_help() -> str:
    lines = ["usage: dpot COMMAND [options]  (dpot --version)", "", "commands:"]
    lines += [f"  {c:<10} train with LightningCLI (--config FILE)" for c in TRAINING_COMMANDS]
    lines += [f"  {c:<10} {h}" for c, h in EXTRA_COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_level_help())
        return
    if argv[0] in ("-V", "--version"):
        from lightning_dpot._version import __version__

        print(f"dpot (lightning_dpot) {__version__}")
        return
    command, rest = argv[0], argv[1:]
    # A module file in the current folder is importable (--model mymethod.MyMethod), as it
    # is under `python -m`.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    if command == "fit":
        from lightning_dpot.commands import fit_help

        if (asked := fit_help.request(rest)) is not None:
            # at once when shipped or cached; a class the parser cannot find: one line
            text = _run_with_one_line_errors(command, lambda: fit_help.text(asked))
            print(text.rstrip("\n"))
            return
    _run_with_one_line_errors(command, lambda: _dispatch(command, rest, argv))


def _dispatch(command: str, rest: list[str], argv: list[str]) -> None:
    if command in EXTRA_COMMANDS:
        importlib.import_module(f"lightning_dpot.commands.{command}").main(rest)
        return
    if command in NOT_OFFERED:
        raise ValueError(
            f"the methods define no {command} step; score a trained run with dpot evaluate "
            "(or the evaluation callbacks during dpot fit)"
        )
    if command not in TRAINING_COMMANDS:
        commands = (*TRAINING_COMMANDS, *EXTRA_COMMANDS)
        raise ValueError(
            f"unknown command {command!r}{_nearest(command, commands)} (commands: "
            f"{', '.join(commands)})"
        )
    from lightning_dpot.commands import report
    from lightning_dpot.loggers import RUN_DIRS_MADE, discard_refused_runs
    from lightning_dpot.training import run_lightning

    made = len(RUN_DIRS_MADE)
    try:
        cli = run_lightning(argv)
    except BaseException:
        discard_refused_runs(made)  # a refused run leaves no folder with nothing in it
        raise
    if command == "fit":
        # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
        log_dir = cli.trainer.log_dir or cli.trainer.default_root_dir
        if cli.trainer.is_global_zero:
            # stderr, like every human-facing message: stdout stays for commands' JSON.
            print(f"\ndpot fit finished\n{report.summary(log_dir)}", file=sys.stderr)


if __name__ == "__main__":
    main()
