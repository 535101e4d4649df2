"""The lines ``auto``'s candidates are read from (``idlegpu.forecast.models.auto``): a series on
its wall-clock grid of days x slots, shifted by whole days, its rolling medians and means over
the same slot of earlier days or weeks, smoothed along the day, an exponentially weighted mean
per slot, a harmonic fit (level, trend, Fourier terms of the day and week) of the last weeks,
trailing slopes and the lag-one autocorrelation of residuals. Pure numpy: each value at a
day uses only the days a lag before it."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from idlegpu.forecast.models.curve import _trailing_nanmean

# harmonic: a level, a linear trend and Fourier terms of the day and the week, fitted by least
# squares on the last HARMONIC_DAYS whole days (what Prophet and MSTL fit on their whole window)
HARMONIC_DAYS = 28
HARMONIC_DAILY = 8  # the day's harmonics (as many as the day has slots for)
HARMONIC_WEEKLY = 3  # the week's, once the window holds two weeks of values
HARMONIC_MIN_DAYS = 3  # a fit needs this many days of values


def _shift(values: np.ndarray, lag: int) -> np.ndarray:
    out = np.full(len(values), np.nan)
    if lag < len(values):
        out[lag:] = values[: len(values) - lag]
    return out


def _rolling_median(rows: np.ndarray, *, lag: int, count: int, stride: int) -> np.ndarray:
    """Per day and slot: the median of the same slot on the days ``lag``, ``lag + stride``,
    ... (``count`` of them) before, ignoring missing ones (NaN if all are)."""
    n_days, S = rows.shape
    stack = np.full((count, n_days, S), np.nan)
    for j in range(count):
        back = lag + j * stride
        if back < n_days:
            stack[j, back:] = rows[: n_days - back]
    ordered = np.sort(stack, axis=0)  # NaN last
    finite = np.isfinite(stack).sum(axis=0)
    lo = np.clip((finite - 1) // 2, 0, count - 1)
    hi = np.clip(finite // 2, 0, count - 1)
    a = np.take_along_axis(ordered, lo[None], axis=0)[0]
    b = np.take_along_axis(ordered, hi[None], axis=0)[0]
    return np.where(finite > 0, (a + b) / 2, np.nan)


def _centred_median(flat: np.ndarray, steps_per_day: int, lag: int) -> np.ndarray:
    """``theta_7d``'s shape: the 7-day slot median (``lag`` days back) of the series less its
    trailing day's mean (a trend within a day is not the daily cycle), less each day's mean of
    it (a shape without a level)."""
    detrended = flat - _trailing_nanmean(flat, steps_per_day)
    days = _rolling_median(detrended.reshape(-1, steps_per_day), lag=lag, count=7, stride=1)
    # each day's mean of what it has (NaN for a day with no value yet), without nanmean's
    # warning: warnings.catch_warnings is not thread-safe, and the console fits in threads
    seen = np.isfinite(days)
    count = seen.sum(axis=1, keepdims=True)
    total = np.where(seen, days, 0.0).sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    return (days - mean).reshape(-1)


def _harmonic_line(flat: np.ndarray, steps_per_day: int, lag: int) -> np.ndarray:
    """``harmonic`` at every grid position of a day D: the least-squares fit of a level, a
    linear trend and Fourier terms of the day (and of the week, from two weeks of values) to
    the ``HARMONIC_DAYS`` whole days before day D - ``lag`` (so that a forecast ``lag`` days
    ahead sees all of them), evaluated at D. One fit per day, from per-day sums of the normal
    equations (cumulative over the days, so a window's sums are a difference)."""
    S = steps_per_day
    rows = flat.reshape(-1, S)
    n_days = rows.shape[0]
    daily = min(HARMONIC_DAILY, max(1, (S - 1) // 2))
    X = _harmonic_basis(n_days, S, daily)
    weekly = np.zeros(X.shape[2], bool)
    weekly[2 + 2 * daily:] = True
    ok = np.isfinite(rows)
    y = np.where(ok, rows, 0.0)
    Xw = X * ok[:, :, None]
    F = X.shape[2]
    # batched matrix products (BLAS), not einsum: the refit's hottest lines
    gram = np.zeros((n_days + 1, F, F))
    np.cumsum(np.matmul(Xw.transpose(0, 2, 1), X), axis=0, out=gram[1:])
    moment = np.zeros((n_days + 1, F))
    np.cumsum(np.matmul(Xw.transpose(0, 2, 1), y[:, :, None])[:, :, 0], axis=0, out=moment[1:])
    seen_days = np.concatenate([[0], ok.any(axis=1).cumsum()])
    ends = np.arange(n_days + 1)  # fit j: the days [j - HARMONIC_DAYS, j)
    starts = np.maximum(0, ends - HARMONIC_DAYS)
    G = gram[ends] - gram[starts]
    b = moment[ends] - moment[starts]
    days_seen = seen_days[ends] - seen_days[starts]
    # too few days for the week's terms: they are held at zero (an identity row each)
    drop = (days_seen < 14)[:, None] & weekly[None, :]
    G = np.where(drop[:, :, None] | drop[:, None, :], 0.0, G)
    eye = np.eye(F)
    count = np.maximum(G[:, 0, 0], 1.0)
    ridge = 1e-6 * count[:, None, None] * eye  # keeps a window of few values solvable
    G = G + ridge + drop[:, :, None] * eye
    b = np.where(drop, 0.0, b)
    fitted = days_seen >= HARMONIC_MIN_DAYS
    beta = np.zeros((n_days + 1, F))
    if fitted.any():
        beta[fitted] = np.linalg.solve(G[fitted], b[fitted][:, :, None])[:, :, 0]
    # day D reads the fit that ends at D - lag
    fit_of_day = np.arange(n_days) - lag
    usable = (fit_of_day >= 0) & fitted[np.maximum(fit_of_day, 0)]
    out = np.matmul(X, beta[np.maximum(fit_of_day, 0)][:, :, None])[:, :, 0]
    return np.where(usable[:, None], out, np.nan).reshape(-1)


@lru_cache(maxsize=8)
def _harmonic_basis(n_days: int, steps_per_day: int, daily: int) -> np.ndarray:
    """``harmonic``'s regressors at every step of ``n_days`` days (days x slots x terms): a
    level, a trend over ``HARMONIC_DAYS``, ``daily`` harmonics of the day and
    ``HARMONIC_WEEKLY`` of the week, in days from the first; the same for every series and
    refit of that many days, so made once (read-only)."""
    t = np.arange(n_days * steps_per_day, dtype=float) / steps_per_day
    columns = [np.ones_like(t), t / HARMONIC_DAYS]
    for period, count in ((1.0, daily), (7.0, HARMONIC_WEEKLY)):
        for h in range(1, count + 1):
            angle = 2 * np.pi * h * t / period
            columns += [np.sin(angle), np.cos(angle)]
    X = np.stack(columns, axis=1).reshape(n_days, steps_per_day, -1)
    X.flags.writeable = False
    return X


def _half_width(steps_per_day: int) -> int:
    """``profile_7d``'s smoothing over the time of day: an hour each side (at least a step)."""
    return max(1, round(steps_per_day / 24))


def _rolling_mean(rows: np.ndarray, *, lag: int, count: int) -> np.ndarray:
    """Per day and slot: the mean of the same slot on the ``count`` days from ``lag`` days
    before, ignoring missing ones."""
    n_days, S = rows.shape
    total = np.zeros((n_days, S))
    seen = np.zeros((n_days, S))
    for j in range(count):
        back = lag + j
        if back < n_days:
            part = rows[: n_days - back]
            ok = np.isfinite(part)
            total[back:] += np.where(ok, part, 0.0)
            seen[back:] += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(seen > 0, total / seen, np.nan)


def _smooth_along(values: np.ndarray, half: int) -> np.ndarray:
    """A triangular moving average of ``half`` steps each side (missing values left out)."""
    weights = np.concatenate([np.arange(1, half + 2), np.arange(half, 0, -1)]).astype(float)
    ok = np.isfinite(values)
    num = np.convolve(np.where(ok, values, 0.0), weights, mode="same")
    den = np.convolve(ok.astype(float), weights, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _slot_ewm(rows: np.ndarray, alpha: float) -> np.ndarray:
    """Per day and slot: the exponentially weighted mean of that slot up to that day (a
    missing day leaves it as it was)."""
    out = np.empty_like(rows)
    current = np.full(rows.shape[1], np.nan)
    for d, row in enumerate(rows):
        seen = np.isfinite(row)
        current = np.where(seen & np.isfinite(current), current + alpha * (row - current),
                           np.where(seen, row, current))
        out[d] = current
    return out


def _trailing_slope(values: np.ndarray, window: int) -> np.ndarray:
    """The least-squares slope (per step) of the finite values among the last ``window`` up to
    each position (NaN with fewer than a quarter of them)."""
    ok = np.isfinite(values)
    t = np.arange(len(values), dtype=float)
    y = np.where(ok, values, 0.0)
    w = ok.astype(float)

    def trailing(x: np.ndarray) -> np.ndarray:
        c = np.concatenate([[0.0], np.cumsum(x)])
        start = np.maximum(0, np.arange(1, len(x) + 1) - window)
        return c[1:] - c[start]

    n, st, sy = trailing(w), trailing(t * w), trailing(y)
    stt, sty = trailing(t * t * w), trailing(t * y)
    with np.errstate(invalid="ignore", divide="ignore"):
        den = n * stt - st * st
        slope = (n * sty - st * sy) / den
    return np.where((n >= window / 4) & (den > 0), slope, np.nan)


def _lag_one(residual: np.ndarray) -> float:
    """The lag-one autocorrelation of a candidate's errors, in [0, 0.995]."""
    a, b = residual[:-1], residual[1:]
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 10 or np.std(a[ok]) == 0 or np.std(b[ok]) == 0:
        return 0.0
    return float(np.clip(np.corrcoef(a[ok], b[ok])[0, 1], 0.0, 0.995))
