"""Lightning plugins."""

from lightning_dpot.plugins.checkpoint_io import AtomicCheckpointIO

__all__ = ["AtomicCheckpointIO"]
