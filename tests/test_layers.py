"""The package is layered: every import (module level or inside a function) goes from a layer to
a lower one, and no set of modules imports itself in a circle.

Layers, bottom up (docs/design.md, "Package layout"):

0. ``_version``, ``checks``, ``resources`` — the version, argument checks, the packaged configs;
1. ``config``, ``rng``, ``grids``, ``distributed``, ``loggers``, ``plugins``, ``locks`` — YAML
   composition, random sources (seeded and OS) and small utilities;
2. ``ot`` (optimal transport, knows nothing of privacy) and ``privacy`` (mechanisms, accounting,
   the contract);
3. ``data``, ``nn``, ``generative``;
4. ``methods``, ``metrics``, ``export`` (standalone generators of trained methods);
5. ``callbacks``, ``audit``;
6. ``training`` (LightningCLI runs);
7. ``compare``;
8. ``commands``;
9. ``cli`` (dispatch only), and the package's ``__init__`` (its public face).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_dpot"
LAYERS = [
    {"_version", "checks", "resources"},
    {"config", "rng", "grids", "distributed", "loggers", "plugins", "locks"},
    {"ot", "privacy"},
    {"data", "nn", "generative"},
    {"methods", "metrics", "export"},
    {"callbacks", "audit"},
    {"training"},
    {"compare"},
    {"commands"},
    {"cli", "__init__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["lightning_dpot", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _unit(module: str) -> str:
    """The layer unit of a module: its top-level subpackage or module under the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``module`` imports, anywhere in its body."""
    out = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in _modules()}
    assert units <= set(RANK), f"units without a layer: {sorted(units - set(RANK))}"


def test_imports_only_go_down_the_layers():
    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in _graph().items()
        for t in targets
        if _unit(t) != _unit(m) and RANK[_unit(t)] >= RANK[_unit(m)]
    )
    assert not wrong, "imports that do not go down a layer:\n" + "\n".join(wrong)


def test_no_import_circle_between_modules():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"
