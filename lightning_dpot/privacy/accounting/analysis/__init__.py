r"""The mathematics of the subsampled Gaussian accountants: pure functions, no state.

As in Opacus (``opacus/accountants/analysis`` beside ``opacus/accountants``), this package holds the
privacy analysis and ``lightning_dpot.privacy.accounting.accountants`` the objects that record
what was released and call it; ``lightning_dpot.privacy.accounting.calibration`` searches it for
the largest number of steps or the smallest noise multiplier within a target.

The mechanism
-------------
One step releases ``M(D) = f(S(D)) + \mathcal N(0, \sigma^2 \Delta^2 I)``, where ``f``
has ``\ell_2`` sensitivity ``\Delta``, ``\sigma`` is the ``noise_multiplier`` (noise
standard deviation divided by the sensitivity) and ``S`` is a random subsample drawn by one
of two *sampling schemes* (``lightning_dpot.privacy.accounting.analysis.schemes``):

* ``"poisson"``: every record kept independently with probability ``sample_rate`` ``q``,
  add/remove-one adjacency; RDP (``lightning_dpot.privacy.accounting.analysis.rdp_poisson``,
  Mironov, Talwar, Zhang 2019) or PLD (``lightning_dpot.privacy.accounting.analysis.pld``);
* ``"without_replacement"``: exactly ``b`` of the ``n`` records, ``sample_rate`` ``b/n``,
  replace-one adjacency; RDP only (``lightning_dpot.privacy.accounting.analysis.rdp_swor``,
  Wang, Balle, Kasiviswanathan 2019).

Training composes ``T`` such steps, possibly with different ``(\sigma, q)`` but one
scheme; the noise and the sampling are fresh at every step.

Layout
------
* ``lightning_dpot.privacy.accounting.analysis.schemes``: the schemes, their adjacency,
  histories of runs ``(noise_multiplier, sample_rate, num_steps)`` and the default settings;
* ``lightning_dpot.privacy.accounting.analysis.dp_events``: a step and a history as
  dp-accounting ``DpEvent``\ s, their neighbouring relation, and the RDP curve its
  ``RdpAccountant`` gives an event;
* ``lightning_dpot.privacy.accounting.analysis.rdp_poisson``,
  ``lightning_dpot.privacy.accounting.analysis.rdp_swor``: the one-step RDP curve of each
  scheme;
* ``lightning_dpot.privacy.accounting.analysis.pld``: the one-step privacy loss distribution
  (Poisson);
* ``lightning_dpot.privacy.accounting.analysis.conversions``: RDP to
  ``(\varepsilon, \delta)`` and the PLD read-out;
* ``lightning_dpot.privacy.accounting.analysis.epsilon``: **the** path from (scheme, q, σ,
  steps, δ) to ε, ``epsilon_of_history``;
  the accountants and the calibrations call it.

All numbers are upper bounds on the true ε computed by Google's ``dp-accounting`` library,
through its public API only; this package chooses its settings and wraps it.
"""
