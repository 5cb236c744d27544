"""A comparison suite: methods × data sources × ε values × seeds, one evaluator set.

A suite file (``configs/compare/<suite>.yaml``) reads::

    name: two_d
    epsilons: [1, 5, 10]        # target ε of every cell (each method's own notion)
    delta: 1.0e-5               # δ of (ε, δ) guarantees (central methods, Gaussian LDP)
    seeds: [0, 1, 2]            # seed_everything of the cell; every cell's release is fresh
    sources:                    # each method runs on each source (a data-source class)
      half_circle: {class_path: lightning_dpot.data.HalfCircle, init_args: {n: 5000}}
    methods:
      entropic_wgan:
        config: two_d/entropic_wgan.yaml   # a `dpot fit` config, relative to the suite file
        set:                               # config keys each cell sets (below)
          data.init_args.epsilon: "{epsilon}"
          data.init_args.delta: "{delta}"
          data.init_args.source: "{source}"
          data.init_args.cache_dir: "{cell_dir}/cache"
        sources: [half_circle]             # optional: only these sources
    prepare:                    # optional: non-private runs done once, before the grid
      autoencoder: {config: mnist_shipped/autoencoder.yaml, set: {...}}
    evaluation: {num_samples: 2000, w2: {subsample: 200, repeats: 10}, manifold: true}
    published: [...]            # optional: numbers from the papers, shown beside the suite's
                                # (or a shared table file: published/fashion_mnist.yaml)
    differences: [...]          # optional: [aspect, the papers, this suite] rows
                                # (``lightning_dpot.compare.published``)

A ``set`` value that is exactly ``"{epsilon}"``, ``"{delta}"``, ``"{source}"`` or ``"{seed}"``
is replaced by that value (a number, or the source's mapping); other strings are formatted with
``{epsilon}``, ``{delta}``, ``{seed}``, ``{cell_dir}`` (the cell's directory), ``{out_dir}`` (the
suite's run directory) and ``{prepare[NAME]}`` (the directory of a ``prepare`` run), e.g. a
stage-1 autoencoder checkpoint shared by every cell of a two-stage method (Sebag et al. 2023).

The suite states the *target* ε; the ε a cell reports is read from its own ``report.json``
(the product's accountant or LDP report), never from this file.
"""

from __future__ import annotations

import json
import math
import pickle
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from lightning_dpot.compare.published import (
    PublishedResult,
    parse_differences,
    parse_published,
)
from lightning_dpot.metrics.selection import METRICS, MetricSelection
from lightning_dpot.resources import resolve_path

__all__ = ["Cell", "MethodSpec", "PrepareSpec", "Suite", "load_suite"]

_WHOLE_VALUE = re.compile(r"^\{(epsilon|delta|source|seed)\}$")
_EVALUATORS = ("num_samples", "w2", "manifold", "frechet", "utility", "grid")
_KEYS = (
    "name", "description", "epsilons", "delta", "seeds", "sources", "methods", "prepare",
    "evaluation", "published", "differences",
)  # fmt: skip


@dataclass(frozen=True)
class MethodSpec:
    """One method of a suite: its ``dpot fit`` config and the keys each cell sets."""

    name: str
    config: Path
    set: dict[str, Any]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class PrepareSpec:
    """A non-private run done once before the grid (e.g. an autoencoder on public data)."""

    name: str
    config: Path
    set: dict[str, Any]


@dataclass(frozen=True)
class Cell:
    """One run: a method on a source at a target ε with a seed."""

    method: str
    source: str
    epsilon: float
    seed: int

    @property
    def key(self) -> str:
        """The cell's directory name, e.g. ``entropic_wgan/half_circle/eps5/seed0``."""
        eps = f"{self.epsilon:g}".replace(".", "p")
        return f"{self.method}/{self.source}/eps{eps}/seed{self.seed}"


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    epsilons: tuple[float, ...]
    delta: float
    seeds: tuple[int, ...]
    sources: dict[str, dict]
    methods: dict[str, MethodSpec]
    prepare: dict[str, PrepareSpec] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    published: tuple[PublishedResult, ...] = ()
    differences: tuple[tuple[str, str, str], ...] = ()

    def cells(self) -> list[Cell]:
        """Every cell, ordered by ε, then seed, then source and method (so an interrupted run
        has every method at the first ε before any at the next)."""
        return [
            Cell(method, source, eps, seed)
            for eps in self.epsilons
            for seed in self.seeds
            for source in self.sources
            for method, spec in self.methods.items()
            if source in spec.sources
        ]

    def values(self, out_dir: Path, cell: Cell | None = None, cell_dir: Path | None = None):
        """What the placeholders of ``set`` stand for (module docstring)."""
        values: dict[str, Any] = {
            "delta": self.delta,
            "out_dir": str(out_dir),
            "prepare": {name: str(out_dir / "prepare" / name) for name in self.prepare},
        }
        if cell is not None:
            values.update(
                epsilon=cell.epsilon,
                source=self.sources[cell.source],
                seed=cell.seed,
                cell_dir=str(cell_dir),
            )
        return values

    def overrides(self, setters: dict[str, Any], values: dict[str, Any]) -> list[str]:
        """``--key=value`` arguments for ``setters`` with the placeholders filled in (strings as
        they are, anything else as JSON; jsonargparse parses both)."""
        args = []
        for key, template in setters.items():
            value = _fill(template, values)
            text = value if isinstance(value, str) else json.dumps(value)
            args.append(f"--{key}={text}")
        return args


def _fill(template: Any, values: dict[str, Any]) -> Any:
    if not isinstance(template, str):
        return template
    whole = _WHOLE_VALUE.match(template)
    if whole:
        return values[whole.group(1)]
    return template.format_map(values)


def _fail(path: Path, message: str) -> ValueError:
    return ValueError(f"suite {str(path)!r}: {message}")


def _positive_floats(path: Path, name: str, values: Any) -> tuple[float, ...]:
    if not isinstance(values, list) or not values:
        raise _fail(path, f"{name} must be a non-empty list of numbers > 0, got {values!r}")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, f"{name} must hold numbers > 0, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise _fail(path, f"{name} must hold finite numbers > 0, got {value!r}")
        out.append(float(value))
    return tuple(out)


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file (on disk, or one of the package's own ``configs/compare/``
    suites); every error names the key and the accepted values."""
    path = Path(resolve_path(str(path)))
    if not path.is_file():
        raise FileNotFoundError(f"--config={str(path)!r}: no such suite file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise _fail(path, "must be a mapping with name, epsilons, seeds, sources, methods")
    unknown = set(raw) - set(_KEYS)
    if unknown:
        raise _fail(path, f"unknown keys {sorted(unknown)}")
    epsilons = _positive_floats(path, "epsilons", raw.get("epsilons"))
    delta = raw.get("delta", 1e-5)
    if not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise _fail(path, f"delta must lie in (0, 1), got {delta!r}")
    seeds = raw.get("seeds", [0])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise _fail(path, f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds) or len(set(epsilons)) != len(epsilons):
        raise _fail(path, "seeds and epsilons must not repeat")
    sources = raw.get("sources")
    if (
        not isinstance(sources, dict)
        or not sources
        or not all(isinstance(s, dict) and "class_path" in s for s in sources.values())
    ):
        raise _fail(path, "sources must map names to {class_path, init_args} data sources")
    methods_raw = raw.get("methods")
    if not isinstance(methods_raw, dict) or not methods_raw:
        raise _fail(path, "methods must map method names to {config, set, sources}")
    methods = {}
    for name, spec in methods_raw.items():
        if not isinstance(spec, dict) or "config" not in spec:
            raise _fail(path, f"methods.{name} needs a config (a `dpot fit` YAML)")
        config = (path.parent / spec["config"]).resolve()
        if not config.is_file():
            raise _fail(path, f"methods.{name}.config={spec['config']!r}: no such file")
        setters = spec.get("set", {})
        if not isinstance(setters, dict) or not any(v == "{epsilon}" for v in setters.values()):
            raise _fail(path, f"methods.{name}.set must map a config key to '{{epsilon}}'")
        only = spec.get("sources", list(sources))
        missing = [s for s in only if s not in sources]
        if missing:
            raise _fail(path, f"methods.{name}.sources names unknown sources {missing}")
        methods[name] = MethodSpec(name, config, dict(setters), tuple(only))
    prepare = {}
    for name, spec in (raw.get("prepare") or {}).items():
        if not isinstance(spec, dict) or "config" not in spec:
            raise _fail(path, f"prepare.{name} needs a config (a `dpot fit` YAML)")
        config = (path.parent / spec["config"]).resolve()
        if not config.is_file():
            raise _fail(path, f"prepare.{name}.config={spec['config']!r}: no such file")
        prepare[name] = PrepareSpec(name, config, dict(spec.get("set") or {}))
    _check_placeholders(path, methods, prepare)
    evaluation = raw.get("evaluation", {}) or {}
    unknown = set(evaluation) - set(_EVALUATORS)
    if unknown:
        raise _fail(path, f"evaluation has unknown keys {sorted(unknown)}; known: {_EVALUATORS}")
    try:
        suite_metrics(evaluation)
    except ValueError as err:
        raise _fail(path, f"evaluation: {err}") from None
    try:
        published = parse_published(raw.get("published"), methods, path.parent)
        differences = parse_differences(raw.get("differences"))
    except ValueError as err:
        raise _fail(path, str(err)) from None
    return Suite(
        name=str(raw.get("name", path.stem)),
        path=path.resolve(),
        epsilons=epsilons,
        delta=float(delta),
        seeds=tuple(seeds),
        sources=dict(sources),
        methods=methods,
        prepare=prepare,
        evaluation=dict(evaluation),
        description=str(raw.get("description", "")).strip(),
        published=published,
        differences=differences,
    )


def _check_placeholders(
    path: Path, methods: dict[str, MethodSpec], prepare: dict[str, PrepareSpec]
) -> None:
    """Fail at load, naming the key, on a placeholder that no cell could fill."""
    cell_values = {
        "epsilon": 1.0, "delta": 1e-5, "source": {}, "seed": 0, "cell_dir": "", "out_dir": "",
        "prepare": {name: "" for name in prepare},
    }  # fmt: skip
    prepare_values = {"delta": 1e-5, "out_dir": "", "prepare": cell_values["prepare"]}
    groups = [(f"methods.{m.name}.set", m.set, cell_values) for m in methods.values()]
    groups += [(f"prepare.{p.name}.set", p.set, prepare_values) for p in prepare.values()]
    for where, setters, values in groups:
        for key, template in setters.items():
            try:
                _fill(template, values)
            except (KeyError, IndexError, ValueError) as err:
                raise _fail(
                    path,
                    f"{where}.{key}={template!r}: unknown placeholder {err}; known: {{epsilon}}, "
                    "{delta}, {source}, {seed}, {cell_dir}, {out_dir}, {prepare[NAME]}",
                ) from None


def suite_metrics(settings: dict) -> MetricSelection | None:
    """The metrics of a suite's ``evaluation`` section (``None``: it selects none); the Fréchet
    distance defaults to the classifier's features with the held-out split halved
    (``split_reference``)."""
    spec = {name: settings[name] for name in METRICS if settings.get(name, False) is not False}
    if not spec:
        return None
    if "frechet" in spec:
        defaults = {"feature_extractor": "classifier", "split_reference": True}
        given = spec["frechet"] if isinstance(spec["frechet"], dict) else {}
        spec["frechet"] = {**defaults, **given}
    return MetricSelection.parse(spec)


def check_inception_weights(weights_path: str | Path) -> str:
    """Build the FID network from the local weights file once, before anything trains; returns
    its absolute path.

    Raises:
        FileNotFoundError: naming ``feature_extractor_weights_path`` and how to get the file.
        ModuleNotFoundError: without torch-fidelity.
        ValueError: a file that does not load as the InceptionV3 weights.
    """
    from lightning_dpot.metrics.fid import InceptionFID

    path = str(Path(weights_path).expanduser().resolve())
    try:
        InceptionFID(path)
    except (RuntimeError, pickle.UnpicklingError, EOFError) as error:
        raise ValueError(
            f"feature_extractor_weights_path={path!r} does not load as the torch-fidelity "
            f"InceptionV3 weights ({type(error).__name__}: {str(error).splitlines()[0]})"
        ) from None
    return path


def with_inception_weights(suite: Suite, weights_path: str | Path) -> Suite:
    """``suite`` with its Fréchet distance measured as FID on InceptionV3 features from the
    local weights file ``weights_path`` (torch-fidelity's
    ``weights-inception-2015-12-05-6726825d.pth``; check it first with
    ``check_inception_weights``), so that its rows sit beside published FIDs. Every other
    evaluation setting is kept; a cell's fingerprint holds the file's digest, not its path.

    Raises:
        ValueError: the suite measures no Fréchet distance (``evaluation.frechet``).
    """
    if not suite.evaluation.get("frechet"):
        raise ValueError(
            f"feature_extractor_weights_path: suite {suite.name!r} measures no Fréchet distance "
            "(its evaluation has no frechet section), so there is no FID to measure"
        )
    path = str(Path(weights_path).expanduser().resolve())
    frechet = {"feature_extractor": "inception", "weights_path": path}
    return replace(suite, evaluation={**suite.evaluation, "frechet": frechet})
