"""A user's own table (CSV, or Parquet with ``pyarrow``) with a declared schema: public bounds for
every numeric column, the categories of every categorical one.

Every column of the file is declared or explicitly dropped; a column without bounds is refused,
because its sensitivity would have to come from the data. Each record is encoded into
[−1, 1]^d by public, data-independent maps (so the package's box bounds and sensitivities
hold):

* a numeric column in [low, high]: v ↦ 2(v − low)/(high − low) − 1, one coordinate;
* a categorical column with K categories: its one-hot vector mapped to {−1, +1}^K, K
  coordinates (a change of category moves two coordinates by 2: the box bound 2 per
  coordinate is valid, and loose by the factor the box gives away).

A value outside its column's bounds, a category not declared, an empty cell or a cell that is not
a number is refused with its column and row, before anything is released: nothing is clipped.
Generated records decode back through the same maps (``decode``, ``write_csv``): numeric values
to the declared range, each categorical block to its largest coordinate.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_dpot.checks import check_nonnegative_int
from lightning_dpot.data.images import check_limit
from lightning_dpot.data.sources import DataSource, DataSplits, digest_ids, seeded_split

__all__ = ["Column", "Table", "read_schema"]

#: the identity namespace of table rows (``DataSplits.id_namespace``)
TABLE_ROWS = "table-rows"


@dataclass(frozen=True)
class Column:
    """One declared column: numeric (``low`` < ``high``) or categorical (``categories``)."""

    name: str
    low: float | None = None
    high: float | None = None
    categories: tuple[str, ...] | None = None

    @property
    def width(self) -> int:
        """Coordinates the column takes in an encoded record."""
        return 1 if self.categories is None else len(self.categories)

    @classmethod
    def declared(cls, name: str, spec: Any) -> Column:
        """The column ``name`` from its schema entry: ``{low, high}`` or ``{categories}``."""
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"columns.{name}: give {{low: ..., high: ...}} (numeric) or "
                f"{{categories: [...]}} (categorical), got {spec!r}"
            )
        keys = set(spec)
        if keys == {"categories"}:
            if any(isinstance(c, bool) for c in spec["categories"]):
                # YAML 1.1 reads unquoted yes/no/on/off/true/false as booleans: the cells'
                # spelling is lost, so the declaration is refused rather than guessed.
                raise ValueError(
                    f"columns.{name}.categories {list(spec['categories'])!r} were read as "
                    "booleans (YAML reads unquoted yes/no/on/off/true/false so): quote them "
                    "as the cells spell them, e.g. ['no', 'yes'] or ['False', 'True']"
                )
            categories = tuple(str(c) for c in spec["categories"])
            if len(categories) < 2 or len(set(categories)) != len(categories):
                raise ValueError(
                    f"columns.{name}.categories must list at least 2 distinct values, "
                    f"got {list(spec['categories'])!r}"
                )
            return cls(name, categories=categories)
        if keys == {"low", "high"}:
            low, high = float(spec["low"]), float(spec["high"])
            if not (math.isfinite(low) and math.isfinite(high) and high > low):
                raise ValueError(
                    f"columns.{name}: need finite low < high, got low={low!r}, high={high!r}"
                )
            return cls(name, low, high)
        raise ValueError(
            f"columns.{name}: declare public bounds {{low, high}} or {{categories}}, got keys "
            f"{sorted(keys)} (bounds come from what is public, never from the data)"
        )


def read_schema(path: str | Path) -> dict[str, Any]:
    """The ``columns`` mapping of a schema file (JSON or YAML: ``{columns: {...}}``)."""
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        schema = json.loads(text)
    else:
        import yaml

        schema = yaml.safe_load(text)
    if not isinstance(schema, Mapping) or not isinstance(schema.get("columns"), Mapping):
        raise ValueError(f"schema={str(path)!r} must hold a mapping 'columns: {{name: spec}}'")
    return dict(schema["columns"])


def _canonical(cell: Any) -> str:
    """A cell as text that CSV and Parquet agree on: a number as its float repr."""
    try:
        return repr(float(cell))
    except (TypeError, ValueError):
        return str(cell)


class Table(DataSource):
    """A table of records with declared per-column bounds (module docstring).

    Args:
        path: a ``.csv`` file with a header row, or a ``.parquet`` file (needs ``pyarrow``).
        columns: ``{name: {low, high}}`` for numeric and ``{name: {categories: [...]}}`` for
            categorical columns; or give ``schema``.
        schema: a JSON or YAML file holding ``columns:`` (instead of ``columns``).
        label: a categorical column to use as the class label (conditional methods and the
            utility metrics); it is declared in ``columns`` and not part of the records.
        drop: columns of the file that are not used (never read into a record).
        id_columns: the columns that identify a person's row (e.g. a patient number) for the
            privacy ledger; default: every column of the row.
        test_fraction: held-out fraction of rows (seeded split); 0 keeps none.
        split_seed: seed of the split.
        limit: keep the first ``limit`` training rows (after the seeded split).

    Raises:
        ValueError: one line naming the column (and row) of what is refused.
    """

    low, high = -1.0, 1.0

    def __init__(
        self,
        path: str,
        columns: dict[str, dict[str, Any]] | None = None,
        schema: str | None = None,
        label: str | None = None,
        drop: list[str] | None = None,
        id_columns: list[str] | None = None,
        test_fraction: float = 0.0,
        split_seed: int = 0,
        limit: int | None = None,
    ) -> None:
        if (columns is None) == (schema is None):
            raise ValueError("give exactly one of columns (a mapping) and schema (a file)")
        self.path = str(path)
        self.schema = None if schema is None else str(schema)
        specs = read_schema(schema) if schema is not None else dict(columns or {})
        if not specs:
            raise ValueError("columns: declare at least one column")
        declared = [Column.declared(str(name), spec) for name, spec in specs.items()]
        self.label = label
        if label is not None:
            kinds = {c.name: c for c in declared}
            if label not in kinds or kinds[label].categories is None:
                raise ValueError(
                    f"label={label!r} must be a categorical column declared in columns"
                )
        self.label_column = next((c for c in declared if c.name == label), None)
        self.columns = [c for c in declared if c.name != label]
        if not self.columns:
            raise ValueError("columns: declare at least one column besides the label")
        self.drop = tuple(drop or ())
        self.id_columns = None if id_columns is None else [str(c) for c in id_columns]
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction!r}")
        self.test_fraction = float(test_fraction)
        self.split_seed = check_nonnegative_int("split_seed", split_seed)
        self.limit = check_limit(limit)

    # -- public facts -------------------------------------------------------------------------
    @property
    def sample_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (sum(c.width for c in self.columns),)

    @property
    def num_classes(self) -> int | None:  # type: ignore[override]
        return None if self.label_column is None else self.label_column.width

    @property
    def name(self) -> str:
        """The file's stem: what runs on this table are named after."""
        return Path(self.path).stem

    def describe(self) -> dict:
        """The source's parameters and its declared schema (public declarations)."""
        declared = [*self.columns, *([self.label_column] if self.label_column else [])]
        schema = {
            c.name: {"categories": list(c.categories)}
            if c.categories is not None
            else {"low": c.low, "high": c.high}
            for c in declared
        }
        return {
            **super().describe(), "columns": schema, "drop": list(self.drop),
            "id_columns": self.id_columns,
        }  # fmt: skip

    # -- reading ------------------------------------------------------------------------------
    def _rows(self) -> tuple[list[str], list[dict[str, Any]]]:
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"path={self.path!r}: no such file")
        if path.suffix.lower() == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError as error:
                raise ImportError(
                    f"path={self.path!r}: reading Parquet needs pyarrow "
                    "(pip install 'lightning_dpot[table]'), or save the table as CSV"
                ) from error
            table = pq.read_table(path)
            return list(table.column_names), table.to_pylist()
        if path.suffix.lower() != ".csv":
            raise ValueError(f"path={self.path!r}: a table is a .csv or .parquet file")
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            header = list(reader.fieldnames or [])
            return header, list(reader)

    def _check_header(self, header: Sequence[str]) -> None:
        known = {c.name for c in self.columns} | {self.label} | set(self.drop)
        for name in header:
            if name not in known:
                raise ValueError(
                    f"column {name!r} of {self.path!r} has no declared bounds: declare it in "
                    "columns ({low, high} or {categories}) or list it in drop"
                )
        wanted = [c.name for c in self.columns] + ([self.label] if self.label else [])
        for name in self.id_columns or []:
            if name not in header:
                raise ValueError(f"id_columns names {name!r}, not a column of {self.path!r}")
        for name in wanted:
            if name not in header:
                raise ValueError(f"columns.{name} is declared but {self.path!r} has no such column")

    def _encode(self, row: Mapping[str, Any], number: int) -> list[float]:
        out: list[float] = []
        for column in self.columns:
            cell = row[column.name]
            where = f"column {column.name!r}, row {number}"
            if cell is None or (isinstance(cell, str) and cell.strip() == ""):
                raise ValueError(f"{where}: empty cell (impute or drop missing values first)")
            if column.categories is not None:
                value = str(cell)
                if value not in column.categories:
                    raise ValueError(
                        f"{where}: {value!r} is not a declared category {list(column.categories)}"
                    )
                out += [1.0 if c == value else -1.0 for c in column.categories]
                continue
            try:
                number_value = float(cell)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: {cell!r} is not a number") from None
            assert column.low is not None and column.high is not None
            if not (column.low <= number_value <= column.high):
                raise ValueError(
                    f"{where}: {number_value!r} is outside the declared "
                    f"[{column.low}, {column.high}] (nothing is clipped)"
                )
            out.append(2.0 * (number_value - column.low) / (column.high - column.low) - 1.0)
        return out

    def _label(self, row: Mapping[str, Any], number: int) -> int:
        assert self.label_column is not None and self.label_column.categories is not None
        value = "" if row[self.label_column.name] is None else str(row[self.label_column.name])
        if value not in self.label_column.categories:
            raise ValueError(
                f"column {self.label!r}, row {number}: {value!r} is not a declared category "
                f"{list(self.label_column.categories)}"
            )
        return self.label_column.categories.index(value)

    def _identity(self, row: Mapping[str, Any]) -> bytes:
        """A row's identity for the privacy ledger: the cells of ``id_columns`` if declared,
        else every cell of the row (declared and dropped alike), by column name, numbers as
        floats. The same person's row in another run that declares other columns, drops
        others, or reads the file as Parquet instead of CSV is the same record."""
        names = self.id_columns or sorted(row)
        return "\x1f".join(f"{name}={_canonical(row[name])}" for name in names).encode()

    def load(self) -> DataSplits:
        header, rows = self._rows()
        self._check_header(header)
        if not rows:
            raise ValueError(f"path={self.path!r} holds no rows")
        for number, row in enumerate(rows, 1):
            if None in row:  # csv.DictReader keeps cells beyond the header under None
                raise ValueError(
                    f"row {number} of {self.path!r} has more cells than the header has columns"
                )
        x = torch.tensor([self._encode(r, i + 1) for i, r in enumerate(rows)], dtype=torch.float32)
        y = None
        if self.label_column is not None:
            y = torch.tensor([self._label(r, i + 1) for i, r in enumerate(rows)])
        ids = digest_ids(self._identity(r) for r in rows)
        train, test = seeded_split(len(rows), self.test_fraction, self.split_seed)
        if self.limit is not None:
            train = train[: self.limit]
        y_train = None if y is None else y[train]
        if len(test) == 0:
            return DataSplits(x[train], y_train, None, None, ids[train], TABLE_ROWS)
        y_test = None if y is None else y[test]
        return DataSplits(x[train], y_train, x[test], y_test, ids[train], TABLE_ROWS)

    # -- generated records back to the table's units -----------------------------------------
    def decode(self, records: Tensor, labels: Tensor | None = None) -> list[dict[str, Any]]:
        """Rows of the table from encoded records ``(n, d)`` (generated ones are post-processing:
        numeric values mapped to, and kept inside, the declared range; each categorical block
        decoded to its largest coordinate)."""
        records = records.detach().reshape(len(records), -1).double().cpu()
        if records.shape[1] != self.sample_shape[0]:
            raise ValueError(
                f"records have {records.shape[1]} values each; this table encodes "
                f"{self.sample_shape[0]}"
            )
        rows: list[dict[str, Any]] = [{} for _ in range(len(records))]
        start = 0
        for column in self.columns:
            block = records[:, start : start + column.width]
            start += column.width
            if column.categories is not None:
                for row, index in zip(rows, block.argmax(1).tolist(), strict=True):
                    row[column.name] = column.categories[index]
                continue
            assert column.low is not None and column.high is not None
            values = column.low + (block[:, 0].clamp(-1.0, 1.0) + 1.0) / 2.0 * (
                column.high - column.low
            )
            for row, value in zip(rows, values.tolist(), strict=True):
                row[column.name] = value
        if labels is not None and self.label_column is not None:
            assert self.label_column.categories is not None
            for row, label in zip(rows, labels.tolist(), strict=True):
                row[self.label_column.name] = self.label_column.categories[int(label)]
        return rows

    def write_csv(self, path: str | Path, records: Tensor, labels: Tensor | None = None) -> None:
        """``decode`` the records and write them as a CSV file with a header row."""
        rows = self.decode(records, labels)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]) if rows else [])
            writer.writeheader()
            writer.writerows(rows)
