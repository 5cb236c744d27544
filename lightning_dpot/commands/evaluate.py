"""``dpot evaluate``: FID / classifier FD, downstream utility, W₂ and leakage of a trained run.

    dpot evaluate --ckpt_path RUN/checkpoints/CKPT --metrics fid,utility,w2 [--num_samples N]
        [--feature_extractor inception|classifier] [--feature_extractor_weights_path P]
        [--classifier_path P] [--data_config YAML]

The model is rebuilt from the run's ``config.yaml`` with
``lightning_dpot.commands.checkpoint.load_model`` (the loader ``dpot sample`` uses; particle
flows get their particles and release back from the checkpoint and their decoder through
``attach_datamodule``, without any mechanism call), and the
reference data are the **raw held-out split** of the run's data section (or ``--data_config``),
read from its ``source`` without privatizing anything. N samples are drawn once through
``Generative`` (labelled when the method is class-conditional)
and shared by all metrics.
The result is printed as JSON on stdout and appended to the list ``"evaluate"`` of the run's
``report.json`` (next to ``config.yaml``; ``--report`` overrides, ``--no_report`` skips). A
progress bar over the stages (sampling, then each metric) is drawn on stderr when it is a
terminal, unless ``--no_progress``; stdout carries the JSON only.

Reference rows use ``--samples`` instead of ``--ckpt_path`` (``--data_config`` required):
``raw-train`` (the raw training split with its labels: the real-data row), ``privatized`` (the
LDP release the run trains on, mapped back to records; no labels are released) or a tensor file
(``torch.save`` of ``(N, ...)`` or of a dict with ``x`` and optionally ``y``).

Metrics are the evaluators of ``lightning_dpot.metrics.evaluators`` (the objects the
evaluation callbacks use; formulas there): ``fid`` is FID only with
``--feature_extractor inception`` (standard InceptionV3 weights); with ``classifier`` it is the
classifier-feature Fréchet distance, reported under the key ``fd_classifier``, never as FID.

``leakage`` (``lightning_dpot.metrics.leakage``) compares the samples with the raw training
split and the held-out one (distance to closest record, a membership-inference AUC). It reads
the training records without noise, so it is printed with a notice that it is not for release
and is left out of ``report.json``; nothing of it enters the privacy ledger as a release.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_dpot.checks import check_positive_int
from lightning_dpot.commands.flags import refuse_old_spellings

if TYPE_CHECKING:
    from torch import Tensor
    from tqdm import tqdm

    from lightning_dpot.metrics.selection import MetricSelection

# torch, the data and the metrics are imported when the command runs: --help prints at once.

DESCRIPTION = (
    "FID / classifier FD, downstream utility, W2 and leakage of a checkpoint (prints JSON)"
)
SAMPLE_SOURCES = ("raw-train", "privatized")
LEAKAGE = "leakage"


def _requested(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys(m.strip() for m in args.metrics.split(",") if m.strip()))


def _selection(args: argparse.Namespace) -> MetricSelection | None:
    """The metrics of ``--metrics`` (but ``leakage``) with the options the other flags set."""
    from lightning_dpot.metrics.selection import MetricSelection

    others = [m for m in _requested(args) if m != LEAKAGE]
    if not others and LEAKAGE in _requested(args):
        return None
    names = MetricSelection.parse(",".join(others)).metrics
    options = {
        "frechet": {
            "feature_extractor": args.feature_extractor,
            "weights_path": args.feature_extractor_weights_path,
            "classifier_path": args.classifier_path,
        },
        "utility": {"mode": args.utility_mode},
        "w2": {"subsample": args.w2_subsample, "repeats": args.w2_repeats},
        "manifold": {},
    }
    return MetricSelection.parse({name: options[name] for name in names})


def reference_samples(datamodule: Any, which: str) -> tuple[Tensor, Tensor | None, str]:
    """``raw-train`` or ``privatized`` records of a datamodule, with labels where known."""
    from lightning_dpot.data.ledger_public import enter_evaluation_use
    from lightning_dpot.data.protocols import LocalDPRelease, satisfies

    source = getattr(datamodule, "source", None)  # None: a datamodule read from a release file
    if which == "raw-train":
        if source is None:
            raise ValueError("--samples raw-train needs a datamodule with a data source")
        splits = source.load()
        enter_evaluation_use(datamodule, splits.train, "train")
        return splits.train, splits.train_labels, "raw training split (reference row)"
    if not satisfies(datamodule, LocalDPRelease):
        raise ValueError(
            f"--samples privatized needs a PrivatizedDataModule, got {type(datamodule).__name__}"
        )
    datamodule.prepare_data()
    datamodule.setup("fit")
    records = datamodule.transform.inverse(datamodule.release)
    records = records.reshape(records.shape[0], *datamodule.sample_shape)
    return records, None, "privatized release, mapped back to records (reference row)"


def load_sample_file(path: str | Path) -> tuple[Tensor, Tensor | None]:
    import torch
    from torch import Tensor

    if not Path(path).is_file():
        raise FileNotFoundError(
            f"--samples={str(path)!r}: no such file (and not one of {SAMPLE_SOURCES})"
        )
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, Tensor):
        return obj, None
    if isinstance(obj, dict) and isinstance(obj.get("x"), Tensor):
        return obj["x"], obj.get("y")
    raise ValueError(
        f"--samples={str(path)!r} must hold a tensor (N, ...) or a dict with 'x' (and 'y'), "
        f"or be one of {SAMPLE_SOURCES}"
    )


def progress_bar(stages: int, enabled: bool) -> tqdm:
    """A tqdm bar of ``stages`` steps on stderr, drawn only when ``enabled`` and stderr is a
    terminal (tqdm is imported here, so ``dpot --help`` does not load it)."""
    from tqdm import tqdm

    return tqdm(
        total=stages,
        desc="dpot evaluate",
        unit="stage",
        file=sys.stderr,
        disable=not (enabled and sys.stderr.isatty()),
        leave=False,
    )


def evaluate(args: argparse.Namespace) -> dict:
    """Compute the requested metrics; returns the JSON record (also written to the report)."""
    selection = _selection(args)
    metrics = 0 if selection is None else len(selection.metrics)
    stages = 1 + metrics + (LEAKAGE in _requested(args))
    with progress_bar(stages, not args.no_progress) as bar:
        return _evaluate(args, selection, bar)


def _evaluate(args: argparse.Namespace, selection: MetricSelection | None, bar: tqdm) -> dict:
    """``evaluate``, advancing ``bar`` after the sampling and after each metric."""
    import torch

    from lightning_dpot.commands.checkpoint import load_datamodule
    from lightning_dpot.data.ledger_public import enter_evaluation_use
    from lightning_dpot.data.protocols import held_out_split
    from lightning_dpot.generative import draw
    from lightning_dpot.metrics.selection import MetricSelection

    metrics = _requested(args)
    num_samples = check_positive_int("num_samples", args.num_samples)
    if (args.ckpt is None) == (args.samples is None):
        raise ValueError("give exactly one of --ckpt_path (a trained run) and --samples")
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    # Built first: Inception fails here, before sampling, without weights.
    frechet = (
        selection.frechet_evaluator()
        if selection is not None and "frechet" in selection.metrics
        else None
    )

    record: dict[str, Any] = {"metrics_requested": metrics}
    model = None
    if args.ckpt is not None:
        from lightning_dpot.commands.checkpoint import load_model

        model, config_path = load_model(args.ckpt, args.config)
        model = model.to(device)
        data_config = Path(args.data_config or config_path)
        record.update(checkpoint=str(args.ckpt), config=str(config_path))
    else:
        if args.data_config is None:
            raise ValueError("--samples needs --data_config (the YAML whose data section to use)")
        data_config = Path(args.data_config)
    record["data_config"] = str(data_config)
    datamodule = load_datamodule(data_config)
    reference, reference_labels = held_out_split(datamodule)
    # The held-out split is read without noise: a public use of those records (data layer).
    enter_evaluation_use(datamodule, reference, "test")

    start = time.perf_counter()
    bar.set_postfix_str("samples")
    if model is not None:
        generator = torch.Generator().manual_seed(args.seed)
        labelled = selection is not None and selection.needs_labels
        x, y = draw(model, num_samples, labelled=labelled, generator=generator)
        record["samples"] = f"generated by {type(model).__name__}"
    elif args.samples in SAMPLE_SOURCES:
        x, y, record["samples"] = reference_samples(datamodule, args.samples)
    else:
        x, y = load_sample_file(args.samples)
        record["samples"] = f"file {args.samples}"
    if x.shape[0] > num_samples:
        x, y = x[:num_samples], None if y is None else y[:num_samples]
    record["num_samples"] = int(x.shape[0])
    record["generate_seconds"] = round(time.perf_counter() - start, 2)
    bar.update()
    x = x.float()

    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    cache_dir = getattr(datamodule, "cache_dir", ".dpot_cache")
    if LEAKAGE in metrics:
        bar.set_postfix_str(LEAKAGE)
        start = time.perf_counter()
        results[LEAKAGE] = leakage(datamodule, x, reference, args.seed)
        timings[LEAKAGE] = round(time.perf_counter() - start, 2)
        bar.update()
    for name, options in ({} if selection is None else selection.metrics).items():
        start = time.perf_counter()
        bar.set_postfix_str("fid" if name == "frechet" else name)
        (section,) = (
            MetricSelection({name: options})
            .score(
                x,
                y,
                reference,
                reference_labels,
                seed=args.seed,
                cache_dir=cache_dir,
                device=device,
                source=getattr(datamodule, "source", None),
                frechet=frechet,
            )
            .values()
        )
        if name == "frechet":
            assert frechet is not None
            results[frechet.key] = {**section, "num_generated": int(x.shape[0])}
        elif name == "utility" and "skipped" in section:
            reason = section["skipped"]
            if model is None:  # a reference row, not a generator
                reason = (
                    f"the samples ({record['samples']}) carry no labels; the utility metric "
                    "needs labelled samples, so it is skipped"
                )
            bar.write(f"dpot evaluate: utility skipped: {reason}", file=sys.stderr)
            results["utility"] = {"skipped": reason}
        elif name == "w2":
            results["w2"] = {**section, "reference": "raw held-out split"}
        else:
            results[name] = section
        timings["fid" if name == "frechet" else name] = round(time.perf_counter() - start, 2)
        bar.update()
    record["results"] = results
    record["seconds"] = timings
    record["reference"] = {"split": "raw held-out", "n": int(reference.shape[0])}
    record["device"] = str(device)
    return record


def leakage(datamodule: Any, samples: Tensor, held_out: Tensor, seed: int) -> dict[str, Any]:
    """``leakage_scores`` of the samples against the raw training split and the held-out one.
    The training records are read here and nowhere else; the result is printed, never written
    to the run's report (it is not differentially private)."""
    from lightning_dpot.metrics.leakage import leakage_scores

    source = getattr(datamodule, "source", None)
    if source is None:
        raise ValueError("--metrics leakage needs the run's data source (its raw training split)")
    return leakage_scores(samples, source.load().train, held_out, seed=seed)


def append_to_report(path: Path, record: dict) -> None:
    """Append ``record`` to the list ``"evaluate"`` of the JSON report at ``path``."""
    from lightning_dpot.callbacks.run_report import update_report

    report = json.loads(path.read_text()) if path.is_file() else {}
    update_report(path, {"evaluate": [*report.get("evaluate", []), record]})


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--ckpt_path", dest="ckpt", help="checkpoint (.ckpt) of a fitted run")
    parser.add_argument(
        "--samples",
        help="instead of --ckpt_path: raw-train | privatized | a tensor file (reference rows)",
    )
    parser.add_argument(
        "--metrics",
        default="fid,utility,w2",
        help="comma list of fid (= frechet), utility, w2, manifold, leakage (reads the raw "
        "training records: printed, not for release, never written to report.json)",
    )
    parser.add_argument("--num_samples", type=int, default=60_000, help="generated samples N")
    parser.add_argument(
        "--feature_extractor",
        default="inception",
        choices=("inception", "classifier"),
        help="inception (FID, standard weights) or classifier (classifier FD, not FID)",
    )
    parser.add_argument("--feature_extractor_weights_path", help="local InceptionV3 FID weights")
    parser.add_argument(
        "--classifier_path",
        help="feature classifier file (trained on the held-out split if absent; default "
        "<data cache_dir>/feature_classifier-<split hash>-e5.pt)",
    )
    parser.add_argument("--data_config", help="YAML with the data section (default: the run's)")
    parser.add_argument("--config", help="the run's config.yaml (default: found from --ckpt_path)")
    parser.add_argument(
        "--utility_mode",
        default="full",
        choices=("full", "quick"),
        help="full (Cao et al. 2021, §D.2) or quick",
    )
    parser.add_argument("--w2_subsample", type=int, default=200, help="W2 subsample size m")
    parser.add_argument("--w2_repeats", type=int, default=10, help="W2 repeats R")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling and metrics")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:index]")
    parser.add_argument("--report", help="report.json to append to (default: the run's)")
    parser.add_argument("--no_report", action="store_true", help="do not write report.json")
    parser.add_argument(
        "--no_progress", action="store_true", help="no progress bar on stderr (off without a TTY)"
    )
    refuse_old_spellings(parser, {"--ckpt": "--ckpt_path"})
    return parser


def main(argv: list[str]) -> None:
    parser = build_parser(argparse.ArgumentParser(prog="dpot evaluate", description=DESCRIPTION))
    args = parser.parse_args(argv)
    record = evaluate(args)  # a bad value raises: `dpot` prints it in one line (lightning_dpot.cli)
    if LEAKAGE in record["results"]:
        from lightning_dpot.metrics.leakage import NOT_FOR_RELEASE

        print(f"dpot evaluate: leakage: {NOT_FOR_RELEASE}", file=sys.stderr)
    if not args.no_report:
        # What is derived from the raw training records without noise stays on this screen.
        results = {k: v for k, v in record["results"].items() if k != LEAKAGE}
        record_out = {**record, "results": results}
        report = args.report
        if report is None and "config" in record:
            report = Path(record["config"]).parent / "report.json"
        if report is not None:
            append_to_report(Path(report), record_out)
            record["report"] = str(report)
    print(json.dumps(record, indent=2))
