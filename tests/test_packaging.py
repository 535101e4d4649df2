"""The package installs under the `idlegpu` namespace (idlegpu.forecast, idlegpu.scheduler)
from the folders the layout keeps at the top (forecast/, scheduler/): the generic names
`forecast` and `scheduler` are never installed, and nothing of ours imports them."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from test_install_extras import OPTIONAL

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("forecast", "scheduler")
# every place that holds Python of ours: the package, its tests, the benchmarks, the scripts
SOURCES = ("forecast", "scheduler", "tests", "bench", "scripts", "examples", "docs")


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"]


def test_every_package_folder_installs_under_the_namespace():
    config = _setuptools()
    assert config["package-dir"] == {f"idlegpu.{f}": f for f in FOLDERS}
    on_disk = {
        "idlegpu." + ".".join(init.parent.relative_to(REPO).parts)
        for folder in FOLDERS for init in (REPO / folder).rglob("__init__.py")
    }
    # a sub-package missing from the list would be left out of the wheel without a word
    assert set(config["packages"]) == on_disk


def _top_level_imports(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [(node.lineno, n) for n in names if n.split(".")[0] in FOLDERS]
    return found


def _notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    # IPython's magics are not Python
    return "\n".join(line for cell in code for line in cell.splitlines()
                     if not line.lstrip().startswith(("%", "!")))


def test_nothing_of_ours_imports_the_bare_folder_names():
    # run from the checkout, `import forecast` would still work (the current directory is on
    # sys.path), so a missed import would pass every other test and fail only when installed
    offenders = []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            for line, name in _top_level_imports(path.read_text(encoding="utf-8")):
                offenders.append(f"{path.relative_to(REPO)}:{line}: {name}")
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for line, name in _top_level_imports(_notebook_code(path)):
            offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert not offenders, "import idlegpu.forecast / idlegpu.scheduler instead:\n" + "\n".join(
        offenders)


def test_the_docs_show_the_namespaced_imports():
    text = "\n".join(p.read_text(encoding="utf-8") for p in
                     [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
                      *sorted((REPO / "examples").rglob("*.yaml"))])
    bare = re.findall(r"(?:(?<![\w.])(?:from|import)|-m) (?:forecast|scheduler)\b.*", text)
    assert not bare, bare
    assert "from idlegpu.forecast" in (REPO / "docs" / "notebooks.md").read_text(encoding="utf-8")


def test_outside_the_checkout_only_the_namespace_imports(tmp_path):
    probe = (
        "import importlib, importlib.resources, json\n"
        "seen = {}\n"
        "for name in ('forecast', 'scheduler'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        seen[name] = 'imported'\n"
        "    except ModuleNotFoundError:\n"
        "        seen[name] = 'absent'\n"
        "import idlegpu.forecast.analysis, idlegpu.scheduler.cli\n"
        "seen['forecast_file'] = idlegpu.forecast.analysis.__file__\n"
        "templates = importlib.resources.files('idlegpu.scheduler.console') / 'templates'\n"
        "seen['templates'] = sorted(p.name for p in templates.iterdir())\n"
        "print(json.dumps(seen))\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, check=False, timeout=120)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["forecast"] == "absent" and seen["scheduler"] == "absent"
    # the checkout's file (the development install links it from build/__editable__.*/)
    assert Path(seen["forecast_file"]).resolve() == REPO / "forecast" / "analysis.py"
    assert "base.html" in seen["templates"]


def test_the_console_script_runs_the_namespaced_cli(tmp_path):
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"]
    assert scripts == {"idlegpu": "idlegpu.scheduler.cli:main"}
    ran = subprocess.run([Path(sys.executable).with_name("idlegpu"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, check=False, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "forecast" in ran.stdout and "plan" in ran.stdout


def test_the_readmes_python_block_runs_on_the_base_install():
    readme = (REPO / "docs" / "notebooks.md").read_text(encoding="utf-8")
    section = readme[readme.index("## From Python"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    # as in a base install: the extras' packages cannot be imported
    absent = (
        "import sys\n"
        "class _Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {OPTIONAL!r}:\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, _Absent())\n")
    ran = subprocess.run([sys.executable, "-c", absent + block], cwd=REPO, capture_output=True,
                         text=True, check=False, timeout=300, env={"OMP_NUM_THREADS": "1",
                                                                   "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    header, *rows = ran.stdout.strip().splitlines()
    assert header.split() == ["start", "end", "gpus", "hours"]
    # the sample's Wednesday evening opens windows; each row a start before its end
    assert rows
    for row in rows:
        start_day, start_time, end_day, end_time, gpus, hours = row.split()
        assert (start_day, start_time) < (end_day, end_time) and int(gpus) > 0
