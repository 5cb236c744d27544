"""``dpot account``: privacy calculators, each printing one JSON object.

Every subcommand is registered by an ``_add_<name>(subparsers)`` function listed in
``_SUBCOMMANDS``; it sets ``func`` to a callable ``(args) -> dict`` whose result is printed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

from lightning_dpot.commands.flags import refuse_old_spellings


def _print_json(result: dict) -> None:
    print(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False))


def _calibrate(args: argparse.Namespace) -> dict:
    from lightning_dpot.checks import check_epsilon, check_positive
    from lightning_dpot.privacy.mechanisms.gaussian import gaussian_epsilon, gaussian_sigma

    if args.mechanism == "laplace":
        if args.delta is not None:
            raise ValueError("--delta does not apply to the pure-DP Laplace mechanism")
        sensitivity = check_positive("sensitivity", args.sensitivity)
        if args.scale is not None:
            scale = check_positive("scale", args.scale)
            return {
                "mechanism": "laplace",
                "scale": scale,
                "epsilon": sensitivity / scale,
                "sensitivity_l1": sensitivity,
            }
        epsilon = check_epsilon("epsilon", _required(args.epsilon, "--epsilon or --scale"))
        return {
            "mechanism": "laplace",
            "scale": sensitivity / epsilon,
            "epsilon": epsilon,
            "sensitivity_l1": sensitivity,
        }
    delta = _required(args.delta, "--delta")
    if args.sigma is not None:
        epsilon = gaussian_epsilon(args.sigma, delta, args.sensitivity, args.method)
        sigma = args.sigma
    else:
        epsilon = _required(args.epsilon, "--epsilon or --sigma")
        sigma = gaussian_sigma(epsilon, delta, args.sensitivity, args.method)
    return {
        "mechanism": "gaussian",
        "calibration": args.method,
        "sigma": sigma,
        "epsilon": epsilon,
        "delta": delta,
        "sensitivity_l2": args.sensitivity,
    }


def _required(value, flag: str):
    if value is None:
        raise ValueError(f"{flag} is required")
    return value


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="noise for one (ε, δ)-DP release: Laplace scale b = Δ1/ε, or Gaussian σ "
        "(analytic by default); or ε from a given scale",
    )
    p.add_argument("--mechanism", choices=["gaussian", "laplace"], required=True)
    p.add_argument("--epsilon", type=float, help="target ε (or give --sigma / --scale)")
    p.add_argument("--delta", type=float, help="δ in (0, 1), Gaussian only")
    p.add_argument("--sensitivity", type=float, required=True, help="Δ2 (Gaussian) or Δ1 (Laplace)")
    p.add_argument(
        "--method",
        choices=["analytic", "zhao", "classical"],
        default="analytic",
        help="Gaussian calibration (default: analytic, Balle & Wang 2018)",
    )
    p.add_argument("--sigma", type=float, help="Gaussian std: report its ε instead")
    p.add_argument("--scale", type=float, help="Laplace scale: report its ε instead")
    p.set_defaults(func=_calibrate)


def _shuffle(args: argparse.Namespace) -> dict:
    from lightning_dpot.privacy.accounting.shuffling import (
        closed_form_max_epsilon0,
        shuffle_epsilon_closed_form,
        shuffle_epsilon_numerical,
    )

    numerical = shuffle_epsilon_numerical(args.epsilon0, args.n, args.delta)  # validates inputs
    result = {
        "guarantee": "(ε, δ)-DP in the central model for n shuffled pure ε0-LDP reports, "
        "replace-one adjacency; δ is the amplification bound's only failure probability",
        "reference": "Feldman, McMillan, Talwar 2021 (Hiding among the clones): "
        "Theorem 3.1 (closed form) and the numerical clone bound",
        "epsilon0": args.epsilon0,
        "n": args.n,
        "delta": args.delta,
        "epsilon_numerical": numerical,
        "closed_form_max_epsilon0": closed_form_max_epsilon0(args.n, args.delta),
    }
    try:
        result["epsilon_closed_form"] = shuffle_epsilon_closed_form(
            args.epsilon0, args.n, args.delta
        )
    except ValueError as err:  # outside Theorem 3.1's range: report why, keep the numerical bound
        result["epsilon_closed_form"] = None
        result["closed_form_error"] = str(err)
    return result


def _add_shuffle(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "shuffle",
        help="central (ε, δ)-DP of n shuffled pure ε0-LDP reports (amplification by shuffling, "
        "Feldman-McMillan-Talwar 2021): closed form and numerical bound",
    )
    p.add_argument("--epsilon0", type=float, required=True, help="pure local ε0 of each report")
    p.add_argument("--n", type=int, required=True, help="number of shuffled reports (users)")
    p.add_argument("--delta", type=float, required=True, help="central δ in (0, 1)")
    p.set_defaults(func=_shuffle)


def _wdp(args: argparse.Namespace) -> dict:
    from lightning_dpot.privacy.accounting.wdp import wdp_gaussian, wdp_laplace

    compute = wdp_gaussian if args.mechanism == "gaussian" else wdp_laplace
    return compute(args.scale, args.sensitivity, args.order).to_dict()


def _add_wdp(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "wdp",
        help="Wasserstein DP (Yang et al. 2024, Prop. 7/8) of one Gaussian or Laplace release: "
        "WDP (μ, ε), a Wasserstein distance, not an (ε, δ)-DP guarantee",
    )
    p.add_argument("--mechanism", choices=["gaussian", "laplace"], required=True)
    p.add_argument("--scale", type=float, required=True, help="Gaussian σ or Laplace scale λ")
    p.add_argument("--sensitivity", type=float, required=True, help="sensitivity Δ")
    p.add_argument("--order", type=float, required=True, help="Wasserstein order μ >= 1")
    p.set_defaults(func=_wdp)


def _wdp_sgm(args: argparse.Namespace) -> dict:
    from lightning_dpot.privacy.accounting.wdp_accountant import wasserstein_accountant

    return wasserstein_accountant(
        noise_multiplier=args.noise_multiplier,
        sample_rate=args.sample_rate,
        steps=args.steps,
        sensitivity=args.sensitivity,
        order=args.order,
        beta=args.beta,
        delta=args.delta,
    ).to_dict()


def _add_wdp_sgm(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "wdp-sgm",
        help="generalized WDP (μ, ε) of T Poisson-subsampled Gaussian steps (the Wasserstein "
        "accountant of Yang et al. 2024, worst-case Δ); δ is WDP's failure probability, not DP's δ",
    )
    p.add_argument("--noise_multiplier", type=float, required=True, help="σ / Δ")
    p.add_argument("--sample_rate", type=float, required=True, help="Poisson rate q in (0, 1]")
    p.add_argument("--steps", type=int, required=True, help="number of steps T")
    p.add_argument("--sensitivity", type=float, required=True, help="ℓ2 sensitivity Δ (clip norm)")
    p.add_argument("--order", type=float, required=True, help="Wasserstein order μ >= 1")
    p.add_argument("--beta", type=float, required=True, help="β > 0 of Yang et al. 2024, Theorem 1")
    p.add_argument("--delta", type=float, required=True, help="WDP failure probability in (0, 1)")
    p.set_defaults(func=_wdp_sgm)


def _sgm(args: argparse.Namespace) -> dict:
    from lightning_dpot.privacy.accounting.analysis.epsilon import subsampled_gaussian_epsilon
    from lightning_dpot.privacy.accounting.analysis.schemes import POISSON, SAMPLINGS
    from lightning_dpot.privacy.accounting.calibration import max_steps, min_noise_multiplier

    mechanism, adjacency = SAMPLINGS[POISSON]
    result: dict = {
        "guarantee": "(ε, δ)-DP of T Poisson-subsampled Gaussian steps, add/remove-one adjacency",
        "mechanism": mechanism,
        "adjacency": adjacency,
        "sample_rate": args.sample_rate,
        "delta": args.delta,
    }
    sigma, steps, target = args.noise_multiplier, args.steps, args.target_epsilon
    if target is not None:
        result.update(target_epsilon=target, accountant=args.accountant)
    if sigma is not None and steps is None and target is not None:
        steps = max_steps(sigma, args.sample_rate, target, args.delta, args.accountant)
    elif sigma is None and steps is not None and target is not None:
        sigma = min_noise_multiplier(
            args.sample_rate, steps, target, args.delta, args.accountant, tolerance=args.tolerance
        )
        result["tolerance"] = args.tolerance
    elif sigma is None or steps is None:
        raise ValueError(
            "give --noise_multiplier and --steps (ε), --noise_multiplier and --target_epsilon "
            "(largest steps), or --steps and --target_epsilon (smallest noise multiplier)"
        )
    result.update(noise_multiplier=sigma, steps=steps)
    for name in ("rdp", "pld"):
        result[f"epsilon_{name}"] = subsampled_gaussian_epsilon(
            sigma, args.sample_rate, steps, args.delta, name
        )
    if target is not None:
        result["within_target"] = result[f"epsilon_{args.accountant}"] <= target
    return result


def _add_sgm(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sgm",
        help="(ε, δ)-DP (add/remove one record) of T Poisson-subsampled Gaussian steps "
        "(DP-SGD, DP-Sinkhorn) under RDP and PLD; or the largest T / smallest σ for a target ε",
    )
    p.add_argument("--noise_multiplier", type=float, help="σ = noise std / ℓ2 sensitivity")
    p.add_argument("--sample_rate", type=float, required=True, help="Poisson rate q in (0, 1]")
    p.add_argument("--steps", type=int, help="number of steps T")
    p.add_argument("--delta", type=float, required=True, help="δ in (0, 1)")
    p.add_argument(
        "--target_epsilon",
        type=float,
        help="with --noise_multiplier: largest T within it; with --steps: smallest σ",
    )
    p.add_argument(
        "--accountant",
        choices=["rdp", "pld"],
        default="rdp",
        help="accountant for the --target_epsilon searches (default: rdp)",
    )
    p.add_argument(
        "--tolerance", type=float, default=1e-3, help="absolute tolerance of the σ search"
    )
    p.set_defaults(func=_sgm)


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_calibrate]
_SUBCOMMANDS += [_add_shuffle, _add_wdp, _add_wdp_sgm]
_SUBCOMMANDS += [_add_sgm]


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Attach the ``account`` subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="account_command", required=True, metavar="GUARANTEE")
    for add in _SUBCOMMANDS:
        add(sub)
    for subparser in sub.choices.values():
        refuse_old_spellings(subparser, {})
    return parser


def run(args: argparse.Namespace) -> None:
    try:
        result = args.func(args)
    except ValueError as err:
        raise SystemExit(f"dpot account {args.account_command}: error: {err}") from err
    _print_json(result)


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="dpot account", description="Privacy calculators. Each prints one JSON object."
    )
    run(build_parser(parser).parse_args(argv))
