"""Accounting: what the releases of a run cost in privacy.

* ``lightning_dpot.privacy.accounting.analysis`` — the mathematics of the subsampled
  Gaussian accountants (pure functions);
* ``lightning_dpot.privacy.accounting.accountants`` — RDP and PLD accountants recording the
  steps of a run; ``lightning_dpot.privacy.accounting.calibration`` — the one calibration
  path: the smallest noise or the most steps within a target ε;
* ``lightning_dpot.privacy.accounting.composition`` — a run's events composed in O(1) each;
  ``lightning_dpot.privacy.accounting.budget`` — continue or stop, as a pure decision;
* ``lightning_dpot.privacy.accounting.journal`` — the release journal, the record of a run's
  releases (also those that left the process before a crash);
  ``lightning_dpot.privacy.accounting.migration`` — earlier checkpoint layouts;
  ``lightning_dpot.privacy.accounting.report`` — the privacy report;
* ``lightning_dpot.privacy.accounting.shuffling`` — amplification by shuffling of local-DP
  releases; ``lightning_dpot.privacy.accounting.wdp`` and
  ``lightning_dpot.privacy.accounting.wdp_accountant`` — Wasserstein DP (Yang et al. 2024),
  a different notion, never reported as (ε, δ)-DP.
"""
