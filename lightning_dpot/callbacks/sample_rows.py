"""Generated rows of a table, written as CSV at the end of a fit: a table's sample grid.

The records come from ``sample(K, generator=torch.Generator().manual_seed(seed))`` of the
``Generative`` protocol and are decoded into the columns' units by the run's table source
(``lightning_dpot.data.Table.write_csv``), which reads only the declared schema. Sampling is
post-processing of the trained model: no privacy cost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.generative import draw, record_shape


def _table(trainer: L.Trainer) -> Any:
    """The datamodule's source when it decodes records into rows (``write_csv``)."""
    source = getattr(trainer.datamodule, "source", None)
    return source if callable(getattr(source, "write_csv", None)) else None


class SampleRows(Callback):
    """Saves ``samples.csv`` in ``trainer.log_dir`` at the end of fitting: ``num_samples``
    generated records as rows of the run's table, in its columns' units (with the label column
    for a class-conditional generator). Rank 0 only.

    Args:
        num_samples: K, the number of rows.
        seed: seed of the draw.

    Raises:
        ValueError: before anything is released, when the run's data source is not a table or
            the method's records are not the table's encoded width.

    Example::

        >>> from lightning_dpot.callbacks import SampleRows
        >>> SampleRows(num_samples=200).num_samples
        200
    """

    def __init__(self, num_samples: int = 100, seed: int = 0) -> None:
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.seed = int(seed)

    def check_before_release(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a run whose data source writes no rows, before the datamodule releases
        anything (``check_before_release``)."""
        table = _table(trainer)
        if table is None:
            source = getattr(trainer.datamodule, "source", None)
            what = "no data source" if source is None else f"data source is {type(source).__name__}"
            raise ValueError(
                f"SampleRows writes rows of a table (lightning_dpot.data.Table); this run's "
                f"{what}: use SampleGrid for images and 2-D points"
            )
        shape, width = tuple(record_shape(pl_module)), tuple(table.sample_shape)
        if shape != width:
            raise ValueError(
                f"SampleRows: {type(pl_module).__name__} generates records of shape {shape}, "
                f"the table encodes {width} (set the generator's output_shape to {list(width)})"
            )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The same check, for a datamodule that released nothing before the fit."""
        self.check_before_release(trainer, pl_module)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
        log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        if not trainer.is_global_zero:
            return
        generator = torch.Generator().manual_seed(self.seed)
        samples, labels = draw(pl_module, self.num_samples, labelled=True, generator=generator)
        _table(trainer).write_csv(log_dir / "samples.csv", samples.cpu(), labels)
