"""The end-of-run summary of `dpot fit` states the run's ε and, for local and central runs
alike, the privacy ledger's total over every release of the same records (and how many of them
were used without noise), as report.json holds them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml
from tiny_runs import CONDITIONAL_GENERATOR

from lightning_dpot.cli import main
from lightning_dpot.commands.report import summary
from lightning_dpot.data import CentralDPDataModule, Digits

QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False}
DP_MERF_RUN = {  # Harder et al. 2021: one release, central DP
    "seed_everything": 0,
    "trainer": {"max_steps": 1, "enable_checkpointing": False, **QUIET},
    "model": {
        "class_path": "lightning_dpot.methods.DPMERF",
        "init_args": {
            "generator": copy.deepcopy(CONDITIONAL_GENERATOR),
            "target_epsilon": 0.5,
            "delta": 1.0e-5,
            "num_frequencies": 20,
            "length_scale": 6.0,
            "generated_batch_size": 10,
        },
    },
    "data": {
        "class_path": "lightning_dpot.data.CentralDPDataModule",
        "init_args": {
            "source": {"class_path": "lightning_dpot.data.Digits"},
            "expected_batch_size": 10,
            "steps_per_epoch": 2,
        },
    },
}


def test_a_central_runs_summary_states_the_ledger_total_beside_its_own_epsilon(tmp_path, capsys):
    earlier = CentralDPDataModule(Digits(), sample_rate=0.5)  # this test's ledger (conftest)
    earlier.run_ledger.settle(earlier.run_ledger.open(10.0, 1e-5, {}), 10.0, 1e-5)
    config = {
        **DP_MERF_RUN,
        "trainer": {**DP_MERF_RUN["trainer"], "default_root_dir": str(tmp_path)},
    }
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(tmp_path / "fit.yaml")])
    printed = capsys.readouterr().err
    privacy = json.loads((tmp_path / "report.json").read_text())["privacy"]
    total = privacy["ledger"]["all_releases_of_these_records"]
    assert total["releases"] == 2 and total["epsilon"] == privacy["epsilon"] + 10.0
    (line,) = [line for line in printed.splitlines() if line.startswith("privacy: central DP")]
    assert line.startswith(f"privacy: central DP, ε={privacy['epsilon']:.4g}, δ=1e-05")
    assert line.endswith(f"; all releases of these records: ε={total['epsilon']:.4g}")
    assert f"privacy ledger: {privacy['ledger']['path']}" in printed


def test_the_summary_says_how_many_records_were_used_without_noise(tmp_path):
    ledger = {
        "path": "/somewhere/ledger/ledger.jsonl",
        "all_releases_of_these_records": {
            "releases": 2, "epsilon": 10.25, "delta": 2e-5, "records_used_without_noise": 719,
        },
    }  # fmt: skip
    privacy = {
        "epsilon": 0.135, "delta": 1e-5, "adjacency": "replace_one", "accountant": "rdp",
        "releases": 1, "ledger": ledger,
    }  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps({"privacy": privacy}))
    lines = summary(Path(tmp_path)).splitlines()
    assert lines[1] == (
        "privacy: central DP, ε=0.135, δ=1e-05, replace_one, rdp accountant, 1 releases; all "
        "releases of these records: ε=10.25, and 719 of them used without noise (no ε bounds "
        "theirs)"
    )
