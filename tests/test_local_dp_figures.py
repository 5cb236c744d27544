"""benchmarks/local_dp_figures.py: each panel fitted by ``dpot fit``, scored from its checkpoint,
written as a table with its grids, and not fitted again by the same command."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "local_dp_figures.py"


def _script():
    spec = importlib.util.spec_from_file_location("local_dp_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_panels_of_a_figure_are_fitted_scored_and_reused(tmp_path, digit_idx_dir, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [
        "--variant", "cpu_demo", "--figures", "fig14", "--out", str(out),
        "--runs-dir", str(runs), "--data-dir", str(digit_idx_dir), "--num_samples", "32",
        "--set", "trainer.max_steps=2",
        "--set", "data.init_args.source.init_args.limit=300",
        "--set", f"data.init_args.cache_dir={tmp_path / 'cache'}",
        "--set", "data.init_args.batch_size=16",
        "--set", "model.init_args.generated_batch_size=16",
        "--set", "model.init_args.generator.init_args.hidden_channels=8",
    ]  # fmt: skip
    results = _script().main(argv)

    panels = {row["panel"]: row for row in results["panels"]}
    assert set(panels) == {"a", "b"}
    assert panels["a"]["noise_scale"] < panels["b"]["noise_scale"]  # ε = 35 against ε = 25
    assert panels["a"]["epsilon"] == 35.0 and panels["b"]["epsilon"] == 25.0
    for panel, row in panels.items():
        assert row["steps"] == 2
        assert row["config"].endswith("_cpu_demo.yaml")
        assert math.isfinite(row["fd_classifier"]) and row["fd_classifier"] > 0
        nearest = row["nearest_heldout"][panel]
        assert nearest["n"] == 32 and nearest["mean_nearest_distance"] > 0
        assert (out / "fig14" / f"{panel}.png").stat().st_size > 0
        assert (out / "fig14" / f"{panel}_privatized.png").stat().st_size > 0
    table = (out / "results.md").read_text()
    assert "| fig14 | (a) entropic 2-WGAN, (35, 1e-4) | 35 | 2 |" in table
    assert "public seed 0" in table and all(row["seed_is_public"] for row in panels.values())
    assert json.loads((out / "results.json").read_text())["settings"]["variant"] == "cpu_demo"

    fitted = sorted(p.name for p in runs.iterdir() if p.is_dir())
    capsys.readouterr()
    _script().main(argv)
    assert "reusing" in capsys.readouterr().out
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == fitted


def test_a_call_for_one_figure_keeps_the_other_figures_of_the_same_settings(tmp_path):
    script = _script()
    path = tmp_path / "results.json"
    options = dict(variant="paper", num_samples=2000, seed=0, release_seed=0, max_minutes=5.0)
    args = argparse.Namespace(**options, set=[], data_dir=None)
    earlier = [{"figure": "fig11", "panel": "b", "x": 1}, {"figure": "fig14", "panel": "a", "x": 1}]
    path.write_text(json.dumps({"settings": script.settings(args), "panels": earlier}))
    rows = script.merged(path, [{"figure": "fig14", "panel": "a", "x": 2}], args)
    assert [(r["figure"], r["panel"], r["x"]) for r in rows] == [
        ("fig11", "b", 1),
        ("fig14", "a", 2),
    ]
    args.max_minutes = 4.0  # other settings: the earlier panels are not mixed in
    assert script.merged(path, [{"figure": "fig14", "panel": "a", "x": 2}], args) == [
        {"figure": "fig14", "panel": "a", "x": 2}
    ]


def test_time_limits_are_written_as_lightning_reads_them():
    script = _script()
    assert script.max_time(5) == "00:00:05:00"
    assert script.max_time(0.5) == "00:00:00:30"
    assert script.max_time(6000) == "04:04:00:00"
