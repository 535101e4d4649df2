"""The example requests the console's Submit page starts from ship with the package: a wheel
built from the tree holds examples/jobs/*.yaml as data files, and the console, installed from
it (no checkout beside it), lists them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "jobs"


@pytest.mark.slow
def test_a_wheel_ships_the_examples_and_the_installed_console_lists_them(tmp_path):
    tree = tmp_path / "tree"  # a copy: building writes build/ and *.egg-info beside the source
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    for folder in ("forecast", "scheduler", "examples/jobs"):
        shutil.copytree(REPO / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path / "dist")], check=False, capture_output=True, text=True,
        timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("idlegpu-*.whl")
    wanted = {p.name: p.read_bytes() for p in EXAMPLES.glob("*.yaml")}
    assert wanted
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        shipped = {Path(n).name: archive.read(n) for n in names
                   if "/data/share/idlegpu/examples/jobs/" in n}
    assert shipped == wanted
    # the package under its namespace only: no top-level forecast/ or scheduler/
    version = wheel.name.split("-")[1]
    assert {n.split("/")[0] for n in names} == {
        "idlegpu", f"idlegpu-{version}.data", f"idlegpu-{version}.dist-info"}
    assert {"idlegpu/forecast/__init__.py", "idlegpu/scheduler/console/templates/base.html",
            "idlegpu/scheduler/console/static/console.css"} <= set(names)

    # installed into an empty virtual environment of its own (pip run for it with --python):
    # never into the environment running the tests, whose idlegpu pip would uninstall first
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True,
                   timeout=120)
    python = target / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)], check=False, capture_output=True, text=True,
        timeout=300)
    assert installed.returncode == 0, installed.stderr
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                               check=True, timeout=60).stdout.strip())
    assert (target / "share/idlegpu/examples/jobs").is_dir()
    # the console from the install, not from this checkout's editable install (its finder)
    probe = (
        "import json, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        "from idlegpu.scheduler.console import routes\n"
        "print(json.dumps({'module': routes.__file__, 'checkout': routes.EXAMPLES.is_dir(),\n"
        "                  'examples': routes._examples()}))\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    ran = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert Path(seen["module"]).is_relative_to(site) and not seen["checkout"]
    assert seen["examples"] == {n: b.decode("utf-8") for n, b in sorted(wanted.items())}
