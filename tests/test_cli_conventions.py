"""The ``dpot`` command's conventions: ``--version``; ``dpot fit --help``, ``--model.help NAME``
and ``--data.help NAME`` print the shipped texts, which a fresh process prints too (else a cache
once written); no command's help imports torch; a module file in the current folder is a
``--model``; bad files and another method's checkpoint are refused in one line; a finished run
leaves no lock file."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lightning_dpot.cli import main

REPO = Path(__file__).resolve().parents[1]


def _one_line_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(argv)
    # the error is one line, the last (a warning may come before it)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"dpot {argv[0]}: error: ") and "Traceback" not in lines
    return lines[-1]


def test_version_and_the_shipped_fit_help_is_what_a_fresh_process_prints(
    tmp_path, monkeypatch, capsys
):
    from lightning_dpot.commands import fit_help

    main(["--version"])
    assert capsys.readouterr().out.startswith("dpot (lightning_dpot) 0.")
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # Fresh processes, as `dpot` runs: the parser lists the subclasses imported so far, and
    # this one has imported the tests' own. The whole help, a method's and a data module's.
    asked = [["--help"], ["--model.help", "DPMERF"], ["--data.help", "PrivatizedDataModule"]]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "lightning_dpot.commands.fit_help", *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "100"},
        )
        for args in asked
    ]
    live = [run.communicate()[0] for run in runs]
    assert "methods (--model NAME" in live[0] and "--model.length_scale" in live[1]
    for group, classes in fit_help.SHIPPED_CLASSES.items():  # the shipped names are listed
        assert all(path in live[0] for path in classes.values()), group
    printed = []
    for args in asked:
        main(["fit", *args])
        printed.append(capsys.readouterr().out)
    if fit_help.shipped_texts()["versions"] == fit_help.versions():  # shipped: must be current
        assert printed == live, "regenerate: python -m lightning_dpot.commands.fit_help --write"
        assert not (tmp_path / "lightning_dpot").exists()
    else:  # other dependency versions: the live texts, cached
        assert len(list((tmp_path / "lightning_dpot").glob("fit-help-*.txt"))) == 3


def test_without_a_matching_shipped_text_the_fit_help_is_cached(tmp_path, monkeypatch, capsys):
    from lightning_dpot.commands import fit_help

    monkeypatch.setattr(fit_help, "versions", lambda: "lightning 0 jsonargparse 0 torch 0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    main(["fit", "--help"])
    first = capsys.readouterr().out
    (cached,) = (tmp_path / "lightning_dpot").glob("fit-help-*.txt")
    cached.write_text(first + "(from the cache)\n")
    main(["fit", "-h"])
    assert capsys.readouterr().out.endswith("(from the cache)\n")


def test_a_config_beside_help_and_a_short_class_name_read_the_shipped_text(capsys):
    config = str(REPO / "configs" / "quickstart.yaml")
    main(["fit", "--config", config, "--help"])
    with_config = capsys.readouterr().out
    main(["fit", "--help"])
    assert with_config == capsys.readouterr().out
    main(["fit", "--model.help", "DPMERF"])
    short = capsys.readouterr().out
    main(["fit", "--model.help=lightning_dpot.DPMERF"])
    assert short == capsys.readouterr().out and "--model.length_scale" in short


def test_the_commands_help_imports_no_torch():
    code = (
        "import sys; from lightning_dpot.cli import main\n"
        "for command in ('evaluate', 'sample', 'privatize', 'export', 'report', 'compare'):\n"
        "    try: main([command, '--help'])\n"
        "    except SystemExit: pass\n"
        "from lightning_dpot.commands import fit_help\n"
        "if fit_help.shipped_texts()['versions'] == fit_help.versions():\n"
        "    main(['fit', '--config', 'configs/quickstart.yaml', '--help'])\n"
        "    main(['fit', '--model.help', 'DPSinkhorn'])\n"
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
    main(["fit", "--model.help", "mymethods.MyWGAN"])  # the parser, for a class of one's own
    assert "Help for --model.help=mymethods.MyWGAN" in capsys.readouterr().out
    line = _one_line_error(capsys, ["fit", "--model.help", "mymethods.Nope"])
    assert line.startswith("dpot fit: error: model: module 'mymethods' has no attribute 'Nope'")
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


def test_a_run_refused_after_its_logger_started_leaves_no_folder_and_its_error_alone(
    tmp_path, monkeypatch, capsys
):
    # Lightning's start-up lines ("Seed set to 0", "GPU available: ...") are held until the fit
    # begins: a run refused while its data are read prints no line that reads as a start.
    with _lightning_lines() as streams:
        _refused_then_fitted(tmp_path, monkeypatch, capsys, streams)


@contextmanager
def _lightning_lines() -> Iterator[list[io.StringIO]]:
    """Lightning's two loggers as outside pytest: a stream handler each, at INFO."""
    streams, undo = [], []
    for name in ("lightning.pytorch", "lightning.fabric"):
        log, stream = logging.getLogger(name), io.StringIO()
        handler, level = logging.StreamHandler(stream), log.level
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        streams.append(stream)
        undo.append((log, handler, level))
    try:
        yield streams
    finally:
        for log, handler, level in undo:
            log.removeHandler(handler)
            log.setLevel(level)


def _refused_then_fitted(tmp_path, monkeypatch, capsys, streams) -> None:
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
    assert [s.getvalue() for s in streams] == ["", ""]
    # the same run with the column dropped: the held lines print once the fit begins
    main(["fit", "--config", str(config), f"{source}.path=t.csv", f"{source}.schema=schema.yaml",
          f"{source}.drop=[id]", "--trainer.max_steps=1", "--trainer.logger=false",
          "--model.init_args.generator.init_args.output_shape=[1]"])  # fmt: skip
    assert "Seed set to 0" in streams[1].getvalue()
    assert "GPU available" in streams[0].getvalue()


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
