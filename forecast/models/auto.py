"""``auto``: the forecast each series' own recent past says is best, calibrated by its errors.

No one model fits every real curve: an office API repeats its working day, an LLM platform's
load trends up for a fortnight or barely has a daily cycle, a batch service runs weekly. So
``auto`` forecasts every series with several simple candidates and lets a rolling-origin
backtest on that series' own recent past choose among them, separately for each block of lead
time (under 1 h, 1-6 h, 6-24 h, 24 h on: what follows the last hour best is rarely what repeats
tomorrow best). The candidates, each a point forecast:

* ``snaive_1d``, ``snaive_7d``: the same wall-clock time a day (a week) earlier, the latest
  one the forecast can see;
* ``median_7d``: the median of that slot over the last seven days; ``median_3w``: of that slot
  of the week over the last three weeks (from 15 days of history);
* ``smooth_1d``: an exponentially weighted mean of that slot over the days (each day 0.3);
* ``profile_7d``: the seven days' mean of that slot, smoothed over an hour each side of the
  time of day (what a noisy count needs);
* ``level_7d``: ``median_7d``'s shape at the level of the last 24 hours (as a ratio, in log
  space, for series that never go below zero): it follows drift and trends, since a steady
  trend keeps the last day the same distance above the median of the week;
* ``theta_7d``: the Theta method on the series less ``median_7d``'s shape (log space as
  above): a simple exponentially smoothed level (its half-life fitted among 1, 3, 12 and 48
  hours) plus none, half or all of the last week's linear drift times the lead (fitted on
  its day-ahead errors), what statsforecast's
  ``AutoTheta`` and ``MSTL`` catch where a series trends or its level wanders;
* ``curve``: the day-type curve model (``idlegpu.forecast.models.curve``), whose rescaling
  follows a launch or a surge within hours;
* each of the first six also ``+now``: corrected by its error over the last few steps, which
  decays with the lead at the rate the candidate's own errors do (an AR(1));
* ``mean(...)``: the mean of the best 2, 3, 5 or 8 in the block.

The backtest replays every candidate at origins every ``origin_hours`` over the last
``backtest_days`` (each replay sees only its past) for up to ``backtest_hours`` ahead (every
step of the first hour, then every ``lead_minutes``), and picks, per lead block, the one with
the lowest pinball loss at ``select_quantile`` after calibration (of its errors around their own
quantile), scored on every lead of the first hour and one every ``score_minutes`` after it
(neighbouring leads rank the candidates alike; the calibration reads them all). The chosen
forecast's replay errors then calibrate it (split-conformal per lead block, hour of day and
working/off day: each bucket's median and mean deviation, shrunk to its lead block's, and one
shared quantile of the standardised errors per lead block, ``_ScaledErrors``; read at a level
the replays' recent misses adapt: ``curve.adapted_levels``); an integer series' quantiles are rounded down, to the nearest or up,
whichever the replays lose least with. A holiday on a weekday takes the curve's forecast (only
its day types know it). ``choices_`` names the choice and its backtest skill against the better
seasonal naive, per series and lead block; every forecast row says what served it
(``served_by``) and that choice's ``skill``.

History: from 3 days (the daily candidates only); the weekly ones join at 8 days (15 for
``median_3w``), the curve's day types at a week. Less than 3 days is refused with a line saying
what the series has and what ``auto`` needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import SUNDAY_OR_HOLIDAY, WORKING_DAY
from idlegpu.forecast.models.base import (
    DAY,
    SERVED_BY,
    SKILL,
    Series,
    SeriesForecaster,
    require_span,
)
from idlegpu.forecast.models.curve import (
    LEAD_EDGES_H,
    CurveForecaster,
    _bucket_key,
    _coarse_key,
    _Errors,
    _Fitted,
    _grouped_quantiles,
    _small_unique,
    _trailing_nanmean,
    adapted_levels,
)
from idlegpu.forecast.models.lines import (
    HARMONIC_DAYS,
    _centred_median,
    _half_width,
    _harmonic_line,
    _lag_one,
    _rolling_mean,
    _rolling_median,
    _shift,
    _slot_ewm,
    _smooth_along,
    _trailing_slope,
)

MIN_HISTORY = pd.Timedelta(days=3)
WEEKLY_HISTORY = pd.Timedelta(days=8)  # a week to look back on and a day of replays
LONG_WEEKLY_HISTORY = pd.Timedelta(days=15)
BLOCK_NAMES = ("<1h", "1-6h", "6-24h", ">=24h")
COMBINED = (2, 3, 5, 8)  # the means of the best this many candidates are candidates too
NOW_STEPS = 3
FUTURE_DAYS = 3  # the grid's empty days past the history
LOOKBACK_DAYS = {  # how many days back a candidate's value at a day looks, seeing k days back
    "snaive_1d": lambda k: k, "snaive_7d": lambda k: 7 * k, "median_7d": lambda k: k + 7,
    "log_median_7d": lambda k: k + 7, "median_3w": lambda k: 7 * k + 14,
    "smooth_1d": lambda k: k + 22,  # and the running mean's warm-up (0.7 ** 22 < 0.1 %)
    "profile_7d": lambda k: k + 8,
    # theta_7d's shape: from the week its drift is fitted on (and the day before it)
    "centred_median_7d": lambda k: k + 15, "centred_log_median_7d": lambda k: k + 15,
    "harmonic": lambda k: k + HARMONIC_DAYS + 1,
}  # the error of the last steps a ``+now`` candidate corrects by
BASE = ("snaive_1d", "snaive_7d", "median_7d", "median_3w", "smooth_1d", "profile_7d",
        "level_7d", "theta_7d", "harmonic", "curve")
CORRECTED = ("snaive_1d", "snaive_7d", "median_7d", "median_3w", "smooth_1d", "profile_7d",
             "harmonic")
SMOOTH_ALPHA = 0.3  # smooth_1d: each day's weight in the slot's running mean
THETA_HALF_LIVES_H = (1.0, 3.0, 12.0, 48.0)  # theta_7d: its level's smoothing, fitted among these
THETA_DRIFT_DAYS = 7  # theta_7d: the drift is the slope over this many days
# theta_7d: how much of that drift it follows (0: the level alone; 0.5: the classic Theta
# method's hedge; 1: all of it), fitted on the day-ahead errors, as the optimised Theta fits
THETA_DRIFT_WEIGHTS = (0.0, 0.5, 1.0)
NAIVE = ("snaive_1d", "snaive_7d")
SCALE_FLOOR = 0.25  # _ScaledErrors: a bucket's scale, at least this share of its parent's
SCALE_PRIOR = 60.0  # _ScaledErrors: the weight of a bucket's parent, in errors
DISCRETE_SHARE = 0.4  # _ScaledErrors: a lead block this often exactly right keeps bucket quantiles


@dataclass
class _Choice:
    label: str  # "median_7d+now", "mean(curve, level_7d)"
    parts: tuple[int, ...]  # candidate indices averaged
    score: float  # backtest pinball of the block
    naive: float  # the better seasonal naive's, same cells


@dataclass
class _State:
    series: Series
    flat: np.ndarray  # the history on the local wall-clock grid (days x slots, flattened)
    pos: np.ndarray  # each step's position on that grid
    first_day: pd.Timestamp
    steps_per_day: int
    names: list[str]
    phis: dict[str, float]
    curve: _Fitted | None  # the curve model's fitted state
    slots: np.ndarray  # each step's slot of the day and day type
    kinds: np.ndarray
    span: pd.Timedelta
    choices: list[_Choice | None] = field(default_factory=lambda: [None] * len(BLOCK_NAMES))
    errors: _Errors = field(default_factory=lambda: _Errors(np.zeros(0, np.int64), np.zeros(0)))
    rounding: str = "down"  # integer series: how a quantile becomes a replica count
    # the grid's medians, by (kind, k): the first row they were read from, and the line
    lines: dict[tuple[str, int], tuple[int, np.ndarray]] = field(default_factory=dict)
    first_row: int = 0  # the first day the candidates are read at (earlier days only feed them)


ROUNDINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "down": np.floor, "nearest": np.round, "up": np.ceil}


class AutoForecaster(SeriesForecaster):
    name = "auto"
    integer_quantiles = False  # integer series: rounded as their backtest says (``_rounding``)

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        backtest_days: float = 21.0,
        origin_hours: float = 2.0,
        backtest_hours: float = 48.0,
        lead_minutes: float = 15.0,
        score_minutes: float = 60.0,
        select_quantile: float = 0.9,
        aci_gamma: float | None = 0.02,
        aci_days: int = 7,
        cache: dict[Any, Any] | None = None,
        candidates: tuple[str, ...] | None = None,
        combined: tuple[int, ...] = (1,) + COMBINED,
        scaled_calibration: bool = True,
        **curve_options: Any,
    ) -> None:
        """``cache``: a dict shared by fits on growing prefixes of one history (the
        simulator's nightly refits): every replay is made once and reused.
        ``scaled_calibration``: calibrate by ``_ScaledErrors`` (a location and a scale per
        bucket, one shared quantile; the default) rather than each bucket's own quantiles.
        ``candidates``: the base candidates to consider (default all); ``curve_options`` go
        to the curve model (e.g. ``level_band=None``: without its regime handling)."""
        super().__init__(timezone=timezone, holiday_country=holiday_country, bounds=bounds)
        self.backtest_days = backtest_days
        self.origin_hours = origin_hours
        self.backtest_hours = backtest_hours
        self.lead_minutes = lead_minutes
        self.score_minutes = score_minutes
        self.select_quantile = select_quantile
        self.aci_gamma = aci_gamma
        self.aci_days = aci_days
        self.cache = cache
        self.candidates = tuple(candidates) if candidates else BASE
        self.combined = combined
        self.scaled_calibration = scaled_calibration
        unknown = sorted(set(self.candidates) - set(BASE))
        if unknown:
            raise ValueError(f"unknown auto candidate(s) {unknown}; choose from {', '.join(BASE)}")
        self.curve_model = CurveForecaster(
            timezone=timezone, holiday_country=self.calendar, bounds=bounds, cache=cache,
            calibrate=False, **curve_options)

    # ---------------------------------------------------------------- the grid
    def _grid(self, index: pd.DatetimeIndex, step: pd.Timedelta,
              first_day: pd.Timestamp | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, pd.Timestamp]:
        """Grid positions, slots of the day and day types of ``index`` (and the grid's first
        local day, the first of ``index``'s unless given)."""
        wall, slots, kinds = self.curve_model._calendar(index, step, False)
        first_day = wall[0].normalize() if first_day is None else first_day
        steps_per_day = int(DAY / step)
        days = ((wall.normalize() - first_day) // DAY).to_numpy().astype(np.int64)
        return days * steps_per_day + np.clip(slots, 0, steps_per_day - 1), slots, kinds, first_day

    def _line(self, s: _State, kind: str, k: int) -> np.ndarray:
        """A candidate's value at every grid position when it must look ``k`` days (weekly
        kinds: weeks) back at least; one entry past the grid's end is NaN."""
        key = (kind, k)
        if key in s.lines and s.lines[key][0] <= s.first_row:
            return s.lines[key][1]
        S = s.steps_per_day
        # from the days the candidates are read at, back as far as a line looks (and the
        # smoothed mean's warm-up): older days change nothing
        start = max(0, s.first_row - LOOKBACK_DAYS[kind](k))
        flat = s.flat[start * S :]
        rows = flat.reshape(-1, S)
        if kind == "snaive_1d":
            line = _shift(flat, k * S)
        elif kind == "snaive_7d":
            line = _shift(flat, 7 * k * S)
        elif kind == "median_7d":
            line = _rolling_median(rows, lag=k, count=7, stride=1).reshape(-1)
        elif kind == "median_3w":
            line = _rolling_median(rows, lag=7 * k, count=3, stride=7).reshape(-1)
        elif kind == "smooth_1d":
            line = _shift(_slot_ewm(rows, SMOOTH_ALPHA).reshape(-1), k * S)
        elif kind == "profile_7d":
            line = _smooth_along(_rolling_mean(rows, lag=k, count=7).reshape(-1),
                                 _half_width(S))
        elif kind == "log_median_7d":
            line = _rolling_median(np.log1p(np.maximum(rows, 0.0)), lag=k, count=7,
                                   stride=1).reshape(-1)
        elif kind == "harmonic":
            log = s.series.lower >= 0
            line = _harmonic_line(np.log1p(np.maximum(flat, 0.0)) if log else flat, S, k)
            line = np.expm1(line) if log else line
        elif kind in ("centred_median_7d", "centred_log_median_7d"):
            line = _centred_median(flat if kind == "centred_median_7d"
                                   else np.log1p(np.maximum(flat, 0.0)), S, k)
        else:
            raise KeyError(kind)
        s.lines[key] = (s.first_row, np.concatenate([np.full(start * S, np.nan), line, [np.nan]]))
        return s.lines[key][1]

    def _read(self, s: _State, kind: str, ks: np.ndarray, at: np.ndarray) -> np.ndarray:
        """A candidate's line at grid positions ``at``, each looking ``ks`` days (weeks) back."""
        out = np.full(at.shape, np.nan)
        for k in range(int(ks.min()), int(ks.max()) + 1):
            hit = ks == k
            out[hit] = self._line(s, kind, k)[at[hit]]
        return out

    # ---------------------------------------------------------------- candidates
    def _forecasts(self, s: _State, origins: np.ndarray, targets: np.ndarray,
                   curve_points: np.ndarray | None) -> np.ndarray:
        """Every candidate's point forecast, candidates x origins x leads: ``origins`` and
        ``targets`` are grid positions (targets -1 where there is nothing to forecast)."""
        S = s.steps_per_day
        safe = np.where(targets >= 0, targets, len(s.flat))  # the NaN past the end
        gap = np.maximum(1, safe - origins[:, None])
        k_day = -(-gap // S)
        k_week = -(-gap // (7 * S))
        base: dict[str, np.ndarray] = {}

        def by_k(kind: str, ks: np.ndarray) -> np.ndarray:
            return self._read(s, kind, ks, safe)

        fallback = by_k("snaive_1d", k_day)
        median = by_k("median_7d", k_day)
        fallback = np.where(np.isfinite(fallback), fallback, median)
        for name in s.names:
            if name == "snaive_1d":
                value = fallback
            elif name == "median_7d":
                value = median
            elif name == "snaive_7d":
                value = by_k("snaive_7d", k_week)
            elif name == "median_3w":
                value = by_k("median_3w", k_week)
            elif name == "smooth_1d":
                value = by_k("smooth_1d", k_day)
            elif name == "profile_7d":
                # smoothed over the neighbouring slots: it must look back a day more often
                value = by_k("profile_7d", -(-(gap + _half_width(S)) // S))
            elif name == "level_7d":
                value = self._level(s, origins, k_day, safe)
            elif name == "theta_7d":
                value = self._theta(s, origins, k_day, safe, gap)
            elif name == "harmonic":
                value = by_k("harmonic", k_day)
            elif name == "curve":
                assert curve_points is not None  # a candidate only where the curve was fitted
                value = curve_points
            else:
                continue
            base[name] = np.where(np.isfinite(value), value, fallback)
        out = []
        for name in s.names:
            if name.endswith("+now"):
                raw = name[:-4]
                out.append(base[raw] + self._nowcast(s, raw, origins, gap))
            else:
                out.append(base[name])
        stacked = np.stack(out)
        # the last value seen, where nothing else is known (a gap of a day or more)
        last = s.flat[origins]
        return np.where(np.isfinite(stacked), stacked, last[None, :, None])

    def _level(self, s: _State, origins: np.ndarray, k_day: np.ndarray,
               safe: np.ndarray) -> np.ndarray:
        """``median_7d``'s shape at the last 24 hours' level (in log space when the series
        never goes below zero: the level then scales the shape)."""
        S = s.steps_per_day
        log = s.series.lower >= 0
        shape_kind = "log_median_7d" if log else "median_7d"
        lo = s.first_row * S
        values = s.flat[lo:]
        values = np.log1p(np.maximum(values, 0.0)) if log else values
        deviation = values - self._line(s, shape_kind, 1)[lo:-1]
        level = _trailing_nanmean(deviation, S)[origins - lo]
        out = self._read(s, shape_kind, k_day, safe) + np.nan_to_num(level)[:, None]
        return np.expm1(out) if log else out

    def _theta(self, s: _State, origins: np.ndarray, k_day: np.ndarray, safe: np.ndarray,
               gap: np.ndarray) -> np.ndarray:
        """The Theta method (simple exponential smoothing with a share of the linear drift)
        on the series less ``median_7d``'s shape (in log space when it never goes below
        zero): at the target, the shape plus the smoothed level at the origin plus a share of
        the slope of the last ``THETA_DRIFT_DAYS`` days times the lead. The level's smoothing
        is the one of ``THETA_HALF_LIVES_H`` with the least one-step error, the share the one
        of ``THETA_DRIFT_WEIGHTS`` with the least day-ahead error."""
        S = s.steps_per_day
        log = s.series.lower >= 0
        shape_kind = "centred_log_median_7d" if log else "centred_median_7d"
        lo = max(0, s.first_row - THETA_DRIFT_DAYS - 1) * S  # the drift's week before
        values = s.flat[lo:]
        values = np.log1p(np.maximum(values, 0.0)) if log else values
        level_series = pd.Series(values - self._line(s, shape_kind, 1)[lo:-1])
        if "theta_alpha" not in s.phis:
            step_h = 24.0 / S
            best = (np.inf, 1.0)
            for half_life in THETA_HALF_LIVES_H:
                alpha = 1.0 - 0.5 ** (step_h / half_life)
                smoothed = level_series.ewm(alpha=alpha, adjust=False, ignore_na=True).mean()
                miss = np.nanmean(np.abs(level_series.to_numpy()[1:]
                                         - smoothed.to_numpy()[:-1]))
                best = min(best, (miss, alpha)) if np.isfinite(miss) else best
            s.phis["theta_alpha"] = best[1]
        alpha = s.phis["theta_alpha"]
        level = level_series.ewm(alpha=alpha, adjust=False, ignore_na=True).mean().to_numpy()
        slope = _trailing_slope(level_series.to_numpy(), THETA_DRIFT_DAYS * S)
        if "theta_drift" not in s.phis:
            later = level_series.to_numpy()[S:]
            misses = [np.abs(later - level[:-S] - weight * slope[:-S] * S)
                      for weight in THETA_DRIFT_WEIGHTS]
            # too short a history to tell (no day-ahead error yet): the level alone
            means = [float(np.mean(m[np.isfinite(m)])) if np.isfinite(m).any() else np.inf
                     for m in misses]
            s.phis["theta_drift"] = THETA_DRIFT_WEIGHTS[int(np.argmin(means))]
        at = origins - lo
        drift = np.nan_to_num(slope[at])[:, None] * s.phis["theta_drift"] * gap
        out = self._read(s, shape_kind, k_day, safe) + np.nan_to_num(level[at])[:, None] + drift
        return np.expm1(out) if log else out

    def _nowcast(self, s: _State, raw: str, origins: np.ndarray, gap: np.ndarray) -> np.ndarray:
        """The correction of a ``+now`` candidate: its error over the last ``NOW_STEPS`` up to
        each origin, decayed over the lead by the AR(1) of its one-day-ahead errors."""
        lo = s.first_row * s.steps_per_day
        residual = s.flat[lo:] - self._line(s, raw, 1)[lo:-1]
        level = _trailing_nanmean(residual, NOW_STEPS)[origins - lo]
        if raw not in s.phis:  # fitted once per fit (the replays' rate serves the forecast)
            s.phis[raw] = _lag_one(residual)
        phi = s.phis[raw]
        return np.nan_to_num(level)[:, None] * phi ** gap

    # ---------------------------------------------------------------- fit
    def _fit_one(self, series: Series) -> _State:
        span = require_span(series, series.values, MIN_HISTORY, self.name)
        steps_per_day = int(DAY / series.step)
        pos, slots, kinds, first_day = self._grid(series.values.index, series.step)
        n_days = int(pos[-1] // steps_per_day) + 1
        # and empty days ahead, so that a forecast of up to two days reuses the fit's lines
        flat = np.full((n_days + FUTURE_DAYS) * steps_per_day, np.nan)
        flat[pos] = series.values.to_numpy()
        names = [c for c in self.candidates
                 if not (c == "snaive_7d" and span < WEEKLY_HISTORY)
                 and not (c == "median_3w" and span < LONG_WEEKLY_HISTORY)]
        # corrected first: where the backtest cannot tell them apart (a series it forecasts
        # perfectly), following the last steps is the safer side
        names = [f"{c}+now" for c in CORRECTED if c in names] + names
        curve = self.curve_model._fit_one(series) if "curve" in names else None
        s = _State(series, flat, pos, first_day, steps_per_day, names, {}, curve, slots, kinds,
                   span)
        self._select(s)
        return s

    def _origins(self, s: _State) -> np.ndarray:
        """Backtest origins: every ``origin_hours`` over the last ``backtest_days``, the last
        one ``origin_hours`` before the history ends, none in the first day (nothing to repeat
        yet); positions in the history (steps that were observed)."""
        values = s.series.values.to_numpy()
        n = len(values)
        step_h = s.series.step / pd.Timedelta(hours=1)
        every = max(1, round(self.origin_hours / step_h))
        first = max(s.steps_per_day, n - 1 - round(self.backtest_days * 24 / step_h))
        origins = np.arange(n - 1 - every, first - 1, -every)[::-1]
        return origins[np.isfinite(values[origins])]

    def _select(self, s: _State) -> None:
        values = s.series.values.to_numpy()
        n = len(values)
        step_h = s.series.step / pd.Timedelta(hours=1)
        steps = max(1, round(self.backtest_hours / step_h))
        origins = self._origins(s)
        if len(origins) == 0:
            return
        leads = _backtest_leads(steps, step_h, self.lead_minutes)
        target_idx = origins[:, None] + leads[None, :]
        inside = target_idx < n
        target_idx = np.where(inside, target_idx, n - 1)
        actual = np.where(inside, values[target_idx], np.nan)
        forecasts = self._replays(s, origins, leads, steps)
        blocks = np.digitize(leads * step_h, LEAD_EDGES_H)
        # the choice is scored on fewer leads than the calibration reads (neighbouring leads
        # rank candidates alike; the quantiles need every error); in single precision: the
        # scores rank candidates, and half the bytes to sort
        scored = np.flatnonzero(_scored_leads(leads, step_h, self.score_minutes))
        errors = (actual[:, scored][None] - forecasts[:, :, scored]).astype(np.float32)
        ok = np.isfinite(errors).all(axis=0)
        scored_blocks = blocks[scored]
        chosen = np.full(actual.shape, np.nan)
        q = self.select_quantile
        naive = [s.names.index(c) for c in NAIVE if c in s.names]
        for block in range(len(s.choices)):
            lead_at = np.flatnonzero(blocks == block)  # the block's leads: one run of them
            picked = np.flatnonzero(scored_blocks == block)
            if len(lead_at) == 0 or len(picked) == 0:
                continue
            span = slice(int(picked[0]), int(picked[-1]) + 1)
            cells = ok[:, span]
            if not cells.any():
                continue
            e = errors[:, :, span][:, cells]  # candidates x cells
            scores = _calibrated_pinball(e, q)
            order = np.argsort(scores, kind="stable")
            options = ([_Choice(s.names[i], (int(i),), float(scores[i]), 0.0) for i in order]
                       if 1 in self.combined else [])
            mixes = [tuple(sorted(int(i) for i in order[:size]))
                     for size in self.combined if 1 < size <= len(order)]
            if mixes:
                mixed = np.stack([e[list(parts)].mean(axis=0) for parts in mixes])
                for parts, score in zip(mixes, _calibrated_pinball(mixed, q)):
                    label = f"mean({', '.join(s.names[i] for i in parts)})"
                    options.append(_Choice(label, parts, float(score), 0.0))
            best = min(options, key=lambda c: c.score)
            best.naive = float(min(scores[i] for i in naive)) if naive else float("nan")
            s.choices[block] = best
            dense = slice(int(lead_at[0]), int(lead_at[-1]) + 1)
            chosen[:, dense] = (actual[:, dense]
                                - forecasts[list(best.parts)][:, :, dense].mean(axis=0))
        # the chosen forecast's errors calibrate it: by lead block, hour of day, off day
        fine = np.isfinite(chosen)
        at = target_idx[fine]
        hour = np.floor(s.slots[at] * step_h).astype(np.int64)
        lead_bucket = np.broadcast_to(blocks, chosen.shape)[fine]
        keys = _bucket_key(lead_bucket, hour, s.kinds[at] != WORKING_DAY)
        calibration = _ScaledErrors if self.scaled_calibration else _Errors
        s.errors = calibration(keys, chosen[fine], target_idx[fine])
        if s.series.is_integer:
            point = actual[fine] - chosen[fine]
            s.rounding = _rounding(actual[fine], point + s.errors.quantiles((q,), keys)[:, 0], q)

    def _replays(self, s: _State, origins: np.ndarray, leads: np.ndarray, steps: int
                 ) -> np.ndarray:
        """Every candidate's forecasts from each backtest origin at ``leads``: candidates x
        origins x leads, past the history's end too (each sees only its past). With a cache,
        an origin is computed once and reused by later refits (with the decay rates of the
        fit that made it)."""
        store = None
        if self.cache is not None:
            key = ("auto-replays", s.series.uid, s.first_day, tuple(s.names), steps,
                   len(leads))
            store = self.cache.setdefault(key, {})
        todo = [i for i, o in enumerate(origins.tolist()) if store is None or o not in store]
        out = np.empty((len(s.names), len(origins), len(leads)))
        if todo:
            picked = origins[todo]
            self._read_from(s, int(s.pos[picked[0]]))
            targets = self._target_positions(s, picked[:, None] + leads[None, :])
            curve_points = None
            if s.curve is not None:
                curve_points = self.curve_model.points(s.curve, picked, steps,
                                                       past_the_end=True)[:, leads - 1]
            fresh = self._clip(s, self._forecasts(s, s.pos[picked], targets, curve_points))
            out[:, todo] = fresh
            if store is not None:
                for j, o in enumerate(picked.tolist()):
                    store[o] = fresh[:, j]
        if store is not None:
            for old in [o for o in store if o < origins[0]]:
                del store[old]  # out of the backtest's window for good: the refits only grow
            fresh_rows = set(todo)
            for i, o in enumerate(origins.tolist()):
                if i not in fresh_rows:
                    out[:, i] = store[o]
        return out

    def _target_positions(self, s: _State, steps: np.ndarray) -> np.ndarray:
        """Grid positions of history steps ``steps`` (indices into the history; those past
        its end on the calendar after it)."""
        n = len(s.series.values)
        beyond = int(steps.max()) - (n - 1)
        positions = s.pos
        if beyond > 0:
            future = s.series.future_index(s.series.step * beyond)
            positions = np.concatenate(
                [s.pos, self._grid(future, s.series.step, s.first_day)[0]])
        return np.minimum(positions[steps], len(s.flat))  # past the grid: its NaN

    def _read_from(self, s: _State, origin: int) -> None:
        """The candidates are read from grid position ``origin`` on (and the decay rates fitted
        on the week before it)."""
        history_days = int(s.pos[-1] // s.steps_per_day) + 1
        s.first_row = max(0, min(origin // s.steps_per_day - 1, history_days - 8))

    def _clip(self, s: _State, forecasts: np.ndarray) -> np.ndarray:
        return np.clip(forecasts, s.series.lower, s.series.upper)

    # ---------------------------------------------------------------- predict
    def _predict_one(
        self, s: _State, horizon: pd.Timedelta, qs: tuple[float, ...]
    ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        series = s.series
        index = series.future_index(horizon)
        n = len(series.values)
        step_h = series.step / pd.Timedelta(hours=1)
        targets, slots, kinds, _ = self._grid(index, series.step, s.first_day)
        origin = np.array([s.pos[-1]])
        self._read_from(s, int(origin[0]))
        curve_points = None
        if s.curve is not None:
            curve = self.curve_model
            _, c_slots, c_kinds = curve._calendar(index, series.step, s.curve.one_curve)
            profile = curve._profile(s.curve, curve._days_before(s.curve, n - 1))
            point, _ = curve._point(s.curve, profile, n - 1, c_kinds, c_slots,
                                    np.arange(1, len(index) + 1))
            curve_points = point[None, :]
        if targets.max() >= len(s.flat):
            # future days on the grid (empty: their candidates read the history through lags)
            days = int(targets.max() // s.steps_per_day) + 1
            s.flat = np.append(s.flat, np.full(days * s.steps_per_day - len(s.flat), np.nan))
            s.lines.clear()
        forecasts = self._forecasts(s, origin, targets[None, :], curve_points)[:, 0, :]
        forecasts = self._clip(s, forecasts)
        lead_h = np.arange(1, len(index) + 1) * step_h
        blocks = np.digitize(lead_h, LEAD_EDGES_H)
        point = np.full(len(index), np.nan)
        served = np.full(len(index), "snaive_1d", dtype=object)
        skill = np.zeros(len(index))
        for block, choice in enumerate(s.choices):
            at = blocks == block
            if choice is None:
                # a lead block the backtest could not reach: the nearest block's choice
                known = [(b, c) for b, c in enumerate(s.choices) if c is not None]
                if not known:
                    point[at] = forecasts[0][at]
                    continue
                choice = min(known, key=lambda bc: abs(bc[0] - block))[1]
            point[at] = forecasts[list(choice.parts)].mean(axis=0)[at]
            served[at] = choice.label
            skill[at] = _skill(choice)
        if s.curve is not None and curve_points is not None and not s.curve.one_curve:
            # a holiday on a weekday is a calendar fact a few weeks of backtest cannot teach:
            # only the curve's day types know it looks like a Sunday
            weekday = index.tz_convert(self.timezone).day_of_week.to_numpy()
            holiday = (kinds == SUNDAY_OR_HOLIDAY) & (weekday < 5)
            point[holiday] = forecasts[s.names.index("curve")][holiday]
            served[holiday] = "curve (holiday)"
        self._served.append((served, skill))
        hour = np.floor(slots * step_h).astype(np.int64)
        levels = tuple(adapted_levels(
            s.errors, qs, end=n, steps_per_day=s.steps_per_day,
            steps_per_hour=max(1, round(1 / step_h)), gamma=self.aci_gamma,
            days=self.aci_days))
        offsets = s.errors.offsets(levels, blocks, hour, kinds != WORKING_DAY)
        out = point[:, None] + offsets
        if series.is_integer:
            out = ROUNDINGS[s.rounding](out + (1e-6 if s.rounding == "down" else 0.0))
        return series, index, out

    def predict(self, horizon: pd.Timedelta | str, quantiles: Sequence[float]) -> pd.DataFrame:
        """The tidy forecast with two more columns: ``served_by``, the candidate (or mean of
        candidates) that made each step's forecast, and ``skill``, that choice's backtest
        skill against the better seasonal naive in the step's lead block (1 - the ratio of
        their pinball losses: 0.3 is 30 % less loss; below 0 the naive did better)."""
        self._served: list[tuple[np.ndarray, np.ndarray]] = []
        frame = super().predict(horizon, quantiles)
        frame[SERVED_BY] = np.concatenate([served for served, _ in self._served])
        frame[SKILL] = np.concatenate([skill for _, skill in self._served])
        return frame

    # ---------------------------------------------------------------- the choice
    @property
    def choices_(self) -> pd.DataFrame:
        """Per series and lead block: the forecast that serves it, its backtest pinball loss
        at ``select_quantile`` and its skill against the better seasonal naive (1 - the ratio:
        0.25 means a quarter less loss)."""
        rows = []
        for s in getattr(self, "fitted_", []):
            for block, choice in enumerate(s.choices):
                if choice is None:
                    continue
                rows.append({
                    "unique_id": s.series.uid, "lead": BLOCK_NAMES[block],
                    "chosen": choice.label, "pinball": choice.score,
                    "naive_pinball": choice.naive,
                    "skill": _skill(choice),
                    "history_days": s.span / DAY,
                })
        return pd.DataFrame(rows, columns=["unique_id", "lead", "chosen", "pinball",
                                           "naive_pinball", "skill", "history_days"])


class _ScaledErrors(_Errors):
    """Split-conformal with a location and a scale per bucket (lead block, hour of day, off
    day). A bucket holds the errors of a few distinct days only, too few for its own 0.9
    quantile but enough for a median and a mean deviation; so each error is standardised by
    its bucket's, and the standardised errors share one quantile per (lead block, off day).
    A bucket's location and scale are its own shrunk towards its (lead block, off day)'s, as
    if the parent added ``SCALE_PRIOR`` errors. A (lead block, off day) whose replays are
    mostly exactly right keeps per-bucket quantiles (``DISCRETE_SHARE``). Measured: on the
    real traces the geometric mean of auto's pinball over the better seasonal naive is 0.890x
    with per-bucket quantiles, 0.845x with these; on the sample pool 0.32x Prophet's with
    either (0.42x without the exception for exact replays)."""

    def __init__(self, keys: np.ndarray, errors: np.ndarray,
                 targets: np.ndarray | None = None) -> None:
        super().__init__(keys, errors, targets)
        size = (len(LEAD_EDGES_H) + 1) * 48
        if len(errors) == 0:
            self._loc, self._scale = np.zeros(size), np.ones(size)
            self._z = _Errors(keys, errors, targets)
            self._discrete = np.zeros(size, dtype=bool)
            return
        uniq, starts, counts, values = self._grouped(0)
        median = np.zeros(size)
        median[uniq] = _grouped_quantiles(values, starts, counts, np.array([0.5]))[:, 0]
        count = np.bincount(keys, minlength=size).astype(float)
        deviation = np.bincount(keys, weights=np.abs(errors - median[keys]), minlength=size)
        # a (lead block, off day) whose replays are exactly right at least half the time (an
        # integer series at rest: a night at its floor, a count that holds) has a point mass no
        # location and scale describe: its buckets keep their own quantiles
        p_uniq, p_starts, p_counts, p_values = self._grouped(1)
        p_median = _grouped_quantiles(p_values, p_starts, p_counts, np.array([0.5]))[:, 0]
        at_median = np.abs(p_values - np.repeat(p_median, p_counts)) <= 1e-9
        ties = np.add.reduceat(at_median.astype(np.int64), p_starts) if len(p_starts) else 0
        exact = np.zeros((len(LEAD_EDGES_H) + 1) * 2, dtype=bool)
        exact[p_uniq] = ties >= DISCRETE_SHARE * p_counts
        self._discrete = exact[_coarse_key(np.arange(size), 1)]
        loc_sum = median * count
        tables = [x.reshape(-1, 24, 2) for x in (count, loc_sum, deviation)]
        n, loc_total, dev_total = tables
        parent_n = n.sum(axis=1, keepdims=True)
        parent_loc = loc_total.sum(axis=1, keepdims=True) / np.maximum(parent_n, 1)
        parent_dev = dev_total.sum(axis=1, keepdims=True) / np.maximum(parent_n, 1)
        prior = SCALE_PRIOR
        loc = (loc_total + prior * parent_loc) / (n + prior)
        scale = (dev_total + prior * parent_dev) / (n + prior)
        self._loc = loc.reshape(-1)
        # a bucket that never misses (a night at the floor) would turn any other error into
        # an outlier of the shared quantile: its scale is at least a share of its parent's
        scale = np.maximum(scale, SCALE_FLOOR * parent_dev)
        self._scale = np.maximum(scale.reshape(-1), 1e-9 + 1e-6 * float(np.mean(np.abs(errors))))
        z = (errors - self._loc[keys]) / self._scale[keys]
        self._z = _Errors(_parent_key(keys), z, targets)

    def quantiles(self, qs: Sequence[float], keys: np.ndarray) -> np.ndarray:
        if len(self.all) == 0:
            return np.zeros((len(keys), len(qs)))
        # per distinct bucket, then spread: a fit asks for every backtest error's bucket
        fine, inverse = _small_unique(np.asarray(keys))
        z = self._z.quantiles(qs, _parent_key(fine))
        out = self._loc[fine][:, None] + self._scale[fine][:, None] * z
        own = self._discrete[fine]
        if own.any():
            out[own] = super().quantiles(qs, fine[own])
        return out[inverse.reshape(-1)]


def _parent_key(keys: np.ndarray) -> np.ndarray:
    """A bucket key's (lead block, off day), as the key of its hour 0."""
    return (keys // 48) * 48 + keys % 2


def _backtest_leads(steps: int, step_h: float, minutes: float) -> np.ndarray:
    """The leads (in steps) the backtest scores: every step of the first hour, then every
    ``minutes`` (neighbouring leads' errors tell the same story; fewer, measured on the real
    traces, choose worse)."""
    every = max(1, round(minutes / (step_h * 60)))
    hour = max(1, round(1 / step_h))
    return np.unique(np.concatenate([np.arange(1, min(hour, steps) + 1),
                                     np.arange(hour + every, steps + 1, every)]))


def _scored_leads(leads: np.ndarray, step_h: float, minutes: float) -> np.ndarray:
    """Which backtest leads score the choice: every one of the first hour, then one every
    ``minutes``."""
    lead_minutes = np.round(leads * step_h * 60).astype(np.int64)
    every = max(1, round(minutes))
    return (lead_minutes <= 60) | (lead_minutes % every == 0)


def _skill(choice: _Choice) -> float:
    return 1.0 - choice.score / choice.naive if choice.naive > 0 else 0.0


def _rounding(actual: np.ndarray, quantile: np.ndarray, q: float) -> str:
    """How an integer series' quantiles become integers: down (the largest integer at or
    below: it keeps the coverage the quantile has), to the nearest or up, whichever the
    backtest's calibrated ``q``-quantiles lose least pinball with. Down is as good as the others
    when the quantile covers exactly ``q``; under-covered it loses the most."""
    def loss(pred: np.ndarray) -> float:
        d = actual - pred
        return float(np.mean(np.maximum(q * d, (q - 1) * d)))

    losses = {name: loss(how(quantile + (1e-6 if name == "down" else 0.0)))
              for name, how in ROUNDINGS.items()}
    return min(losses, key=lambda name: losses[name])


def _calibrated_pinball(errors: np.ndarray, q: float) -> np.ndarray:
    """Per row of errors (actual - forecast): the pinball loss at ``q`` of the forecast
    shifted by the row's own ``q``-quantile error (what calibration makes of it)."""
    n = errors.shape[1]
    rank = q * (n - 1)  # numpy's default ("linear") quantile
    k = min(int(np.floor(rank)), n - 1)
    # a full sort, not a partial one: the errors of integer series are full of ties, where
    # numpy's introselect is 3-4x slower than its (vectorised) sort
    ordered = np.sort(errors, axis=1)
    low = ordered[:, k]
    high = ordered[:, k + 1] if k + 1 < n else low
    offsets = low + (high - low) * (rank - k)
    # the pinball loss of d = e - offset is q * d - min(d, 0), and the errors under the
    # offset are exactly the first k + 1 in order
    total = ordered.sum(axis=1, dtype=np.float64) - n * offsets
    under = ordered[:, : k + 1].sum(axis=1, dtype=np.float64) - (k + 1) * offsets
    return (q * total - under) / n
