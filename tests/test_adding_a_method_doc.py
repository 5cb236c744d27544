"""docs/adding_a_method.md: each example (a local-DP and a central-DP method, each with a short
run) runs as written in a fresh process, in a temporary folder, and prints its guarantee."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding_a_method.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_a_local_and_a_central_example():
    assert len(EXAMPLES) == 2
    assert "GeneratorModule" in EXAMPLES[0] and "ReleasedStatisticModule" in EXAMPLES[1]


@pytest.mark.parametrize(
    ("index", "printed"), [(0, "local DP: ε = 5.0 per record"), (1, "central DP: ε = ")]
)
def test_an_example_runs_as_written(index, printed, tmp_path):
    env = {"DPOT_LEDGER_DIR": str(tmp_path / "ledger"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", EXAMPLES[index]], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert printed in result.stdout
    if index == 1:
        epsilon = float(result.stdout.split("ε = ")[1].split()[0])
        assert 0.9 < epsilon <= 1.0 and "after 1 release" in result.stdout
