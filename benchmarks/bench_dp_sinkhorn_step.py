"""DP-Sinkhorn training step (Cao et al. 2021) at the MNIST settings, side by side in one process.

Sides, timed in turn step after step (same thread, same load):

* ``new``: this package — conditional DCGAN, semi-debiased loss with ``auto`` (the fixed-budget
  ``newton`` backend, ``fixed_budget`` as a private run sets it), its ``GradientSanitizer`` as the
  gradient hook, fused Adam as ``DPSinkhorn`` steps it; ``--cuda-graphs``: the solves replayed
  as CUDA graphs (``cuda_graphs=True``).
* ``old``: the package at ``--old-rev``: its fixed-budget private solve where it has one,
  else Sinkhorn sweeps to tol 1e-3 with a 2,000-sweep cap (the default, b8dc265),
  loaded with ``revision.load_revision``.
* ``official``: the configuration of the authors' released code — geomloss 0.3.1
  ``SamplesLoss("sinkhorn", p=2, blur, debias=False, backend="tensorized")`` (default scaling
  0.5, diameter from the data) with the ‖x − y‖₂² + m‖x − y‖₁ cost as a dense callable over an
  N × M × D difference, the generator called once for the n cross rows and once for the n'
  debias rows, block clipping and Gaussian noise in the gradient hook. ``--official-blur``:
  0.05 as released (geomloss' ε = blur² = 0.0025 in cost units), or √0.05 (ε = λ = 0.05, the
  value the other sides use). Its generator is the package's (channels-last, the first layer a
  matrix product): the same generator as ``new``.
* ``released``: ``official`` with the generator in the authors' layout (NCHW, every layer an
  ``nn.ConvTranspose2d``), as their code runs it; same weights.
* ``authors``: the authors' own code, imported from ``--authors-code PATH`` (the root of a
  checkout of https://github.com/nv-tlabs/DP-Sinkhorn_code; none of it is kept here): their
  ``train_step`` of ``sinkhorn_poisson.py`` with their generator (``src/architecture/dcgan.py``),
  cost (``src/cost_function.py``) and geomloss loss at the README's MNIST flags (``--p 1
  --sinkhorn_eps 0.05``: ε = 0.05), n' = 20, σ = 1.5, on the same real batch
  (``authors_dp_sinkhorn`` says what it runs and how the parts are split). Every side is also
  reported against it (``vs_authors``).

Settings (paper, App. D.3): n = 50 real and n + ⌊0.4n⌋ = 70 generated rows, λ = 0.05, m = 1,
α_c = 15, clip 0.5, σ = 1.5, q = 1/1200; random images as the real batch. One step = generator
forward, loss, backward through the hook and the generator, Adam step. Reported per side: the
median step time and its parts, and the error of the loss gradient w.r.t. the generated images
(before the hook) against a float64 reference plan (``lightning_dpot.ot.reference.
entropic_plan_newton``) at the side's own ε, on the first step's batch.

    python benchmarks/bench_dp_sinkhorn_step.py --threads 1 --steps 20 \
        --out docs/results/bench_dp_sinkhorn_step_cpu.json
    python benchmarks/bench_dp_sinkhorn_step.py --threads 1 --steps 5 --warmup 1 \
        --sides new released authors --authors-code PATH/TO/DP-Sinkhorn_code
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from revision import load_revision  # noqa: E402

OLD_REV = "b8dc265"


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _official_loss(blur: float, l1_weight: float):
    from geomloss import SamplesLoss

    def cost(x, y):  # the released code's dense l1+l2 cost: a (B ×) N × M × D difference
        diff = x[..., :, None, :] - y[..., None, :, :]
        return diff.norm(p=2, dim=-1) ** 2 + l1_weight * diff.norm(p=1, dim=-1)

    return SamplesLoss("sinkhorn", p=2, blur=blur, debias=False, backend="tensorized", cost=cost)


def _sanitizer_class(pkg):
    """``GradientSanitizer`` of ``pkg``: ``privacy.mechanisms`` now, ``privacy`` at b8dc265."""
    mechanisms = getattr(pkg.privacy, "mechanisms", None)
    module = getattr(mechanisms, "gradient_sanitizer", None) or pkg.privacy.gradient_sanitizer
    return module.GradientSanitizer


class Side:
    """One side's generator, optimizer and loss; ``step`` runs and times one step."""

    def __init__(self, name: str, pkg, args, device) -> None:
        import torch

        from lightning_dpot.ot.dp_sinkhorn import mixed_cost_diameter

        self.name, self.args, self.device = name, args, device
        torch.manual_seed(0)
        self.gen = pkg.nn.dcgan.ConditionalDCGANGenerator(10).to(device)
        if name == "released":  # the authors' layout: NCHW, every layer a ConvTranspose2d
            first = self.gen.net[0]
            plain = torch.nn.ConvTranspose2d(16, 256, 7, bias=first.bias is not None)
            plain.load_state_dict(first.state_dict())
            self.gen.net[0] = plain.to(device)
            self.gen.to(memory_format=torch.contiguous_format)
        # ``new`` steps Adam as DPSinkhorn.configure_optimizers does (fused), the others as
        # their code does.
        fused = {"fused": True} if name == "new" else {}
        self.opt = torch.optim.Adam(self.gen.parameters(), lr=1e-4, weight_decay=2e-5, **fused)
        self.n, self.n_prime = args.batch, int(args.batch * 0.4 + 1e-9)
        diameter = mixed_cost_diameter(784, 2.0, 1.0, 15.0)
        self.official = name in ("official", "released")
        if self.official:
            self.loss_fn = _official_loss(args.official_blur, 1.0)
            self.eps = args.official_blur**2
        else:
            loss_class = pkg.ot.dp_sinkhorn.SemiDebiasedSinkhorn
            private = "fixed_budget" in inspect.signature(loss_class).parameters
            kwargs = {"fixed_budget": True} if private else {"warn_not_converged": False}
            if name == "new" and args.cuda_graphs:
                kwargs["cuda_graphs"] = True
            self.loss_fn = pkg.ot.dp_sinkhorn.SemiDebiasedSinkhorn(
                0.05, 1.0, 0.4, 10, 15.0, diameter, **kwargs
            )
            self.eps = 0.05
        self.sanitizer = (
            None if self.official else _sanitizer_class(pkg)(0.5, 1.5, sample_rate=1 / 1200)
        )
        self.parts: dict[str, list[float]] = {k: [] for k in ("forward", "loss", "backward", "opt")}
        self.totals: list[float] = []
        self.captured = None

    def _capture(self, grad) -> None:
        """Keep the gradient w.r.t. the generated rows as the hook sees it (before noise)."""
        if self.captured is None:
            self.captured = []
        self.captured.append(grad.detach().clone())

    def _hook(self, grad, rows: slice | None):
        """The released code's hook: block clipping to Frobenius norm Δ = 0.5 and N(0, (2Δσ)²)
        noise on the cross rows."""
        import torch

        self._capture(grad)
        clip = 0.5
        out = grad * min(1.0, clip / (float(grad.norm()) + 1e-12))
        if rows is not None:
            out = out + 2 * clip * 1.5 * torch.randn_like(out)
        return out

    def step(self, real, real_labels, record: bool) -> None:
        import torch
        import torch.nn.functional as F

        n, n_prime, device = self.n, self.n_prime, self.device
        _sync(device)
        t0 = time.perf_counter()
        z = torch.rand(n + n_prime, 12, device=device)
        labels = torch.randint(10, (n + n_prime,), device=device)
        if self.official:
            fake = self.gen(z[:n], labels[:n])
            alt = self.gen(z[n:], labels[:n_prime])
            labels = torch.cat([labels[:n], labels[:n_prime]])
            fake.register_hook(lambda g: self._hook(g, slice(0, n)))
            alt.register_hook(lambda g: self._hook(g, None))
            fake = torch.cat([fake, alt])
        else:  # the package's sanitizer, as a private run registers it
            fake = self.gen(z, labels)
            fake.register_hook(self._capture)
            fake.register_hook(lambda g: self.sanitizer(g, n))
        self.fake, self.labels = fake.detach(), labels
        _sync(device)
        t1 = time.perf_counter()
        if self.official:
            onehot = 15.0 * F.one_hot(labels, 10).float()
            fx = torch.cat([fake.reshape(len(fake), -1), onehot], 1)
            fy = torch.cat([real.reshape(len(real), -1), 15.0 * F.one_hot(real_labels, 10)], 1)
            loss = 2 * self.loss_fn(fx[:n], fy) - self.loss_fn(fx[:n], fx[n_prime:])
        else:
            loss = self.loss_fn(fake, real, n, labels, real_labels)
        _sync(device)
        t2 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.captured = None
        loss.backward()
        _sync(device)
        t3 = time.perf_counter()
        self.opt.step()
        _sync(device)
        t4 = time.perf_counter()
        if record:
            for key, dt in zip(self.parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                self.parts[key].append(dt * 1e3)
            self.totals.append((t4 - t0) * 1e3)

    def gradient_error(self, real, real_labels) -> float:
        """‖∇ − ∇_ref‖_F/‖∇_ref‖_F of the loss gradient w.r.t. the generated images of the last
        step (as the hook saw it), against float64 reference plans at the side's ε."""
        import torch

        from lightning_dpot.ot import MixedL2L1Cost, entropic_plan_newton
        from lightning_dpot.ot.dp_sinkhorn import class_conditional_features

        grad = torch.cat(self.captured[::-1]) if self.official else self.captured[0]
        n, n_prime = self.n, self.n_prime
        cost = MixedL2L1Cost(1.0)
        x = self.fake.double().requires_grad_(True)
        fx = class_conditional_features(x, self.labels, 10, 15.0)
        fy = class_conditional_features(real.double(), real_labels, 10, 15.0)
        total = x.new_zeros(())
        for weight, a, b in ((2.0, fx[:n], fy), (-1.0, fx[:n], fx[n_prime:])):
            plan = entropic_plan_newton(a.detach(), b.detach(), 2, self.eps, cost_fn=cost)
            total = total + weight * (plan * cost(a, b)).sum()
        (ref,) = torch.autograd.grad(total, x)
        return float((grad.double().reshape(ref.shape) - ref).norm() / ref.norm())

    def summary(self) -> dict:
        return {
            "side": self.name,
            "epsilon": self.eps,
            "step_ms_median": round(statistics.median(self.totals), 2),
            "step_ms_min": round(min(self.totals), 2),
            "parts_ms_median": {k: round(statistics.median(v), 2) for k, v in self.parts.items()},
        }


def _dispatch(side: Side, real, real_labels, steps: int = 3) -> dict:
    """Operations dispatched and host waits per step (``lightning_dpot.callbacks.
    step_profile``), counted by the profiler over ``steps`` untimed steps."""
    from torch.profiler import profile

    from lightning_dpot.callbacks.step_profile import count_events

    with profile() as prof:
        for _ in range(steps):
            side.step(real, real_labels, record=False)
    ops, waits, optimizer_reads = count_events(prof.events())
    return {
        "ops_per_step": round(ops / steps),
        "host_waits_per_step": round(sum(waits.values()) / steps, 1),
        "optimizer_counter_reads_per_step": round(optimizer_reads / steps, 1),
        "host_waits": {where: count / steps for where, count in waits.most_common()},
    }


def _authors_side(args, device):
    """The ``authors`` side: their own step, imported from ``--authors-code``."""
    from authors_dp_sinkhorn import AuthorsSide

    return AuthorsSide(args.authors_code, args.batch, device, Side.gradient_error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--sides", nargs="*", default=["new", "old", "official", "released"])
    parser.add_argument("--old-rev", default=OLD_REV)
    parser.add_argument("--official-blur", type=float, default=0.05)
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="new: replay the solves as CUDA graphs"
    )
    parser.add_argument(
        "--authors-code",
        help="authors: root of a checkout of https://github.com/nv-tlabs/DP-Sinkhorn_code",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if "authors" in args.sides and not args.authors_code:
        parser.error("the authors side needs --authors-code PATH")
    old = load_revision(args.old_rev) if "old" in args.sides else None
    import torch

    import lightning_dpot.nn.dcgan  # noqa: F401
    import lightning_dpot.ot.dp_sinkhorn  # noqa: F401
    import lightning_dpot.privacy.mechanisms.gradient_sanitizer  # noqa: F401

    new = sys.modules["lightning_dpot"]
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sides = [
        _authors_side(args, device)
        if s == "authors"
        else Side(s, old if s == "old" else new, args, device)
        for s in args.sides
    ]
    gen = torch.Generator().manual_seed(0)
    real = (torch.rand(args.batch, 1, 28, 28, generator=gen) * 2 - 1).to(device)
    real_labels = torch.randint(10, (args.batch,), generator=gen).to(device)
    errors = {}
    for i in range(args.warmup + args.steps):
        for side in sides:
            side.step(real, real_labels, record=i >= args.warmup)
            if i == 0:
                errors[side.name] = side.gradient_error(real, real_labels)
    results = [
        dict(
            s.summary(), gradient_error=round(errors[s.name], 4), **_dispatch(s, real, real_labels)
        )
        for s in sides
    ]
    base = {r["side"]: r["step_ms_median"] for r in results}
    for r in results:
        for peer in ("official", "released", "authors"):
            if peer in base:
                r[f"vs_{peer}"] = round(r["step_ms_median"] / base[peer], 3)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    text = json.dumps(
        {
            "device": name,
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
            "official_blur": args.official_blur,
            "old_rev": args.old_rev,
            "cuda_graphs": args.cuda_graphs,
            "authors_code": args.authors_code,
            "results": results,
        },
        indent=2,
    )
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
