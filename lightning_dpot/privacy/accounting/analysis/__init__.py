r"""The mathematics of the subsampled Gaussian accountants: pure functions, no state.

As in Opacus (``opacus/accountants/analysis`` beside ``opacus/accountants``), this package holds the
privacy analysis and :mod:`lightning_dpot.privacy.accounting.accountants` the objects that record
what was released and call it; :mod:`lightning_dpot.privacy.accounting.calibration` searches it for
the largest number of steps or the smallest noise multiplier within a target.

The mechanism
-------------
One step releases :math:`M(D) = f(S(D)) + \mathcal N(0, \sigma^2 \Delta^2 I)`, where :math:`f`
has :math:`\ell_2` sensitivity :math:`\Delta`, :math:`\sigma` is the ``noise_multiplier`` (noise
standard deviation divided by the sensitivity) and :math:`S` is a random subsample drawn by one
of two *sampling schemes* (:mod:`~lightning_dpot.privacy.accounting.analysis.schemes`):

* ``"poisson"``: every record kept independently with probability ``sample_rate`` :math:`q`,
  add/remove-one adjacency; RDP (:mod:`~lightning_dpot.privacy.accounting.analysis.rdp_poisson`,
  Mironov, Talwar, Zhang 2019) or PLD (:mod:`~lightning_dpot.privacy.accounting.analysis.pld`);
* ``"without_replacement"``: exactly ``b`` of the ``n`` records, ``sample_rate`` :math:`b/n`,
  replace-one adjacency; RDP only (:mod:`~lightning_dpot.privacy.accounting.analysis.rdp_swor`,
  Wang, Balle, Kasiviswanathan 2019).

Training composes :math:`T` such steps, possibly with different :math:`(\sigma, q)` but one
scheme; the noise and the sampling are fresh at every step.

Layout
------
* :mod:`~lightning_dpot.privacy.accounting.analysis.schemes`: the schemes, their adjacency,
  histories of runs ``(noise_multiplier, sample_rate, num_steps)`` and the default settings;
* :mod:`~lightning_dpot.privacy.accounting.analysis.dp_events`: a step and a history as
  dp-accounting ``DpEvent``\ s, their neighbouring relation, and the RDP curve its
  ``RdpAccountant`` gives an event;
* :mod:`~lightning_dpot.privacy.accounting.analysis.rdp_poisson`,
  :mod:`~lightning_dpot.privacy.accounting.analysis.rdp_swor`: the one-step RDP curve of each
  scheme;
* :mod:`~lightning_dpot.privacy.accounting.analysis.pld`: the one-step privacy loss distribution
  (Poisson);
* :mod:`~lightning_dpot.privacy.accounting.analysis.conversions`: RDP to
  :math:`(\varepsilon, \delta)` and the PLD read-out;
* :mod:`~lightning_dpot.privacy.accounting.analysis.epsilon`: **the** path from (scheme, q, σ,
  steps, δ) to ε, :func:`~lightning_dpot.privacy.accounting.analysis.epsilon.epsilon_of_history`;
  the accountants and the calibrations call it.

All numbers are upper bounds on the true ε computed by Google's ``dp-accounting`` library,
through its public API only; this package chooses its settings and wraps it.
"""
