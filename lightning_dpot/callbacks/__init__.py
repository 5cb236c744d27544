"""Callbacks: privacy reports and accounting, evaluation, run reports and artifacts."""

from lightning_dpot.callbacks.artifacts import RunArtifacts
from lightning_dpot.callbacks.evaluation import FIDEvaluation, UtilityEvaluation, W2Evaluation
from lightning_dpot.callbacks.ldp_report import LDPPrivacyReport
from lightning_dpot.callbacks.manifold import ManifoldEvaluation
from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.callbacks.privacy_record import commit_releases
from lightning_dpot.callbacks.run_report import RunReport
from lightning_dpot.callbacks.sample_rows import SampleRows
from lightning_dpot.callbacks.samples import SampleGrid
from lightning_dpot.callbacks.step_profile import StepProfile
from lightning_dpot.callbacks.training_rng import TrainingRngStream

__all__ = [
    "FIDEvaluation",
    "LDPPrivacyReport",
    "ManifoldEvaluation",
    "PrivacyAccountantCallback",
    "RunArtifacts",
    "RunReport",
    "SampleGrid",
    "SampleRows",
    "StepProfile",
    "TrainingRngStream",
    "UtilityEvaluation",
    "W2Evaluation",
    "commit_releases",
]
