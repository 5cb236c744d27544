"""The README's Python example runs as written (a fresh process, a temporary directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_example() -> str:
    section = README.read_text().split("## In Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_in_python_example_fits_reports_and_samples(tmp_path):
    code = _python_example()
    assert len(code.strip().splitlines()) <= 10
    check = "\nassert samples.shape == (1000, 2)\n"
    env = {**os.environ, "DPOT_LEDGER_DIR": str(tmp_path / "ledger")}
    out = subprocess.run(
        [sys.executable, "-c", code + check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "2.5"


def test_import_is_lazy_and_lists_the_public_classes():
    code = (
        "import sys, lightning_dpot as d; assert 'torch' not in sys.modules; "
        "names = {'EntropicWGAN', 'PrivatizedDataModule', 'PrivacyAccountantCallback'}; "
        "assert names <= set(dir(d)); "
        "d.EntropicWGAN; assert 'lightning_dpot.methods' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
