"""docs/your_data.md runs as written, in a temporary folder: a generated table and a generated
image folder go through fit, report, samples, the leakage check and export; and the leakage check
tells a generator that returns its training records from the trained private one."""

from __future__ import annotations

import glob
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_dpot.cli import main
from lightning_dpot.data import Table

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "your_data.md"


def _commands(section: str) -> list[str]:
    """The shell commands of the ```bash blocks of a section, continuation lines joined and
    each here-document kept whole."""
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    out: list[str] = []
    for block in blocks:
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if "<<'EOF'" in line:
                end = lines.index("EOF", i)
                out.append("\n".join(lines[i : end + 1]))
                i = end + 1
                continue
            while line.endswith("\\"):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            out.append(line)
            i += 1
    return out


def _run(command: str, cwd: Path, capsys) -> str:
    """A here-document through Python; a ``dpot`` command in this process, globs expanded as
    the shell would and ``configs/`` read from the repository; returns its stdout."""
    if "<<'EOF'" in command:
        script = command.split("\n", 1)[1].rsplit("\nEOF", 1)[0]
        subprocess.run([sys.executable, "-"], input=script, text=True, cwd=cwd, check=True)
        return ""
    words = shlex.split(command)
    assert words[0] == "dpot", command
    args = []
    for word in words[1:]:
        if "*" in word:
            matches = sorted(glob.glob(word, root_dir=cwd))
            assert len(matches) == 1, (word, matches)
            word = matches[0]
        args.append(word.replace("configs/", f"{REPO}/configs/", 1))
    capsys.readouterr()
    main(args)
    return capsys.readouterr().out


def _section(title: str) -> str:
    text = DOC.read_text()
    return text.split(f"## {title}", 1)[1].split("\n## An image folder", 1)[0]


def test_a_table_goes_from_csv_to_private_samples_a_leakage_check_and_an_export(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPOT_LEDGER_DIR", str(tmp_path / "ledger"))
    text = DOC.read_text().split("## An image folder", 1)[0]
    outputs = [_run(c, tmp_path, capsys) for c in _commands(text.split("## A sensitive table")[1])]
    (run,) = (tmp_path / "runs").glob("dpmerf_patients-*")  # named after method and file
    report = json.loads((run / "privacy_report.json").read_text())
    assert report["epsilon"] <= 1.0 and report["releases"] == 1
    rows = (tmp_path / "synthetic_patients.csv").read_text().splitlines()
    assert rows[0] == "age,income,smoker,diagnosis" and len(rows) == 2001
    written = (run / "samples.csv").read_text().splitlines()  # the fit's own sample
    assert written[0] == rows[0] and len(written) == 101
    assert (run / "generator.pt").is_file()
    leakage = next(json.loads(o)["results"]["leakage"] for o in outputs if '"leakage"' in o)
    assert "not for release" in leakage["notice"]
    evaluated = json.loads((run / "report.json").read_text())["evaluate"]
    assert evaluated and all("leakage" not in entry["results"] for entry in evaluated)
    # A generator that returns its training records, scored the same way
    source = Table("patients.csv", schema="patients_schema.yaml", drop=["id"], test_fraction=0.2)
    torch.save(source.load().train, tmp_path / "copies.pt")
    capsys.readouterr()
    main(["evaluate", "--samples", "copies.pt", "--data_config", str(run / "config.yaml"),
          "--metrics", "leakage", "--num_samples", "2000", "--no_report"])  # fmt: skip
    copies = json.loads(capsys.readouterr().out)["results"]["leakage"]
    assert copies["closer_to_train"] == 1.0 and copies["mia_auc"] > 0.95
    baseline = leakage["closer_to_train_if_independent"]
    assert baseline == pytest.approx(0.8)  # 1,600 training rows against 400 held out
    assert leakage["closer_to_train"] < baseline + 0.1 and leakage["mia_auc"] < 0.65


@pytest.mark.slow
def test_an_image_folder_goes_to_a_private_class_conditional_generator(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPOT_LEDGER_DIR", str(tmp_path / "ledger"))
    section = DOC.read_text().split("## An image folder", 1)[1].split("\n## Your own method")[0]
    for command in _commands(section):
        _run(command, tmp_path, capsys)
    (run,) = (tmp_path / "runs").glob("dpmerf_digits-*")
    assert (run / "samples.png").is_file() and (tmp_path / "digits_samples.png").is_file()
    assert (run / "generator.pt").is_file()
    report = json.loads((run / "privacy_report.json").read_text())
    assert report["epsilon"] <= 10.0 and report["releases"] == 1
