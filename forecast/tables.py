"""Tables written as CSV for people, spreadsheets and scripts: one convention for every file.

- **Times**: ISO 8601 with the offset, to the second (``2026-01-28T17:00:00+09:00``), in the
  pool's time zone when the writer knows it (``tz``), else as they are (UTC: ``+00:00``). A
  reader never has to guess the zone, and no file carries odd fractions (``14:11:07.600``).
- **Numbers**: plain decimals, never ``1.226e+04``; ``decimals`` digits after the point for
  floats (trailing zeros kept, so a column lines up), or with ``decimals=None`` every digit the
  value has (a data file another command reads back, e.g. a simulation's run table: rounding
  there would shift the sums made from it); integers as integers.
- **Text**: a cell that a spreadsheet would run as a formula (starting with ``=``, ``+``, ``-``,
  ``@``, a tab or a carriage return: a team, job or series name an untrusted user chose) is
  written with a leading ``'``, the escape spreadsheets themselves use, so it shows as text.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd

from idlegpu.forecast.cells import FORMULA_STARTS, safe_text


def iso_time(value: object, tz: str | None = None) -> object:
    """``value`` as ISO 8601 with the offset, to the second (in ``tz`` when given); anything that
    is not a time is returned unchanged."""
    if isinstance(value, (pd.Timestamp, dt.datetime)) and not pd.isna(value):
        stamp = pd.Timestamp(value)
        if stamp.tzinfo is None:
            stamp = stamp.tz_localize("UTC")
        if tz is not None:
            stamp = stamp.tz_convert(tz)
        return stamp.floor("s").isoformat()
    return value


def _column(series: pd.Series, tz: str | None) -> pd.Series:
    if isinstance(series.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_any_dtype(
            series.dtype):
        return series.map(lambda v: iso_time(v, tz))
    if series.dtype == object or pd.api.types.is_string_dtype(series.dtype):
        return series.map(lambda v: safe_text(iso_time(v, tz)))
    return series


def csv_ready(frame: pd.DataFrame, *, tz: str | None = None, index: bool = False
              ) -> pd.DataFrame:
    """``frame`` with its times, texts and (with ``index``) its index as they are written."""
    out = frame.copy()
    for name in out.columns:
        out[name] = _column(out[name], tz)
    if index:
        out.index = pd.Index(_column(out.index.to_series(), tz).to_numpy(), name=out.index.name)
    out.columns = [safe_text(str(c)) for c in out.columns]
    return out


def _every_digit(value: float) -> str:
    import numpy as np

    return np.format_float_positional(value, trim="-")


def write_csv(frame: pd.DataFrame, path: str | Path, *, tz: str | None = None,
              decimals: int | None = 4, index: bool = False) -> Path:
    """Write ``frame`` as CSV under the module's convention; returns the path."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    csv_ready(frame, tz=tz, index=index).to_csv(
        file, index=index, lineterminator="\n",
        float_format=_every_digit if decimals is None else f"%.{decimals}f")
    return file


__all__ = ["FORMULA_STARTS", "csv_ready", "iso_time", "safe_text", "write_csv"]
