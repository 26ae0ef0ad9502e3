"""Imports point one way, with no hidden ones.

The layers, lowest first: ``broker_adapter`` (0) <- ``scheduler`` (1) <-
``spark_tasks`` (2) <- ``workers`` (3). A module may import its own package and
the layers below it, never one above. The walk reads every module's source with
:mod:`ast`: module-level imports, imports inside functions (and under
``TYPE_CHECKING``), and ``importlib.import_module("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS: dict[str, int] = {"broker_adapter": 0, "scheduler": 1, "spark_tasks": 2, "workers": 3}


def module_name(path: Path) -> str:
    """``workers.executors.base`` for ``ROOT/workers/executors/base.py``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> Iterator[str]:
    """Every module name ``source`` (the module ``module``) imports, wherever the import is."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.module
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value


def _is_import_module(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr in ("import_module", "__import__")
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that point to a higher layer than its own."""
    own = LAYERS[module.partition(".")[0]]
    return sorted(
        name
        for name in set(imported_modules(source, module, is_package))
        if LAYERS.get(name.partition(".")[0], -1) > own
    )


def package_cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The cycles of a package dependency graph (each as a path back to its start)."""
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for target in sorted(edges.get(node, ())):
            visit(target, [*path, node])
        done.add(node)

    for start in sorted(edges):
        visit(start, [])
    return cycles


def _modules() -> Iterator[tuple[Path, str]]:
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, module_name(path)


def test_every_package_is_walked() -> None:
    walked = {name.partition(".")[0] for _, name in _modules()}
    assert walked == set(LAYERS)
    assert sum(1 for _ in _modules()) > 40


def test_no_module_imports_a_higher_layer() -> None:
    found = {
        name: up
        for path, name in _modules()
        if (up := upward_imports(path.read_text(), name, path.name == "__init__.py"))
    }
    assert found == {}, "upward imports (layer order: " + " <- ".join(LAYERS) + ")"


def test_no_import_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = {package: set() for package in LAYERS}
    for path, name in _modules():
        own = name.partition(".")[0]
        for target in imported_modules(path.read_text(), name, path.name == "__init__.py"):
            top = target.partition(".")[0]
            if top in LAYERS and top != own:
                edges[own].add(top)
    assert package_cycles(edges) == []
    assert "workers" not in edges["scheduler"] and "spark_tasks" not in edges["scheduler"]


# -- the walker catches what it must (planted sources) ---------------------------------

PLANTED = """
import importlib
from typing import TYPE_CHECKING

from broker_adapter.errors import ChronoqError
from . import spec

if TYPE_CHECKING:
    from spark_tasks.session import get_spark


def run(app):
    from workers.runner import run_app

    return importlib.import_module("workers.cli"), run_app
"""


def test_the_walker_finds_function_level_hidden_and_type_only_imports() -> None:
    names = set(imported_modules(PLANTED, "scheduler.scheduler"))
    assert {"broker_adapter.errors", "scheduler", "workers.runner", "workers.cli"} <= names
    assert upward_imports(PLANTED, "scheduler.scheduler") == [
        "spark_tasks.session",
        "workers.cli",
        "workers.runner",
    ]
    # the same imports are fine one layer up
    assert upward_imports(PLANTED, "workers.cli") == []


@pytest.mark.parametrize(
    "planted",
    [
        "def f():\n    import workers\n",
        "def f():\n    from workers import cli\n",
        "import importlib\nm = importlib.import_module('spark_tasks.jobs')\n",
        "from importlib import import_module\nm = import_module('workers')\n",
        "m = __import__('workers.trace')\n",
    ],
)
def test_each_way_of_importing_upward_is_caught(planted: str) -> None:
    assert upward_imports(planted, "scheduler.apps") != []


def test_relative_imports_resolve_to_their_package() -> None:
    assert set(
        imported_modules("from .base import X\nfrom .. import routing\n", "workers.executors.spark")
    ) == {
        "workers.executors.base",
        "workers",
    }
    assert set(imported_modules("from .base import X\n", "workers.executors", is_package=True)) == {
        "workers.executors.base"
    }


def test_the_cycle_check_finds_a_cycle() -> None:
    assert package_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert package_cycles({"a": {"b"}, "b": set()}) == []
