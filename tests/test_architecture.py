"""Import rules: forecast never imports scheduler; only adapters import server clients; the
pure core imports no edge; the services no front door; the job API and the console neither
other (pyproject.toml's import-linter contracts)."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [LINT, str(root / "pyproject.toml")],
        cwd=root, capture_output=True, text=True, check=False, env=env,
    )


def test_import_contracts_hold():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 6
    assert f"Contracts: {len(contracts)} kept, 0 broken" in result.stdout


def test_contracts_catch_a_violation(tmp_path):
    # the copy is laid out as installed (idlegpu/forecast, idlegpu/scheduler), found first
    # through PYTHONPATH, ahead of the editable install's mapping of the real folders
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for part in ("forecast", "scheduler"):
        shutil.copytree(REPO / part, tmp_path / "idlegpu" / part)
    (tmp_path / "idlegpu" / "forecast" / "leak.py").write_text(
        "import idlegpu.scheduler.cli\nimport prometheus_api_client\n"
    )
    # a console page reaching into the API, a service into the CLI, the policy into the store
    (tmp_path / "idlegpu" / "scheduler" / "console" / "leak.py").write_text(
        "import idlegpu.scheduler.api.app\n")
    (tmp_path / "idlegpu" / "scheduler" / "service" / "leak.py").write_text(
        "import idlegpu.scheduler.cli\n")
    policy = tmp_path / "idlegpu" / "scheduler" / "policy" / "__init__.py"
    policy.write_text(policy.read_text() + "\nimport idlegpu.scheduler.adapters.store\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "idlegpu.forecast.leak -> idlegpu.scheduler.cli" in result.stdout
    assert "idlegpu.forecast.leak -> prometheus_api_client" in result.stdout
    assert "idlegpu.scheduler.console.leak -> idlegpu.scheduler.api.app" in result.stdout
    assert "idlegpu.scheduler.service.leak -> idlegpu.scheduler.cli" in result.stdout
    assert "idlegpu.scheduler.policy -> idlegpu.scheduler.adapters.store" in result.stdout
