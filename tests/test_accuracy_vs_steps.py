"""benchmarks/accuracy_vs_steps.py: the ε = 10 cells of the CPU suites, averaged over seeds,
and the GPU playbook's runs, as one table and one plot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "accuracy_vs_steps.py"


def _script():
    spec = importlib.util.spec_from_file_location("accuracy_vs_steps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(method: str, steps: int, seed: int, cnn: float | None, eps: float = 10.0) -> dict:
    return {
        "method": method, "target_epsilon": eps, "seed": seed, "steps": steps,
        "privacy": {"epsilon": eps - 0.001 * seed},
        "metrics": {"fd_classifier": 100.0 + seed,
                    "utility": None if cnn is None else {"cnn": cnn, "mlp": cnn, "logreg": cnn}},
        "fit_seconds": 10.0,
    }  # fmt: skip


def test_cells_are_averaged_per_method_and_length_beside_the_gpu_runs(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"cells": [
        _cell("dp_sinkhorn", 300, 0, 0.2), _cell("dp_sinkhorn", 300, 1, 0.4),
        _cell("dp_sinkhorn", 300, 0, 0.9, eps=1.0),  # another ε: left out
        _cell("entropic_wgan", 150, 0, None),  # not a method of the plot
    ]}))  # fmt: skip
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({"cells": [
        _cell("dp_sinkhorn_1000", 1000, 0, 0.5), _cell("dpswflow_r_2240", 2240, 0, None),
    ]}))  # fmt: skip
    gpu = REPO / "docs" / "results" / "gpu_playbook_h100" / "summary.json"
    out = tmp_path / "out"
    assert (
        _script().main(["--cpu", str(grid), str(steps), "--gpu", str(gpu), "--out", str(out)]) == 0
    )
    table = (out / "accuracy_vs_steps.md").read_text()
    # σ, ms/step and evaluation time: the GPU runs have them, the averaged cells do not
    assert (
        "| 2 CPU cores | dp_sinkhorn | 300 | 2 | — | 10 | 100.5 | 0.3 | 0.3 | 0.3 | — | 10 | — |"
        in table
    )
    assert "| 2 CPU cores | dp_sinkhorn | 1,000 | 1 |" in table
    assert (
        "| 2 CPU cores | dpswflow_r | 2,240 | 1 | — | 10 | 100 | — | — | — | — | 10 | — |" in table
    )
    assert "entropic_wgan" not in table and "NVIDIA H100" in table
    assert (out / "accuracy_vs_steps.png").stat().st_size > 10_000
