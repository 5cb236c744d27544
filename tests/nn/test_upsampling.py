"""The DP-MERF image generator (Harder et al. 2021's layout): shapes, range, conditioning."""

from __future__ import annotations

import pytest
import torch

from lightning_dpot.nn import ConditionalUpsamplingGenerator


@pytest.mark.parametrize("size", [28, 32])
def test_images_of_the_declared_shape_in_the_data_range(size):
    torch.manual_seed(0)
    generator = ConditionalUpsamplingGenerator(10, image_size=size)
    images = generator(torch.randn(16, 5), torch.arange(16) % 10)
    assert images.shape == (16, 1, size, size) == (16, *generator.output_shape)
    assert images.min() > -1.0 and images.max() < 1.0


def test_the_label_changes_the_image_and_a_wrong_label_shape_is_refused():
    torch.manual_seed(0)
    generator = ConditionalUpsamplingGenerator(10).eval()
    z = torch.randn(1, 5).expand(10, 5)
    images = generator(z, torch.arange(10))
    assert (images[1:] - images[:1]).abs().amax(dim=(1, 2, 3)).min() > 0
    with pytest.raises(ValueError, match=r"labels must have shape \(10,\)"):
        generator(z, torch.arange(9))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"image_size": 30}, "image_size must be a multiple of 4"),
     ({"conv_channels": (8,)}, "conv_channels must list 2 widths"),
     ({"hidden": 0}, "hidden")],
)  # fmt: skip
def test_bad_settings_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConditionalUpsamplingGenerator(10, **kwargs)
