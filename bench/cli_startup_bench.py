"""Benchmark: how long ``idlegpu`` takes to answer, this checkout against an older commit, in
one run.

    python bench/cli_startup_bench.py [--base 2614a74] [--runs 5]

Times ``idlegpu --help``, ``idlegpu plan --help`` and the README's quick start (``plan`` on the
sample) as fresh processes, best of ``--runs``, the two versions interleaved so that the
machine's noise falls on both. The older version is ``git archive`` of ``--base``'s
``forecast/`` and ``scheduler/``, laid out as installed and found first through PYTHONPATH;
both run in this interpreter's environment, each with its own ``idlegpu.yaml`` (a newer one
may name fields that the older version refuses), on the same sample. The default base is the last commit whose CLI
imported every command's module at start (its commands importing their work inside
functions).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import record  # bench/record.py: --record writes the output into docs/bench/

SAMPLE = REPO / "data" / "sample"
CONFIG = REPO / "idlegpu.yaml"
COMMANDS = {
    "idlegpu --help": ["--help"],
    "idlegpu plan --help": ["plan", "--help"],
    "idlegpu plan (the quick start)": [
        "plan", "--config", str(CONFIG), "--history",
        str(SAMPLE / "history.parquet"), "--jobs", str(SAMPLE / "jobs.yaml"), "--runs",
        str(SAMPLE / "runs.csv"), "--now", "2026-01-28T18:00:00+09:00"],
}
IDLEGPU = "from idlegpu.scheduler.cli import main; main()"


def _unpack(base: str, into: Path) -> Path:
    """``base``'s package laid out under ``into``; returns the path of its ``idlegpu.yaml``."""
    archive = subprocess.run(["git", "archive", base, "forecast", "scheduler", CONFIG.name],
                             cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into / "idlegpu", filter="data")
    return into / "idlegpu" / CONFIG.name


def _seconds(args: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", IDLEGPU, *args], env=env, cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="2614a74")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    with tempfile.TemporaryDirectory() as tmp:
        old_root, work = Path(tmp) / "base", Path(tmp) / "work"
        old_config = _unpack(args.base, old_root)
        work.mkdir()  # the plan's out/ goes here
        versions = {"before": ({**env, "PYTHONPATH": str(old_root)}, str(old_config)),
                    "after": (env, str(CONFIG))}
        best = {(name, v): float("inf") for name in COMMANDS for v in versions}
        for name, command in COMMANDS.items():
            commands = {version: [config if arg == str(CONFIG) else arg for arg in command]
                        for version, (_, config) in versions.items()}
            for version, (version_env, _) in versions.items():  # compile, warm the file cache
                _seconds(commands[version], version_env, work)
            for _ in range(args.runs):
                for version, (version_env, _) in versions.items():
                    best[name, version] = min(best[name, version],
                                              _seconds(commands[version], version_env, work))
    print(f"### idlegpu's start, best of {args.runs} (before: {args.base}, after: this "
          "checkout)\n")
    print("| command | before (s) | after (s) | after / before |")
    print("|---|---|---|---|")
    for name in COMMANDS:
        before, after = best[name, "before"], best[name, "after"]
        print(f"| {name} | {before:.3f} | {after:.3f} | {after / before:.2f} |")


if __name__ == "__main__":
    record.run("cli_startup", main)
