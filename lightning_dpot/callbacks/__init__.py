"""Callbacks: privacy reports and accounting, evaluation, run reports."""

from lightning_dpot.callbacks.ldp_report import LDPPrivacyReport
from lightning_dpot.callbacks.manifold import ManifoldEvaluation
from lightning_dpot.callbacks.run_report import RunReport

__all__ = ["LDPPrivacyReport", "ManifoldEvaluation", "RunReport"]
