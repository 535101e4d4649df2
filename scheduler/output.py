"""How list commands print their rows (``-o table|wide|csv|json``, the kubectl habit).

- ``table``: a rich table that never cuts an identifier: the ID columns are as wide as their
  longest value and never wrap (an ID is what ``cancel`` needs, copied whole); the other columns
  wrap to fit the terminal. ``wide``: every column, as wide as its content (no fitting to the
  terminal), for pagers and wide screens.
- ``csv`` and ``json``: the same rows for scripts: times as ISO 8601 with the offset (in the
  pool's zone), numbers as numbers, every column (``wide``'s); CSV under the file convention of
  ``idlegpu.forecast.tables`` (text that a spreadsheet would run as a formula is escaped).

Rows are mappings from column keys to values (str, int, float, datetime or None).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from idlegpu.forecast.cells import safe_text

FORMATS = ("table", "wide", "csv", "json")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: object) -> str:
    """``value`` as text safe to show: control characters (an escape sequence would steer the
    terminal) written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    identifier: bool = False
    """Never cut or wrapped (unit and request ids)."""
    right: bool = False
    wide_only: bool = False
    """Shown by ``wide``, ``csv`` and ``json`` only."""


# the plan's two tables, the same locally and from a server (``plan --server``)
PLAN_START_COLUMNS = (
    Column("job", "job", identifier=True), Column("team", "team"), Column("kind", "kind"),
    Column("gpus", "GPUs", right=True), Column("from", "from"), Column("until", "until"),
    Column("then", "then"))
PLAN_WAIT_COLUMNS = (Column("job", "job", identifier=True), Column("gpus", "GPUs", right=True),
                     Column("why", "why"))
# a word longer than this may still be folded (a URL, a path), rather than widen its column
WORD_WIDTH = 24


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def check_format(output: str) -> str:
    if output not in FORMATS:
        raise ValueError(f"-o {output!r}: use one of {', '.join(FORMATS)}")
    return output


def _screen(value: Any, tz) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z") if tz else value.isoformat()
    return str(value)


def _data(value: Any, tz) -> Any:
    if isinstance(value, datetime):
        local = value.astimezone(tz) if tz is not None else value
        return local.replace(microsecond=0).isoformat()
    return value


def emit(console: Console, rows: Sequence[Mapping[str, Any]], columns: Sequence[Column],
         output: str, *, title: str = "", tz=None) -> None:
    """Print ``rows`` in ``output`` format (see the module); ``tz``: the zone of the times."""
    check_format(output)
    if output in ("csv", "json"):
        console.file.write(_machine(rows, columns, output, tz))
        console.file.flush()
        return
    shown = [c for c in columns if output == "wide" or not c.wide_only]
    cells = [[plain(_screen(r.get(c.key), tz)) for c in shown] for r in rows]
    longest = [max([cell_len(c.header), *(cell_len(row[i]) for row in cells)])
               for i, c in enumerate(shown)]
    # the narrowest a column may be: an id whole, any other column's longest word whole (up
    # to WORD_WIDTH), so that "foundation" never reads "found / ation"
    least = [longest[i] if c.identifier else
             max([cell_len(c.header), *(min(_longest_word(row[i]), WORD_WIDTH) for row in cells)])
             for i, c in enumerate(shown)]

    def table_of(widths: Sequence[int | None]) -> Table:
        table = Table(title=Text(plain(title)) if title else None, title_justify="left",
                      box=box.SIMPLE_HEAD, pad_edge=False)
        for c, width in zip(shown, widths, strict=True):
            table.add_column(c.header, justify="right" if c.right else "left",
                             no_wrap=c.identifier or output == "wide", overflow="fold",
                             width=width)
        for row in cells:
            table.add_row(*(Text(cell) for cell in row))
        return table

    natural = table_of([None] * len(shown))
    needs = Console(width=100_000, file=io.StringIO()).measure(natural).maximum
    if output == "wide" or needs <= console.width:
        table, width = natural, needs
    else:
        # rich would narrow the widest columns inside their words: the widths are set here,
        # each column its least plus a share of the room left, by how much more it would take
        edges = needs - sum(longest)  # padding and borders
        widths = _shares(least, longest, console.width - edges)
        table, width = table_of(widths), sum(widths) + edges
    if width > console.width:  # (else the terminal would cut an id)
        Console(width=width, file=console.file, markup=False, emoji=False, highlight=False,
                force_terminal=console.is_terminal,
                no_color=not console.is_terminal).print(table)
    else:
        console.print(table)


def _shares(least: Sequence[int], most: Sequence[int], room: int) -> list[int]:
    """Column widths from ``least`` towards ``most`` within ``room`` (never under ``least``):
    the room beyond ``least`` shared in proportion to what each column lacks."""
    widths = list(least)
    spare = room - sum(least)
    lack = [m - w for m, w in zip(most, widths, strict=True)]
    if spare <= 0 or not sum(lack):
        return widths
    total = sum(lack)
    for i, gap in enumerate(lack):
        widths[i] += min(gap, spare * gap // total)
    spare = room - sum(widths)
    for i in range(len(widths)):  # what the rounding left, first come
        give = min(spare, most[i] - widths[i])
        widths[i] += give
        spare -= give
    return widths


def _machine(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], output: str,
             tz) -> str:
    if output == "json":
        data = [{c.key: _data(r.get(c.key), tz) for c in columns} for r in rows]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([c.key for c in columns])
    for r in rows:
        writer.writerow([safe_text(_data(r.get(c.key), tz)) if r.get(c.key) is not None
                         else "" for c in columns])
    return buffer.getvalue()


__all__ = ["FORMATS", "PLAN_START_COLUMNS", "PLAN_WAIT_COLUMNS", "Column", "check_format",
           "emit", "plain"]
