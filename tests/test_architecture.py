"""Import rules: forecast never imports scheduler; only adapters import server clients."""

import os
import shutil
import subprocess
import sys
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
    assert "Contracts: 3 kept, 0 broken" in result.stdout


def test_contracts_catch_a_violation(tmp_path):
    # the copy is laid out as installed (idlegpu/forecast, idlegpu/scheduler), found first
    # through PYTHONPATH, ahead of the editable install's mapping of the real folders
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for part in ("forecast", "scheduler"):
        shutil.copytree(REPO / part, tmp_path / "idlegpu" / part)
    (tmp_path / "idlegpu" / "forecast" / "leak.py").write_text(
        "import idlegpu.scheduler.cli\nimport prometheus_api_client\n"
    )
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "idlegpu.forecast.leak -> idlegpu.scheduler.cli" in result.stdout
    assert "idlegpu.forecast.leak -> prometheus_api_client" in result.stdout
