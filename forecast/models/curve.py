"""``curve``: the day-type curve model, ``auto``'s candidate for office-day shaped series.

It was idlegpu's ``auto`` until ``auto`` became a choice among candidates by backtest
(``idlegpu.forecast.models.auto``); as a model of its own it keeps its calibration.

The idea: an inference service repeats its day. The curve model learns, per series, the curve of a
working day, a Saturday and a Sunday-or-holiday at every time-of-day slot, as a recency-weighted
median of past days of that type (half-life two weeks, so growth and new habits are followed
and one-off spikes are ignored). From the last observations it corrects the level: the current
deviation from the curve decays with the lead time at the rate the series' own deviations
decay (an AR(1) fitted to them).

Its quantiles are calibrated by construction: while fitting, it replays itself at every hour
of the last three weeks (each replay sees only its past), collects the errors by lead time,
hour of day and working/off day, and adds their empirical quantiles to the point forecast:
split-conformal prediction per bucket. Integer series (replica counts) get integer quantiles
(rounded down: the largest integer at or below each quantile, which keeps its coverage; see
``finish_quantiles``) within their bounds (the autoscaler's min/max replicas when the config
is given, else the range seen).

Regimes (a launch, a lost customer, a surge): the curve is a two-week median and would take a
week or two to follow a new level, and the level correction fades within hours. So the curve
is rescaled by the ratio of the actuals to it over the last 12 hours of steps where it is above
the series' floor (the mean of the middle half of the step ratios: a spike does not count; at
the floor, a night at min replicas, a change of demand does not show), once that ratio leaves
a dead band of +-12 %: ordinary days stay inside it and forecast as before, a +40 % launch is
followed within hours. A drop must also show over three times that window (a quiet eve or a
bridge day is not a new regime, and following it would under-forecast the next day), and is
followed for a day ahead only, then fades back to the curve (a lull of a few days, the year's
end, is not extrapolated for a week; each nightly refit measures it again). The calibration
replays are rescaled the same way, their errors kept in the units of the curve and scaled with
it, so the quantiles know how well rescaled forecasts do. A surge still outruns the ratio (it
lags by half a window): the quantile level adapts to the replays' recent misses (one-sided
adaptive conformal inference, ``_adapted_levels``), widening the upper quantiles while they
miss more than they should. What it cannot see: a change hidden under the floor (a small
service that idles at its min replicas all weekend shows its launch on weekdays only, so its
first weekend after it is under-covered).

Short histories: with less than a week, all days share one curve (documented fallback); less
than one day of history is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import WORKING_DAY, HolidayCalendar, day_types, wall_clock
from idlegpu.forecast.models.base import (
    DAY,
    WEEK,
    Series,
    SeriesForecaster,
    require_span,
)

LEAD_EDGES_H = (1.0, 6.0, 24.0)  # lead-time buckets: <1 h, 1-6 h, 6-24 h, >= 24 h
MIN_BUCKET = 40  # fewer errors than this in a bucket: use the coarser bucket
LOOKBACK_HALF_LIVES = 5  # days older than this many half-lives weigh < 3 %: left out
LEVEL_BAND = 0.12  # the last day within +-12 % of the curve: no rescaling (ordinary days)
LEVEL_MAX_AGE_DAYS = 3  # the ratio's evidence reaches back at most this far (a weekend)
DOWN_WINDOWS = 3  # a drop must show over three windows (a quiet day does not)
ACI_TOLERANCE = 2.0  # the adaptive level widens once a day misses more than twice 1 - q
ACI_MAX_WIDENING = 5.0  # the adaptive level misses at least (1 - q) / 5: q0.9 -> q0.98 at most


def _bucket_key(lead: np.ndarray, hour: np.ndarray, off: np.ndarray) -> np.ndarray:
    return (lead.astype(np.int64) * 24 + hour) * 2 + off.astype(np.int64)


def _coarse_key(key: Any, level: int) -> Any:
    """A bucket key (int or array) at grouping ``level``: 0 (lead, hour, off day) as is,
    1 (lead, off day), 2 (lead)."""
    if level == 0:
        return key
    if level == 1:
        return (key // 48) * 2 + key % 2
    return key // 48


class _Errors:
    """Calibration errors grouped by bucket, with coarser groupings for sparse buckets."""

    def __init__(self, keys: np.ndarray, errors: np.ndarray,
                 targets: np.ndarray | None = None) -> None:
        self.all = errors
        self._keys = keys
        # position of each error's target step in the series (for the adaptive level)
        self.targets = np.zeros(len(errors), dtype=np.int64) if targets is None else targets
        # by grouping level: each bucket's keys, first positions, sizes, the sorted errors
        self._sorted: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._by_value: np.ndarray | None = None  # the errors' stable order by value

    def offsets(
        self, qs: tuple[float, ...], lead: np.ndarray, hour: np.ndarray, off: np.ndarray
    ) -> np.ndarray:
        """Empirical error quantiles for each future step, from its finest well-filled bucket."""
        return self.quantiles(qs, _bucket_key(lead, hour, off))

    def quantiles(self, qs: Sequence[float], keys: np.ndarray) -> np.ndarray:
        """The error quantiles ``qs`` of the finest well-filled bucket of each key."""
        if len(self.all) == 0:
            return np.zeros((len(keys), len(qs)))
        fine, inverse = _small_unique(np.asarray(keys))
        levels = np.asarray(qs, dtype=float)
        table = np.empty((len(fine), len(levels)))
        todo = np.ones(len(fine), dtype=bool)
        for level in (0, 1, 2, -1):
            if not todo.any():
                break
            uniq, starts, counts, values = self._grouped(level)
            coarse = _coarse_key(fine[todo], level) if level >= 0 else np.zeros(todo.sum(), int)
            at = np.clip(np.searchsorted(uniq, coarse), 0, len(uniq) - 1)
            found = uniq[at] == coarse
            if level >= 0:
                found &= counts[at] >= MIN_BUCKET
            rows = np.flatnonzero(todo)[found]
            table[rows] = _grouped_quantiles(values, starts[at[found]], counts[at[found]],
                                              levels)
            todo[rows] = False
        return table[inverse.reshape(-1)]

    def _grouped(self, level: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The errors sorted by bucket of grouping ``level`` (-1: one bucket) and by value:
        each bucket's keys, first positions, sizes, and the sorted errors; once per fit."""
        if level not in self._sorted:
            if self._by_value is None:
                self._by_value = np.argsort(self.all, kind="stable")
            by_value = self._by_value
            if level >= 0:
                keys = _coarse_key(self._keys, level)[by_value]
                # a stable sort by bucket of the errors sorted by value is lexsort's order,
                # and small integer keys sort by radix in linear time
                small = keys.astype(np.int16) if len(keys) and keys.max() < 2**15 else keys
                by_key = np.argsort(small, kind="stable")
                order, keys = by_value[by_key], keys[by_key]
            else:
                order, keys = by_value, np.zeros(len(self.all), dtype=np.int64)
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys
            counts = np.diff(np.r_[starts, len(keys)])
            self._sorted[level] = (keys[starts], starts, counts, self.all[order])
        return self._sorted[level]


def _small_unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` of bucket keys (small non-negative integers)
    by counting, in linear time: a fit asks for the quantiles of every backtest error's bucket."""
    if len(keys) == 0 or keys.min() < 0 or keys.max() > 1_000_000:
        return np.unique(keys, return_inverse=True)
    present = np.bincount(keys.reshape(-1)) > 0
    fine = np.flatnonzero(present)
    where = np.zeros(len(present), dtype=np.int64)
    where[fine] = np.arange(len(fine))
    return fine, where[keys]


def _grouped_quantiles(values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                       qs: np.ndarray) -> np.ndarray:
    """``np.quantile(run, qs)`` (its default, linear method) of many sorted runs of
    ``values`` at once, one row per run."""
    index = qs[None, :] * (counts[:, None] - 1)
    below = np.floor(index).astype(np.int64)
    above = np.minimum(below + 1, counts[:, None] - 1)
    t = index - below
    a, b = values[starts[:, None] + below], values[starts[:, None] + above]
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


@dataclass
class _Fitted:
    series: Series
    slots: np.ndarray  # slot of day of every step
    kinds: np.ndarray  # day type of every step
    day_of: np.ndarray  # day number of every step (local)
    matrix: np.ndarray  # days x slots, NaN where missing
    day_kind: np.ndarray  # day type per day
    phi: float
    errors: _Errors
    key: tuple[Any, ...] = ()  # identifies the series and its calendar, for the cache
    one_curve: bool = False  # under a week of history: one curve for every day
    floor: float = 0.0  # the level the series rests at (min replicas): rescaling stops there


class CurveForecaster(SeriesForecaster):
    name = "curve"
    integer_quantiles = True

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: HolidayCalendar | str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        half_life_days: float = 14.0,
        calibration_days: int = 21,
        recent_steps: int = 3,
        level_band: float | None = LEVEL_BAND,
        level_hours: float = 12.0,
        aci_gamma: float | None = 0.05,
        aci_days: int = 3,
        cache: dict[Any, Any] | None = None,
        calibrate: bool = True,
    ) -> None:
        """``cache``: a dict shared by fits on growing prefixes of one history (the simulator's
        nightly refits): day curves and replays whose future is complete are reused rather than
        recomputed (a reused replay keeps the decay rate of the fit that made it). Never share
        one between different histories. ``calibrate=False``: no replays (``auto`` uses the
        curve as a candidate and calibrates what it chooses itself)."""
        super().__init__(timezone=timezone, holiday_country=holiday_country, bounds=bounds)
        self.half_life_days = half_life_days
        self.calibration_days = calibration_days
        self.recent_steps = recent_steps
        self.level_band = level_band  # None: never rescale
        self.level_hours = level_hours
        self.aci_gamma = aci_gamma  # None or 0: no adaptive level
        self.aci_days = aci_days
        self.cache = cache
        self.calibrate = calibrate
        self._calendar_memo: dict[Any, tuple[pd.DatetimeIndex, np.ndarray, np.ndarray]] = {}

    # ---------------------------------------------------------------- fit
    def _fit_one(self, series: Series) -> _Fitted:
        span = require_span(series, series.values, DAY, self.name)
        # too little for weekly shapes: one curve for every day
        one_curve = span < WEEK
        wall, slots, kinds = self._calendar(series.values.index, series.step, one_curve)
        first_day = wall[0].normalize()
        day_of = ((wall.normalize() - first_day) // DAY).to_numpy().astype(int)
        n_days, n_slots = day_of[-1] + 1, int(DAY / series.step)
        matrix = np.full((n_days, n_slots), np.nan)
        matrix[day_of, np.clip(slots, 0, n_slots - 1)] = series.values.to_numpy()
        day_kind = np.full(n_days, WORKING_DAY)
        day_kind[day_of] = kinds
        fitted = _Fitted(series, slots, kinds, day_of, matrix, day_kind, 0.0, _Errors(
            np.zeros(0, dtype=np.int64), np.zeros(0)), key=(series.uid, first_day, span >= WEEK),
            one_curve=one_curve)
        # the bound, or the level the series rests at (an outlier below it does not count)
        fitted.floor = max(series.lower, float(np.nanquantile(series.values, 0.01)))
        fitted.phi = self._residual_decay(fitted)
        if self.calibrate:
            fitted.errors = self._calibration_errors(fitted)
        return fitted

    def points(self, f: _Fitted, origins: np.ndarray, steps: int, *,
               past_the_end: bool = False) -> np.ndarray:
        """Point forecasts made at each of ``origins`` (positions in the history; each sees
        only its past) for the next ``steps`` steps that the history holds (NaN past its end;
        with ``past_the_end``, those too, on the calendar after the history): the curve's
        rolling-origin replays for ``auto``'s backtest. A replay of all ``steps`` is kept in
        the cache."""
        values = f.series.values
        n = len(values)
        out = np.full((len(origins), steps), np.nan)
        leads_all = np.arange(1, steps + 1)
        kinds, slots = f.kinds, f.slots
        if past_the_end:
            future = f.series.future_index(f.series.step * steps)
            _, more_slots, more_kinds = self._calendar(future, f.series.step, f.one_curve)
            kinds = np.concatenate([kinds, more_kinds])
            slots = np.concatenate([slots, more_slots])
        profiles: dict[int, np.ndarray] = {}
        for i, cutoff in enumerate(np.asarray(origins).tolist()):
            m = steps if past_the_end else min(steps, n - 1 - cutoff)
            if m <= 0:
                continue
            key = ("points", f.key, cutoff, steps)
            if self.cache is not None and m == steps and key in self.cache:
                out[i] = self.cache[key]
                continue
            before = self._days_before(f, cutoff)
            if before not in profiles:  # the replays of one day share its curve
                profiles[before] = self._profile(f, before)
            profile = profiles[before]
            ahead = slice(cutoff + 1, cutoff + 1 + m)
            point, _ = self._point(f, profile, cutoff, kinds[ahead], slots[ahead],
                                   leads_all[:m])
            out[i, :m] = point
            if self.cache is not None and m == steps:
                self.cache[key] = point
        return out

    def _calendar(
        self, index: pd.DatetimeIndex, step: pd.Timedelta, one_curve: bool
    ) -> tuple[pd.DatetimeIndex, np.ndarray, np.ndarray]:
        """Wall-clock times (naive, local), slot of day and day type of every step of ``index``;
        with ``one_curve`` every day counts as a working day. A regular index's calendar is
        kept for the next call with the same one (``auto`` and its curve read the same
        history's)."""
        if index.freq is None or not len(index):
            wall, slots, kinds = self._compute_calendar(index, step)
        else:
            # a regular index is its start, step and length: a shorter one's calendar is a
            # prefix of a longer one's, so the refits of growing histories (sharing
            # ``cache``) compute only the steps that are new
            key = ("calendar", index[0], index.freq, step, self.timezone, self.calendar)
            memo = self.cache if self.cache is not None else self._calendar_memo
            kept = memo.get(key)
            n = len(index)
            if kept is None or len(kept[1]) < n:
                done = 0 if kept is None else len(kept[1])
                more = self._compute_calendar(index[done:], step)
                kept = more if kept is None else (kept[0].append(more[0]),
                                                  np.concatenate([kept[1], more[1]]),
                                                  np.concatenate([kept[2], more[2]]))
                if self.cache is None:
                    memo.clear()  # the last history only
                memo[key] = kept
            wall, slots, kinds = kept[0][:n], kept[1][:n], kept[2][:n]
        if one_curve:
            kinds = np.full_like(kinds, WORKING_DAY)
        return wall, slots, kinds

    def _compute_calendar(self, index: pd.DatetimeIndex, step: pd.Timedelta
                          ) -> tuple[pd.DatetimeIndex, np.ndarray, np.ndarray]:
        wall = wall_clock(index, self.timezone)
        slots = ((wall - wall.normalize()) // step).to_numpy().astype(int)
        return wall, slots, day_types(index, self.timezone, self.calendar)

    def _days_before(self, f: _Fitted, cutoff: int) -> int:
        """The days whose curve a forecast made at position ``cutoff`` reads: complete days
        only, as in the calibration replays (its own day once its last slot is in)."""
        day = int(f.day_of[cutoff])
        return day + 1 if f.slots[cutoff] == f.matrix.shape[1] - 1 else max(1, day)

    def _profile(self, f: _Fitted, before_day: int) -> np.ndarray:
        """Day-type x slot curve from the complete days before ``before_day``."""
        if self.cache is None:
            return self._compute_profile(f, before_day)
        key = ("profile", f.key, before_day)
        if key not in self.cache:
            self.cache[key] = self._compute_profile(f, before_day)
        return self.cache[key]

    def _compute_profile(self, f: _Fitted, before_day: int) -> np.ndarray:
        first = max(0, before_day - int(LOOKBACK_HALF_LIVES * self.half_life_days))
        past = f.matrix[first:before_day]
        kinds = f.day_kind[first:before_day]
        ages = before_day - np.arange(first, before_day)
        weights = 0.5 ** (ages / self.half_life_days)
        overall = _weighted_median(past, weights)
        profile = np.empty((3, past.shape[1]))
        for kind in range(3):
            rows = kinds == kind
            curve = _weighted_median(past[rows], weights[rows]) if rows.any() else overall
            profile[kind] = np.where(np.isnan(curve), overall, curve)
        return profile

    def _residual_decay(self, f: _Fitted) -> float:
        start = min(f.matrix.shape[0] - 1, max(1, f.matrix.shape[0] // 2))
        profile = self._profile(f, start)
        mask = f.day_of >= start
        resid = f.series.values.to_numpy()[mask] - profile[f.kinds[mask], f.slots[mask]]
        a, b = resid[:-1], resid[1:]
        ok = ~(np.isnan(a) | np.isnan(b))
        if ok.sum() < 10 or np.nanstd(a[ok]) == 0 or np.nanstd(b[ok]) == 0:
            return 0.9
        return float(np.clip(np.corrcoef(a[ok], b[ok])[0, 1], 0.0, 0.995))

    def _point(self, f: _Fitted, profile: np.ndarray, cutoff: int, kinds: np.ndarray,
               slots: np.ndarray, leads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Point forecasts at future steps given data up to position ``cutoff``: the curve,
        rescaled by the last day's ratio (``_ratios``), plus the decaying level correction."""
        values = f.series.values.to_numpy()
        back = max(0, cutoff + 1 - max(self.recent_steps, LEVEL_MAX_AGE_DAYS * f.matrix.shape[1]))
        curve = profile[f.kinds[back : cutoff + 1], f.slots[back : cutoff + 1]]
        ratio = self._ratios(f, values[back : cutoff + 1], curve, np.array([cutoff - back]))[0]
        seen = _rescale(curve, ratio, f.floor, f.series.upper)
        recent = (values[back : cutoff + 1] - seen)[-self.recent_steps :]
        level = float(np.nanmean(recent)) if np.isfinite(recent).any() else 0.0
        curve = profile[kinds, slots]
        ahead = _ahead(ratio, leads, f.matrix.shape[1])
        future = _rescale(curve, ahead, f.floor, f.series.upper)
        scale = np.where(curve > f.floor + 1e-9, ahead, 1.0)  # of the errors
        return future + level * f.phi**leads, scale

    def _ratios(self, f: _Fitted, values: np.ndarray, curve: np.ndarray,
                at: np.ndarray) -> np.ndarray:
        """At each position of ``at``: the ratio of the actuals to the curve over the last
        ``level_hours`` of steps where the curve is above the series' floor (at the floor,
        e.g. a night at min replicas, a change of demand does not show), within the last
        ``LEVEL_MAX_AGE_DAYS`` (so a weekend at the floor carries Friday's ratio); the mean of
        the middle half of the step ratios, so a spike of a few hours does not move it. 1
        within the dead band ``level_band``, or with too little evidence (or on a series that
        goes below zero, where ratios mean nothing). Below 1, the ratio over ``DOWN_WINDOWS``
        times the window counts when it is closer to 1: a drop is followed once it lasts."""
        out = np.ones(len(at))
        if self.level_band is None or f.series.lower < 0:
            return out
        steps_per_day = f.matrix.shape[1]
        window = max(1, round(steps_per_day * self.level_hours / 24))
        active = np.isfinite(values) & (curve > f.floor + 1e-9)
        where = np.flatnonzero(active)
        if len(where) < window:
            return out
        step_ratio = values[where] / curve[where]
        seen = np.searchsorted(where, at, side="right")  # active steps up to each position
        ok = seen >= window
        ok[ok] = at[ok] - where[seen[ok] - window] <= LEVEL_MAX_AGE_DAYS * steps_per_day
        if not ok.any():
            return out

        def middle_mean(ends: np.ndarray, size: int) -> np.ndarray:
            """The mean of the middle half of the ``size`` step ratios before each end."""
            last = np.sort(step_ratio[ends[:, None] - size + np.arange(size)], axis=1)
            return last[:, size // 4 : size - size // 4].mean(axis=1)

        ends = seen[ok]
        ratio = middle_mean(ends, window)
        if DOWN_WINDOWS > 1 and (ratio < 1.0).any():
            # a drop is followed once it lasts: a quiet day (an eve, a bridge day) is not
            down = ratio < 1.0
            longer = np.minimum(ends[down], DOWN_WINDOWS * window)
            for size in np.unique(longer):
                picked = np.flatnonzero(down)[longer == size]
                ratio[picked] = np.maximum(ratio[picked], middle_mean(ends[picked], size))
        out[ok] = np.where(np.abs(ratio - 1.0) > self.level_band, ratio, 1.0)
        return out

    def _calibration_errors(self, f: _Fitted) -> _Errors:
        """Errors of replayed forecasts: hourly cutoffs for the first day of lead time, every
        six hours for leads of one to seven days (each replay sees only its past)."""
        values = f.series.values.to_numpy()
        n = len(values)
        steps_per_day = f.matrix.shape[1]
        steps_per_hour = max(1, round(pd.Timedelta(hours=1) / f.series.step))
        step_h = f.series.step / pd.Timedelta(hours=1)
        last_day = f.day_of[-1]
        first = max(1, last_day - self.calibration_days)
        # everything that depends only on the target step or the lead, computed once
        target_key = _bucket_key(
            np.zeros(n, dtype=np.int64),
            np.floor(f.slots * step_h).astype(np.int64),
            f.kinds != WORKING_DAY,
        )
        max_lead = 7 * steps_per_day
        leads_all = np.arange(1, max_lead + 1)
        lead_key = np.digitize(leads_all * step_h, LEAD_EDGES_H).astype(np.int64) * 48
        decay = f.phi ** leads_all.astype(float)
        day_starts = np.searchsorted(f.day_of, np.arange(last_day + 2))
        keys_out: list[np.ndarray] = []
        errors_out: list[np.ndarray] = []
        targets_out: list[np.ndarray] = []
        for day in range(first, last_day + 1):
            lo, hi = day_starts[day], day_starts[day + 1]
            complete = hi + max_lead <= n  # every replay of this day sees its whole future
            cache_key = ("replays", f.key, day)
            cached = self.cache.get(cache_key) if self.cache is not None else None
            if complete and cached is not None:
                keys_out.append(cached[0])
                errors_out.append(cached[1])
                targets_out.append(cached[2])
                continue
            done = len(keys_out)
            profile = self._profile(f, day)
            reach = min(n, hi + max_lead)
            # the curve at every step a cutoff of this day sees or forecasts, from a day
            # before the day's first cutoff on (the ratio's window)
            back = max(0, lo - max(self.recent_steps, LEVEL_MAX_AGE_DAYS * steps_per_day) + 1)
            curve = profile[f.kinds[back:reach], f.slots[back:reach]]
            seg = values[back:reach]
            cutoffs = np.arange(lo, hi, steps_per_hour)
            ratios = self._ratios(f, seg, curve, cutoffs - back)
            resid = seg - curve
            levels = _trailing_nanmean(resid, self.recent_steps)
            for i, cutoff in enumerate(cutoffs):
                stop = min(n, cutoff + 1 + (max_lead if i % 6 == 0 else steps_per_day))
                m = stop - cutoff - 1
                if m <= 0:
                    continue
                at = cutoff - back
                ratio = ratios[i]
                if ratio == 1.0:
                    level = levels[at]
                    err = resid[at + 1 : stop - back] - level * decay[:m]
                else:  # rescaled: the level correction and errors against the rescaled curve
                    r0 = max(0, at + 1 - self.recent_steps)
                    seen = seg[r0 : at + 1] - _rescale(curve[r0 : at + 1], ratio, f.floor,
                                                       f.series.upper)
                    level = float(np.nanmean(seen)) if np.isfinite(seen).any() else 0.0
                    factor = _ahead(ratio, leads_all[:m], steps_per_day)
                    ahead = _rescale(curve[at + 1 : stop - back], factor, f.floor,
                                     f.series.upper)
                    # errors above the floor in the units of the curve: they scale with it
                    above = curve[at + 1 : stop - back] > f.floor + 1e-9
                    err = (seg[at + 1 : stop - back] - ahead - level * decay[:m]) / np.where(
                        above, factor, 1.0)
                ok = np.isfinite(err)
                keys_out.append(target_key[cutoff + 1 : stop][ok] + lead_key[:m][ok])
                errors_out.append(err[ok])
                targets_out.append(np.arange(cutoff + 1, stop)[ok])
            if complete and self.cache is not None and len(keys_out) > done:
                # the day's replays as one cached chunk, which the output then shares
                keys_out[done:] = [np.concatenate(keys_out[done:])]
                errors_out[done:] = [np.concatenate(errors_out[done:])]
                targets_out[done:] = [np.concatenate(targets_out[done:])]
                self.cache[cache_key] = (keys_out[done], errors_out[done], targets_out[done])
        if not errors_out:
            return _Errors(np.zeros(0, dtype=np.int64), np.zeros(0))
        return _Errors(np.concatenate(keys_out), np.concatenate(errors_out),
                       np.concatenate(targets_out))

    def _adapted_levels(self, f: _Fitted, qs: tuple[float, ...]) -> np.ndarray:
        return adapted_levels(
            f.errors, qs, end=len(f.series.values), steps_per_day=f.matrix.shape[1],
            steps_per_hour=max(1, round(pd.Timedelta(hours=1) / f.series.step)),
            gamma=self.aci_gamma, days=self.aci_days)

    # ---------------------------------------------------------------- predict
    def _predict_one(
        self, f: _Fitted, horizon: pd.Timedelta, qs: tuple[float, ...]
    ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        index = f.series.future_index(horizon)
        _, slots, kinds = self._calendar(index, f.series.step, f.one_curve)
        profile = self._profile(f, self._days_before(f, len(f.series.values) - 1))
        leads = np.arange(1, len(index) + 1)
        point, scale = self._point(f, profile, len(f.series.values) - 1, kinds, slots, leads)
        lead_bucket = np.digitize(leads * f.series.step / pd.Timedelta(hours=1), LEAD_EDGES_H)
        hour = np.floor(slots * f.series.step / pd.Timedelta(hours=1)).astype(int)
        levels = tuple(self._adapted_levels(f, qs))
        offsets = f.errors.offsets(levels, lead_bucket, hour, kinds != WORKING_DAY)
        offsets = offsets * scale[:, None]
        return f.series, index, point[:, None] + offsets


def adapted_levels(errors: _Errors, qs: tuple[float, ...], *, end: int, steps_per_day: int,
                   steps_per_hour: int, gamma: float | None, days: int) -> np.ndarray:
    """Adaptive conformal inference (Gibbs and Candes, 2021), one-sided: the quantile
    level to read the errors at for each of ``qs``, from the misses of the replays over
    the last ``days``. Hour by hour of the replays' targets, the miss level
    ``alpha = 1 - q`` moves by ``gamma`` times (1 - q minus the miss rate of the 24
    hours up to it, a miss being an actual above the q-quantile the replay gave; a whole
    day, so the daily rhythm of misses cancels out): a surge the curve has not caught up
    with lowers it, widening the band, and ordinary days raise it back; a day missing
    more than 1 - q but at most ``ACI_TOLERANCE`` times that moves nothing (bad luck,
    which a clipped level would otherwise only ever widen for). It
    never goes above 1 - q (no narrowing: on integer series most hours miss never, the
    night at its floor) nor below (1 - q) / ACI_MAX_WIDENING; quantiles up to the median
    stay as calibrated."""
    levels = np.array(qs, dtype=float)
    if not gamma or len(errors.all) == 0:
        return levels
    start = end - (days + 1) * steps_per_day  # a day more: the first day's rate
    # the replays' first day of lead time (hourly cutoffs), with targets in the window
    recent = (errors.targets >= start) & (errors._keys // 48 < len(LEAD_EDGES_H))
    if not recent.any():
        return levels
    offsets = errors.quantiles(qs, errors._keys[recent])
    missed = errors.all[recent][:, None] > offsets + 1e-9
    hour = (errors.targets[recent] - start) // steps_per_hour
    hours = (end - start) // steps_per_hour
    counts = _trailing_sum(np.bincount(hour, minlength=hours).astype(float), 24)[24:]
    filled = counts > 0
    for j, q in enumerate(qs):
        if q <= 0.5:  # the median and below: as calibrated
            continue
        misses = _trailing_sum(np.bincount(hour, weights=missed[:, j], minlength=hours), 24)
        rates = misses[24:][filled] / counts[filled]
        target = 1.0 - q
        alpha = target
        for rate in rates:
            if target < rate <= ACI_TOLERANCE * target:
                continue  # a day of ordinary bad luck: neither widen nor narrow back
            alpha = min(target, max(target / ACI_MAX_WIDENING,
                                    alpha + gamma * (target - rate)))
        levels[j] = 1.0 - alpha
    return levels


def _ahead(ratio: float, leads: np.ndarray, steps_per_day: int) -> float | np.ndarray:
    """The ratio to rescale each lead with: a rise holds over the horizon; a drop holds for a
    day and fades back to the curve over the next (a lull of a few days, the year's end, is
    not followed for a week; under-forecasting is the side that costs the service)."""
    if ratio >= 1.0:
        return ratio
    weight = np.clip(2.0 - leads / steps_per_day, 0.0, 1.0)
    return 1.0 + (ratio - 1.0) * weight


def _rescale(curve: np.ndarray, ratio: float | np.ndarray, floor: float, upper: float
             ) -> np.ndarray:
    """``curve`` times ``ratio`` (a number, or one per step) where it is above the ``floor``
    (at the floor, demand is below it by an unknown amount: kept), between the floor and
    ``upper``."""
    if np.isscalar(ratio) and ratio == 1.0:
        return curve
    return np.where(curve > floor + 1e-9, np.clip(curve * ratio, floor, upper), curve)


def _trailing_sum(values: np.ndarray, window: int) -> np.ndarray:
    """Sum of the last ``window`` values up to each position."""
    sums = np.concatenate([[0.0], np.cumsum(values)])
    end = np.arange(1, len(values) + 1)
    return sums[end] - sums[np.maximum(0, end - window)]


def _trailing_nanmean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the finite values among the last ``window`` up to each position (0 if none):
    the level correction of a cutoff there."""
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(0, end - window)
    n = counts[end] - counts[start]
    return np.where(n > 0, (sums[end] - sums[start]) / np.maximum(n, 1), 0.0)


def _weighted_median(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Column-wise weighted median of ``rows`` (days x slots), ignoring NaN."""
    if rows.shape[0] == 0:
        return np.full(rows.shape[1], np.nan)
    order = np.argsort(np.where(np.isnan(rows), np.inf, rows), axis=0, kind="stable")
    sorted_vals = np.take_along_axis(rows, order, axis=0)
    w = np.where(np.isnan(rows), 0.0, weights[:, None])
    sorted_w = np.take_along_axis(w, order, axis=0)
    cum = np.cumsum(sorted_w, axis=0)
    total = cum[-1]
    idx = (cum >= 0.5 * total[None, :]).argmax(axis=0)
    med = sorted_vals[idx, np.arange(rows.shape[1])]
    return np.where(total > 0, med, np.nan)
