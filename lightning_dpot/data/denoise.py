"""Wavelet-thresholding denoiser for privatized images (baseline of Reshetova et al. 2024,
Fig. 3, 4, 5).

The baseline denoises the locally privatized images y = x + noise and then trains the unregularized
p-WGAN on the result. Denoising is post-processing of the released data, so it costs no privacy —
**provided its parameters do not depend on the raw data**. Reshetova et al. 2024, §IV-B tuned the
wavelet basis, level and thresholds "to minimize the average distance between the reconstructed and
original image under the particular noise instance": an oracle that reads the raw images, not
available to a real LDP trainer (and a leak if done on private data). Here every parameter is
public:

- **Threshold: VisuShrink** (Donoho & Johnstone 1994, "Ideal spatial adaptation by wavelet
  shrinkage", Biometrika 81(3)), the universal threshold

      t = σ · √(2 · ln n),

  n = H·W the number of pixels of one image channel, σ the noise standard deviation. σ is the
  **known** standard deviation of the privatization noise (a public mechanism parameter: the
  Gaussian mechanism's σ, or √2·b for Laplace(0, b)), *not* the usual data-based estimate
  MAD(finest detail coefficients)/0.6745: estimating it would make the output depend on the data
  through a second channel and would be less accurate, since σ is known exactly.
- **Orthonormal transform.** The default signal extension ``"periodization"`` makes the
  discrete wavelet transform of an orthogonal wavelet (``db4`` by default) exactly orthonormal,
  so i.i.d. noise of std σ in pixels is i.i.d. noise of std σ in every wavelet coefficient and
  the universal threshold applies unchanged at every level. (For Laplace noise the coefficients
  are sums of Laplace variables, close to Gaussian at coarse levels; VisuShrink is then a
  heuristic.)
- The approximation (coarsest low-pass) coefficients are kept, all detail coefficients are
  thresholded (``soft``: sign(c)·max(|c| − t, 0); ``hard``: c·1{|c| > t}; ``garrote``).

Implemented with PyWavelets (``pywt.wavedec2`` / ``pywt.threshold`` / ``pywt.waverec2``),
vectorized over the batch and channel axes.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from lightning_dpot.checks import check_nonnegative, check_positive

ThresholdMode = Literal["soft", "hard", "garrote"]


def universal_threshold(noise_std: float, num_pixels: int) -> float:
    """VisuShrink threshold σ·√(2 ln n) (Donoho & Johnstone 1994) for n = ``num_pixels``."""
    noise_std = check_nonnegative("noise_std", noise_std)
    if isinstance(num_pixels, bool) or int(num_pixels) != num_pixels or num_pixels < 2:
        raise ValueError(f"num_pixels must be an integer >= 2, got {num_pixels!r}")
    return noise_std * math.sqrt(2.0 * math.log(num_pixels))


def wavelet_denoise(
    images: Tensor,
    noise_std: float,
    wavelet: str = "db4",
    level: int | None = None,
    mode: ThresholdMode = "soft",
    *,
    threshold: float | None = None,
    extension: str = "periodization",
    clip: tuple[float, float] | None = None,
) -> Tensor:
    """Denoise images ``(..., H, W)`` by wavelet shrinkage with a public threshold.

    Each H×W slice (every image and channel) is decomposed with
    ``pywt.wavedec2(·, wavelet, mode=extension, level=level)``, its detail coefficients are
    thresholded at t (``mode``), and the image is reconstructed with ``pywt.waverec2``.

    Args:
        images: privatized images, any leading shape, e.g. (B, C, H, W); any float dtype and
            device (computation in float64 on the CPU, the result comes back as given).
        noise_std: the mechanism's known noise standard deviation σ > 0 (Gaussian σ, or √2·b
            for Laplace scale b).
        wavelet: a discrete PyWavelets wavelet name (``pywt.wavelist(kind="discrete")``).
        level: decomposition depth in [1, max level]; ``None`` uses the maximum useful level
            ``pywt.dwt_max_level(min(H, W), wavelet)`` (2 for 28×28 with db4).
        mode: thresholding rule, ``soft`` (default, VisuShrink), ``hard`` or ``garrote``.
        threshold: an explicit threshold t ≥ 0 instead of σ·√(2 ln(H·W)); must itself be
            data-independent for the result to stay post-processing.
        extension: PyWavelets signal-extension mode (see module docstring for the default).
        clip: clamp the output to these public bounds, e.g. the declared (−1, 1).

    Returns:
        Denoised images with the shape, dtype and device of ``images``.
    """
    import pywt  # only here: importing the package (``lightning_dpot.data``) needs no PyWavelets

    if images.ndim < 2:
        raise ValueError(f"images must have shape (..., H, W), got {tuple(images.shape)}")
    noise_std = check_positive("noise_std", noise_std)
    if wavelet not in pywt.wavelist(kind="discrete"):
        raise ValueError(
            f"wavelet must be a discrete PyWavelets wavelet (pywt.wavelist(kind='discrete')), "
            f"got {wavelet!r}"
        )
    if mode not in ("soft", "hard", "garrote"):
        raise ValueError(f"mode must be 'soft', 'hard' or 'garrote', got {mode!r}")
    if extension not in pywt.Modes.modes:
        raise ValueError(f"extension must be one of {pywt.Modes.modes}, got {extension!r}")
    height, width = images.shape[-2:]
    max_level = pywt.dwt_max_level(min(height, width), pywt.Wavelet(wavelet).dec_len)
    if level is None:
        level = max(max_level, 1)
    elif isinstance(level, bool) or int(level) != level or not 1 <= level <= max(max_level, 1):
        raise ValueError(
            f"level must be an integer in [1, {max(max_level, 1)}] for {height}×{width} images "
            f"and wavelet {wavelet!r}, got {level!r}"
        )
    if threshold is None:
        threshold = universal_threshold(noise_std, height * width)
    else:
        threshold = check_nonnegative("threshold", threshold)
    if clip is not None and not clip[1] > clip[0]:
        raise ValueError(f"clip must be (low, high) with high > low, got {clip!r}")

    x = images.detach().to(device="cpu", dtype=torch.float64).numpy()
    coeffs = pywt.wavedec2(x, wavelet, mode=extension, level=level, axes=(-2, -1))
    shrunk = [coeffs[0]] + [
        tuple(pywt.threshold(band, threshold, mode=mode) for band in details)
        for details in coeffs[1:]
    ]
    restored = pywt.waverec2(shrunk, wavelet, mode=extension, axes=(-2, -1))
    restored = np.ascontiguousarray(restored[..., :height, :width])
    out = torch.from_numpy(restored).to(device=images.device, dtype=images.dtype)
    if clip is not None:
        out = out.clamp(clip[0], clip[1])
    return out


class WaveletDenoising:
    """The data modules' ``denoise``: the release → images (inverse record transform) →
    ``wavelet_denoise`` with the mechanism's public noise std, clipped to the declared bounds →
    forward transform. Post-processing: the release and its cache file are left as they are;
    training reads the result. In a config::

        denoise: {class_path: WaveletDenoising, init_args: {wavelet: db4}}

    Args:
        wavelet: a discrete PyWavelets wavelet (``pywt.wavelist(kind="discrete")``).

    Raises:
        ValueError: a ``wavelet`` PyWavelets does not have.

    Example::

        >>> from lightning_dpot.data import WaveletDenoising
        >>> WaveletDenoising("haar").wavelet
        'haar'
    """

    def __init__(self, wavelet: str = "db4") -> None:
        import pywt

        if wavelet not in pywt.wavelist(kind="discrete"):
            raise ValueError(
                "denoise.wavelet must be a discrete PyWavelets wavelet "
                f"(pywt.wavelist(kind='discrete')), got {wavelet!r}"
            )
        self.wavelet = wavelet

    @staticmethod
    def check_transform(transform: str) -> None:
        """Refuse a record ``transform`` other than the identity: the release must hold
        images. Called before any release."""
        if transform != "identity":
            raise ValueError(
                f"denoise: WaveletDenoising needs transform='identity' (the release must hold "
                f"images), got transform={transform!r}"
            )

    def __call__(
        self, release: Tensor, transform: Any, noise_std: float, low: float, high: float
    ) -> Tensor:
        if transform.name != "identity" or len(transform.sample_shape) != 3:
            raise ValueError(
                "denoise: WaveletDenoising needs an image release (C, H, W) with transform="
                f"'identity', got transform={transform.name!r}, "
                f"sample_shape={transform.sample_shape}"
            )
        images = transform.inverse(release)
        denoised = wavelet_denoise(images, noise_std, self.wavelet, clip=(low, high))
        return transform.forward(denoised)

    def report(self, low: float, high: float) -> dict[str, Any]:
        """The report's ``post_processing`` entry."""
        return {
            "denoise": "wavelet",
            "wavelet": self.wavelet,
            "threshold": "VisuShrink sigma*sqrt(2 ln(H*W)), sigma = the mechanism's noise std",
            "clip": [low, high],
            "privacy_cost": "none (post-processing of the release)",
        }
