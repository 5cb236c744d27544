"""The standalone samplers and their export, without a run: each kind's saved file draws what the
uncompiled sampler draws for the same seed, and each generator method's sampler what the method
draws; a network TorchScript cannot compile is traced, and one whose trace does not reproduce it
is refused with no file left behind."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from lightning_dpot.export import read_embedded_report, save_sampler, standalone_sampler
from lightning_dpot.methods import DPSinkhorn, DPSWGen, EntropicWGAN, NoisyWGAN
from lightning_dpot.nn import ConditionalDCGANGenerator, ConvAutoencoder32, MLPGenerator
from lightning_dpot.nn.samplers import (
    ConditionalGeneratorSampler,
    GeneratorSampler,
    LatentDecoder,
    ParticleSampler,
    Reshape,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit:FutureWarning")


def _samplers() -> dict[str, object]:
    torch.manual_seed(0)
    conditional = ConditionalDCGANGenerator(
        10, latent_dim=4, image_size=8, hidden_channels=(4,) * 3
    )
    return {
        "uniform": GeneratorSampler(MLPGenerator(2, [2], [8]), 2, "uniform", -1.0, 1.0),
        "normal": GeneratorSampler(MLPGenerator(3, [1, 2, 2], [8]), 3, "normal"),
        "conditional": ConditionalGeneratorSampler(conditional, 10, 4, "uniform", 0.0, 1.0),
        "points": ParticleSampler(torch.randn(10, 2), Reshape([2])),
        "decoded": ParticleSampler(torch.randn(6, 8), LatentDecoder(ConvAutoencoder32())),
    }


@pytest.mark.parametrize("kind", list(_samplers()))
def test_the_saved_file_draws_what_the_sampler_draws(kind, tmp_path):
    sampler = _samplers()[kind]
    expected = sampler.sample(5, seed=7)
    embedded = save_sampler(
        sampler, tmp_path / "g.pt", privacy={"epsilon": 1.0}, config=None, method="M"
    )
    loaded = torch.jit.load(str(tmp_path / "g.pt"))
    torch.testing.assert_close(loaded.sample(5, seed=7), expected)
    assert not torch.equal(loaded.sample(5, seed=8), expected)  # the seed matters
    assert loaded.sample(3).shape == (3, *embedded["sampler"]["record_shape"])
    assert read_embedded_report(tmp_path / "g.pt") == embedded
    assert embedded["privacy"] == {"epsilon": 1.0} and embedded["method"] == "M"
    if kind == "conditional":
        x, y = loaded.sample_labeled(5, seed=7)
        torch.testing.assert_close(x, expected)
        assert y.dtype == torch.int64 and 0 <= int(y.min()) and int(y.max()) < 10
    if kind == "decoded":  # the public decoder travels with the particles
        assert embedded["sampler"]["record_shape"] == [1, 32, 32]
        assert embedded["sampler"]["compiled_by"] == "torch.jit.trace"


def _methods() -> dict[str, object]:
    torch.manual_seed(0)
    conditional = ConditionalDCGANGenerator(10, latent_dim=4, image_size=8, hidden_channels=[4] * 3)
    return {
        "EntropicWGAN": EntropicWGAN(MLPGenerator(2, [2], [8]), latent_range=(-2.0, 3.0)),
        "NoisyWGAN": NoisyWGAN(MLPGenerator(2, [2], [8])),
        "DPSWGen": DPSWGen(MLPGenerator(3, [2], [8]), num_directions=4, noise_scale=1.0),
        "DPSinkhorn": DPSinkhorn(conditional, noise_multiplier=1.0, delta=1e-5),
    }


@pytest.mark.parametrize("name", list(_methods()))
def test_each_generator_methods_sampler_draws_what_the_method_draws(name, tmp_path):
    model = _methods()[name]
    save_sampler(
        standalone_sampler(model), tmp_path / "g.pt", privacy=None, config=None, method=name
    )
    loaded = torch.jit.load(str(tmp_path / "g.pt"))
    seeded = torch.Generator().manual_seed(5)
    if name == "DPSinkhorn":  # labels, then latents, from one generator
        x, y = loaded.sample_labeled(7, seed=5)
        expected_x, expected_y = model.sample_labeled(7, generator=seeded)
        assert torch.equal(y, expected_y)
        torch.testing.assert_close(x, expected_x)
    else:
        torch.testing.assert_close(loaded.sample(7, seed=5), model.sample(7, generator=seeded))
    assert loaded.latent == ("normal" if name == "DPSWGen" else "uniform")


def test_a_uniform_latent_lies_in_its_range_and_a_bad_count_is_refused(tmp_path):
    sampler = _samplers()["uniform"]
    z = sampler.draw_latent(1000, torch.Generator().manual_seed(0))
    assert -1.0 <= float(z.min()) and float(z.max()) <= 1.0 and float(z.min()) < -0.9
    save_sampler(sampler, tmp_path / "g.pt", privacy=None, config=None, method="M")
    loaded = torch.jit.load(str(tmp_path / "g.pt"))
    with pytest.raises(torch.jit.Error, match="n must be an integer >= 1, got 0"):
        loaded.sample(0)
    with pytest.raises(ValueError, match="latent must be one of"):
        GeneratorSampler(MLPGenerator(2, [2], [8]), 2, "laplace")


class _ParityFlip(nn.Module):
    """A network whose output's sign depends on the parity of the batch size, read through
    numpy: TorchScript cannot compile it, and a trace keeps the branch of its example batch."""

    latent_dim = 2

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def forward(self, z: Tensor) -> Tensor:
        odd = int(np.prod(z.shape[:1])) % 2
        return self.linear(z) * (-1.0 if odd else 1.0)


def test_a_network_its_trace_does_not_reproduce_is_refused_and_no_file_is_left(tmp_path):
    # traced on two rows (even), checked on three (odd)
    sampler = GeneratorSampler(_ParityFlip(), 2, "uniform", -1.0, 1.0)
    with pytest.raises(ValueError, match="does not reproduce M's draws"):
        save_sampler(sampler, tmp_path / "g.pt", privacy=None, config=None, method="M")
    assert list(tmp_path.iterdir()) == []
