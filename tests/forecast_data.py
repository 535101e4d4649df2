"""Synthetic series with known patterns, for forecaster tests."""

import numpy as np
import pandas as pd

TZ = "Asia/Seoul"


def daily_pattern(local: pd.DatetimeIndex) -> np.ndarray:
    """Replicas: 2 at night, 8 at a weekday peak (09-18 local), 4 at a weekend peak."""
    hour = local.hour + local.minute / 60
    bump = np.clip(np.minimum(hour - 8, 19 - hour), 0, 1)  # ramps 08-09 and 18-19
    peak = np.where(local.day_of_week < 5, 6.0, 2.0)
    return 2.0 + peak * bump


def replica_history(days=28, step="15min", uid="svc/replicas", start="2025-11-03", noise=0.0,
                    seed=0) -> pd.DataFrame:
    local = pd.date_range(start, periods=int(pd.Timedelta(days=days) / pd.Timedelta(step)),
                          freq=step, tz=TZ)
    rng = np.random.default_rng(seed)
    y = daily_pattern(local) + rng.normal(0, noise, len(local)) * (noise > 0)
    return pd.DataFrame({"unique_id": uid, "ds": local.tz_convert("UTC"), "y": np.round(y)})


def continuous_history(days=70, step="30min", seed=1) -> pd.DataFrame:
    """A daily+weekly pattern plus AR(1) noise of unit standard deviation (not integer)."""
    local = pd.date_range("2025-10-06", periods=int(pd.Timedelta(days=days) / pd.Timedelta(step)),
                          freq=step, tz=TZ)
    rng = np.random.default_rng(seed)
    noise = np.zeros(len(local))
    shocks = rng.normal(0, np.sqrt(1 - 0.8**2), len(local))
    for i in range(1, len(local)):
        noise[i] = 0.8 * noise[i - 1] + shocks[i]
    y = 10 * daily_pattern(local) + 3 * noise
    return pd.DataFrame({"unique_id": "svc/kv", "ds": local.tz_convert("UTC"), "y": y})
