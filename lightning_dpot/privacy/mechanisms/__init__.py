"""Mechanisms: the code that adds noise to what depends on private records.

* ``lightning_dpot.privacy.mechanisms.additive`` — Laplace and Gaussian noise with their
  calibration; ``lightning_dpot.privacy.mechanisms.gaussian`` — the analytic Gaussian
  mechanism (Balle & Wang 2018);
* ``lightning_dpot.privacy.mechanisms.sensitivity``,
  ``lightning_dpot.privacy.mechanisms.projections``,
  ``lightning_dpot.privacy.mechanisms.transforms`` — sensitivities from declared bounds,
  norm-ball projections and data-independent transforms applied before noise;
* ``lightning_dpot.privacy.mechanisms.ldp`` — the local randomizer that privatizes a data
  set once;
* ``lightning_dpot.privacy.mechanisms.gradient_sanitizer`` — DP-Sinkhorn's release: block
  clipping and Gaussian noise on the gradient w.r.t. the generated samples.
"""
