"""EntropicWGAN: λ = p·σ^p from the mechanism, p checked against it, one real Trainer run."""

import lightning as L
import pytest
import torch

from lightning_dpot.data import HalfCircle, PrivatizedDataModule
from lightning_dpot.methods import EntropicWGAN
from lightning_dpot.nn import MLPGenerator
from lightning_dpot.ot import EntropicOT, ExactOT


def _fit(tmp_path, model, mechanism="gaussian", steps=3, **kw):
    kw = {"epsilon": 5.0, **kw}
    if mechanism == "gaussian":
        kw.setdefault("delta", 1e-4)
    dm = PrivatizedDataModule(
        HalfCircle(n=400, n_test=50), mechanism, batch_size=100, cache_dir=str(tmp_path), **kw
    )
    trainer = L.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm)
    return dm, trainer


def _gen():
    return MLPGenerator(2, (2,), (32, 32))


@pytest.mark.parametrize(("mechanism", "p"), [("gaussian", 2), ("laplace", 1)])
def test_lambda_is_p_sigma_to_the_p(tmp_path, mechanism, p):
    model = EntropicWGAN(_gen())
    dm, trainer = _fit(tmp_path, model, mechanism)
    assert model.p == p
    assert model.entropic_reg == pytest.approx(p * dm.mechanism.noise_scale**p)
    assert isinstance(model.loss_fn, EntropicOT) and not model.loss_fn.debias
    assert model.loss_fn.entropic_reg == pytest.approx(model.entropic_reg)
    assert trainer.global_step == 3


def test_mismatched_p_is_refused_unless_overridden(tmp_path):
    with pytest.raises(ValueError, match="does not match the laplace mechanism"):
        _fit(tmp_path, EntropicWGAN(_gen(), p=2), "laplace")
    model = EntropicWGAN(_gen(), p=2, allow_cost_mismatch=True)
    _fit(tmp_path, model, "laplace")
    assert model.p == 2


def test_unregularized_variant_uses_exact_ot(tmp_path):
    model = EntropicWGAN(_gen(), regularization="none")
    _fit(tmp_path, model)
    assert isinstance(model.loss_fn, ExactOT)


def test_generator_shape_mismatch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="outputs records of shape"):
        _fit(tmp_path, EntropicWGAN(MLPGenerator(2, (3,), (8,))))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="regularization must be"):
        EntropicWGAN(_gen(), regularization="l2")
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        EntropicWGAN(_gen(), p=3)


def test_training_reduces_the_entropic_loss(tmp_path):
    torch.manual_seed(0)
    model = EntropicWGAN(_gen(), lr=1e-3)
    dm, _ = _fit(tmp_path, model, steps=1)
    real = dm.release[:200]
    before = model.loss_fn(model.release_view(model.sample(200)), real).item()
    _fit(tmp_path, model, steps=60)
    after = model.loss_fn(model.release_view(model.sample(200)), real).item()
    assert after < before
