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
from rich.console import Console
from rich.table import Table
from rich.text import Text

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
    table = Table(title=Text(plain(title)) if title else None, title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    fixed = 0  # what the identifiers and the narrowest other columns need, borders included
    for c in shown:
        longest = max((len(_screen(r.get(c.key), tz)) for r in rows), default=0)
        fixed += 2 + (max(longest, len(c.header)) if c.identifier else 4)
        if c.identifier:
            table.add_column(c.header, no_wrap=True, min_width=max(longest, len(c.header)))
        else:  # wrapped between words (or folded), never cut
            table.add_column(c.header, justify="right" if c.right else "left",
                             no_wrap=output == "wide", overflow="fold")
    for r in rows:
        table.add_row(*(Text(plain(_screen(r.get(c.key), tz))) for c in shown))
    if output == "wide" or fixed > console.width:  # (else the terminal would cut an id)
        # as wide as the content: a console of that width on the same stream
        width = Console(width=100_000, file=io.StringIO()).measure(table).maximum
        Console(width=max(width, console.width), file=console.file, markup=False,
                emoji=False, highlight=False, force_terminal=console.is_terminal,
                no_color=not console.is_terminal).print(table)
    else:
        console.print(table)


def _machine(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], output: str,
             tz) -> str:
    if output == "json":
        data = [{c.key: _data(r.get(c.key), tz) for c in columns} for r in rows]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    from idlegpu.forecast.tables import safe_text

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([c.key for c in columns])
    for r in rows:
        writer.writerow([safe_text(_data(r.get(c.key), tz)) if r.get(c.key) is not None
                         else "" for c in columns])
    return buffer.getvalue()


__all__ = ["FORMATS", "Column", "check_format", "emit", "plain"]
