"""A user's table and image folder: every column has declared bounds or is refused, values are
encoded by the declared maps and decode back, bad cells are refused in one line naming the column
and row, Parquet reads as CSV does; flat image folders with or without a labels file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_dpot.data import ImageFolder, Table

COLUMNS = {
    "age": {"low": 0, "high": 100},
    "smoker": {"categories": ["no", "yes"]},
    "diagnosis": {"categories": ["healthy", "sick"]},
}


def _csv(path: Path, rows: list[str], header: str = "id,age,smoker,diagnosis") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_records_are_encoded_by_the_declared_maps_and_decode_back(tmp_path):
    path = _csv(tmp_path / "t.csv", ["1,25,no,healthy", "2,75,yes,sick", "3,100,yes,healthy"])
    table = Table(str(path), COLUMNS, label="diagnosis", drop=["id"])
    data = table.load()
    assert table.sample_shape == (3,) and table.num_classes == 2
    expected = [[-0.5, 1.0, -1.0], [0.5, -1.0, 1.0], [1.0, -1.0, 1.0]]
    rows = sorted(data.train.tolist())
    assert rows == sorted(expected)
    assert table.decode(torch.tensor(expected), torch.tensor([0, 1, 0])) == [
        {"age": 25.0, "smoker": "no", "diagnosis": "healthy"},
        {"age": 75.0, "smoker": "yes", "diagnosis": "sick"},
        {"age": 100.0, "smoker": "yes", "diagnosis": "healthy"},
    ]
    assert data.id_namespace == "table-rows" and len(set(data.train_ids.tolist())) == 3
    # public declarations only: the schema is in the release metadata, no value is
    assert table.describe()["columns"]["age"] == {"low": 0.0, "high": 100.0}
    described = {k: v for k, v in table.describe().items() if k != "path"}
    assert "25" not in json.dumps(described) and "75" not in json.dumps(described)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            ["1,120,no,healthy"],
            r"column 'age', row 1: 120.0 is outside the declared \[0.0, 100.0\]",
        ),
        (["1,20,maybe,healthy"], r"column 'smoker', row 1: 'maybe' is not a declared category"),
        (["1,,no,healthy"], r"column 'age', row 1: empty cell"),
        (["1,20,no,healthy", "2,old,no,healthy"], r"column 'age', row 2: 'old' is not a number"),
        (["1,20,no,unknown"], r"column 'diagnosis', row 1: 'unknown' is not a declared category"),
    ],
)
def test_a_bad_cell_is_refused_naming_its_column_and_row(tmp_path, rows, message):
    table = Table(str(_csv(tmp_path / "t.csv", rows)), COLUMNS, label="diagnosis", drop=["id"])
    with pytest.raises(ValueError, match=message):
        table.load()


def test_a_column_without_bounds_is_refused(tmp_path):
    path = str(_csv(tmp_path / "t.csv", ["1,20,no,healthy"]))
    with pytest.raises(ValueError, match="column 'id' .* has no declared bounds: declare it"):
        Table(path, COLUMNS).load()
    with pytest.raises(ValueError, match=r"columns.weight is declared but .* has no such column"):
        Table(path, {**COLUMNS, "weight": {"low": 0, "high": 1}}, drop=["id"]).load()
    with pytest.raises(ValueError, match=r"columns.age: declare public bounds \{low, high\}"):
        Table(path, {"age": {"low": 0}})
    with pytest.raises(ValueError, match=r"columns.age: need finite low < high"):
        Table(path, {"age": {"low": 5, "high": 1}})
    with pytest.raises(ValueError, match="label='age' must be a categorical column"):
        Table(path, COLUMNS | {"age": {"low": 0, "high": 1}}, label="age")
    with pytest.raises(ValueError, match="exactly one of columns"):
        Table(path)
    # unquoted yes/no in a YAML schema arrive as booleans: refused, not matched as 'True'
    with pytest.raises(ValueError, match=r"columns.smoker.categories \[False, True\] were read"):
        Table(path, COLUMNS | {"smoker": {"categories": [False, True]}}, drop=["id"])


def test_a_schema_file_and_a_parquet_file_read_as_the_mapping_and_the_csv_do(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = ["1,25,no,healthy", "2,75,yes,sick"]
    csv_path = _csv(tmp_path / "t.csv", rows)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"columns": COLUMNS}))
    columns = {
        "id": [1, 2], "age": [25.0, 75.0], "smoker": ["no", "yes"], "diagnosis": ["healthy", "sick"]
    }  # fmt: skip
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    from_csv = Table(str(csv_path), COLUMNS, drop=["id"]).load()
    from_schema = Table(str(csv_path), schema=str(schema), drop=["id"]).load()
    from_parquet = Table(str(tmp_path / "t.parquet"), COLUMNS, drop=["id"]).load()
    assert torch.equal(from_csv.train, from_schema.train)
    assert torch.equal(from_csv.train, from_parquet.train)
    assert torch.equal(from_csv.train_ids, from_parquet.train_ids)  # the same rows


def _pngs(folder: Path, count: int) -> list[str]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    names = []
    for i in range(count):
        pixels = gen.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
        names.append(f"{i}.png")
    return names


def test_a_flat_image_folder_reads_with_a_labels_file_or_unlabelled(tmp_path):
    names = _pngs(tmp_path / "flat", 5)
    labels = tmp_path / "labels.csv"
    labels.write_text("file,label\n" + "".join(f"{n},{'cat' if i < 2 else 'dog'}\n"
                                               for i, n in enumerate(names)))  # fmt: skip
    source = ImageFolder(tmp_path / "flat", image_size=8, labels=str(labels))
    data = source.load()
    assert source.classes == ["cat", "dog"] and torch.bincount(data.train_labels).tolist() == [2, 3]
    declared = ImageFolder(tmp_path / "flat", 8, labels=str(labels), classes=["dog", "cat"])
    assert torch.bincount(declared.load().train_labels).tolist() == [3, 2]
    unlabelled = ImageFolder(tmp_path / "flat", image_size=8, grayscale=True)
    assert unlabelled.num_classes is None
    data = unlabelled.load()
    assert data.train.shape == (5, 1, 8, 8) and data.train_labels is None


def test_a_flat_folder_is_refused_where_its_labels_do_not_match(tmp_path):
    names = _pngs(tmp_path / "flat", 3)
    labels = tmp_path / "labels.csv"
    labels.write_text(f"file,label\n{names[0]},a\n{names[1]},b\n")
    with pytest.raises(ValueError, match="has no row for '2.png'"):
        ImageFolder(tmp_path / "flat", 8, labels=str(labels)).load()
    labels.write_text("file,label\n" + "".join(f"{n},a\n" for n in names))
    with pytest.raises(ValueError, match="has label 'a', not among classes"):
        ImageFolder(tmp_path / "flat", 8, labels=str(labels), classes=["b"]).load()
    (tmp_path / "flat" / "sub").mkdir()
    with pytest.raises(ValueError, match="holds both images and folders"):
        ImageFolder(tmp_path / "flat", 8).load()


def test_a_rows_identity_does_not_depend_on_the_columns_a_run_declares(tmp_path):
    path = str(_csv(tmp_path / "t.csv", ["1,25,no,healthy", "2,75,yes,sick"]))
    full = Table(path, COLUMNS, drop=["id"]).load()
    fewer = Table(path, {"age": COLUMNS["age"]}, drop=["id", "smoker", "diagnosis"]).load()
    assert torch.equal(full.train_ids, fewer.train_ids)  # the same people to the ledger
    by_id = Table(path, {"age": COLUMNS["age"]}, drop=["smoker", "diagnosis", "id"],
                  id_columns=["id"]).load()  # fmt: skip
    path2 = str(_csv(tmp_path / "t2.csv", ["1,26,no,healthy", "2,75,yes,sick"]))
    corrected = Table(path2, {"age": COLUMNS["age"]}, drop=["smoker", "diagnosis", "id"],
                      id_columns=["id"]).load()  # fmt: skip
    assert torch.equal(by_id.train_ids, corrected.train_ids)  # a corrected age, the same person
    with pytest.raises(ValueError, match="id_columns names 'patient'"):
        Table(path, COLUMNS, drop=["id"], id_columns=["patient"]).load()


def test_a_row_with_more_cells_than_the_header_is_refused(tmp_path):
    path = str(_csv(tmp_path / "t.csv", ["1,25,no,healthy", "2,75,yes,sick,extra"]))
    with pytest.raises(ValueError, match="row 2 of .* has more cells than the header"):
        Table(path, COLUMNS, drop=["id"]).load()
