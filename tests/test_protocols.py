"""The generation protocol (every method) and the data protocols (every datamodule): one way to
sample, one name for the held-out split, and errors that name what is missing."""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch

import lightning_dpot.methods as methods
from lightning_dpot.data import (
    CentralDPDataModule,
    Digits,
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
    PublicSplitDataModule,
)
from lightning_dpot.data.protocols import (
    CentralPrivateData,
    HeldOutData,
    LatentPrivateData,
    LocalDPRelease,
    PublicData,
    held_out_split,
    missing_members,
    require_data,
)
from lightning_dpot.generative import Generative, NotConditionalError, draw
from lightning_dpot.nn import ConditionalDCGANGenerator, DCGANGenerator, MLPGenerator


def _method_classes() -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(methods, inspect.isclass)
        if issubclass(cls, L.LightningModule)
    ]


def test_every_method_implements_the_generation_protocol():
    classes = _method_classes()
    expected = {"EntropicWGAN", "NoisyWGAN", "DPSinkhorn", "DPMERF", "DPSWFlow", "DPSWFlowR"}
    assert expected | {"DPSWGen"} <= {cls.__name__ for cls in classes}
    for cls in classes:
        assert Generative in cls.__mro__, cls.__name__
        params = inspect.signature(cls.sample).parameters
        assert params["generator"].kind is inspect.Parameter.KEYWORD_ONLY, cls.__name__


def _dp_sinkhorn(conditional: bool):
    generator = (
        ConditionalDCGANGenerator(
            10, latent_dim=4, embed_dim=2, image_size=8, hidden_channels=(8, 8, 8)
        )
        if conditional
        else DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4)
    )
    return methods.DPSinkhorn(generator, noise_multiplier=None, conditional=conditional)


@pytest.mark.parametrize(
    "build",
    [
        lambda: methods.EntropicWGAN(MLPGenerator(latent_dim=2, output_shape=[2], hidden=[8])),
        lambda: methods.DPSWGen(
            MLPGenerator(latent_dim=3, output_shape=[2], hidden=[8]), noise_scale=1.0
        ),
        lambda: _dp_sinkhorn(conditional=True),
    ],
    ids=["EntropicWGAN", "DPSWGen", "DPSinkhorn"],
)
def test_seeded_samples_repeat_leave_the_global_rng_and_the_mode_alone(build):
    torch.manual_seed(0)
    model = build()
    model.train()
    assert isinstance(model, Generative) and model.max_samples is None
    state = torch.get_rng_state()
    first = model.sample(7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), state) and model.training
    assert torch.equal(model.sample(7, generator=torch.Generator().manual_seed(1)), first)
    assert not torch.equal(model.sample(7, generator=torch.Generator().manual_seed(2)), first)
    assert model.sample(7).shape == first.shape  # unseeded: the global RNG


def test_labelled_sampling_only_for_conditional_methods():
    conditional = _dp_sinkhorn(conditional=True)
    x, y = draw(conditional, 40, labelled=True, generator=torch.Generator().manual_seed(0))
    assert x.shape == (40, 1, 8, 8) and y.shape == (40,) and int(y.max()) < 10
    again = conditional.sample_labeled(40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[1], y) and torch.equal(again[0], x)

    unconditional = _dp_sinkhorn(conditional=False)
    assert not unconditional.conditional
    with pytest.raises(NotConditionalError, match="unconditional"):
        unconditional.sample_labeled(3)
    x, y = draw(unconditional, 3, labelled=True)
    assert x.shape == (3, 1, 8, 8) and y is None


def test_a_particle_flow_returns_at_most_its_particles(tmp_path):
    model = methods.DPSWFlowR(num_particles=16, num_directions=8, noise_scale=1.0)
    with pytest.raises(ValueError, match="holds no particles"):
        draw(model, 4)
    data = PrivateLatentDataModule(
        GaussianMixture2D(n=300, n_test=50), normalize="ball", batch_size=60, steps_per_epoch=10
    )
    L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu",
    ).fit(model, data)  # fmt: skip
    assert model.max_samples == 16
    with pytest.warns(UserWarning, match="holds 16 particles"):
        x, _ = draw(model, 20)
    torch.testing.assert_close(x, model.sample(16))
    with pytest.raises(ValueError, match="exceeds the 16 particles"):
        model.sample(17)


def test_datamodules_implement_their_protocol_under_one_held_out_name(tmp_path):
    local = PrivatizedDataModule(
        HalfCircle(n=200, n_test=30), noise_scale=0.5, delta=1e-4, cache_dir=str(tmp_path)
    )
    central = CentralDPDataModule(Digits(), expected_batch_size=50)
    latent = PrivateLatentDataModule(GaussianMixture2D(n=100, n_test=20), batch_size=10)
    public = PublicSplitDataModule(Digits())
    cases = [
        (local, LocalDPRelease),
        (central, CentralPrivateData),
        (latent, LatentPrivateData),
        (public, PublicData),
    ]
    for datamodule, protocol in cases:
        assert missing_members(datamodule, protocol) == [], type(datamodule).__name__
        assert require_data(datamodule, protocol, "test") is datamodule
        assert datamodule.test_records is None  # declared before setup, loaded by it
        x, _ = held_out_split(datamodule)  # from the source until setup
        datamodule.setup("fit")
        assert torch.equal(datamodule.test_records, x)
    digits_test = Digits().load()
    for datamodule in (central, public):
        assert torch.equal(held_out_split(datamodule)[1], digits_test.test_labels)


def test_a_wrong_datamodule_names_the_protocol_and_the_missing_members():
    central = CentralDPDataModule(Digits(), expected_batch_size=50)
    with pytest.raises(TypeError) as err:
        require_data(central, LocalDPRelease, "EntropicWGAN")
    message = str(err.value)
    assert "EntropicWGAN" in message and "LocalDPRelease" in message
    assert "write_release" in message and "release" in message
    with pytest.raises(TypeError, match="HeldOutData"):
        held_out_split(object())
    assert HeldOutData in LocalDPRelease.__mro__
