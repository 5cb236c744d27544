"""``dpot fit``'s help at once.

LightningCLI builds its parser only after importing torch, Lightning and every method (seconds),
so the texts it prints for ``dpot fit --help`` and for ``--model.help NAME`` / ``--data.help
NAME`` of the package's methods and data modules ship with the package
(``resources/fit_help.json.gz``). Each was written by a fresh ``dpot`` process
(``write_shipped``: the parser lists the subclasses imported so far, so the process state
matters), and is printed when the installed Python, Lightning, jsonargparse, docstring-parser
and torch are the versions it was written with (``versions``); a test checks them against a
fresh process. Any other help request, or
other versions, runs the parser and keeps its text in a per-user cache, keyed by the request,
the package files' times, the versions and the terminal's width.

A ``--config`` beside ``--help`` changes nothing in the text LightningCLI prints (the defaults it
shows are the classes'), so ``dpot fit --config FILE --help`` prints the same text at once; a
class of the user's own that the config names is not among the subclasses it lists
(``--model.help mymodule.MyMethod`` shows that class's arguments).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path

SHIPPED = "fit_help.json.gz"

#: The classes whose ``--model.help`` / ``--data.help`` text ships: short name → the path the
#: parser lists them by (either spelling reads the shipped text).
SHIPPED_CLASSES = {
    "model": {
        "DPMERF": "lightning_dpot.DPMERF",
        "DPSinkhorn": "lightning_dpot.DPSinkhorn",
        "EntropicWGAN": "lightning_dpot.EntropicWGAN",
        "NoisyWGAN": "lightning_dpot.NoisyWGAN",
        "DPSWFlow": "lightning_dpot.DPSWFlow",
        "DPSWFlowR": "lightning_dpot.DPSWFlowR",
        "DPSWGen": "lightning_dpot.DPSWGen",
        "AutoencoderModule": "lightning_dpot.methods.AutoencoderModule",
    },
    "data": {
        "PrivatizedDataModule": "lightning_dpot.PrivatizedDataModule",
        "CentralDPDataModule": "lightning_dpot.CentralDPDataModule",
        "PrivateLatentDataModule": "lightning_dpot.PrivateLatentDataModule",
        "PublicSplitDataModule": "lightning_dpot.data.PublicSplitDataModule",
    },
}


def versions() -> str:
    """What the texts depend on: Python (argparse's layout), the parser's packages (the
    descriptions come through docstring-parser), and torch (the ``nn.Module`` subclasses a
    generator's help lists)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "none"

    packages = ("lightning", "jsonargparse", "docstring-parser", "torch")
    python = "python {}.{}".format(*sys.version_info[:2])
    return " ".join([python, *(f"{p} {installed(p)}" for p in packages)])


def request(args: Sequence[str]) -> list[str] | None:
    """The help a ``dpot fit`` command line asks for, as the arguments that print it
    (``["--help"]`` or ``["--model.help", NAME]``); ``None`` when it asks for none."""
    for i, arg in enumerate(args):
        if arg in ("-h", "--help"):
            return ["--help"]
        flag, eq, name = arg.partition("=")
        if flag in ("--model.help", "--data.help"):
            if not eq:
                name = args[i + 1] if i + 1 < len(args) else ""
            return [flag, name] if name and not name.startswith("-") else None
    return None


def _shipped_key(args: list[str]) -> str | None:
    if args == ["--help"]:
        return "--help"
    group = args[0][2:].split(".")[0]
    short = args[1].rsplit(".", 1)[-1]
    if short in SHIPPED_CLASSES[group] and args[1] in (short, SHIPPED_CLASSES[group][short]):
        return f"{args[0]} {short}"
    return None


def live(args: Sequence[str]) -> str:
    """The text LightningCLI's parser prints for ``dpot fit ARGS`` (imports torch and Lightning:
    seconds)."""
    from lightning_dpot.training import run_lightning

    text, argv0 = io.StringIO(), sys.argv[0]
    sys.argv[0] = "dpot"  # the program name the usage line shows
    with redirect_stdout(text):
        try:
            run_lightning(["fit", *args])
        except SystemExit:
            pass
        finally:
            sys.argv[0] = argv0
    return text.getvalue()


def _fresh(args: Sequence[str]) -> str:
    """``live(args)`` in a fresh process at 100 columns, as a user's first ``dpot fit`` runs."""
    return subprocess.run(
        [sys.executable, "-m", "lightning_dpot.commands.fit_help", *args],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "100"},
    ).stdout  # fmt: skip


def shipped_requests() -> list[list[str]]:
    """Every request whose text ships."""
    return [["--help"]] + [
        [f"--{group}.help", name] for group, names in SHIPPED_CLASSES.items() for name in names
    ]


def write_shipped() -> None:
    """Regenerate the shipped texts after a change of a method's or a data module's arguments,
    or of the dependencies: ``python -m lightning_dpot.commands.fit_help --write`` (a minute
    or two: one fresh process per text)."""
    from lightning_dpot.resources import resource_root

    texts = {_shipped_key(args): _fresh(args) for args in shipped_requests()}
    payload = json.dumps({"versions": versions(), "texts": texts}, indent=0, sort_keys=True)
    with gzip.open(resource_root() / SHIPPED, "wt", encoding="utf-8") as f:
        f.write(payload + "\n")


def shipped_texts() -> dict:
    """The shipped file: ``{"versions": ..., "texts": {key: text}}`` (empty when it is missing
    or unreadable: the texts are then built)."""
    from lightning_dpot.resources import resource_root

    try:
        with gzip.open(resource_root() / SHIPPED, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"versions": None, "texts": {}}


def text(args: list[str]) -> str:
    """The help text for ``request``'s ``args``: shipped, cached, or built (then cached)."""
    key = _shipped_key(args)
    if key is not None:
        shipped = shipped_texts()
        if shipped["versions"] == versions() and key in shipped["texts"]:
            return shipped["texts"][key]
    package = Path(__file__).resolve().parents[1]
    stamp = max(p.stat().st_mtime_ns for p in package.rglob("*.py"))
    cache_key = f"{args}-{stamp}-{versions()}-{shutil.get_terminal_size().columns}"
    digest = hashlib.blake2b(cache_key.encode(), digest_size=8).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightning_dpot"
    path = cache / f"fit-help-{digest}.txt"
    if path.is_file():
        return path.read_text()
    built = live(args)
    if key is not None or "." not in args[-1] or args[-1].startswith("lightning_dpot."):
        try:  # only the package's own classes: a user's module may change under the same key
            cache.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(built)
            os.replace(partial, path)  # whole or absent, for a second process reading it
        except OSError:  # a read-only home: print without caching
            pass
    return built


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_shipped()
    else:
        print(live(sys.argv[1:]), end="")
