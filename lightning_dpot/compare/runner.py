"""Running a suite's cells: one ``dpot fit`` each, then the shared evaluators.

A cell trains in-process through the same LightningCLI as ``dpot fit`` (same callbacks,
accountant and reports) with the suite's overrides, in ``<out>/cells/<method>/<source>/eps<ε>/
seed<s>/``. It then draws samples through ``Generative``,
scores them with ``lightning_dpot.metrics.evaluators`` against the raw held-out split, reads
the privacy guarantee from the run's own ``report.json`` and writes ``cell.json`` last
(atomically): a cell with ``cell.json`` is finished and never redone. An interrupted cell
resumes from its newest checkpoint (its accountant state and cached release come back with it,
so the count continues; a cell killed before its first checkpoint starts over). A cell folder that
moved since its checkpoint was written (another machine, another path) continues the release
journal that moved with it: the runner names it to the accountant
(``PrivacyAccountantCallback(journal_path=...)``), which checks that it is the checkpoint's.
``train_cell`` and ``score_cell`` are the two halves of ``run_cell``, for a caller
that trains one cell across several processes (``benchmarks/gpu_playbook.py --single-run``).

A cell is tied to what it ran: the fingerprint of its composed config, its overrides, the
suite's δ, the evaluation settings and the prepare steps (``cell_fingerprint``) is written
to ``plan.json`` before training and into ``cell.json``. A finished or checkpointed cell whose
fingerprint differs on a rerun (an edited config or suite) is refused, naming what changed,
instead of mixing old and new cells in one table or resuming a checkpoint under other settings.
Every cell is scored on the suite's ``num_samples``; a model that cannot draw that many (a
particle flow) is refused before it trains.

A cell that raises does not end the grid: ``record_failure`` writes its traceback to
``errors/<cell>.txt`` and the caller lists it (``dpot compare`` then exits with status 1; a rerun
retries it, as a cell without ``cell.json``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
import traceback
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dpot.compare.suite import Cell, Suite, suite_metrics
from lightning_dpot.data.protocols import held_out_split
from lightning_dpot.generative import draw

__all__ = [
    "FailedRun",
    "TrainedCell",
    "cell_fingerprint",
    "cell_privacy",
    "digest_matches",
    "evaluate_model",
    "record_failure",
    "run_cell",
    "run_prepare",
    "score_cell",
    "train_cell",
    "write_json",
]

NOTIONS = ("local", "central")

#: Version of the evaluation protocol (the runner's code, not the suite): part of every cell's
#: fingerprint, so cells scored under an older protocol are never mixed with newer ones.
#: 2: the classifier-FD reference is the half of the held-out split the classifier never saw.
PROTOCOL_VERSION = 2


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, replaced atomically (a reader never sees half a
    file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


@dataclass(frozen=True)
class FailedRun:
    """A cell or run that raised: its name and its error in one line; the traceback is in
    ``errors/<run>.txt`` of the run directory."""

    run: str
    error: str


def record_failure(name: str, err: BaseException, errors_dir: Path) -> FailedRun:
    """Write the traceback being handled (call inside ``except``) to ``errors_dir/<name>.txt``
    and return the failure."""
    path = errors_dir / f"{name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(traceback.format_exc())
    return FailedRun(name, f"{type(err).__name__}: {err}")


def cell_privacy(report: dict) -> dict:
    """The guarantee a run's ``report.json`` states, in one shape for every method.

    ``notion`` is ``"local"`` (per-record ε of a local randomizer; with the central ε of the
    shuffled release where the report has it) or ``"central"`` ((ε, δ) of the trained model
    from the accountant, with its adjacency)."""
    section = report.get("privacy")
    if not isinstance(section, dict) or section.get("epsilon") is None:
        raise ValueError(
            "the run's report.json has no privacy section with an epsilon: a suite compares "
            "private runs only"
        )
    notion = section.get("notion")
    if notion not in NOTIONS:
        raise ValueError(f"the run's privacy section has notion={notion!r}, not one of {NOTIONS}")
    out = {
        "notion": notion,
        "epsilon": float(section["epsilon"]),
        "delta": section.get("delta"),
        "mechanism": section.get("mechanism"),
    }
    if notion == "local":
        shuffled = section.get("central_by_shuffling") or {}
        out["adjacency"] = "any two values of one record (local DP, per record)"
        out["shuffled_central_epsilon"] = shuffled.get("epsilon_numerical")
        out["shuffled_central_delta"] = shuffled.get("delta")
    else:
        out["adjacency"] = section.get("adjacency")
        out["accountant"] = section.get("accountant")
        out["releases"] = section.get("releases")
        module = section.get("module") or {}
        public = module.get("poisson_seed_is_public", module.get("subset_seed_is_public"))
        out["sampling_seed_is_public"] = public
    return out


def check_sample_count(model: Any, n: int) -> None:
    """Every cell is scored on the same number of samples: refuse a model that cannot draw
    ``n`` (a particle flow holds ``max_samples``) instead of scoring it on fewer, since the
    Fréchet distance and W2 are biased by the sample count."""
    if model.max_samples is not None and model.max_samples < n:
        raise ValueError(
            f"evaluation.num_samples={n} but {type(model).__name__} can draw at most "
            f"{model.max_samples} samples (its particles): lower evaluation.num_samples or raise "
            "the method's num_particles, so that every method is scored on the same count"
        )


class _SampleCount(Callback):
    """``check_sample_count`` once the model is set up (a flow's particles exist), before
    the module's own ``on_fit_start`` (DPSWflow's one release) and before any step."""

    def __init__(self, n: int) -> None:
        self.n = n

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        check_sample_count(pl_module, self.n)


def cell_fingerprint(suite: Suite, cell: Cell) -> dict[str, Any]:
    """What a cell's result depends on, with the run directory left out (so a moved run
    directory still resumes): the composed config, the overrides, δ, the evaluation settings
    and the prepare steps; ``digest`` hashes them."""
    from lightning_dpot.config import compose_config

    spec = suite.methods[cell.method]
    where = Path("{out_dir}")
    values = suite.values(where, cell, where / "cells" / cell.key)
    parts = {
        "protocol": PROTOCOL_VERSION,
        "config": compose_config(spec.config),
        "overrides": suite.overrides(spec.set, values),
        "delta": suite.delta,
        "evaluation": _evaluation_fingerprint(suite.evaluation),
        "prepare": {name: prepare_fingerprint(suite, name) for name in suite.prepare},
    }
    return {"digest": _digest(parts), "parts": parts}


def _evaluation_fingerprint(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The evaluation settings with a local weights file named by its content, not its path (the
    same file elsewhere resumes the same cells)."""
    frechet = evaluation.get("frechet")
    if not isinstance(frechet, dict) or frechet.get("weights_path") is None:
        return evaluation
    digest = hashlib.sha256(Path(frechet["weights_path"]).read_bytes()).hexdigest()[:16]
    named = {k: v for k, v in frechet.items() if k != "weights_path"}
    return {**evaluation, "frechet": {**named, "weights_sha256": digest}}


def prepare_fingerprint(suite: Suite, name: str) -> dict[str, Any]:
    """What a prepare step's output depends on: its composed config and overrides."""
    from lightning_dpot.config import compose_config

    spec = suite.prepare[name]
    return {"config": compose_config(spec.config), "set": spec.set}


def _digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def digest_matches(stored: str | None, parts: dict[str, Any]) -> bool:
    """Whether ``stored`` is the digest of ``parts``, or of the same settings spelled as before
    the data modules' arguments were grouped (``lightning_dpot.config.earlier_spelling``): a
    cell or prepare step run then resumes, instead of a new private run on the same records."""
    from lightning_dpot.config import earlier_spelling

    return stored is not None and stored in (_digest(parts), _digest(earlier_spelling(parts)))


def _check_fingerprint(cell: Cell, cell_dir: Path, stored: dict | None, current: dict) -> None:
    if stored is not None and digest_matches(stored.get("digest"), current["parts"]):
        return
    if stored is None:
        changed = "it has no fingerprint (written by an older version)"
    else:
        parts = stored.get("parts", {})
        names = [k for k in current["parts"] if parts.get(k) != current["parts"][k]]
        changed = f"its {', '.join(names) or 'settings'} changed since it ran"
    raise ValueError(
        f"cell {cell.key}: {changed}; its result would not be comparable with the others. Run "
        f"the suite into a new --output directory, or delete {cell_dir} to redo this cell "
        "(a new private run on the same data)"
    )


def evaluate_model(
    model: Any,
    datamodule: Any,
    settings: dict,
    seed: int,
    cache_dir: Path,
    device: torch.device | str = "cpu",
) -> tuple[dict, torch.Tensor]:
    """Score ``model`` against the datamodule's raw held-out split with the suite's evaluator
    set (``suite_metrics``); returns the metrics and the samples drawn (seeded by the cell's
    seed). ``device`` runs the evaluators' networks (the Fréchet features, the MLP and CNN)."""
    selection = suite_metrics(settings)
    reference, labels = held_out_split(datamodule)
    n = int(settings.get("num_samples", 2000))
    check_sample_count(model, n)
    want_labels = selection is not None and selection.needs_labels and model.conditional
    x, y = draw(model, n, labelled=want_labels, generator=torch.Generator().manual_seed(seed))
    metrics: dict[str, Any] = {"num_samples": int(x.shape[0])}
    if selection is None:
        return metrics, x
    source = getattr(datamodule, "source", None)
    sections = selection.score(
        x, y, reference, labels, seed=seed, cache_dir=cache_dir, device=device, source=source
    )
    for name, section in sections.items():
        if name == "w2":
            metrics.update(w2=section["w2"], w2_stderr=section["w2_stderr"])
        elif name == "frechet":
            key = "fid" if "fid" in section else "fd_classifier"
            metrics[key] = section[key]
            if "features_sha256" in section:  # the classifier's weights: which FDs compare
                metrics["fd_classifier_weights"] = section["features_sha256"]
        elif name == "utility":  # None: unconditional, or no labels to train a classifier on
            accuracies = {k: v for k, v in section.items() if k not in ("mode", "skipped")}
            metrics["utility"] = None if "skipped" in section else accuracies
        elif "skipped" not in section:
            metrics.update(section)
    return metrics, x


def _newest_checkpoint(cell_dir: Path) -> Path | None:
    checkpoints = sorted(cell_dir.glob("checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime)
    return checkpoints[-1] if checkpoints else None


@contextmanager
def _quiet():
    """Lightning's per-run banners and known benign warnings off for the grid's runs."""
    names = ("lightning.pytorch", "lightning.fabric", "lightning")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*holds .* particles.*")
            warnings.filterwarnings("ignore", message=".*will be overridden by.*")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def run_prepare(suite: Suite, name: str, out_dir: Path) -> Path:
    """Run the suite's ``prepare`` step ``name`` once (non-private, e.g. an autoencoder on the
    public split); ``<out_dir>/prepare/<name>/done.json`` marks it finished."""
    from lightning_dpot.training import run_lightning

    spec = suite.prepare[name]
    run_dir = out_dir / "prepare" / name
    parts = prepare_fingerprint(suite, name)
    digest = _digest(parts)
    if (run_dir / "done.json").is_file():
        if not digest_matches(json.loads((run_dir / "done.json").read_text()).get("digest"), parts):
            raise ValueError(
                f"prepare step {name!r}: its config or overrides changed since it ran (or it was "
                "written by an older version); the cells that use it would mix two versions. "
                f"Run the suite into a new --output directory, or delete {run_dir} and the "
                "cells that use it"
            )
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "fit",
        "--config", str(spec.config),
        *suite.overrides(spec.set, suite.values(out_dir)),
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]  # fmt: skip
    start = time.perf_counter()
    with _quiet():
        run_lightning(args)
    done = {"seconds": round(time.perf_counter() - start, 2), "digest": digest}
    write_json(run_dir / "done.json", done)
    return run_dir


def _moved_journal(checkpoint: Path, cell_dir: Path) -> Path | None:
    """The release journal of the cell in ``cell_dir`` when the folder moved since
    ``checkpoint`` was written: the file of the journal's name in it (the runner's runs journal
    at the top of their cell folder), if the journal the checkpoint names is gone."""
    from lightning_dpot.callbacks.privacy_record import checkpoint_journal

    journal = checkpoint_journal(torch.load(checkpoint, map_location="cpu", weights_only=False))
    if journal is None:
        return None
    if Path(journal["path"]).exists():  # not moved: a copy beside it is not the run
        return None
    here = cell_dir.absolute() / Path(journal["path"]).name
    return here if here.is_file() else None


@dataclass
class TrainedCell:
    """A cell's run after ``train_cell``: its LightningCLI (``model``, ``datamodule``,
    ``trainer``), folder, fitting time, the checkpoint it resumed from and its fingerprint."""

    cli: Any
    cell_dir: Path
    fit_seconds: float
    resumed: Path | None
    fingerprint: dict[str, Any]


def train_cell(
    suite: Suite,
    cell: Cell,
    out_dir: Path,
    callbacks: Sequence[Callback] = (),
    fingerprint: dict[str, Any] | None = None,
    args: Sequence[str] = (),
) -> TrainedCell:
    """Train one cell, or resume it from its newest checkpoint, without scoring it.

    ``fingerprint`` (default ``cell_fingerprint``) is what a checkpoint of the cell is
    checked against and ``plan.json`` holds; ``args`` are further ``dpot fit`` arguments outside
    it (how often to checkpoint, say); ``callbacks`` join the trainer."""
    from lightning_dpot.callbacks import PrivacyAccountantCallback
    from lightning_dpot.training import run_lightning

    cell_dir = out_dir / "cells" / cell.key
    plan_path = cell_dir / "plan.json"
    fingerprint = cell_fingerprint(suite, cell) if fingerprint is None else fingerprint
    resumed = _newest_checkpoint(cell_dir)
    if resumed is not None:  # resume only under the settings the checkpoint was made with
        stored = json.loads(plan_path.read_text()) if plan_path.is_file() else None
        _check_fingerprint(cell, cell_dir, stored, fingerprint)
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_json(plan_path, fingerprint)
    spec = suite.methods[cell.method]
    cli_args = [
        "--config", str(spec.config),
        *suite.overrides(spec.set, suite.values(out_dir, cell, cell_dir)),
        f"--seed_everything={cell.seed}",
        f"--trainer.default_root_dir={cell_dir}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *args,
    ]  # fmt: skip
    start = time.perf_counter()
    with _quiet():
        cli = run_lightning(cli_args, run=False)
        cli.trainer.callbacks.append(_SampleCount(int(suite.evaluation.get("num_samples", 2000))))
        cli.trainer.callbacks.extend(callbacks)
        moved = None if resumed is None else _moved_journal(resumed, cell_dir)
        for callback in cli.trainer.callbacks:
            if moved is not None and isinstance(callback, PrivacyAccountantCallback):
                callback.journal_path = moved
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=resumed)
    return TrainedCell(cli, cell_dir, time.perf_counter() - start, resumed, fingerprint)


def score_cell(suite: Suite, cell: Cell, out_dir: Path, trained: TrainedCell) -> dict:
    """Evaluate a trained cell on the device it trained on, save its sample grid and write its
    record (``cell.json``), which marks it finished."""
    cli, cell_dir = trained.cli, trained.cell_dir
    with _quiet():
        report = json.loads((cell_dir / "report.json").read_text())
        privacy = cell_privacy(report)
        start = time.perf_counter()
        metrics, samples = evaluate_model(
            cli.model,
            cli.datamodule,
            suite.evaluation,
            cell.seed,
            out_dir / "cache",
            device=cli.trainer.strategy.root_device,
        )
    torch.save(samples[: int(suite.evaluation.get("grid", 64))].clone(), cell_dir / "samples.pt")
    record = {
        "method": cell.method,
        "method_class": type(cli.model).__name__,
        "source": cell.source,
        "target_epsilon": cell.epsilon,
        "seed": cell.seed,
        "privacy": privacy,
        "metrics": metrics,
        "steps": int(cli.trainer.global_step),
        "fit_seconds": round(trained.fit_seconds, 2),
        "evaluate_seconds": round(time.perf_counter() - start, 2),
        "resumed_from": None if trained.resumed is None else str(trained.resumed),
        "report": str(cell_dir / "report.json"),
        "fingerprint": trained.fingerprint,
    }
    delta = privacy.get("delta")
    if (
        not math.isfinite(privacy["epsilon"])
        or privacy["epsilon"] > cell.epsilon * (1 + 1e-6)
        or (delta is not None and delta > suite.delta * (1 + 1e-9))
    ):
        record["privacy"]["exceeds_target"] = True  # (ε, δ) above the suite's target
    write_json(cell_dir / "cell.json", record)
    return record


def run_cell(suite: Suite, cell: Cell, out_dir: Path, callbacks: Sequence[Callback] = ()) -> dict:
    """Train, evaluate and record one cell (or read its record if it is finished).

    ``callbacks`` join the cell's trainer (e.g. a step timer); they change nothing the cell
    records. The evaluators run on the device the cell trained on."""
    record_path = out_dir / "cells" / cell.key / "cell.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        _check_fingerprint(
            cell, record_path.parent, record.get("fingerprint"), cell_fingerprint(suite, cell)
        )
        return record
    return score_cell(suite, cell, out_dir, train_cell(suite, cell, out_dir, callbacks))
