"""``Trainer(precision="bf16-mixed")`` on the CPU (and on a GPU where there is one): the networks
run in bfloat16, while the OT costs, the losses and every privacy step (DP-Sinkhorn's sanitizer,
the sliced release, the noisy WGAN's mechanism noise) stay in float32 or float64
(docs/performance.md#mixed-precision). Each method family runs a few real steps; spies record the
dtypes where the math runs."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

import lightning_dpot.methods.dpsw.sliced_release as sliced_release
import lightning_dpot.methods.noisy_wgan as noisy_wgan
import lightning_dpot.ot.costs as costs
import lightning_dpot.ot.sliced as sliced
import lightning_dpot.privacy.mechanisms.gradient_sanitizer as gradient_sanitizer
from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data import (
    CentralDPDataModule,
    Digits,
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
)
from lightning_dpot.methods import DPSinkhorn, DPSWFlowR, DPSWGen, EntropicWGAN, NoisyWGAN
from lightning_dpot.nn import ConditionalDCGANGenerator, MLPGenerator

FULL = (torch.float32, torch.float64)
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        warnings.filterwarnings("ignore", message=".*bf16.*")
        yield


class _Losses(Callback):
    """The loss each training step returned."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs:  # the particle flows return no loss
            self.losses.append(outputs["loss"].detach())


class _Spy:
    """Wraps module-level functions; records the dtypes of their tensor inputs and output and
    whether autocast was on (on ``device``) while they ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
        self.monkeypatch, self.device = monkeypatch, device
        self.calls: dict[str, list[tuple[list[torch.dtype], torch.dtype, bool]]] = {}

    def watch(self, module, name: str) -> None:
        original = getattr(module, name)
        calls = self.calls.setdefault(name, [])

        def spy(*args, **kwargs):
            out = original(*args, **kwargs)
            inputs = [a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            calls.append((inputs, out.dtype, torch.is_autocast_enabled(self.device)))
            return out

        self.monkeypatch.setattr(module, name, spy)

    def assert_full_precision(self, name: str) -> None:
        """Every recorded call ran outside autocast on float32/float64 tensors."""
        assert self.calls[name], f"{name} was never called"
        for inputs, out, autocast in self.calls[name]:
            assert not autocast, name
            assert out in FULL and all(dtype in FULL for dtype in inputs), (name, inputs, out)


def _autocast_steps(monkeypatch, cls, device: str) -> list[bool]:
    """Whether autocast was on when each training step began (it must be: bf16-mixed)."""
    seen: list[bool] = []
    original = cls.training_step

    def training_step(self, *args, **kwargs):
        seen.append(torch.is_autocast_enabled(device))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "training_step", training_step)
    return seen


def _network_dtypes(network: torch.nn.Module) -> list[torch.dtype]:
    """The dtypes of ``network``'s outputs (bfloat16 in the training steps under bf16-mixed)."""
    seen: list[torch.dtype] = []
    network.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    return seen


def _fit(
    tmp_path: Path,
    model,
    datamodule,
    device: str,
    steps: int = 2,
    callbacks=(),
    precision: str = "bf16-mixed",
) -> _Losses:
    losses = _Losses()
    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        precision=precision,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[losses, *callbacks],
    )
    trainer.fit(model, datamodule)
    assert trainer.global_step == steps
    return losses


def _assert_finite_full_precision(losses: _Losses, steps: int) -> None:
    assert len(losses.losses) == steps
    for loss in losses.losses:
        assert loss.dtype in FULL and math.isfinite(float(loss))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [EntropicWGAN, NoisyWGAN])
def test_local_dp_wgans_solve_in_float32_under_bf16_mixed(tmp_path, monkeypatch, cls, device):
    spy = _Spy(monkeypatch, device)
    spy.watch(costs, "squared_euclidean_cost")
    spy.watch(noisy_wgan, "fresh_mechanism_noise")
    autocast = _autocast_steps(monkeypatch, cls, device)
    generator = MLPGenerator(2, (2,), (16,))
    generated = _network_dtypes(generator)
    dm = PrivatizedDataModule(
        HalfCircle(n=200, n_test=20), "gaussian", epsilon=5.0, delta=1e-4, batch_size=50,
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    losses = _fit(tmp_path, cls(generator), dm, device)
    assert autocast == [True, True] and torch.bfloat16 in generated
    spy.assert_full_precision("squared_euclidean_cost")
    if cls is NoisyWGAN:  # the mechanism's noise on generated records
        spy.assert_full_precision("fresh_mechanism_noise")
    _assert_finite_full_precision(losses, 2)


def _dp_sinkhorn() -> tuple[list[torch.dtype], DPSinkhorn]:
    generator = ConditionalDCGANGenerator(
        10, latent_dim=4, embed_dim=2, image_size=8, hidden_channels=(8, 8, 8)
    )
    generated = _network_dtypes(generator)
    model = DPSinkhorn(generator, noise_multiplier=1.0, clip_norm=0.5, num_cross=10, lr=1e-3)
    return generated, model


@pytest.mark.parametrize("device", DEVICES)
def test_dp_sinkhorn_solves_clips_and_noises_in_full_precision_under_bf16_mixed(
    tmp_path, monkeypatch, device
):
    spy = _Spy(monkeypatch, device)
    spy.watch(costs, "squared_euclidean_cost")
    spy.watch(costs, "l1_cost")
    spy.watch(gradient_sanitizer, "standard_normal")  # the noise of the release G̃
    autocast = _autocast_steps(monkeypatch, DPSinkhorn, device)
    generated, model = _dp_sinkhorn()
    dm = CentralDPDataModule(Digits(), sample_rate=0.01, steps_per_epoch=2)
    accountant = PrivacyAccountantCallback(10.0, 1e-5)
    losses = _fit(tmp_path, model, dm, device, callbacks=[accountant])
    assert autocast == [True, True] and torch.bfloat16 in generated
    spy.assert_full_precision("squared_euclidean_cost")
    spy.assert_full_precision("l1_cost")
    assert [out for _, out, _ in spy.calls["standard_normal"]] == [torch.float64] * 2
    released = model.sanitizer.last["released"]
    assert released.dtype == torch.float32 and torch.isfinite(released).all()
    _assert_finite_full_precision(losses, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [DPSWFlowR, DPSWGen])
def test_sliced_methods_release_and_project_in_full_precision_under_bf16_mixed(
    tmp_path, monkeypatch, cls, device
):
    spy = _Spy(monkeypatch, device)
    spy.watch(sliced, "project")  # the particles', the generated and the released projections
    spy.watch(sliced_release, "gaussian_sliced_release")  # the release XΘᵀ + Z
    autocast = _autocast_steps(monkeypatch, cls, device)
    if cls is DPSWFlowR:
        model, generated = DPSWFlowR(num_particles=32, num_directions=10, noise_scale=1.0), None
    else:
        generator = MLPGenerator(2, (2,), (16,))
        generated = _network_dtypes(generator)
        model = DPSWGen(generator, num_directions=10, noise_scale=1.0, generated_batch_size=32)
    dm = PrivateLatentDataModule(
        GaussianMixture2D(n=240, n_test=40), normalize="ball", steps_per_epoch=5, batch_size=60
    )
    losses = _fit(tmp_path, model, dm, device)
    assert autocast == [True, True]
    assert generated is None or torch.bfloat16 in generated
    spy.assert_full_precision("project")
    spy.assert_full_precision("gaussian_sliced_release")
    assert {inputs[0] for inputs, _, _ in spy.calls["gaussian_sliced_release"]} == {torch.float64}
    _assert_finite_full_precision(losses, 0 if cls is DPSWFlowR else 2)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="Lightning runs '16-mixed' as 'bf16-mixed' on a CPU"
)
def test_private_dp_sinkhorn_refuses_float16_loss_scaling(tmp_path):
    _, model = _dp_sinkhorn()
    dm = CentralDPDataModule(Digits(), sample_rate=0.01, steps_per_epoch=2)
    with pytest.raises(ValueError, match="precision='16-mixed' scales the loss"):
        _fit(tmp_path, model, dm, "cuda", precision="16-mixed")
