"""Standalone generators: a trained method as one TorchScript file that samples with plain torch.

``export_generator`` asks the method for its standalone sampler (``Exportable``; the
modules of ``lightning_dpot.nn.samplers``), compiles it with ``torch.jit.script`` and saves
it with ``torch.jit.save``. The file loads without this package::

    import torch
    generator = torch.jit.load("generator.pt")
    x = generator.sample(16, seed=0)  # (16, *generator.record_shape), on the CPU

A class-conditional generator also has ``x, y = generator.sample_labeled(16, seed=0)``; a
particle flow's file holds its N particles with the public decoder, and ``sample(n)`` draws
``n ≤ N`` of them without replacement, decoded (more samples need a new flow, i.e. new private
releases). The run's privacy report travels inside the file, as the extra file
``report.json``::

    files = {"report.json": ""}
    generator = torch.jit.load("generator.pt", _extra_files=files)
    embedded = json.loads(files["report.json"])  # privacy, config, method, sampler

What goes in: the sampler's parameters and buffers (the trained network's; or the particles,
post-processing of noisy releases, and the decoder of the public stage-1 autoencoder), its
sampling rule, and the report's ``privacy`` section and the run's config, which the run already
wrote, as they may leave the machine: without the privacy ledger's entry (its total over every
release of the same records depends, without noise, on which records other releases held) or
the release journal, and with absolute paths replaced. Nothing else of the module: no release
cache, no optimizer state, no private record.

A network TorchScript cannot compile (e.g. one calling ``super().forward``) is traced on two
rows instead (``torch.jit.trace``). Either way the saved file is loaded back, and its seeded
draw must equal the uncompiled sampler's (on three rows), or the export is refused.

Why TorchScript: the file must hold a sampling rule (latent law, labels, seeded draws) beside
the network and run without the Python classes that built it. ``torch.export``, which PyTorch
now recommends over ``torch.jit`` (PyTorch 2.14 marks ``torch.jit`` deprecated with a
``FutureWarning``, which loading a file also shows), captures one traced ``forward`` and cannot
hold a seeded sampler.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from lightning_dpot._version import __version__
from lightning_dpot.nn.samplers import StandaloneSampler
from lightning_dpot.privacy.accounting.report import shareable_report

__all__ = [
    "EMBEDDED_REPORT",
    "Exportable",
    "compile_sampler",
    "export_generator",
    "read_embedded_report",
    "save_sampler",
    "standalone_sampler",
]

#: Name of the extra file of ``torch.jit.save`` that holds the run's report.
EMBEDDED_REPORT = "report.json"
_CHECK_SEED, _CHECK_ROWS = 0, 3


@runtime_checkable
class Exportable(Protocol):
    """A method whose trained model samples on its own: ``standalone_sampler()`` returns a
    TorchScript-able module of ``lightning_dpot.nn.samplers`` (a copy, on the CPU) holding
    only released or post-processed quantities."""

    def standalone_sampler(self) -> StandaloneSampler: ...


def standalone_sampler(model: object) -> StandaloneSampler:
    """``model.standalone_sampler()``, refusing a model that has none in one line."""
    if not isinstance(model, Exportable):
        raise TypeError(
            f"{type(model).__name__} cannot be exported: it defines no standalone sampler "
            "(lightning_dpot.export.Exportable); the generator methods (EntropicWGAN, NoisyWGAN, "
            "DPSinkhorn, DPSWGen) and the particle flows (DPSWFlow, DPSWFlowR) have one"
        )
    return model.standalone_sampler()


@contextmanager
def _quiet_jit() -> Iterator[None]:
    """Warnings off for torch.jit's deprecation notice (torch.export, its successor, cannot hold
    a seeded sampler: docs/exports.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit")
        yield


def _first_line(error: BaseException) -> str:
    """The first non-empty line of ``error``'s message (TorchScript's start with a newline)."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), repr(error))


def _draw(sampler: StandaloneSampler | torch.jit.ScriptModule) -> tuple[torch.Tensor, ...]:
    """The seeded check draw (records, and labels for a conditional sampler)."""
    rows = min(_CHECK_ROWS, sampler.max_samples) if sampler.max_samples > 0 else _CHECK_ROWS
    if sampler.num_classes > 0:
        return tuple(sampler.sample_labeled(rows, _CHECK_SEED))
    return (sampler.sample(rows, _CHECK_SEED),)


def compile_sampler(sampler: StandaloneSampler) -> tuple[torch.jit.ScriptModule, str]:
    """``(torch.jit.script(sampler), "script")``, or ``(…, "trace")`` when TorchScript cannot
    compile the network and it is traced first (``trace_network``, which replaces the sampler's
    network by its trace).

    Raises:
        ValueError: the network can be neither scripted nor traced.
    """
    with _quiet_jit():
        try:
            return torch.jit.script(sampler), "script"
        except Exception as script_error:  # TorchScript raises many kinds
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            try:
                sampler.trace_network()
                return torch.jit.script(sampler), "trace"
            except Exception as trace_error:
                raise ValueError(
                    f"the network of {type(sampler).__name__} can be neither scripted nor "
                    f"traced by TorchScript: {_first_line(trace_error)} (scripting failed "
                    f"with: {_first_line(script_error)})"
                ) from trace_error


def describe(scripted: torch.jit.ScriptModule, how: str) -> dict[str, Any]:
    """The sampler's attributes, as the embedded report states them."""
    out = {
        "kind": scripted.kind,
        "record_shape": list(scripted.record_shape),
        "latent": scripted.latent,
        "latent_dim": scripted.latent_dim,
        "num_classes": scripted.num_classes,
        "max_samples": None if scripted.max_samples < 0 else scripted.max_samples,
        "compiled_by": f"torch.jit.{how}",
    }
    if scripted.latent == "uniform":
        out["latent_range"] = [scripted.latent_low, scripted.latent_high]
    return out


def save_sampler(
    sampler: StandaloneSampler,
    path: str | Path,
    *,
    privacy: dict[str, Any] | None,
    config: dict[str, Any] | None,
    method: str,
) -> dict[str, Any]:
    """Compile ``sampler`` (``compile_sampler``) and save it to ``path`` with the embedded
    report ``{"method", "sampler", "privacy", "config", "lightning_dpot"}``; returns that
    report. ``privacy`` and ``config`` go in as they may leave the machine
    (``shareable_report``: no ledger or journal, no
    absolute path). The saved file is loaded back and its seeded draw compared with the uncompiled
    sampler's (another batch size than a trace's) before it takes the name ``path``.

    Raises:
        ValueError: the sampler cannot be compiled, or the saved file does not reproduce its
            draws (e.g. a traced network whose forward depends on more than input shapes).
    """
    expected = _draw(sampler)
    scripted, how = compile_sampler(sampler)
    embedded = {
        "method": method,
        "sampler": describe(scripted, how),
        "privacy": shareable_report(privacy),
        "config": shareable_report(config),
        "lightning_dpot": __version__,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(embedded, indent=2, sort_keys=True, default=str)
    staging = path.with_name(f".{path.name}.tmp")
    try:
        with _quiet_jit():
            torch.jit.save(scripted, str(staging), _extra_files={EMBEDDED_REPORT: text})
            got = _draw(torch.jit.load(str(staging), map_location="cpu"))
        if any(
            a.shape != b.shape or not torch.allclose(a.float(), b.float(), atol=1e-5)
            for a, b in zip(expected, got, strict=True)
        ):
            raise ValueError(
                f"the saved sampler (torch.jit.{how}) does not reproduce {method}'s draws: "
                "its network depends on more than the input shapes a trace records"
            )
        staging.replace(path)
    finally:
        staging.unlink(missing_ok=True)
    return embedded


def export_generator(
    model: object,
    path: str | Path,
    *,
    privacy: dict[str, Any] | None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``model``'s standalone generator to ``path`` (module docstring); returns the
    embedded report.

    Args:
        model: a trained method implementing ``Exportable``.
        path: the TorchScript file to write (parents are created).
        privacy: the ``privacy`` section of the run's ``report.json`` (``None``: the run had
            none, e.g. a non-private reference).
        config: the run's ``config.yaml`` as a mapping.

    Raises:
        TypeError: ``model`` has no standalone sampler.
        ValueError: the sampler cannot be saved faithfully (``save_sampler``).

    Example (an untrained generator here; a fitted run's model comes from
    ``lightning_dpot.commands.checkpoint.load_model(ckpt)`` and its privacy section from its
    ``report.json``, which ``dpot export`` reads for you)::

        >>> import pathlib, tempfile, torch
        >>> from lightning_dpot.methods import EntropicWGAN
        >>> from lightning_dpot.nn import MLPGenerator
        >>> model = EntropicWGAN(MLPGenerator(2, [2], [8]), latent_range=(-2.0, 3.0))
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "generator.pt"
        >>> embedded = export_generator(model, path, privacy=None)
        >>> embedded["method"], read_embedded_report(path)["method"]
        ('EntropicWGAN', 'EntropicWGAN')
        >>> torch.jit.load(path).sample(16, seed=0).shape  # plain torch, no lightning_dpot
        torch.Size([16, 2])
    """
    sampler = standalone_sampler(model)
    return save_sampler(sampler, path, privacy=privacy, config=config, method=type(model).__name__)


def read_embedded_report(path: str | Path) -> dict[str, Any]:
    """The report embedded in an exported generator (what ``_extra_files`` returns, parsed)."""
    files = {EMBEDDED_REPORT: ""}
    with _quiet_jit():
        torch.jit.load(str(path), map_location="cpu", _extra_files=files)
    return json.loads(files[EMBEDDED_REPORT])
