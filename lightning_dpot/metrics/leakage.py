r"""What a trained generator's samples reveal of its training records: distance to closest record
and a distance-based membership-inference attack, for the data holder's own check.

Both compare the training records T with held-out records H of the same distribution through
synthetic samples S:

* **distance to closest record** (DCR; the privacy metric of synthetic-data toolkits such as
  synthcity): for every s ∈ S, d_T(s) = min_{x ∈ T} ‖s − x‖₂ and d_H(s) likewise.
  ``closer_to_train`` is the share of samples strictly closer to a training record than to any
  held-out one. A sample drawn independently of T has its nearest neighbour in T ∪ H uniformly
  among the |T| + |H| records (they are exchangeable), so it is closer to T with probability
  ``closer_to_train_if_independent`` = |T|/(|T| + |H|); a generator that copies records puts
  d_T at 0 and the share at 1 (Platzer & Reutterer 2021 use |T| = |H|, baseline 1/2).
* **membership inference** (the full black-box attack of GAN-Leaks, Chen, Yu, Zhang, Fritz
  2020): the attacker scores a candidate record x by −min_{s ∈ S} ‖x − s‖₂ and calls it a
  member when the score is high. ``mia_auc`` is the area under the ROC curve of that score, m
  training records against m held-out ones: 1/2 is chance, 1 is a perfect attack.

What they can show: that samples copy or cluster around training records (a failed or
misconfigured run, or a non-private baseline). What they cannot: a small DCR gap or an AUC near
1/2 does not prove privacy (one attack, one sample draw; a DP guarantee bounds every attack,
these numbers measure one). They read the raw training records, so their output is not
differentially private: it is for the data holder's machine, not for release.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive_int

__all__ = ["NOT_FOR_RELEASE", "leakage_scores"]

NOT_FOR_RELEASE = (
    "computed from the raw training records without noise: for the data holder's machine, not "
    "for release (not covered by the run's ε)"
)


def _min_distances(queries: Tensor, records: Tensor, chunk: int = 1024) -> Tensor:
    """min_j ‖q_i − r_j‖₂ for every query, in float64 chunks."""
    records = records.double()
    out = []
    for start in range(0, len(queries), chunk):
        out.append(torch.cdist(queries[start : start + chunk].double(), records).min(1).values)
    return torch.cat(out)


def leakage_scores(
    samples: Tensor,
    train: Tensor,
    held_out: Tensor,
    max_records: int = 5000,
    seed: int = 0,
) -> dict[str, Any]:
    """DCR and membership-inference AUC of ``samples`` (module docstring).

    Args:
        samples: synthetic records ``(N, ...)``.
        train: the generator's training records T.
        held_out: records H of the same distribution it never saw.
        max_records: at most this many records of each of T and H (random subsets).
        seed: seed of the subsets.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> train, held = torch.randn(300, 4, generator=g), torch.randn(100, 4, generator=g)
        >>> copies = leakage_scores(train.clone(), train, held)
        >>> copies["closer_to_train"], copies["mia_auc"]
        (1.0, 1.0)
        >>> fresh = leakage_scores(torch.randn(300, 4, generator=g), train, held)
        >>> fresh["closer_to_train_if_independent"]
        0.75
        >>> 0.65 < fresh["closer_to_train"] < 0.85 and 0.4 < fresh["mia_auc"] < 0.6
        True
    """
    from sklearn.metrics import roc_auc_score

    cap = check_positive_int("max_records", max_records)
    if len(samples) == 0 or len(train) == 0 or len(held_out) == 0:
        raise ValueError("leakage needs samples, training records and held-out records")
    generator = torch.Generator().manual_seed(seed)
    members = train.flatten(1)[torch.randperm(len(train), generator=generator)[:cap]]
    others = held_out.flatten(1)[torch.randperm(len(held_out), generator=generator)[:cap]]
    synthetic = samples.flatten(1)
    to_train = _min_distances(synthetic, members)
    to_held = _min_distances(synthetic, others)
    m = min(len(members), len(others))  # the attack: m members against m held-out records
    attack = -torch.cat(
        [_min_distances(members[:m], synthetic), _min_distances(others[:m], synthetic)]
    )
    truth = torch.cat([torch.ones(m), torch.zeros(m)])
    return {
        "dcr_train_median": float(to_train.median()),
        "dcr_held_out_median": float(to_held.median()),
        "closer_to_train": float((to_train < to_held).double().mean()),
        "closer_to_train_if_independent": len(members) / (len(members) + len(others)),
        "mia_auc": float(roc_auc_score(truth.numpy(), attack.numpy())),
        "train_records": len(members),
        "held_out_records": len(others),
        "num_samples": len(synthetic),
        "notice": NOT_FOR_RELEASE,
    }
