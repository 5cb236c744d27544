"""One learning rate per optimizer a run uses: every method builds its optimizer from its own
``lr`` (``dpot fit`` takes no ``optimizer:`` or ``lr_scheduler:`` section), so a composed config
holds at most one ``lr``, the method's, and the optimizer the method builds uses it. The Fig. 1–2
manifold experiments train with RMSprop at the paper's 10⁻⁴ (Reshetova et al. 2024, §IV-A)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from jsonargparse import ArgumentParser

from lightning_dpot.cli import main
from lightning_dpot.commands.checkpoint import instantiate
from lightning_dpot.config import compose_config

REPO = Path(__file__).resolve().parents[1]
#: Every ``dpot fit`` config (not the fragments, nor the compare suites and their data files).
CONFIGS = sorted(
    path
    for path in (REPO / "configs").rglob("*.yaml")
    if "_shared" not in path.parts and "model" in compose_config(path)
)


def _lr_keys(node: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of every key named ``lr`` in a nested config."""
    if isinstance(node, dict):
        here = [(*path, "lr")] if "lr" in node else []
        return here + [k for key, value in node.items() for k in _lr_keys(value, (*path, key))]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _lr_keys(value, (*path, str(i)))]
    return []


def _module(config: dict) -> L.LightningModule:
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningModule, "model")
    return instantiate(parser, parser.parse_object({"model": config["model"]})).model


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(REPO)) for p in CONFIGS])
def test_a_config_holds_one_learning_rate_and_the_method_uses_it(path: Path):
    config = compose_config(path)
    assert "optimizer" not in config and "lr_scheduler" not in config
    assert _lr_keys(config) in ([], [("model", "init_args", "lr")])
    module = _module(config)
    lr = module.hparams.get("lr")
    if lr is None:  # a particle flow: no learning rate at all
        assert not _lr_keys(config)
        return
    assert lr == config["model"]["init_args"].get("lr", lr)
    assert {group["lr"] for group in module.configure_optimizers().param_groups} == {lr}


def test_the_fig1_experiment_trains_with_rmsprop_at_the_papers_learning_rate(capsys):
    path = REPO / "configs/entropic_wgan/fig1_half_circle_laplace_entropic.yaml"
    optimizer = _module(compose_config(path)).configure_optimizers()
    assert type(optimizer) is torch.optim.RMSprop and optimizer.param_groups[0]["lr"] == 1e-4
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(path), "--print_config"])
    printed = capsys.readouterr().out
    assert printed.count(" lr: ") == 1 and "lr: 0.0001" in printed


def test_an_optimizer_section_is_refused_in_one_line_naming_the_method_arguments(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"__base__: {REPO / 'configs/quickstart.yaml'}\n"
        "optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.1}}\n"
    )
    for args in (["--config", str(config)], ["--optimizer", "torch.optim.SGD"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", *args])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("dpot fit: error: optimizer: dpot fit takes no optimizer section")
        assert "model.init_args.lr" in err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"optimizer": "sgd"}, "optimizer must be 'adam' or 'rmsprop', got 'sgd'"),
        ({"optimizer": "rmsprop", "betas": (0.5, 0.9)}, "betas are Adam's"),
        ({"lr": 0.0}, "lr must be a finite number > 0, got 0.0"),
    ],
)
def test_bad_optimizer_arguments_are_refused_naming_them(arguments, message):
    from lightning_dpot.methods import EntropicWGAN
    from lightning_dpot.nn import MLPGenerator

    with pytest.raises(ValueError, match=message):
        EntropicWGAN(MLPGenerator(2, (2,), (8,)), **arguments)


def test_adam_takes_its_betas_and_rmsprop_torch_defaults():
    from lightning_dpot.methods import NoisyWGAN
    from lightning_dpot.nn import MLPGenerator

    adam = NoisyWGAN(MLPGenerator(2, (2,), (8,)), lr=1e-3, betas=(0.5, 0.9))
    group = adam.configure_optimizers().param_groups[0]
    assert group["betas"] == (0.5, 0.9) and group["lr"] == 1e-3
    rmsprop = NoisyWGAN(MLPGenerator(2, (2,), (8,)), optimizer="rmsprop").configure_optimizers()
    assert type(rmsprop) is torch.optim.RMSprop and rmsprop.param_groups[0]["alpha"] == 0.99
