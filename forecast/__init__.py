"""idlegpu forecasting: history ingestion (files, Prometheus), idle-GPU analysis, calibrated
replica forecasts chosen per series by backtest, the pool's joint free-GPU scenarios, idle
windows, capacity planning and right-sizing. It never imports the scheduler.

The public input of every command is a tidy history frame with columns ``unique_id``, ``ds``
(UTC timestamps) and ``y`` (float), one series per ``<service>/<metric>``.
"""

from idlegpu.forecast.errors import (
    ConfigError,
    HistoryError,
    IdlegpuError,
    PermanentError,
    SourceUnavailableError,
    TemporaryError,
)

__all__ = [
    "ConfigError",
    "HistoryError",
    "IdlegpuError",
    "PermanentError",
    "SourceUnavailableError",
    "TemporaryError",
]
