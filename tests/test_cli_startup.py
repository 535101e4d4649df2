"""``idlegpu <command> --help`` answers at once: a command's module holds its signature (options,
help texts) and imports only what starts fast; its work (pandas, the forecasters, the simulator,
the job store) is in ``idlegpu.scheduler.cli.actions``, imported when the command runs. Each
command's help is asked for in a fresh interpreter, which must not have loaded numpy or pandas
(the commands themselves are run by the other CLI tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from idlegpu.scheduler.cli.registry import COMMANDS

HEAVY = ("numpy", "pandas")
CODE = f"""
import sys
from idlegpu.scheduler.cli import main
sys.argv = ["idlegpu", sys.argv[1], "--help"]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print("exit:", code)
print("loaded:", " ".join(m for m in {HEAVY!r} if m in sys.modules) or "-")
"""


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_commands_help_loads_neither_numpy_nor_pandas(name):
    done = subprocess.run([sys.executable, "-c", CODE, name], capture_output=True, text=True,
                          timeout=120, check=False, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    help_text, exit_line, loaded = done.stdout.rsplit("\n", 3)[:3]
    assert f"Usage: idlegpu {name} [OPTIONS]" in help_text, done.stdout
    assert "--help" in help_text and "Show this message and exit." in help_text
    assert exit_line == "exit: 0"
    assert loaded == "loaded: -", f"idlegpu {name} --help imported {loaded}"
