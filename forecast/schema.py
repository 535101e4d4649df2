"""The tidy history format: one row per (series, timestamp).

Columns: ``unique_id`` (``<service>/<metric>``, e.g. ``chat/replicas``), ``ds`` (timestamps, stored
and returned in UTC; naive timestamps are read as UTC) and ``y`` (float). Missing samples are
missing rows: a gap stays a gap, nothing is filled in.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.errors import OutOfBoundsDatetime

from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.metrics import (
    DESIRED_REPLICAS,
    GENERATION_TOKENS_PER_S,
    KV_CACHE_USAGE,
    LIVE_METRICS,
    PROMPT_TOKENS_PER_S,
    REPLICAS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SERVICE_METRICS,
    series_id,
    split_series_id,
)

# metric names and series ids live in idlegpu.forecast.metrics (no pandas) and are re-exported here
__all__ = [
    "COLUMNS", "DESIRED_REPLICAS", "DS", "GENERATION_TOKENS_PER_S", "KV_CACHE_USAGE",
    "LIVE_METRICS", "PROMPT_TOKENS_PER_S", "REPLICAS", "REQUESTS_RUNNING", "REQUESTS_WAITING",
    "SERVICE_METRICS", "UNIQUE_ID", "Y", "empty_history", "infer_step", "metric_rows", "series_id",
    "split_series_id", "validate_history",
]

UNIQUE_ID = "unique_id"
DS = "ds"
Y = "y"
COLUMNS = (UNIQUE_ID, DS, Y)


def metric_rows(history: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The rows of every service's ``metric`` series (e.g. all ``*/replicas``)."""
    ids = history[UNIQUE_ID]
    # a handful of series over many rows: test each name once, not each row (the nightly
    # refits of a simulation filter the same long history hundreds of times)
    names = pd.unique(ids)
    wanted = [name for name in names if str(name).endswith("/" + metric)]
    if len(wanted) == len(names):
        return history
    return history[ids.isin(wanted)]


def empty_history() -> pd.DataFrame:
    return pd.DataFrame(
        {
            UNIQUE_ID: pd.Series([], dtype="string"),
            DS: pd.Series([], dtype="datetime64[ns, UTC]"),
            Y: pd.Series([], dtype="float64"),
        }
    )


def validate_history(frame: pd.DataFrame, *, source: str = "history") -> pd.DataFrame:
    """Check and normalise a history frame; raise ``HistoryError`` naming the problem and the fix.

    Returns a new frame with exactly the three columns, ``ds`` as UTC nanosecond timestamps,
    ``y`` as float64, rows with a missing ``y`` dropped (a gap), sorted by series and time.
    """
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise HistoryError(
            f"{source}: missing column(s) {', '.join(missing)}; a history needs columns "
            f"unique_id, ds, y (found: {', '.join(map(str, frame.columns)) or 'none'})"
        )
    out = frame.loc[:, list(COLUMNS)].copy()

    if out[UNIQUE_ID].isna().any():
        row = int(out.index[out[UNIQUE_ID].isna()][0])
        raise HistoryError(f"{source}: empty unique_id at row {row}; every row needs a series id")
    out[UNIQUE_ID] = out[UNIQUE_ID].astype("string")

    out[DS] = _parse_timestamps(out[DS], source)

    y = pd.to_numeric(out[Y], errors="coerce")
    coerced = y.isna() & out[Y].notna()  # only text that is not a number lands here
    bad = coerced.copy()
    if coerced.any():
        text = out.loc[coerced, Y].astype("string").str.strip().str.lower()
        bad[coerced] = ~text.isin(["nan", ""])
    if bad.any():
        pos = int(bad.to_numpy().nonzero()[0][0])
        raise HistoryError(
            f"{source}: non-numeric y {out[Y].iloc[pos]!r} for series "
            f"{out[UNIQUE_ID].iloc[pos]} at {out[DS].iloc[pos]} (row {pos}); y must be a number"
        )
    out[Y] = y.astype("float64")
    out = out[out[Y].notna()]
    _refuse_negative(out, source)
    if _in_order(out):  # what a fetch or a written history holds: nothing to sort or repeat
        return out.reset_index(drop=True)

    dup = out.duplicated([UNIQUE_ID, DS], keep=False)
    if dup.any():
        first = out[dup].iloc[0]
        raise HistoryError(
            f"{source}: {int(dup.sum())} rows share a (unique_id, ds) pair, e.g. "
            f"{first[UNIQUE_ID]} at {first[DS].isoformat()}; keep one sample per series and "
            "timestamp (de-duplicate or aggregate before loading)"
        )
    return out.sort_values([UNIQUE_ID, DS], kind="stable").reset_index(drop=True)


def _in_order(frame: pd.DataFrame) -> bool:
    """Rows sorted by series and time with no (unique_id, ds) pair twice: then sorting changes
    nothing and there is no duplicate (one comparison of neighbours, ~15x cheaper than both)."""
    if len(frame) < 2:
        return True
    ids = frame[UNIQUE_ID].array
    ascending = np.asarray(ids[1:] >= ids[:-1], dtype=bool)
    if not ascending.all():
        return False
    same_series = np.asarray(ids[1:] == ids[:-1], dtype=bool)
    ns = frame[DS].array.asi8
    return bool((~same_series | (ns[1:] > ns[:-1])).all())


def _parse_timestamps(ds: pd.Series, source: str) -> pd.Series:
    if isinstance(ds.dtype, pd.DatetimeTZDtype):
        parsed = ds.dt.tz_convert("UTC")
    elif pd.api.types.is_datetime64_any_dtype(ds):
        parsed = ds.dt.tz_localize("UTC")
    else:
        parsed = pd.to_datetime(ds, utc=True, errors="coerce", format="ISO8601")
        bad = parsed.isna() & ds.notna()
        if bad.any():
            pos = int(bad.to_numpy().nonzero()[0][0])
            raise HistoryError(
                f"{source}: unreadable timestamp {ds.iloc[pos]!r} at row {pos}; use ISO 8601, "
                "e.g. 2025-10-01T00:00:00Z (naive times are read as UTC)"
            )
    if parsed.isna().any():
        pos = int(parsed.isna().to_numpy().nonzero()[0][0])
        raise HistoryError(f"{source}: missing timestamp at row {pos}")
    try:
        return parsed.astype("datetime64[ns, UTC]")
    except OutOfBoundsDatetime:
        low, high = pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC")
        outside = ((parsed < low) | (parsed > high)).to_numpy()
        pos = int(outside.nonzero()[0][0]) if outside.any() else 0
        raise HistoryError(
            f"{source}: timestamp {ds.iloc[pos]!r} at row {pos} is outside the range a "
            f"history can hold ({low:%Y-%m-%d} to {high:%Y-%m-%d}); check the column ds"
        ) from None


def _refuse_negative(frame: pd.DataFrame, source: str) -> None:
    """Every metric of a service is a count, a rate or a share: a negative sample is a broken
    export (a counter reset read as a rate, a sign flip), and counted as replicas it would make
    the pool look emptier than it is."""
    below = frame[Y].to_numpy() < 0
    if not below.any():  # the usual case: no per-row string work on millions of samples
        return
    negative = below.copy()
    negative[below] = (
        frame.loc[below, UNIQUE_ID].str.rpartition("/")[2].isin(SERVICE_METRICS).to_numpy()
    )
    if negative.any():
        row = frame[negative].iloc[0]
        raise HistoryError(
            f"{source}: {int(negative.sum())} negative value(s), e.g. {row[Y]:g} for "
            f"{row[UNIQUE_ID]} at {row[DS].isoformat()}; every service metric is a count, a "
            "rate or a share (>= 0): fix the export, or drop those rows (a gap stays a gap)"
        )


def infer_step(frame: pd.DataFrame) -> pd.Timedelta:
    """The sampling step of a history: the most common spacing between consecutive samples."""
    diffs = frame.groupby(UNIQUE_ID, observed=True)[DS].diff().dropna()
    diffs = diffs[diffs > pd.Timedelta(0)]
    if diffs.empty:
        raise HistoryError(
            "cannot infer the sampling step: every series has fewer than two samples"
        )
    return pd.Timedelta(diffs.mode().iloc[0])
