"""The forecast policy's nightly profiles kept on disk between simulations of the same inputs.

A 90-day simulation spends most of its time refitting the forecaster each evening, and those
refits depend only on the history, the config and the code, never on the policy or the job
trace: a second run on the same history (another trace, other admission knobs, the job trace
shifted) reads them back. The file's name is a digest of everything the refits read: the
history's rows, the settings, the simulated steps, the refresh hour and horizon, and the
source of the forecaster and the refresh, so a change to any of them makes a new file.

The files are plain arrays (``numpy.savez``, read with ``allow_pickle=False``): a cache
directory another user can write to can make a run slower (a file that does not read back is
ignored and made again), never run code.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.simulate.profiles import HORIZON, REFRESH_HOUR, forecast_profiles_for
from idlegpu.scheduler.simulate.timeline import simulated_steps
from idlegpu.scheduler.types import FreeProfile

MAX_FILE_BYTES = 256 * 2**20
"""A cache file larger than this is not read (90 days of 48-hour profiles are under 2 MiB)."""
_FORMAT = "idlegpu-profiles-1"
_SOURCES = ("forecast", "scheduler/refresh.py", "scheduler/replay.py", "scheduler/coverage.py",
            "scheduler/simulate/profiles.py", "scheduler/config.py", "scheduler/types.py")


def _source_digest() -> bytes:
    """A digest of the code the refits run: a change to it makes new cache files."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for name in _SOURCES:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.digest()


def profiles_key(history: pd.DataFrame, settings: Settings, index: pd.DatetimeIndex,
                 refresh_hour: int, horizon: timedelta) -> str:
    """The cache file's name for these inputs (a hex digest)."""
    digest = hashlib.sha256(_FORMAT.encode())
    digest.update(pd.util.hash_pandas_object(history, index=False).to_numpy().tobytes())
    digest.update(",".join(map(str, history.columns)).encode())
    digest.update(settings.model_dump_json().encode())
    digest.update(index.asi8.tobytes())
    digest.update(f"{refresh_hour}|{horizon.total_seconds()}".encode())
    digest.update(_source_digest())
    return digest.hexdigest()


def _ns(moment: datetime) -> int:
    return pd.Timestamp(moment).value


def _moment(ns: int) -> datetime:
    return pd.Timestamp(int(ns), tz=UTC).to_pydatetime()


def save_profiles(path: Path, profiles: dict[datetime, FreeProfile]) -> None:
    """Write ``profiles`` to ``path`` (a new file put in place at once: a reader never sees
    half of one)."""
    made = sorted(profiles)
    ordered = [profiles[m] for m in made]
    likely = [p.likely for p in ordered]
    arrays: dict[str, Any] = {
        "format": np.array(_FORMAT),
        "made": np.array([_ns(m) for m in made], dtype=np.int64),
        "start": np.array([_ns(p.start) for p in ordered], dtype=np.int64),
        "made_at": np.array([_ns(p.made_at) for p in ordered], dtype=np.int64),
        "step_s": np.array([p.step_s for p in ordered], dtype=np.int64),
        "confidence": np.array([p.confidence for p in ordered], dtype=np.float64),
        "free_len": np.array([len(p.free) for p in ordered], dtype=np.int64),
        "free": (np.concatenate([np.asarray(p.free, dtype=np.float64) for p in ordered])
                 if ordered else np.zeros(0)),
        "likely_len": np.array([-1 if v is None else len(v) for v in likely], dtype=np.int64),
        "likely": np.concatenate([np.asarray(v, dtype=np.float64) for v in likely
                                  if v is not None] or [np.zeros(0)]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".profiles-", suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, allow_pickle=False, **arrays)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_profiles(path: Path) -> dict[datetime, FreeProfile] | None:
    """The profiles ``save_profiles`` wrote to ``path``; None when it is missing, too large,
    or not such a file (damaged, of another format, or written by anyone else)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        with np.load(path, allow_pickle=False) as data:
            if str(data["format"]) != _FORMAT:
                return None
            made, start, made_at = data["made"], data["start"], data["made_at"]
            step_s, confidence = data["step_s"], data["confidence"]
            free_len, free = data["free_len"], data["free"]
            likely_len, likely = data["likely_len"], data["likely"]
            count = len(made)
            columns = (start, made_at, step_s, confidence, free_len, likely_len)
            if any(c.ndim != 1 or len(c) != count for c in columns) or (
                    free_len.min(initial=0) < 0 or int(free_len.sum()) != len(free)
                    or int(likely_len[likely_len > 0].sum()) != len(likely)
                    or (step_s <= 0).any()):
                return None
            profiles: dict[datetime, FreeProfile] = {}
            f_at = l_at = 0
            for n in range(count):
                values = free[f_at : f_at + free_len[n]].copy()
                f_at += int(free_len[n])
                seen = None
                if likely_len[n] >= 0:
                    seen = likely[l_at : l_at + likely_len[n]].copy()
                    l_at += int(likely_len[n])
                profiles[_moment(made[n])] = FreeProfile(
                    start=_moment(start[n]), step_s=int(step_s[n]), free=values,
                    confidence=float(confidence[n]), made_at=_moment(made_at[n]), likely=seen)
            return profiles
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def profiles_path(directory: Path, history: pd.DataFrame, settings: Settings,
                  start: datetime, end: datetime, *, refresh_hour: int = REFRESH_HOUR,
                  horizon: timedelta = HORIZON) -> Path:
    """The file in ``directory`` that keeps the forecast policy's profiles for
    ``simulate(history, settings, ..., start=start, end=end)`` at these defaults."""
    return _path(directory, history, settings, simulated_steps(history, settings, start, end),
                 refresh_hour, horizon)


def _path(directory: Path, history: pd.DataFrame, settings: Settings, index: pd.DatetimeIndex,
          refresh_hour: int, horizon: timedelta) -> Path:
    return Path(directory) / f"{profiles_key(history, settings, index, refresh_hour, horizon)}.npz"


def cached_forecast_profiles(
    directory: Path, history: pd.DataFrame, settings: Settings, start: datetime,
    end: datetime, *, refresh_hour: int = REFRESH_HOUR, horizon: timedelta = HORIZON,
    on_refresh: Callable[[int, int], None] | None = None, workers: int = 1,
) -> tuple[dict[datetime, FreeProfile], Path, bool]:
    """The forecast policy's profiles for ``simulate(history, settings, ..., start=start,
    end=end)`` at these defaults: read from ``directory`` when a run on the same inputs made
    them, else made (``forecast_profiles_for``) and written there. Returns them, the file and
    whether it was read. ``workers``: processes to make them in (``pool_profiles_for``)."""
    index = simulated_steps(history, settings, start, end)
    path = _path(directory, history, settings, index, refresh_hour, horizon)
    found = load_profiles(path)
    if found is not None:
        return found, path, True
    made = forecast_profiles_for(history, settings, index, refresh_hour, horizon,
                                 on_refresh=on_refresh, workers=workers)
    save_profiles(path, made)
    return made, path, False
