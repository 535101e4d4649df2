"""The project's own modules are imported at the top of files, where readers, mypy and the
import-linter see the dependency graph (issue 26). A function may import one of them only when
that module needs an optional extra: it imports, at its top (itself or through the project's
other modules), a package that only an extra of pyproject.toml brings (the command's
``EXTRAS``: the job store's sqlalchemy, the Kubernetes client, FastAPI...), or matplotlib for a
chart. A base install then still runs what needs no extra, and a command that needs one names
it (tests/test_install_extras.py).
``idlegpu`` keeps its start fast with one documented exception (``_a_command_importing_its_work``):
the root loads a command's module only when that command runs or shows its help
(idlegpu.scheduler.cli.registry), and that module holds the command's signature alone; its
work, imported by the command function, is in ``idlegpu.scheduler.cli.actions``. And no import
cycle between modules."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import networkx as nx

from idlegpu.scheduler.cli.common import EXTRAS
from idlegpu.scheduler.cli.registry import COMMANDS, PACKAGE

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"forecast": "idlegpu.forecast", "scheduler": "idlegpu.scheduler"}
# what a function may load on demand: the packages of the extras, and matplotlib, which only a
# chart needs (a third of a second: `idlegpu plan --help` would wait for it)
ON_DEMAND = frozenset(EXTRAS) | {"matplotlib"}
# function-level imports of a module that needs no extra, each with its reason: none (but the
# one rule of _a_command_importing_its_work)
ALLOWED: dict[tuple[str, str], str] = {}
# the CLI's command modules (registry.COMMANDS): each holds its commands' signatures, and each
# command imports what does its work from ACTIONS
SIGNATURES = frozenset(f"{PACKAGE}.{module}" for module, _ in COMMANDS.values())
ACTIONS = f"{PACKAGE}.actions"


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The modules an import statement loads (``from package import submodule`` loads that
    submodule), the project's own or not."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names]


@cache
def _imports(module: str) -> tuple[list[str], list[tuple[int, str, str]]]:
    """What a module imports at its top (outside functions, ``TYPE_CHECKING`` blocks
    included: they run for no one), and its function-level imports (line, function, module)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    top: list[str] = []
    inner: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]), function)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, module):
                    if function is None:
                        top.append(target)
                    else:
                        inner.append((child.lineno, function, target))
            else:
                visit(child, function)

    visit(tree, None)
    return top, sorted(set(inner))


def _own(name: str) -> bool:
    return name.startswith("idlegpu.")


def _commands(module: str) -> frozenset[str]:
    """The functions of ``module`` that are commands: decorated with ``<a Typer app>.command``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return frozenset(
        node.name for node in tree.body if isinstance(node, ast.FunctionDef)
        for decorator in node.decorator_list
        if isinstance(call := decorator.func if isinstance(decorator, ast.Call) else decorator,
                      ast.Attribute) and call.attr == "command")


def _a_command_importing_its_work(module: str, function: str, target: str) -> bool:
    """The one exception to the rule, beside the extras: a command function of a signature
    module of ``idlegpu.scheduler.cli`` (``planning``, ``jobs``...: a module of
    ``registry.COMMANDS``) may import a module of ``idlegpu.scheduler.cli.actions``, which does
    the command's work. Why: the root imports a command's module for its ``--help`` too (the
    options and help texts are read from the function's signature), and the work imports
    pandas, the forecasters and the simulator at its top: ``idlegpu plan --help`` waited two
    seconds for them (tests/test_cli_startup.py keeps every command's help light). The
    signature module itself imports only what starts fast, at its top; the actions module
    imports at its top as every other module does. Nothing else: not a helper of a signature
    module, not another module, not another target."""
    return (module in SIGNATURES and target.startswith(f"{ACTIONS}.")
            and function in _commands(module))


@cache
def _top_level_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for name in MODULES:
        graph.add_node(name)
        graph.add_edges_from((name, target) for target in _imports(name)[0])
        if "." in name.removeprefix("idlegpu.") and name.rpartition(".")[0] in MODULES:
            graph.add_edge(name, name.rpartition(".")[0])  # a submodule runs its package first
    return graph


def _extras_needed(module: str) -> frozenset[str]:
    """The packages of ``ON_DEMAND`` that ``module`` imports at its top, itself or through the
    project's modules it (and, for a submodule, its packages) imports there."""
    graph = _top_level_graph()
    reached = nx.descendants(graph, module) | {module} if module in graph else {module}
    return frozenset(name.split(".")[0] for name in reached if name.split(".")[0] in ON_DEMAND)


def _function_level_imports() -> list[tuple[str, int, str, str]]:
    return [(module, line, function, target) for module in MODULES
            for line, function, target in _imports(module)[1] if _own(target)]


def test_the_project_imports_its_modules_at_the_top_but_for_the_extras():
    found = [(module, line, function, target)
             for module, line, function, target in _function_level_imports()
             if not _a_command_importing_its_work(module, function, target)]
    hidden = [f"{MODULES[module].relative_to(REPO)}:{line} {function}() imports {target}"
              for module, line, function, target in found
              if not _extras_needed(target) and (module, target) not in ALLOWED]
    assert not hidden, "import these at the top of the file:\n" + "\n".join(hidden)
    assert len(found) < 60  # 145 before the CLI loaded its commands on demand


def test_the_rule_sees_the_extras_and_a_hidden_import(tmp_path):
    assert _extras_needed("idlegpu.scheduler.adapters.store") >= {"sqlalchemy"}
    assert _extras_needed("idlegpu.scheduler.server") >= {"fastapi"}
    assert _extras_needed("idlegpu.forecast.plots") == {"matplotlib"}
    assert not _extras_needed("idlegpu.scheduler.plan")  # the analyst's install runs plan
    path = tmp_path / "hidden.py"
    path.write_text("def f():\n    from idlegpu.scheduler.plan import tonight\n")
    MODULES["idlegpu.scheduler.hidden_example"] = path
    _imports.cache_clear()
    try:
        assert ("idlegpu.scheduler.hidden_example", 2, "f", "idlegpu.scheduler.plan") \
            in _function_level_imports()
    finally:
        del MODULES["idlegpu.scheduler.hidden_example"]


def test_the_one_exception_is_a_command_importing_its_work(tmp_path):
    planning = f"{PACKAGE}.planning"
    assert planning in SIGNATURES and "plan" in _commands(planning)
    path = tmp_path / "planning.py"
    path.write_text("@app.command()\n"
                    "def plan():\n"
                    "    from idlegpu.scheduler.cli.actions import planning as actions\n"
                    "    from idlegpu.scheduler.plan import tonight\n"
                    "def _helper():\n"
                    "    from idlegpu.scheduler.cli.actions import planning\n")
    real = MODULES[planning]
    MODULES[planning] = path
    _imports.cache_clear()
    try:
        found = {(line, function, target): _a_command_importing_its_work(module, function,
                                                                         target)
                 for module, line, function, target in _function_level_imports()
                 if module == planning}
    finally:
        MODULES[planning] = real
        _imports.cache_clear()
    assert found == {(3, "plan", f"{ACTIONS}.planning"): True,
                     (4, "plan", "idlegpu.scheduler.plan"): False,  # not its work: at the top
                     (6, "_helper", f"{ACTIONS}.planning"): False}  # not a command
    # outside the signature modules (the shared options, the actions themselves): none
    assert not _a_command_importing_its_work(f"{PACKAGE}.common", "main", f"{ACTIONS}.planning")
    assert not _a_command_importing_its_work(f"{ACTIONS}.planning", "plan",
                                             f"{ACTIONS}.forecasting")


def _cycles(root: Path) -> list[list[str]]:
    """Import cycles between the project's modules as Python runs them (imports for type
    checkers only left out), by grimp (the import-linter's graph) in a fresh interpreter that
    finds the package at ``root``."""
    code = (
        "import grimp, json, sys\n"
        "graph = grimp.build_graph('idlegpu.forecast', 'idlegpu.scheduler', cache_dir=None,\n"
        "                          exclude_type_checking_imports=True)\n"
        "edges = [(m, t) for m in graph.modules if m.startswith('idlegpu.')\n"
        "         for t in graph.find_modules_directly_imported_by(m)\n"
        "         if t.startswith('idlegpu.')]\n"
        "json.dump(edges, sys.stdout)\n")
    env_path = {"PYTHONPATH": str(root)} if root != REPO else {}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, **env_path}, timeout=300)
    graph = nx.DiGraph(json.loads(done.stdout))
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_import_cycle_between_the_modules():
    assert _cycles(REPO) == []


def test_a_cycle_is_found(tmp_path):
    # the copy laid out as installed, found first through PYTHONPATH (as test_architecture's)
    for part in FOLDERS:
        shutil.copytree(REPO / part, tmp_path / "idlegpu" / part)
    (tmp_path / "idlegpu" / "forecast" / "errors.py").write_text(
        (REPO / "forecast" / "errors.py").read_text() + "\nimport idlegpu.forecast.redact\n")
    redact = tmp_path / "idlegpu" / "forecast" / "redact.py"
    redact.write_text(redact.read_text() + "\nimport idlegpu.forecast.errors\n")
    assert ["idlegpu.forecast.errors", "idlegpu.forecast.redact"] in _cycles(tmp_path)
