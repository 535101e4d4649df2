"""The package is typed and its types are checked: `mypy` passes on the whole of `idlegpu` (the
pure core strictly: pyproject.toml's [tool.mypy]), and code outside the checkout that imports
`idlegpu` from the development install (scripts/test.sh's, the README's: a strict editable
install, which links the folders into a tree static tools can follow) sees our types, not a
missing import typed `Any`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the pure core: forecast math and admission policy
STRICT = ("idlegpu.forecast.models.*", "idlegpu.forecast.capacity", "idlegpu.scheduler.policy",
          "idlegpu.scheduler.policy.*", "idlegpu.scheduler.types",
          "idlegpu.scheduler.admission_checks", "idlegpu.scheduler.native_jobs",
          "idlegpu.scheduler.kube_objects")


def mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False)


def test_the_whole_package_type_checks():
    result = mypy("-p", "idlegpu.forecast", "-p", "idlegpu.scheduler", cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_the_pure_core_is_checked_strictly():
    overrides = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["mypy"]["overrides"]
    strict = next(o for o in overrides if o.get("disallow_untyped_defs"))
    assert set(strict["module"]) == set(STRICT)
    for flag in ("disallow_incomplete_defs", "disallow_untyped_calls", "disallow_any_generics",
                 "strict_equality", "no_implicit_reexport"):
        assert strict[flag] is True, flag


def test_a_strict_module_refuses_an_unannotated_function(tmp_path):
    # the check can fail: the same configuration on a copy of the core with one function
    # left unannotated reports it
    (tmp_path / "pyproject.toml").write_text(
        (REPO / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    package = tmp_path / "idlegpu" / "forecast" / "models"
    package.mkdir(parents=True)
    for folder in (package.parents[1], package.parent, package):
        (folder / "__init__.py").write_text("", encoding="utf-8")
    (package / "loose.py").write_text("def half(x):\n    return x / 2\n", encoding="utf-8")
    result = mypy("--cache-dir", str(tmp_path / "cache"), "idlegpu/forecast/models/loose.py",
                  cwd=tmp_path)
    assert result.returncode == 1
    assert "loose.py:1: error: Function is missing a type annotation" in result.stdout


def test_code_outside_the_checkout_sees_the_package_types(tmp_path):
    (tmp_path / "use.py").write_text(
        "from idlegpu.forecast.capacity import forecast_pool_usage\n"
        "from idlegpu.scheduler.policy import decide\n"
        "reveal_type(forecast_pool_usage)\n"
        "reveal_type(decide)\n"
        "decide(1, 2)\n", encoding="utf-8")
    result = mypy("--python-executable", sys.executable, "--no-incremental", "use.py",
                  cwd=tmp_path)
    out = result.stdout
    assert "import-not-found" not in out and "import-untyped" not in out, (
        out + "\nthe development install must be strict for static tools to see idlegpu: "
        "pip install -e '.[dev]' --config-settings editable_mode=strict")
    assert 'Revealed type is "def (forecast: ' in out
    assert "settings: idlegpu.forecast.config.Settings" in out
    assert "-> idlegpu.scheduler.types.Plan" in out
    # and it checks calls against them: decide() takes its inputs, not two numbers
    assert 'use.py:5: error: Missing positional arguments' in out or \
        'use.py:5: error: Argument 1 to "decide" has incompatible type' in out, out
