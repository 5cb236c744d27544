"""``dpot compare``: DP-OT methods side by side on the same data at equal target privacy.

``lightning_dpot.compare.suite`` reads a suite file, ``lightning_dpot.compare.runner``
runs and evaluates its cells (resumable), ``lightning_dpot.compare.results`` writes the
JSON, the table (grouped by privacy notion) and the plots.
"""

from lightning_dpot.compare.suite import Cell, MethodSpec, Suite, load_suite

__all__ = ["Cell", "MethodSpec", "Suite", "load_suite"]
