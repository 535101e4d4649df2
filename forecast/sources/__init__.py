"""Where history comes from: files (CSV/Parquet) and Prometheus. All return the tidy frame."""

from idlegpu.forecast.sources.files import read_history, write_history

__all__ = ["read_history", "write_history"]
