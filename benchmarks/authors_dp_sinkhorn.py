"""DP-Sinkhorn's training step as the authors' own code runs it, imported from the user's checkout.

``AuthorsSide`` times one generator step of https://github.com/nv-tlabs/DP-Sinkhorn_code
(Cao et al. 2021) checked out at ``--authors-code PATH``; nothing of that code is kept in this
repository. It runs their modules at the README's MNIST command (m = 1):

* generator: ``src.architecture.build_generator`` (``ConvCondGenerator`` of
  ``src/architecture/dcgan.py``, ``--g_type conv_cond --latent_dim 16 --embed_dim 8
  --hidden_dim 64 --act_function lllt --embed_multiplier 15``), in train mode;
* cost: ``src.cost_function.get_cost_adv`` with ``--cost l1+l2 --mixture_fraction 1``
  (‖x − y‖₂² + m‖x − y‖₁ over an N × M × D difference);
* loss: geomloss ``SamplesLoss("sinkhorn", debias=False, p, blur, backend="tensorized", cost)``
  as the main block of ``sinkhorn_poisson.py`` builds it under ``--debias``, blur from
  ``src.trainer.get_sinkhorn_eps`` and set on the loss as ``src.trainer.main_loop`` does; the
  README's ``--p 1 --sinkhorn_eps 0.05`` give geomloss' ε = blur^p = 0.05 = λ;
* step: ``sinkhorn_poisson.train_step`` as ``src.trainer.train`` calls it (``args.global_step``
  set first), unchanged: zero_grad, ``compute_loss`` (uniform z, the generator called for the
  n rows and again for the n' debias rows, ``sanitize_img_grads_hook`` — block clip + noise —
  and ``clip_img_grads_hook`` of ``src/rdp/privacy.py`` as gradient hooks, ``2·S(X, Y) −
  S(X, X')``, two ``.item()`` reads), backward, Adam (lr 1e-5, weight decay 1e-5, as their main
  block builds it). ``global_step`` is 1, not a multiple of 20 or 100, so the accountant
  (``calc_epsilon``, every 20th step) and the gradient copy (every 100th) do not run, as on 19
  of every 20 steps of their loop.

Settings off the README to match the other sides: ``--debias_ratio 0.4`` (n' = 20 for n = 50;
README 0.2) and ``--noise_multiplier 1.5`` (README 1.1); ``--l2_norm_clip 0.5
--sensitivity_to_l2_norm_clip 2`` as there. The real batch is the benchmark's.

Loading: PATH goes first on ``sys.path`` and ``src.architecture`` and ``src.cost_function``
import as usual. ``sinkhorn_poisson.py``, ``src/trainer.py``, ``src/utils.py``,
``src/rdp/privacy.py`` and ``src/data/data.py`` import the rest of their training loop at the
top (tensorboard, pytorch-fid, torchvision datasets, the RDP accountant's ``six``): from these
only the definitions the step calls are taken, compiled from their files (tracebacks point
there) without running the files' imports. A module the step needs that is not installed ends
the run with one line naming it.

Parts: their ``train_step`` is one function; it is split at seams outside their code, each with
a device sync: ``forward`` ends at the first call of the loss (zero_grad, the two generator
calls, the features), ``loss`` when ``compute_loss`` returns (the two solves, the ``.item()``
reads), ``backward`` at the optimizer's step pre-hook (autograd through their hooks), ``opt``
when ``train_step`` returns.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import math
import statistics
import sys
import time
from pathlib import Path

REPOSITORY = "https://github.com/nv-tlabs/DP-Sinkhorn_code"
IMG_DIM, LABEL_DIM = (1, 28, 28), 10  # ``metadata`` of their MNIST loader (src/data/data.py)
PIXELS = math.prod(IMG_DIM)


def _definitions(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Run only the top-level definitions ``names`` of their file ``path`` in ``namespace``."""
    tree = ast.parse(path.read_text(), str(path))
    body = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names
    ]
    missing = set(names) - {node.name for node in body}
    if missing:
        raise SystemExit(f"--authors-code: {path} has no {', '.join(sorted(missing))}")
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def load_authors_code(root: str | Path) -> dict:
    """Their step's pieces, from the checkout at ``root``: a dict of functions and classes."""
    root = Path(root).resolve()
    needed = ("sinkhorn_poisson.py", "src/trainer.py", "src/cost_function.py", "src/utils.py")
    for rel in (*needed, "src/rdp/privacy.py", "src/data/data.py", "src/architecture/dcgan.py"):
        if not (root / rel).is_file():
            raise SystemExit(f"--authors-code: no {rel} under {root} (a checkout of {REPOSITORY})")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
        from geomloss import SamplesLoss

        src = importlib.import_module("src")
        if Path(src.__file__).resolve().parent != root / "src":
            raise SystemExit(f"--authors-code: 'src' is already imported from {src.__file__}")
        architecture = importlib.import_module("src.architecture")
        cost_function = importlib.import_module("src.cost_function")
    except ModuleNotFoundError as err:
        raise SystemExit(
            f"--authors-code: their step needs the module {err.name!r}, which is not installed"
        ) from None
    base = {"np": np, "torch": torch, "F": F}
    utils = _definitions(root / "src/utils.py", ("Metric", "PrivacyExceededError"), dict(base))
    privacy = _definitions(
        root / "src/rdp/privacy.py", ("sanitize_img_grads_hook", "clip_img_grads_hook"), dict(base)
    )
    data = _definitions(root / "src/data/data.py", ("get_balanced_class_labels",), dict(base))
    trainer = _definitions(root / "src/trainer.py", ("get_sinkhorn_eps",), dict(base))
    step = dict(base, __name__="sinkhorn_poisson")
    for module, names in (
        (utils, ("Metric", "PrivacyExceededError")),
        (privacy, ("sanitize_img_grads_hook", "clip_img_grads_hook")),
        (data, ("get_balanced_class_labels",)),
    ):
        step.update({name: module[name] for name in names})
    _definitions(root / "sinkhorn_poisson.py", ("compute_loss", "train_step"), step)
    return {
        "root": str(root),
        "SamplesLoss": SamplesLoss,
        "build_generator": architecture.build_generator,
        "get_cost_adv": cost_function.get_cost_adv,
        "get_sinkhorn_eps": trainer["get_sinkhorn_eps"],
        "step_globals": step,
    }


def authors_args(batch: int, device: str) -> argparse.Namespace:
    """Their ``args`` for the step: the README's MNIST command (m = 1), but for n' and σ."""
    return argparse.Namespace(
        # sinkhorn_poisson.py
        noise="uniform",
        debias=True,
        debias_ratio=0.4,  # README 0.2; n' = 20 as the other sides
        class_cond=1,
        batch_size=batch,
        lr=1e-5,
        optimizer=None,  # their default: Adam
        balance_class_label=False,
        adv=False,
        d_steps=0,
        sinkhorn_eps=0.05,
        p=1.0,
        sinkhorn_eps_schedule=None,
        sinkhorn_eps_step_every=None,
        cost="l1+l2",
        mixture_fraction=1.0,
        global_step=1,
        # src/rdp/privacy.py
        dp=True,
        sampling="poisson",
        mechanism="img_grad",
        l2_norm_clip=0.5,
        noise_multiplier=1.5,  # README 1.1; σ = 1.5 as the other sides
        sensitivity_to_l2_norm_clip=2.0,
        js_estimate=False,
        # src/architecture/__init__.py
        g_type="conv_cond",
        embed_dim=8,
        latent_dim=16,
        hidden_dim=64,
        embed_multiplier=15.0,
        act_function="lllt",
        num_vis_examples=20,
        device=device,
    )


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


class AuthorsSide:
    """Their generator, Adam and loss; ``step`` runs and times one ``train_step`` of theirs.

    ``reference_error(side, real, real_labels)``: the benchmark's gradient check, given the
    attributes it reads (``captured``, ``fake``, ``labels``, ``n``, ``n_prime``, ``eps``).
    """

    name = "authors"
    official = False

    def __init__(self, root: str, batch: int, device, reference_error=None) -> None:
        import torch

        self.code = load_authors_code(root)
        self.device, self.reference_error = device, reference_error
        self.args = authors_args(batch, str(device))
        self.metadata = {"img_dim": IMG_DIM, "label_dim": LABEL_DIM}
        torch.manual_seed(0)
        with contextlib.redirect_stdout(io.StringIO()):  # build_generator prints the model
            gen = self.code["build_generator"](self.args, IMG_DIM, LABEL_DIM)
        self.gen = gen.to(device)
        self.gen.train()
        self.opt = torch.optim.Adam(self.gen.parameters(), lr=self.args.lr, weight_decay=1e-5)
        self.opt.register_step_pre_hook(lambda *_: self._stamp("backward"))
        self.loss_fn = self.code["SamplesLoss"](
            loss="sinkhorn",
            debias=False,
            p=self.args.p,
            blur=self.args.sinkhorn_eps,
            backend="tensorized",
            cost=self.code["get_cost_adv"](self.args, self.metadata),
        )
        self.loss_fn.blur = self.code["get_sinkhorn_eps"](1, self.args)  # as main_loop sets it
        self.eps = self.loss_fn.blur**self.args.p  # geomloss' temperature
        step = self.code["step_globals"]
        self._compute_loss = step["compute_loss"]
        step["compute_loss"] = self._timed_compute_loss  # train_step looks it up as a global
        self._train_step = step["train_step"]
        self.n = batch
        self.n_prime = int(self.args.debias_ratio * batch)
        self.parts: dict[str, list[float]] = {k: [] for k in ("forward", "loss", "backward", "opt")}
        self.totals: list[float] = []
        self.captured = self.fake = self.labels = None
        self._stamps: dict[str, float] = {}

    def _stamp(self, part: str) -> None:
        """End ``part`` of the running step (after a device sync); first stamp wins."""
        if part not in self._stamps:
            _sync(self.device)
            self._stamps[part] = time.perf_counter()

    def _loss(self, x, y):
        """Their SamplesLoss; the first call ends the forward. On the first step, the gradient
        w.r.t. all generated features (before their image hooks) is kept for the check."""
        self._stamp("forward")
        rows = x._base if x._base is not None else x
        if self.captured is None and rows.requires_grad:
            self.captured = []
            self.fake = rows[:, :PIXELS].detach().reshape(-1, *IMG_DIM)
            self.labels = rows[:, PIXELS:].detach().argmax(1)
            rows.register_hook(lambda g: self.captured.append(g[:, :PIXELS].detach().clone()))
        return self.loss_fn(x, y)

    def _timed_compute_loss(self, *args, **kwargs):
        out = self._compute_loss(*args, **kwargs)
        self._stamp("loss")
        return out

    def step(self, real, real_labels, record: bool) -> None:
        import torch

        self._stamps = {}
        _sync(self.device)
        t0 = time.perf_counter()
        self.args.global_step = 1  # as src.trainer.train sets it before each call
        self._train_step(
            {"g": self.gen, "d": None},
            {"g_optimizer": self.opt, "d_optimizer": None},
            real,
            real_labels,
            torch.arange(len(real_labels), device=real.device),
            self._loss,
            self.args,
            self.metadata,
        )
        _sync(self.device)
        t4 = time.perf_counter()
        if record:
            s = self._stamps
            ends = (s["forward"], s["loss"], s["backward"], t4)
            for key, start, end in zip(self.parts, (t0, *ends[:3]), ends, strict=True):
                self.parts[key].append((end - start) * 1e3)
            self.totals.append((t4 - t0) * 1e3)

    def gradient_error(self, real, real_labels) -> float:
        if self.reference_error is None:
            return float("nan")
        return self.reference_error(self, real, real_labels)

    def summary(self) -> dict:
        return {
            "side": self.name,
            "epsilon": self.eps,
            "step_ms_median": round(statistics.median(self.totals), 2),
            "step_ms_min": round(min(self.totals), 2),
            "parts_ms_median": {k: round(statistics.median(v), 2) for k, v in self.parts.items()},
            "authors_code": self.code["root"],
        }
