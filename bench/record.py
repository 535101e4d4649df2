"""What a benchmark printed, written where the manual includes it, so that no figure of a table
is typed twice.

Every ``bench/*.py`` ends with ``record.run("<name>", main)``: run as usual it prints; with
``--record`` among its arguments it also writes what it printed to ``docs/bench/<name>.md``,
headed by the date, the machine's CPUs and the exact command. ``docs/benchmarks.md`` includes
those files (``--8<-- "bench/<name>.md"``, pymdownx.snippets), and ``mkdocs build --strict``
fails on a missing one. Tables (lines starting with ``|``) stay tables; every other line
becomes a paragraph of its own.
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
    """Tables kept whole, each other non-empty line a paragraph."""
    blocks: list[list[str]] = []
    for line in printed.splitlines():
        line = line.rstrip()
        if not line:
            continue
        table = line.startswith("|")
        if table and blocks and blocks[-1][0].startswith("|"):
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"


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
