"""``dpot report RUN_DIR``: a run's ``report.json`` as a readable table, and the summary that
``dpot fit`` prints at the end of a run."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lightning_dpot.commands.flags import refuse_old_spellings

__all__ = ["checkpoint_report", "flatten", "journal_note", "main", "summary"]


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted.key, leaf)`` pairs of nested dicts; lists of scalars stay one value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def table(report: dict) -> str:
    rows = [(key, _format(value)) for key, value in flatten(report)]
    width = max((len(key) for key, _ in rows), default=0)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def _ledger_total(privacy: dict) -> str:
    """The privacy ledger's total over every release of the run's records (local or central),
    and how many of them were used without noise, as the privacy line ends."""
    total = (privacy.get("ledger") or {}).get("all_releases_of_these_records")
    if not total:
        return ""
    shown = f"; all releases of these records: ε={total['epsilon']:.4g}"
    public = total.get("records_used_without_noise")
    if public:
        shown += f", and {public} of them used without noise (no ε bounds theirs)"
    return shown


def _privacy_line(report: dict) -> str:
    privacy = report.get("privacy")
    if not privacy:
        return "privacy: none (not a private run)"
    if "kind" in privacy:  # local DP: the release's own guarantee
        delta = "" if not privacy.get("delta") else f", δ={privacy['delta']}"  # pure ε-DP
        return (
            f"privacy: local DP, ε={privacy['epsilon']:.4g}{delta} per record "
            f"({privacy['mechanism']}){_ledger_total(privacy)}"
        )
    epsilon = privacy.get("epsilon")
    shown = f"{epsilon:.4g}" if isinstance(epsilon, float) else str(epsilon)
    return (
        f"privacy: central DP, ε={shown}, δ={privacy.get('delta')}, {privacy.get('adjacency')}, "
        f"{privacy.get('accountant')} accountant, {privacy.get('releases')} releases"
        f"{_ledger_total(privacy)}"
    )


def journal_note(report: dict) -> str | None:
    """A line when the run's release journal holds more releases than ``report`` states: a later
    process of the same run (a resume killed before it reported) released after this report was
    written. ``None`` when they agree or the journal is not on this machine."""
    from lightning_dpot.privacy.accounting.journal import ReleaseJournal

    privacy = report.get("privacy") or {}
    path, stated = privacy.get("journal"), privacy.get("releases")
    if not path or stated is None or not Path(path).is_file():
        return None
    try:
        first = json.loads(Path(path).read_text().split("\n", 1)[0])
        held = len(ReleaseJournal(path, first["journal"]).read())
    except (ValueError, KeyError, TypeError):
        return f"note: the run's release journal {path} cannot be read; it is the record"
    if held <= stated:
        return None
    return (
        f"note: the run's release journal {path} holds {held} releases, more than the {stated} "
        "this report states (a later process of the run released after it was written): resume "
        "the run to report them all; `dpot report --ckpt_path` states a checkpoint's own releases"
    )


def checkpoint_report(ckpt: str | Path) -> dict:
    """The privacy report of the releases checkpoint ``ckpt`` holds (its accountant state)."""
    import torch

    from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback

    path = Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt={str(ckpt)!r}: no such checkpoint file")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    privacy = PrivacyAccountantCallback.report_of_checkpoint(checkpoint)
    if privacy is None:
        raise ValueError(
            f"ckpt={str(ckpt)!r} holds no central-DP release (a local-DP run's guarantee is its "
            "data release's, in the run's report.json)"
        )
    return {"checkpoint": str(path), "privacy": privacy}


def summary(run_dir: str | Path, max_files: int = 12) -> str:
    """What ``dpot fit`` prints at the end: where the run went, its privacy guarantee, its final
    metrics and the files it wrote."""
    run_dir = Path(run_dir)
    path = run_dir / "report.json"
    report = json.loads(path.read_text()) if path.is_file() else {}
    lines = [f"run directory: {run_dir}", _privacy_line(report)]
    note = journal_note(report)
    if note is not None:
        lines.append(note)
    ledger = (report.get("privacy") or {}).get("ledger") or {}
    if ledger.get("path"):
        lines.append(
            f"privacy ledger: {ledger['path']} (every release of these records; set by "
            "$DPOT_LEDGER_DIR or the data module's ledger.dir)"
        )
    metrics = report.get("metrics") or {}
    if metrics:
        shown = ", ".join(f"{k}={_format(v)}" for k, v in sorted(metrics.items())[:10])
        lines.append(f"final metrics: {shown}")
    files = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file())
    listed = ", ".join(str(p) for p in files[:max_files])
    more = f" (+{len(files) - max_files} more)" if len(files) > max_files else ""
    lines.append(f"files: {listed}{more}")
    lines.append(f"details: dpot report {run_dir}")
    return "\n".join(lines)


def _data_line(run_dir: Path, report: dict) -> str:
    """``method: M; data: SOURCE (file); steps: S (epochs E)`` from the report and config."""
    import yaml

    config_path = Path(report.get("config_path") or run_dir / "config.yaml")
    if not config_path.is_file():
        config_path = run_dir / "config.yaml"
    data = "unknown"
    if config_path.is_file():
        config = yaml.safe_load(config_path.read_text()) or {}
        source = ((config.get("data") or {}).get("init_args") or {}).get("source") or {}
        args = source.get("init_args") or {}
        where = next((args[k] for k in ("path", "root", "idx_dir") if args.get(k)), None)
        name = str(source.get("class_path", "")).rsplit(".", 1)[-1] or "unknown"
        data = f"{name} ({where})" if where else name
    steps = f"{report.get('global_step')} (epochs {report.get('epochs')})"
    return f"method: {report.get('method', 'unknown')}; data: {data}; steps: {steps}"


def _evaluation_lines(report: dict, limit: int = 8) -> list[str]:
    """One line per ``dpot evaluate`` record: its numbers, a few."""
    lines = []
    for record in report.get("evaluate") or []:
        numbers = [
            f"{key}={_format(value)}"
            for key, value in flatten(record.get("results") or {})
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        more = f" (+{len(numbers) - limit})" if len(numbers) > limit else ""
        if numbers:
            lines.append(f"evaluated: {', '.join(numbers[:limit])}{more}")
    return lines


def run_summary(run_dir: str | Path) -> str:
    """``dpot report RUN``: method, data and length first, then ``summary``'s privacy,
    metrics and files, and the evaluations."""
    run_dir = Path(run_dir)
    report = json.loads((run_dir / "report.json").read_text())
    note = journal_note(report)  # first: the report is older than the run's releases
    lines = [line for line in summary(run_dir).splitlines() if line != note]
    lines = [lines[0], _data_line(run_dir, report), *lines[1:-1], *_evaluation_lines(report)]
    head = [] if note is None else [note]
    return "\n".join([*head, *lines, f"the full report: dpot report {run_dir} --all"])


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="dpot report",
        description="a run's summary (method, data, privacy, metrics, files); --all: every "
        "entry of its report.json",
    )
    parser.add_argument("run_dir", nargs="?", help="a run directory holding report.json")
    parser.add_argument(
        "--all", action="store_true", help="every entry of report.json, one dotted key per line"
    )
    parser.add_argument(
        "--ckpt_path",
        dest="ckpt",
        help="instead: the privacy report of the releases this checkpoint holds",
    )
    refuse_old_spellings(parser, {"--ckpt": "--ckpt_path"})
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.ckpt is None):
        raise ValueError("give exactly one of RUN_DIR and --ckpt_path")
    if args.ckpt is not None:
        print(table(checkpoint_report(args.ckpt)))
        return
    path = Path(args.run_dir) / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"run_dir={args.run_dir!r} holds no report.json")
    if not args.all:
        print(run_summary(args.run_dir))
        return
    report = json.loads(path.read_text())
    note = journal_note(report)
    if note is not None:
        print(note)
    print(table(report))
