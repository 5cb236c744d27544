"""One spelling of command-line flags across ``dpot``: Lightning's, as ``dpot fit`` takes them
(``--ckpt_path``, ``--trainer.max_steps``): words joined by underscores. Earlier spellings are
refused in one line that names the new flag."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["refuse_old_spellings"]


class _Renamed(argparse.Action):
    """An earlier spelling: refused, naming the flag that replaced it."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, nargs=0, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        raise ValueError(f"{option} was renamed to {self.new}")


def refuse_old_spellings(parser: argparse.ArgumentParser, renamed: dict[str, str]) -> None:
    """Refuse, naming the new flag: every ``--a_b`` flag of ``parser`` spelled ``--a-b``, and
    each ``old → new`` of ``renamed``."""
    old_new = dict(renamed)
    for action in list(parser._actions):
        for flag in action.option_strings:
            if flag.startswith("--") and "_" in flag:
                old_new.setdefault(flag.replace("_", "-"), flag)
    for old, new in old_new.items():
        parser.add_argument(old, action=_Renamed, new=new, dest=f"_renamed_{old}")
