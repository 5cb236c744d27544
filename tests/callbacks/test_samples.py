"""SampleGrid: fixed samples across epochs, PNGs in the run directory (an image grid, or a
scatter plot of 2-D records) sent to loggers that can take them, and any other record shape
refused before the first step; SampleRows refused before a release of data that is not a
table (its writing of rows: tests/test_your_data_doc.py)."""

import re
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lightning_dpot.callbacks import SampleGrid, SampleRows
from lightning_dpot.data import Digits, HalfCircle, PrivatizedDataModule, TensorFile
from lightning_dpot.grids import images_to_grid
from lightning_dpot.methods import EntropicWGAN
from lightning_dpot.nn import DCGANGenerator, MLPGenerator


def _image_module():
    return EntropicWGAN(
        DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4), latent_range=(0.0, 1.0)
    )


class _ImageLogger:
    def __init__(self):
        self.calls = []

    def log_image(self, key, images, step):
        self.calls.append((key, images, step))


def _png_shape(path):
    """(height, width) of a PNG file."""
    import matplotlib.image

    return matplotlib.image.imread(path).shape[:2]


def _fake_trainer(tmp_path, loggers=()):
    return SimpleNamespace(
        is_global_zero=True,
        log_dir=str(tmp_path),
        default_root_dir=str(tmp_path),
        loggers=list(loggers),
        global_step=7,
        current_epoch=0,
    )


def test_grid_samples_are_fixed_and_leave_the_global_rng_alone():
    module = _image_module()
    callback = SampleGrid(num_samples=9, seed=3)
    state = torch.get_rng_state()
    first = callback.generate(module)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(callback.generate(module), first)
    assert torch.equal(SampleGrid(num_samples=9, seed=3).generate(module), first)
    assert not torch.equal(SampleGrid(num_samples=9, seed=4).generate(module), first)
    # The grid is G(z) for z ~ Unif[latent_range]^latent_dim drawn from the seeded generator.
    z = torch.rand(9, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        module.eval()
        torch.testing.assert_close(first, module(z))
    assert first.shape == (9, 1, 8, 8)


def test_same_generator_gives_the_same_grid_and_training_mode_is_restored():
    module = _image_module()
    module.train()
    callback = SampleGrid(num_samples=4)
    assert torch.equal(callback.generate(module), callback.generate(module))
    assert module.training


def test_save_grid_writes_pngs_and_logs_to_image_loggers(tmp_path):
    logger = _ImageLogger()
    path = SampleGrid(num_samples=4).save_grid(
        _fake_trainer(tmp_path, [logger, object()]), _image_module(), "epoch0"
    )
    assert path == tmp_path / "samples_epoch0.png"
    assert path.is_file() and (tmp_path / "samples.png").read_bytes() == path.read_bytes()
    assert _png_shape(path) == (2 * (8 + 2) + 2, 2 * (8 + 2) + 2)  # 2 × 2 grid, 2-px padding
    assert logger.calls == [("samples", [str(path)], 7)]


def _fit_two_epochs(tmp_path, callbacks, batches=1):
    """The tiny image module fitted for two epochs of ``batches`` batches; returns it."""
    dm = PrivatizedDataModule(
        Digits(), "laplace", noise_scale=0.5, batch_size=64, cache_dir=str(tmp_path / "c")
    )
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
    )
    module = _image_module()
    trainer.fit(module, datamodule=dm)
    return module


def test_fit_saves_a_grid_per_epoch_and_at_the_end(tmp_path):
    _fit_two_epochs(tmp_path, [SampleGrid(num_samples=16, every_n_epochs=1)])
    names = sorted(p.name for p in tmp_path.glob("samples*.png"))
    assert names == ["samples.png", "samples_epoch0.png", "samples_epoch1.png"]


def test_weights_averaged_after_the_last_grid_get_a_final_grid_of_the_model_left(tmp_path):
    """Lightning's EMAWeightAveraging copies its average into the module at on_train_end, after
    the last epoch's grid: samples.png must show that model, not the one before."""
    from lightning.pytorch.callbacks import EMAWeightAveraging

    grid = SampleGrid(num_samples=16, every_n_epochs=1)
    module = _fit_two_epochs(tmp_path, [grid, EMAWeightAveraging(decay=0.5)], batches=2)
    names = sorted(p.name for p in tmp_path.glob("samples*.png"))
    assert names == ["samples.png", "samples_epoch0.png", "samples_epoch1.png", "samples_final.png"]
    final = (tmp_path / "samples.png").read_bytes()
    assert final == (tmp_path / "samples_final.png").read_bytes()
    assert final != (tmp_path / "samples_epoch1.png").read_bytes()
    from torchvision.utils import save_image

    save_image(images_to_grid(grid.generate(module), grid.nrow), tmp_path / "left.png")
    assert final == (tmp_path / "left.png").read_bytes()  # the grid of the model the fit left


def test_fit_on_2d_records_saves_scatter_plots_of_the_same_points(tmp_path):
    """The quickstart's kind of run (2-D points): a scatter plot per epoch, and the plotted
    points are the fixed-seed samples."""
    dm = PrivatizedDataModule(
        HalfCircle(n=200, n_test=20), "laplace", epsilon=5.0, batch_size=100,
        cache_dir=str(tmp_path / "c"),
    )  # fmt: skip
    callback = SampleGrid(num_samples=50, every_n_epochs=1)
    trainer = L.Trainer(
        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[callback],
    )  # fmt: skip
    module = EntropicWGAN(MLPGenerator(latent_dim=2, output_shape=(2,), hidden=(8,)))
    trainer.fit(module, datamodule=dm)
    names = sorted(p.name for p in tmp_path.glob("samples*.png"))
    assert names == ["samples.png", "samples_epoch0.png", "samples_epoch1.png"]
    assert (tmp_path / "samples.png").read_bytes() == (tmp_path / "samples_epoch1.png").read_bytes()
    height, width = _png_shape(tmp_path / "samples.png")
    assert height > 200 and width > 200  # a 4 × 4 inch plot, not an empty file
    assert callback.generate(module).shape == (50, 2)


def _fit_5d_records(tmp_path, callback) -> L.Trainer:
    """Fit a WGAN with ``callback`` on a local-DP release of 5-D records (a tensor file)."""
    torch.save({"x": torch.rand(64, 5) * 2 - 1}, tmp_path / "table.pt")
    dm = PrivatizedDataModule(
        TensorFile(str(tmp_path / "table.pt"), low=-1.0, high=1.0, test_fraction=0.25),
        "laplace", epsilon=5.0, batch_size=16, cache_dir=str(tmp_path / "c"),
    )  # fmt: skip
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[callback],
    )  # fmt: skip
    module = EntropicWGAN(MLPGenerator(latent_dim=2, output_shape=(5,), hidden=(8,)))
    trainer.fit(module, datamodule=dm)
    return trainer


def test_other_record_shapes_are_refused_before_the_first_step(tmp_path):
    """5-D tabular records: neither images nor points; one line naming the callback, what it
    draws and the shape, before anything is released."""
    expected = (
        "SampleGrid draws image grids (records (C, H, W) with C in (1, 3)) and scatter plots "
        "(2-D records); EntropicWGAN generates records of shape (5,)"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        _fit_5d_records(tmp_path, SampleGrid())
    assert not list(tmp_path.glob("*.png"))
    assert [p.name for p in tmp_path.rglob("*.pt")] == ["table.pt"]  # no release cached


def test_sample_rows_is_refused_before_a_release_of_data_that_is_not_a_table(tmp_path):
    """A tensor file writes no rows: refused before the local-DP release is drawn or cached."""
    with pytest.raises(ValueError, match="SampleRows writes rows of a table .* is TensorFile"):
        _fit_5d_records(tmp_path, SampleRows())
    assert [p.name for p in tmp_path.rglob("*.pt")] == ["table.pt"]  # no release cached


def test_sample_rows_refuses_records_that_are_not_the_tables_width(tmp_path):
    from lightning_dpot.data import Table

    (tmp_path / "t.csv").write_text("age,smoker\n30,no\n")
    table = Table(str(tmp_path / "t.csv"), {"age": {"low": 0, "high": 120},
                                             "smoker": {"categories": ["no", "yes"]}})  # fmt: skip
    trainer = SimpleNamespace(datamodule=SimpleNamespace(source=table))
    module = EntropicWGAN(MLPGenerator(latent_dim=2, output_shape=(5,), hidden=(8,)))
    with pytest.raises(ValueError, match=re.escape("of shape (5,), the table encodes (3,)")):
        SampleRows().check_before_release(trainer, module)
    fitting = EntropicWGAN(MLPGenerator(latent_dim=2, output_shape=(3,), hidden=(8,)))
    SampleRows().check_before_release(trainer, fitting)


def test_images_to_grid_maps_minus_one_one_to_zero_one():
    grid = images_to_grid(torch.tensor([-1.0, 1.0]).repeat(2, 1, 1, 1).reshape(2, 1, 1, 2))
    assert grid.min() == 0.0 and grid.max() == 1.0
    with pytest.raises(ValueError, match="images must have shape"):
        images_to_grid(torch.zeros(3, 2))


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="num_samples"):
        SampleGrid(num_samples=0)
    with pytest.raises(ValueError, match="every_n_epochs"):
        SampleGrid(every_n_epochs=0)
