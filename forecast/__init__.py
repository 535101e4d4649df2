"""idlegpu forecasting: history ingestion, idle-GPU analysis and (later) demand forecasts.

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
