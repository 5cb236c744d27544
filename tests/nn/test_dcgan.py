"""DCGAN generators of Reshetova et al. 2024 (unconditional) and Cao et al. 2021
(class-conditional)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dpot.nn.dcgan import (
    ConditionalDCGANGenerator,
    DCGANGenerator,
    LatentProjection,
    dcgan_base_size,
)


def _latent(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    """z ~ Unif[0, 1]^dim, the latent distribution of Reshetova et al. 2024 and
    Cao et al. 2021."""
    return torch.rand(n, dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("image_size", "channels"), [(28, 1), (32, 1), (64, 3)])
@pytest.mark.parametrize("batch_norm", [True, False])
def test_dcgan_output_shape_and_range_for_each_image_size(image_size, channels, batch_norm):
    gen = DCGANGenerator(
        image_size=image_size, channels=channels, hidden_channels=16, batch_norm=batch_norm
    )
    out = gen(_latent(3, 100))
    assert out.shape == (3, channels, image_size, image_size)
    assert gen.output_shape == (channels, image_size, image_size)
    assert out.min() >= -1.0 and out.max() <= 1.0
    assert gen.latent_dim == 100


def test_dcgan_28_defaults_follow_the_usual_mnist_dcgan():
    gen = DCGANGenerator()
    convs = [m for m in gen.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size[0]) for c in convs] == [
        (100, 256, 7),
        (256, 128, 4),
        (128, 1, 4),
    ]
    assert isinstance(list(gen.net)[-1], nn.Tanh)
    assert gen.paper_latent_range == (0.0, 1.0)


def test_dcgan_64_defaults_are_the_original_dcgan_widths():
    gen = DCGANGenerator(image_size=64, channels=3)
    widths = [m.out_channels for m in gen.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert widths == [1024, 512, 256, 128, 3]


def test_batch_norm_switch_removes_every_norm_layer():
    with_bn = DCGANGenerator(hidden_channels=8)
    without = DCGANGenerator(hidden_channels=8, batch_norm=False)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in with_bn.modules()) == 2
    assert not any(isinstance(m, nn.BatchNorm2d) for m in without.modules())
    # without batch norm the hidden convolutions carry their own bias
    assert all(m.bias is not None for m in without.modules() if isinstance(m, nn.ConvTranspose2d))


def test_without_batch_norm_a_sample_does_not_depend_on_its_batch():
    gen = DCGANGenerator(hidden_channels=8, batch_norm=False).train()
    z = _latent(4, 100)
    assert torch.allclose(gen(z)[:1], gen(z[:1]), atol=1e-6)


def test_dcgan_accepts_4d_latents_and_backpropagates():
    gen = DCGANGenerator(latent_dim=10, hidden_channels=8)
    z = _latent(2, 10)
    out = gen(z.reshape(2, 10, 1, 1))
    assert torch.allclose(out, gen(z))
    out.sum().backward()
    assert all(p.grad is not None for p in gen.parameters())


@pytest.mark.parametrize(
    ("image_size", "expected"), [(28, (7, 2)), (32, (4, 3)), (64, (4, 4)), (8, (4, 1))]
)
def test_base_size_decomposition(image_size, expected):
    assert dcgan_base_size(image_size) == expected


@pytest.mark.parametrize("image_size", [27, 6, 0])
def test_unsupported_image_size_is_refused_with_the_range(image_size):
    with pytest.raises(ValueError, match="image_size must"):
        DCGANGenerator(image_size=image_size)


def test_conditional_generator_matches_cao_2021_app_d3():
    gen = ConditionalDCGANGenerator(num_classes=10)
    convs = [m for m in gen.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [
        (16, 256),
        (256, 128),
        (128, 64),
        (64, 1),
    ]
    assert [c.kernel_size[0] for c in convs] == [7, 4, 4, 3]
    assert [c.stride[0] for c in convs] == [1, 2, 2, 1]
    assert [c.padding[0] for c in convs] == [0, 1, 1, 1]
    assert gen.latent_dim == 12 and gen.embedding.embedding_dim == 4


def test_conditional_generator_shape_range_and_label_dependence():
    gen = ConditionalDCGANGenerator(num_classes=10, hidden_channels=(32, 16, 8)).eval()
    z = _latent(5, 12)
    labels = torch.tensor([0, 1, 2, 3, 4])
    out = gen(z, labels)
    assert out.shape == (5, 1, 28, 28) and out.min() >= -1.0 and out.max() <= 1.0
    other = gen(z, (labels + 5) % 10)
    assert not torch.allclose(out, other)  # same z, other labels → other images
    assert torch.allclose(gen(z, labels), out)  # deterministic in eval mode
    gen(z, labels).sum().backward()
    assert gen.embedding.weight.grad is not None and gen.embedding.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("batch_norm", [True, False])
def test_conditional_generator_32_by_32_rgb(batch_norm):
    gen = ConditionalDCGANGenerator(
        num_classes=2, channels=3, image_size=32, hidden_channels=(16, 8, 8), batch_norm=batch_norm
    )
    out = gen(_latent(2, 12), torch.tensor([0, 1]))
    assert out.shape == (2, 3, 32, 32)
    assert any(isinstance(m, nn.BatchNorm2d) for m in gen.modules()) == batch_norm


def test_conditional_generator_refuses_mismatched_labels_and_bad_arguments():
    gen = ConditionalDCGANGenerator(num_classes=10, hidden_channels=(8, 8, 8))
    with pytest.raises(ValueError, match=r"labels must have shape \(3,\)"):
        gen(_latent(3, 12), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="num_classes must be an integer >= 1"):
        ConditionalDCGANGenerator(num_classes=0)
    with pytest.raises(ValueError, match="image_size must be a multiple of 4"):
        ConditionalDCGANGenerator(num_classes=10, image_size=30)
    with pytest.raises(ValueError, match="hidden_channels must list 3 widths"):
        ConditionalDCGANGenerator(num_classes=10, hidden_channels=(8, 8))  # type: ignore[arg-type]


@pytest.mark.parametrize("bias", [True, False])
def test_latent_projection_is_the_transposed_convolution(bias):
    """Same values and gradients as ``nn.ConvTranspose2d`` from a 1 × 1 input, the same state-dict
    keys; other inputs go through the convolution."""
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(16, 8, 7, 1, 0, bias=bias)
    projection = LatentProjection(16, 8, 7, 1, 0, bias=bias)
    projection.load_state_dict(conv.state_dict())
    for shape in ((5, 16, 1, 1), (5, 16, 3, 2)):
        z = torch.randn(shape, requires_grad=True)
        expected, out = conv(z), projection(z)
        torch.testing.assert_close(out, expected)
        grads = torch.autograd.grad(out.square().sum(), [z, *projection.parameters()])
        reference = torch.autograd.grad(expected.square().sum(), [z, *conv.parameters()])
        for got, want in zip(grads, reference, strict=True):
            torch.testing.assert_close(got, want)
    assert isinstance(ConditionalDCGANGenerator(10).net[0], LatentProjection)
    assert isinstance(DCGANGenerator().net[0], LatentProjection)
