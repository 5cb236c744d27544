"""Every reference in the repository resolves inside it, and the text speaks of the product.

Papers are cited by author and year (docs/references.md), conventions by the docs that hold them
(docs/design.md and the method pages); a paper's number in a private collection, a section of a
document users do not have, or a step of how the code was written means nothing to a reader.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ".sh", ""}
# Built from parts so that this file does not match itself.
FORBIDDEN = re.compile(
    "|".join(
        [
            r"\bstop ?[0-9]",
            r"\bissue [0-9]",
            "SP" + r"EC\b",
            r"\bpapers? 0{2}[0-9]",
            r"(?<![.\d])\b0{2}[0-4] ?§",
            r"\(0{2}[0-4][ ,§)]",
        ]
    ),
    re.IGNORECASE,
)


def _repository_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout to list the repository's files")
    return [ROOT / name for name in listed if name and (ROOT / name).is_file()]


def _matches(line: str) -> list[str]:
    found = []
    for match in FORBIDDEN.finditer(line):
        text = match.group(0)
        if text.upper().startswith("SP") and text != "SP" + "EC":
            continue  # "spec" as an ordinary word or identifier, not the document's name
        found.append(text)
    return found


def test_no_unresolvable_reference_or_process_word_in_the_repository():
    offenders = []
    for path in _repository_files():
        if path.suffix not in TEXT_SUFFIXES or path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _matches(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "\n".join(offenders[:50])


def test_file_names_carry_no_process_words():
    pattern = re.compile(r"stop[_-]?\d|issue[_-]?\d|session", re.IGNORECASE)
    names = [str(p.relative_to(ROOT)) for p in _repository_files() if pattern.search(p.name)]
    assert not names, names


# Each forbidden example is split so that no line of this file reads as one.
@pytest.mark.parametrize(
    "line",
    [
        "see pa" + "per 002, App. D.3",
        "Pa" + "pers 000/001 say",
        "(0" + "01 §IV-B)",
        "as in SP" + "EC §6",
        "added in st" + "op 21",
        "fixes iss" + "ue 12",
    ],
)
def test_the_check_catches_each_kind(line):
    assert _matches(line)


@pytest.mark.parametrize(
    "line",
    ["Cao et al. 2021, App. D.3", "tol 0.001 §", "inspect.signature", "a spec string"],
)
def test_the_check_spares_ordinary_text(line):
    assert not _matches(line)
