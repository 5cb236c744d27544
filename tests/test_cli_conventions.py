"""The ``dpot`` command's conventions: ``--version``; ``dpot fit --help`` lists the methods and is
read from a cache once written; ``--model.help NAME`` takes a short name; the other commands'
help imports no torch; a module file in the current folder is a ``--model``; bad files and another
method's checkpoint are refused in one line; a finished run leaves no lock file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_dpot.cli import main

REPO = Path(__file__).resolve().parents[1]


def _one_line_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(argv)
    # Lightning's own start-up lines may come first; the error is one line, the last
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"dpot {argv[0]}: error: ") and "Traceback" not in lines
    return lines[-1]


def test_version_and_the_shipped_fit_help_is_the_live_one(tmp_path, monkeypatch, capsys):
    import lightning_dpot.cli as cli

    main(["--version"])
    assert capsys.readouterr().out.startswith("dpot (lightning_dpot) 0.")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # A fresh process, as `dpot` runs: the help lists the Callback and LightningModule
    # subclasses imported so far, and this one has imported the tests' own.
    live = subprocess.run(
        [sys.executable, "-c", "import lightning_dpot.cli as c; print(c.live_fit_help(), end='')"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "100"},
    ).stdout  # fmt: skip
    assert "methods (--model NAME" in live and "DPMERF" in live and "EntropicWGAN" in live
    main(["fit", "--help"])
    printed = capsys.readouterr().out
    header = (REPO / "lightning_dpot" / "resources" / "fit_help.txt").read_text().split("\n")[0]
    if header == f"# {cli._versions()}":  # the shipped text is printed: it must be current
        assert printed == live, "regenerate it: see lightning_dpot.cli.write_shipped_fit_help"
        assert not (tmp_path / "lightning_dpot").exists()
    else:  # other dependency versions: the live text, cached
        assert list((tmp_path / "lightning_dpot").glob("fit-help-*.txt"))


def test_without_a_matching_shipped_text_the_fit_help_is_cached(tmp_path, monkeypatch, capsys):
    import lightning_dpot.cli as cli

    monkeypatch.setattr(cli, "_versions", lambda: "lightning 0 jsonargparse 0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    main(["fit", "--help"])
    first = capsys.readouterr().out
    (cached,) = (tmp_path / "lightning_dpot").glob("fit-help-*.txt")
    cached.write_text(first + "(from the cache)\n")
    main(["fit", "-h"])
    assert capsys.readouterr().out.endswith("(from the cache)\n")


def test_model_help_takes_the_short_name_of_a_method(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model.help", "DPMERF"])
    assert exit_.value.code == 0 and "--model.length_scale" in capsys.readouterr().out


def test_the_commands_help_imports_no_torch():
    code = (
        "import sys; from lightning_dpot.cli import main\n"
        "for command in ('evaluate', 'sample', 'privatize', 'export', 'report', 'compare'):\n"
        "    try: main([command, '--help'])\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_a_module_in_the_current_folder_is_a_model_and_an_unknown_class_one_line(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPOT_LEDGER_DIR", str(tmp_path / "ledger"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "mymethods.py").write_text(
        "from lightning_dpot.methods import EntropicWGAN\n\n\n"
        "class MyWGAN(EntropicWGAN):\n    pass\n"
    )
    config = REPO / "configs" / "quickstart.yaml"
    main(["fit", "--config", str(config), "--model", "mymethods.MyWGAN", "--trainer.max_steps=1",
          "--trainer.logger=false", "--data.init_args.source.init_args.n=200",
          "--data.init_args.batch_size=100", "--model.init_args.generated_batch_size=100",
          f"--trainer.default_root_dir={tmp_path / 'out'}",
          f"--data.init_args.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    assert list((tmp_path / "out").rglob("*.ckpt"))
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--model", "mymethods.Nope"])
    assert "module 'mymethods' has no attribute 'Nope'" in line
    # the run's journal and the release cache keep no lock file
    assert not list(tmp_path.rglob("*.lock"))


def test_an_empty_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text("")
    assert "config='empty.yaml' is empty" in _one_line_error(
        capsys, ["fit", "--config", "empty.yaml"]
    )
    (tmp_path / "empty.pt").write_bytes(b"")
    source = "--data.init_args.source"
    line = _one_line_error(
        capsys,
        ["fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
         f"{source}=lightning_dpot.data.TensorFile", f"{source}.init_args.path=empty.pt",
         f"{source}.init_args.low=0", f"{source}.init_args.high=1"],
    )  # fmt: skip
    assert "path='empty.pt' is an empty file" in line


def test_a_checkpoint_of_another_method_is_refused_naming_it():
    from lightning_dpot.methods import DPMERF, DPSinkhorn
    from lightning_dpot.nn import ConditionalDCGANGenerator

    generator = ConditionalDCGANGenerator(10, image_size=8, hidden_channels=(8, 8, 8))
    checkpoint: dict = {}
    DPMERF(generator, noise_scale=1.0, num_frequencies=10).on_save_checkpoint(checkpoint)
    other = DPSinkhorn(ConditionalDCGANGenerator(10, image_size=8, hidden_channels=(8, 8, 8)))
    with pytest.raises(ValueError, match="written by DPMERF, not DPSinkhorn"):
        other.on_load_checkpoint(checkpoint)


def test_a_run_refused_after_its_logger_started_leaves_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPOT_LEDGER_DIR", str(tmp_path / "ledger"))
    (tmp_path / "t.csv").write_text("id,x\n1,0.5\n")
    (tmp_path / "schema.yaml").write_text("columns:\n  x: {low: 0, high: 1}\n")
    config = REPO / "configs" / "your_data" / "table_dp_merf.yaml"
    source = "--data.init_args.source.init_args"
    line = _one_line_error(
        capsys,
        ["fit", "--config", str(config), f"{source}.path=t.csv", f"{source}.schema=schema.yaml"],
    )
    assert "column 'id' of 't.csv' has no declared bounds" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["schema.yaml", "t.csv"]


@pytest.mark.parametrize(
    ("argv", "new"),
    [
        (["sample", "--ckpt", "x.ckpt", "--num_samples", "2"], "--ckpt_path"),
        (["sample", "--ckpt_path", "x.ckpt", "--num", "2"], "--num_samples"),
        (["evaluate", "--ckpt", "x.ckpt"], "--ckpt_path"),
        (["evaluate", "--ckpt_path", "x.ckpt", "--num-samples", "9"], "--num_samples"),
        (["export", "run", "--ckpt", "x.ckpt"], "--ckpt_path"),
        (["report", "--ckpt", "x.ckpt"], "--ckpt_path"),
        (["account", "sgm", "--sample-rate", "0.1", "--delta", "1e-5"], "--sample_rate"),
    ],
)
def test_every_command_spells_flags_as_lightning_and_names_the_new_flag(argv, new, capsys):
    old = next(a for a in argv[1:] if a.startswith("--") and a not in (new,) and "_" not in a)
    assert _one_line_error(capsys, argv).endswith(
        f"error: {old} was renamed to {new}  (DPOT_DEBUG=1 for the traceback)"
    )
