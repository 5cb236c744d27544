"""Cost of the release journal: one durable (``fsync``-ed) line per privacy event.

Every release object emits its event before it draws its noise, and the accountant's journal
writes and ``fsync``-s one JSON line inside that emit
(``lightning_dpot/privacy/accounting/journal.py``).
This times ``--appends`` appends to a journal in ``--dir`` (the disk a run's log directory is
on matters: a network file system ``fsync``-s slower than a local disk) and reading it back,
as a resumed run does.

Run: python benchmarks/bench_journal.py [--dir PATH] [--appends 500]
Prints one JSON object: milliseconds per append (median and 95th percentile) and per read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.events import SubsampledGaussianStep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the journal is written")
    parser.add_argument("--appends", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        journal = ReleaseJournal(Path(directory) / "journal.jsonl")
        journal.start()
        event = SubsampledGaussianStep(1.5, 1 / 1200)
        times = []
        for _ in range(args.appends):
            start = time.perf_counter()
            journal.append(0, event)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        count = len(journal.read())
        read = time.perf_counter() - start
    times.sort()
    print(
        json.dumps(
            {
                "appends": count,
                "append_ms_median": 1e3 * statistics.median(times),
                "append_ms_p95": 1e3 * times[int(0.95 * (len(times) - 1))],
                "read_ms": 1e3 * read,
            }
        )
    )


if __name__ == "__main__":
    main()
