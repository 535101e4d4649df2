"""What a benchmark printed, written where the manual includes it, so that no figure of a table
is typed twice.

Every ``bench/*.py`` ends with ``record.run("<name>", main)``: run as usual it prints; with
``--record`` among its arguments it also writes what it printed to ``docs/bench/<name>.md``,
headed by the date, the machine's CPUs and the exact command. ``docs/benchmarks.md`` includes
those files (``--8<-- "bench/<name>.md"``, pymdownx.snippets), and ``mkdocs build --strict``
fails on a missing one. Markdown tables stay tables, lines laid out in columns by spaces go
into a code block as they are, every other line becomes a paragraph of its own.
"""

from __future__ import annotations

import io
import os
import platform
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "bench"
FLAG = "--record"


class _Tee(io.TextIOBase):
    def __init__(self, *streams: io.TextIOBase) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def as_markdown(printed: str) -> str:
    """Markdown tables kept whole; a run of lines laid out in columns by spaces (a text
    table, indented figures) kept as it is, in a code block; every other line a paragraph."""
    runs: list[list[str]] = [[]]
    for line in printed.splitlines():
        line = line.rstrip()
        if line:
            runs[-1].append(line)
        elif runs[-1]:
            runs.append([])
    blocks: list[str] = []
    for run in runs:
        parts: list[list[str]] = []
        for line in run:  # within a run: the table lines apart from the others
            if parts and parts[-1][0].startswith("|") == line.startswith("|"):
                parts[-1].append(line)
            else:
                parts.append([line])
        for part in parts:
            if part[0].startswith("|"):
                blocks.append("\n".join(part))
            elif any(_in_columns(line) for line in part):
                blocks.append("```text\n" + "\n".join(part) + "\n```")
            else:
                blocks += part
    return "\n\n".join(blocks) + "\n"


def _in_columns(line: str) -> bool:
    return line.startswith("  ") or "   " in line.strip()


def header(name: str, argv: list[str], today: date) -> str:
    command = " ".join(["python", f"bench/{Path(argv[0]).name}", *argv[1:]])
    return (f"*Measured {today:%Y-%m-%d} on {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}: `{command}` (what it printed, written by "
            f"`{FLAG}`: run it again to refresh it, do not edit)*\n\n")


def run(name: str, main: Callable[[], None]) -> None:
    if FLAG not in sys.argv:
        main()
        return
    sys.argv.remove(FLAG)
    printed = io.StringIO()
    stdout = sys.stdout
    sys.stdout = _Tee(stdout, printed)
    try:
        main()
    finally:
        sys.stdout = stdout
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / f"{name}.md"
    path.write_text(header(name, sys.argv, date.today()) + as_markdown(printed.getvalue()),
                    encoding="utf-8")
    print(f"wrote {path.relative_to(DOCS.parents[1])}", file=sys.stderr)
