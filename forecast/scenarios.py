"""The pool's joint uncertainty: the free GPUs of the whole pool at a confidence, from scenarios
that keep the services' co-movement, not a sum of per-service quantiles.

Pure functions: no I/O, no clock.

Adding every service's quantile ``q`` (``capacity.forecast_pool_usage``) promises the pool's
free GPUs at ``q`` only when the services move in lockstep; services that do not (an API pool
of several tenants) are then all planned at their bad hour at once, and the promise sits below
what the pool truly leaves free. Here each service's forecast quantiles are its marginal
distribution per step, and a Gaussian copula ties them together with the correlation of the
services' own recent surprises (each step's change against the same step a day before, in
normal scores, ``service_correlation``). Scenario ``k`` draws one correlated normal vector
per path and keeps it over the horizon (a path that is busy stays busy: forecast errors persist
for hours), maps it through every service's quantiles, and adds the services' GPUs; the pool's
usage at confidence ``c`` is the ``c``-quantile of the scenarios at each step.

Two guarantees hold by construction: with perfectly correlated services the result is the
sum of quantiles, and it is never more pessimistic than the sum (the sum is the lockstep
bound; a Monte Carlo draw a hair above it is taken as the bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from idlegpu.forecast.capacity import FREE, IN_USE, forecast_pool_usage
from idlegpu.forecast.config import Settings
from idlegpu.forecast.models.base import quantile_column
from idlegpu.forecast.schema import DS, REPLICAS, UNIQUE_ID, Y, series_id

SCENARIOS = 2000
# the pool's median free GPUs (a column beside ``free``): what is likely, beside what is
# promised, for decisions that pay off only when a shortfall is likely (``decide()``'s early
# stops just after a checkpoint)
FREE_MEDIAN = "free_median"
# the forecast quantiles the marginals are read from (the admission confidence is added);
# beyond the outermost ones a service's distribution is taken as flat (its extremes are not
# modelled, and the pool's quantile at a confidence of 0.5-0.95 seldom reaches them)
MARGINAL_LEVELS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
CORRELATION_DAYS = 14


def marginal_levels(confidence: float, also: Sequence[float] = ()) -> list[float]:
    """The quantiles a forecast needs for ``joint_pool_usage`` at ``confidence``."""
    return sorted({*MARGINAL_LEVELS, confidence, *also})


def service_correlation(replicas: pd.DataFrame, services: Sequence[str], *,
                        days: int = CORRELATION_DAYS) -> np.ndarray:
    """The services' correlation of surprises over the last ``days`` days of ``replicas``
    (tidy rows of ``<service>/replicas``): each step's change against the same step one day
    before, as normal scores of its ranks, correlated pairwise over the steps both services
    saw. A service with no variation, or a pair with too few common steps, is taken as
    independent of the others. Returns a positive semi-definite matrix in ``services`` order."""
    n = len(services)
    out = np.eye(n)
    if replicas.empty or n < 2:
        return out
    ids = [series_id(s, REPLICAS) for s in services]
    rows = replicas[replicas[UNIQUE_ID].isin(ids)]
    if rows.empty:
        return out
    # only the last days count: cut before reshaping (the history of a long replay is months)
    stamps = rows[DS]
    rows = rows[stamps >= stamps.max() - pd.Timedelta(days=days)]
    wide = _wide_last(rows, ids)
    if len(wide.index) < 3:
        return out
    step = pd.Series(wide.index).diff().median()
    lag = max(1, round(pd.Timedelta(days=1) / step)) if step and step > pd.Timedelta(0) else 1
    change = wide - wide.shift(lag)
    # normal scores: rank / (n + 1) through the normal quantile function (ties share a rank)
    scores = ndtri((change.rank() / (change.notna().sum() + 1)).to_numpy(dtype=float))
    seen = np.isfinite(scores)
    for i in range(n):
        for j in range(i + 1, n):
            both = seen[:, i] & seen[:, j]
            a, b = scores[both, i], scores[both, j]
            if len(a) < 24 or a.std() == 0 or b.std() == 0:
                continue
            r = float(np.corrcoef(a, b)[0, 1])
            if np.isfinite(r):
                out[i, j] = out[j, i] = r
    return _nearest_correlation(out)


def _wide_last(rows: pd.DataFrame, ids: Sequence[str]) -> pd.DataFrame:
    """``rows.pivot_table(index=DS, columns=UNIQUE_ID, values=Y, aggfunc="last")`` in the
    columns ``ids``: one row per time with any value, the last value (in row order, NaN
    skipped) of each series there. In numpy: pandas' pivot was most of a refresh's
    correlation."""
    values = rows[Y].to_numpy(dtype=float)
    seen = ~np.isnan(values)
    row, times = pd.factorize(pd.DatetimeIndex(rows[DS])[seen], sort=True)
    codes, names = pd.factorize(rows[UNIQUE_ID])  # a few names: matched once each
    position = {name: i for i, name in enumerate(ids)}
    column = np.array([position[name] for name in names], dtype=np.int64)[codes][seen]
    values = values[seen]
    cell = row * len(ids) + column
    # the last of a time's values per series: the first from the end
    _, from_end = np.unique(cell[::-1], return_index=True)
    last = len(cell) - 1 - from_end
    grid = np.full((len(times), len(ids)), np.nan)
    grid.reshape(-1)[cell[last]] = values[last]
    return pd.DataFrame(grid, index=pd.DatetimeIndex(times, name=DS),
                        columns=pd.Index(list(ids), name=UNIQUE_ID))


def _nearest_correlation(matrix: np.ndarray) -> np.ndarray:
    """A valid correlation matrix near ``matrix`` (pairwise estimates need not be one):
    negative eigenvalues clipped, the diagonal put back to 1."""
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    fixed = vectors @ np.diag(np.clip(values, 1e-9, None)) @ vectors.T
    d = np.sqrt(np.diag(fixed))
    return np.clip(fixed / np.outer(d, d), -1.0, 1.0)


def joint_pool_usage(
    forecast: pd.DataFrame,
    settings: Settings,
    confidence: float,
    correlation: np.ndarray,
    quantiles: Mapping[str, float] | None = None,
    *,
    scenarios: int = SCENARIOS,
    seed: int = 0,
) -> pd.DataFrame:
    """``capacity.forecast_pool_usage`` from scenarios: the same frame (GPUs per service, each
    at its own quantile as there, ``in_use`` and ``free``) but ``in_use`` the
    ``confidence``-quantile of the pool's usage over ``scenarios`` joint paths (the module
    docstring), never above the sum of the services' quantiles. ``correlation``: in the order
    of ``settings.services`` (``service_correlation``). A step where any service is unknown
    stays unknown."""
    summed = forecast_pool_usage(forecast, settings, confidence, quantiles)
    services = settings.services
    if len(services) < 2:
        return summed
    levels = sorted(float(c[1:]) for c in forecast.columns
                    if c.startswith("q") and _is_level(c[1:]))
    if len(levels) < 3:
        return summed  # no distribution to draw from: the sum stands
    index = summed.index
    draws = np.random.default_rng(seed).multivariate_normal(
        np.zeros(len(services)), correlation, size=scenarios, method="cholesky"
        if _positive_definite(correlation) else "eigh")
    u = ndtr(draws)  # scenarios x services, one rank per path for the whole horizon
    # scenarios x steps while adding up: each path's steps contiguous, so every path reads
    # whole rows of a service's quantile grid (a row gather, not a column one)
    total = np.zeros((scenarios, len(index)), dtype=np.float32)
    columns = [quantile_column(q) for q in levels]
    values = forecast[columns].to_numpy(dtype=np.float32)  # once: pandas is slow per service
    ids = forecast[UNIQUE_ID].to_numpy()
    when = pd.DatetimeIndex(forecast[DS])
    for k, service in enumerate(services):
        wider = (quantiles or {}).get(service.name)
        if wider is not None and wider > confidence:
            # a service planned wider (its forecasts lately covered less than promised): its
            # ranks are moved so the confidence maps to its wider quantile
            u[:, k] = _remap(u[:, k], confidence, wider)
        mine = np.flatnonzero(ids == series_id(service.name, REPLICAS))
        grid = np.full((len(index), len(levels)), np.nan, dtype=np.float32)
        at = index.get_indexer(when[mine])
        grid[at[at >= 0]] = values[mine[at >= 0]]
        grid = np.maximum.accumulate(np.nan_to_num(grid, nan=-np.inf), axis=1)  # monotone
        grid[~np.isfinite(grid)] = np.nan
        total += _interpolate(grid * service.gpus_per_replica, np.asarray(levels), u[:, k])
    # the confidence-quantile of the scenarios at each step ("higher": an actual scenario),
    # and the median, from one sort: the pool's GPUs are full of ties, where numpy's partial
    # sort (introselect) is several times slower than its vectorised full sort; each step's
    # scenarios contiguous for it
    rank = min(scenarios - 1, int(np.ceil(confidence * (scenarios - 1))))
    middle = (scenarios - 1) // 2
    ordered = np.ascontiguousarray(total.T)
    ordered.sort(axis=1)
    joint = ordered[:, rank].astype(float)
    median = ordered[:, middle].astype(float)
    joint = np.minimum(joint, summed[IN_USE].to_numpy())  # never worse than lockstep
    joint[summed[IN_USE].isna().to_numpy()] = np.nan
    frame = summed.copy()
    frame[IN_USE] = joint
    frame[FREE] = (settings.pool.lendable_gpus - frame[IN_USE]).clip(lower=0)
    median[np.isnan(joint)] = np.nan
    frame[FREE_MEDIAN] = np.maximum(
        frame[FREE].to_numpy(), np.clip(settings.pool.lendable_gpus - median, 0, None))
    return frame


def forecast_levels(settings: Settings, confidence: float,
                    also: Sequence[float] = ()) -> list[float]:
    """The quantiles to forecast for ``pool_forecast_usage`` at ``confidence`` (the median
    and ``also`` included)."""
    if settings.admission.pool_uncertainty == "joint" and len(settings.services) > 1:
        return marginal_levels(confidence, also)
    return sorted({0.5, confidence, *also})


def pool_forecast_usage(
    forecast: pd.DataFrame,
    settings: Settings,
    confidence: float,
    replicas: pd.DataFrame,
    quantiles: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """The pool's usage and free GPUs over a forecast at ``confidence`` as
    ``admission.pool_uncertainty`` says: ``joint`` (``joint_pool_usage``, the correlation from
    ``replicas``, the history the forecast was fitted on) or ``sum``
    (``capacity.forecast_pool_usage``). The forecast needs ``forecast_levels``' quantiles.
    ``FREE_MEDIAN``: the pool's median free GPUs (joint: the scenarios' median; sum: the
    services' medians added up), never below ``free``."""
    if settings.admission.pool_uncertainty != "joint" or len(settings.services) < 2:
        frame = forecast_pool_usage(forecast, settings, confidence, quantiles)
    else:
        correlation = service_correlation(replicas, settings.service_names)
        frame = joint_pool_usage(forecast, settings, confidence, correlation, quantiles)
    if FREE_MEDIAN not in frame.columns:
        median = forecast_pool_usage(forecast, settings, 0.5)[FREE].reindex(frame.index)
        frame[FREE_MEDIAN] = np.fmax(frame[FREE].to_numpy(), median.to_numpy())
        frame.loc[frame[FREE].isna(), FREE_MEDIAN] = np.nan
    return frame


def _remap(u: np.ndarray, confidence: float, wider: float) -> np.ndarray:
    """Ranks moved monotonically so that ``confidence`` becomes ``wider`` (0 and 1 stay)."""
    return np.where(u <= confidence, u * wider / confidence,
                    1 - (1 - u) * (1 - wider) / (1 - confidence))


def _is_level(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0.0 < value < 1.0


def _positive_definite(matrix: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        return False
    return True


def _interpolate(grid: np.ndarray, levels: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Each path's value at every step, paths x steps: the step's quantile function
    (``grid``: steps x levels) at the path's rank ``u`` (one per path), linear between
    levels, flat beyond."""
    position = np.interp(u, levels, np.arange(len(levels)))  # fractional level index per path
    low = np.floor(position).astype(np.intp)
    weight = (position - low).astype(np.float32)[:, None]
    by_level = np.ascontiguousarray(grid.T)  # levels x steps
    # each level's rise to the next (none past the last): the same float32 difference of the
    # two levels a path lies between, taken once per level rather than once per path
    rise = by_level[np.minimum(np.arange(len(levels)) + 1, len(levels) - 1)] - by_level
    # in place (the same float32 products and sums): two passes over the paths, not four
    out = rise[low]
    out *= weight
    out += by_level[low]
    return out


__all__ = ["FREE_MEDIAN", "MARGINAL_LEVELS", "forecast_levels", "joint_pool_usage", "marginal_levels",
           "pool_forecast_usage", "service_correlation"]
