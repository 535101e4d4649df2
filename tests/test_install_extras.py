"""The analyst's install (no extras) runs the quick start without the Kubernetes client, the
job store or the web server; what needs them says which extra brings it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = ("kubernetes", "sqlalchemy", "apscheduler", "prometheus_client", "fastapi",
            "uvicorn", "jinja2", "starlette", "sklearn", "prophet", "statsmodels")
# a child interpreter in which the optional packages cannot be imported, as in a base install
BLOCK = f"""
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Absent())
from idlegpu.scheduler.cli import main
main(sys.argv[1:])
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=False,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_the_base_dependencies_leave_the_daemon_and_the_server_to_extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = " ".join(project["dependencies"]).lower()
    for name in ("kubernetes", "sqlalchemy", "apscheduler", "fastapi", "uvicorn", "jinja2"):
        assert name not in base, name
    extras = project["optional-dependencies"]
    assert {"daemon", "server", "models", "notebooks"} <= set(extras)
    assert any("jupyterlab" in d for d in extras["notebooks"])


def test_the_quick_start_runs_without_the_optional_packages(tmp_path):
    done = _run(["plan", "--config", str(REPO / "idlegpu.yaml"), "--history",
                 str(REPO / "data/sample/history.parquet"), "--jobs",
                 str(REPO / "data/sample/jobs.yaml"), "--runs", str(REPO / "data/sample/runs.csv"),
                 "--now", "2026-01-28T18:00:00+09:00", "--out", str(tmp_path / "plan")],
                tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Plan from Wed 2026-01-28 18:00" in done.stdout
    # the newcomer's friction: without scikit-learn the runtime estimates (and so the plan)
    # differ from an install with it, and the plan now says so instead of changing silently
    said = " ".join(done.stderr.split())
    assert "runtime model, which needs scikit-learn (the models extra: pip install " \
           "'idlegpu[models]')" in said, said[-1500:]
    assert re.search(r"runtime estimates: \d+ job famil(y|ies) \(\S+#", said), said[-1500:]


def test_with_the_models_extra_the_plan_says_nothing_of_a_missing_runtime_model(tmp_path, cli):
    code, _, err = cli(["plan", "--config", str(REPO / "idlegpu.yaml"), "--history",
                        str(REPO / "data/sample/history.parquet"), "--jobs",
                        str(REPO / "data/sample/jobs.yaml"), "--runs",
                        str(REPO / "data/sample/runs.csv"), "--now", "2026-01-28T18:00:00+09:00",
                        "--out", str(tmp_path / "plan")])
    assert code == 0, err
    assert "scikit-learn" not in err


def test_the_job_store_without_its_extra_names_the_extra(tmp_path):
    done = _run(["queue", "--config", str(REPO / "idlegpu.yaml"), "--store",
                 f"sqlite:///{tmp_path / 's.db'}"], tmp_path)
    assert done.returncode == 2
    assert "pip install 'idlegpu[daemon]'" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
