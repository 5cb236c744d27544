"""``dpot compare``: every method of a suite on the same data at equal target privacy.

    dpot compare --config configs/compare/two_d.yaml [--output DIR]
        [--feature_extractor_weights_path weights-inception-2015-12-05-6726825d.pth]

Runs the suite's grid (methods × sources × ε × seeds; ``lightning_dpot.compare.suite``),
one ``dpot fit`` per cell with one evaluator set (``lightning_dpot.compare.runner``), and
writes to ``DIR`` (default ``runs/compare/<suite name>``):

* ``comparison.json`` — every cell (privacy from its own report, metrics, timings) and the
  per-(source, method, ε) means and standard deviations over seeds;
* ``comparison.md`` — the table, grouped by privacy notion;
* ``plots/<source>_<metric>.png`` (metric against ε per method, ±1 std over seeds) and
  ``plots/<source>_samples.png`` (samples side by side at each ε).

A cell that raises is listed (``failed_cells`` in ``comparison.json`` and a line under the
table, its traceback in ``errors/<cell>.txt``) and the other cells go on; the command then exits
with status 1. Rerunning the command resumes: finished cells are read back, not redone, and
failed ones are tried again. With
``--feature_extractor_weights_path`` the suite's Fréchet distance is FID on InceptionV3 features
from that local file (docs/evaluation.md says how to get it), never the classifier FD, and its
rows sit beside the published FIDs; the evaluation is part of every cell's fingerprint, so such a
run goes to its own ``--output``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lightning_dpot.commands.flags import refuse_old_spellings

DESCRIPTION = "every method of a suite on the same data at equal privacy: table, plots, JSON"


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--config", required=True, help="suite file (configs/compare/*.yaml)")
    parser.add_argument("--output", help="run directory (default runs/compare/<suite name>)")
    parser.add_argument(
        "--feature_extractor_weights_path",
        help="local InceptionV3 FID weights: the Fréchet distance becomes FID (docs/evaluation.md)",
    )
    refuse_old_spellings(parser, {})
    return parser


def run(args: argparse.Namespace) -> dict:
    """Run (or resume) the grid and write the results; returns a summary."""
    from tqdm import tqdm

    from lightning_dpot.compare.results import (
        aggregate,
        comparison_record,
        markdown_table,
        plot_metrics,
        plot_samples,
    )
    from lightning_dpot.compare.runner import record_failure, run_cell, run_prepare
    from lightning_dpot.compare.suite import (
        check_inception_weights,
        load_suite,
        with_inception_weights,
    )

    suite = load_suite(args.config)
    if args.feature_extractor_weights_path is not None:
        weights = check_inception_weights(args.feature_extractor_weights_path)
        suite = with_inception_weights(suite, weights)
    out_dir = Path(args.output or Path("runs") / "compare" / suite.name).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = suite.cells()
    finished = sum((out_dir / "cells" / c.key / "cell.json").is_file() for c in cells)
    start = time.perf_counter()
    records, failed = [], []
    for name in suite.prepare:
        print(f"dpot compare: prepare {name}", file=sys.stderr)
        run_prepare(suite, name, out_dir)
    with tqdm(total=len(cells), initial=finished, desc=suite.name, file=sys.stderr) as bar:
        for cell in cells:
            done = (out_dir / "cells" / cell.key / "cell.json").is_file()
            bar.set_postfix_str(cell.key)
            try:
                records.append(run_cell(suite, cell, out_dir))
            except Exception as err:  # listed, with its traceback; the others go on
                failed.append(record_failure(cell.key, err, out_dir / "errors"))
                print(
                    f"\ndpot compare: {cell.key} failed ({failed[-1].error}); traceback in "
                    f"{out_dir / 'errors' / cell.key}.txt",
                    file=sys.stderr,
                )
            if not done:
                bar.update(1)
    if not records:
        raise RuntimeError(
            f"every cell failed; the first: {failed[0].run}: {failed[0].error} (tracebacks in "
            f"{out_dir / 'errors'})"
        )
    above = [r["method"] + "/" + r["source"] for r in records if r["privacy"].get("exceeds_target")]
    if above:
        print(
            f"dpot compare: warning: {len(above)} cell(s) reported ε above the suite's target "
            f"({', '.join(sorted(set(above)))}); their rows are flagged, not at equal privacy",
            file=sys.stderr,
        )
    rows = aggregate(records)
    failures = [asdict(failure) for failure in failed]
    record = {**comparison_record(suite, records, rows), "failed_cells": failures}
    (out_dir / "comparison.json").write_text(json.dumps(record, indent=2, default=str))
    table = markdown_table(suite, rows) + "".join(
        f"\nFailed: {f.run}: {f.error} (errors/{f.run}.txt)\n" for f in failed
    )
    (out_dir / "comparison.md").write_text(table + "\n")
    plots = plot_metrics(rows, out_dir / "plots") + plot_samples(
        suite, records, out_dir / "plots", out_dir / "cells"
    )
    return {
        "suite": suite.name,
        "cells": len(cells),
        "resumed_finished_cells": finished,
        "seconds": round(time.perf_counter() - start, 1),
        "comparison": str(out_dir / "comparison.json"),
        "table": str(out_dir / "comparison.md"),
        "plots": [str(p) for p in plots],
        "failed_cells": failures,
    }


def main(argv: list[str]) -> None:
    parser = build_parser(argparse.ArgumentParser(prog="dpot compare", description=DESCRIPTION))
    args = parser.parse_args(argv)
    summary = run(args)
    print(Path(summary["table"]).read_text(), file=sys.stderr)
    print(json.dumps(summary, indent=2))
    if summary["failed_cells"]:
        raise SystemExit(1)
