"""The analyst notebooks (notebooks/*.ipynb) run top to bottom on the sample data.

Each notebook is executed with nbclient in a fresh kernel, with notebooks/ as its working
directory (as Jupyter starts it), in memory: the committed files stay without outputs. Any error
in any cell fails the test; then the expected figures (PNG outputs) and key results are checked.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbclient  # the `test` extra installs nbclient, nbformat and ipykernel
import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
TIMEOUT_S = 300  # per cell; a whole notebook takes well under a minute on 2 cores

# notebook -> (minimum PNG figures, strings that must appear in its text outputs)
EXPECTED = {
    "01_idle_gpu_patterns.ipynb": (
        7,
        [
            r"On a typical night 48 GPUs stay idle for at least 8 hours",
            r"median_hours\s+p10_hours\s+share_nights_ge_8h",  # the depth table
            r"Chuseok",  # the holidays
            r"share_at_min\s+share_at_max",  # the autoscaling summary
        ],
    ),
    "02_forecasting_idle_windows.ipynb": (
        4,
        [
            r"Tonight: \d+ GPUs free from Wed \d\d:\d\d to Thu \d\d:\d\d",
            r"seasonal_naive",
            r"strict_coverage_0.9",  # the backtest table
            r"precision\s+recall",
            r"night_of",  # the week's windows
        ],
    ),
    "03_capacity_planning.ipynb": (
        5,
        [
            r"useful_gpu_hours",
            r"oracle",
            r"pool size\s+80 GPUs",  # the what-if table
            r"grace period",
            r"job mix",
            r"Tighter night floors would free \d+ GPUs every night",
            r"suggested_night_min",
            r"With bin-packing scoring on the inference scheduler, [\d.]+ (more|fewer) whole "
            r"nodes are free each night \(worth [+-][\d,]+ GPU-hours a month\)",
            r"service_unplaced_gpu_hours",  # the simulation on nodes
        ],
    ),
    "04_monthly_report.ipynb": (
        5,
        [
            r"2026-01: [\d,.]+ useful GPU-hours = [\d.]+ GPUs \(12 h\)",
            r"gpus_12h\s+gpus_24h",  # the summary table
            r"foundation",  # by team
            r"forecast accuracy, 2026-01",
            r"summary.csv matches the report: True",
            r"KRW 4,500",  # the price what-if
        ],
    ),
}


def test_every_notebook_is_tested_and_has_a_readme_entry():
    found = sorted(p.name for p in NOTEBOOKS.glob("0[1-9]_*.ipynb"))
    assert found == sorted(EXPECTED)
    readme = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    for name in EXPECTED:
        assert name in readme


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebooks_are_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{name} has outputs; clear them before committing "
                f"(jupyter nbconvert --clear-output --inplace notebooks/{name})"
            )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_uses_only_public_package_api(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    source = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    imports = re.findall(r"^\s*(?:from|import)\s+(idlegpu\.(?:forecast|scheduler)[\w.]*)(.*)$",
                         source, re.MULTILINE)
    assert imports, "the notebook should build on the package"
    for module, rest in imports:
        assert not any(part.startswith("_") for part in module.split(".")), module
        assert not re.search(r"\b_\w+", rest), f"private name imported: {module}{rest}"
    assert "idlegpu.scheduler.cli" not in source


def _text(output) -> str:
    if output.output_type == "stream":
        return output.text
    data = output.get("data", {})
    return data.get("text/plain", "") if output.output_type != "error" else ""


# the forecasting, capacity-planning and report notebooks run backtests, simulations and a
# month of refits (30-60 s each): slow, so a plain `pytest` leaves them out; scripts/test.sh
# (and CI) runs them
SLOW_NOTEBOOKS = {"02_forecasting_idle_windows.ipynb", "03_capacity_planning.ipynb",
                  "04_monthly_report.ipynb"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_NOTEBOOKS else n
    for n in sorted(EXPECTED)])
def test_notebook_runs_on_the_sample_and_draws_its_figures(name, tmp_path):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    started = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError on any error in any cell
    finally:
        # the executed copy, for a look when something fails; never the committed file
        nbformat.write(notebook, tmp_path / name)
    seconds = time.perf_counter() - started

    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    min_figures, markers = EXPECTED[name]
    assert len(figures) >= min_figures, f"{name}: {len(figures)} figures, expected {min_figures}"
    text = "\n".join(_text(o) for o in outputs)
    for marker in markers:
        assert re.search(marker, text), f"{name}: no output matches {marker!r}"
    assert "Traceback" not in text
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "Warning" not in stderr, f"{name} warns:\n{stderr}"
    print(json.dumps({"notebook": name, "seconds": round(seconds, 1), "figures": len(figures)}))


def test_a_failing_cell_fails_the_run():
    """The harness above really stops on an error (nbclient's default, relied upon here)."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("1 / 0")]
    client = nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="ZeroDivisionError"):
        client.execute()
