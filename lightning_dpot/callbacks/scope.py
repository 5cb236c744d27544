"""What a run uses or produces that its (ε, δ) does not cover, stated in its privacy report.

The guarantee covers the private training records only. Three things a run commonly touches
are outside it, and the report names those that apply to the run:

* the raw **held-out split** that evaluation callbacks read and plot (``scatter.png``, FID and
  W₂ references): never privatized, so it must be public data or kept as private as the raw
  records;
* the **public split** that trained a DPSW autoencoder: used without any noise, so it must be
  data its people agreed to publish;
* **other releases of the same people** (another run, another ε or cache, each cell of ``dpot
  compare``): they compose with this one (sequential composition, Dwork & Roth 2014,
  Thm. 3.16), and the total is what the privacy ledger reports, not this run's ε.
"""

from __future__ import annotations

import lightning as L

from lightning_dpot.data.latent import PrivateLatentDataModule
from lightning_dpot.data.protocols import HeldOutData, satisfies

__all__ = ["outside_the_guarantee"]

OTHER_RELEASES = (
    "other releases of the same people (another run, another epsilon or cache, every cell of "
    "`dpot compare`) compose with this one: their total, not this run's epsilon, is what a "
    "person has spent (the privacy ledger sums local-DP releases and private runs of the same "
    "records)"
)


def outside_the_guarantee(trainer: L.Trainer) -> list[str]:
    """The statements of the module docstring that apply to ``trainer``'s datamodule."""
    datamodule = trainer.datamodule
    out = []
    if satisfies(datamodule, HeldOutData) and datamodule.test_records is not None:
        out.append(
            f"the raw held-out split ({len(datamodule.test_records)} records) that evaluation "
            "callbacks read and plot: used without noise, it must be public data or kept as "
            "private as the raw records"
        )
    if isinstance(datamodule, PrivateLatentDataModule) and datamodule.split is not None:
        out.append(
            f"the public split ({len(datamodule.split.public)} records) that trained the "
            "autoencoder: "
            "used without noise, it must be data its people agreed to publish"
        )
    out.append(OTHER_RELEASES)
    return out
