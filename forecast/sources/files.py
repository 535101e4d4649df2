"""History files: CSV (optionally compressed) and Parquet, columns ``unique_id, ds, y``."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.schema import DS, UNIQUE_ID, Y, validate_history

_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.zst", ".csv.xz")


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def read_history(path: str | Path) -> pd.DataFrame:
    """Load and validate a history file; the error names the file and the problem."""
    file = Path(path)
    if not file.is_file():
        raise HistoryError(f"history file {file} not found")
    name = file.name.lower()
    try:
        if _is_parquet(file):
            frame = pd.read_parquet(file)
        elif name.endswith(_CSV_SUFFIXES):
            frame = pd.read_csv(file, dtype={UNIQUE_ID: "string"}, keep_default_na=True)
        else:
            raise HistoryError(
                f"{file}: unknown history format; use .parquet or .csv (optionally .csv.gz)"
            )
    except HistoryError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise HistoryError(f"{file}: cannot read history ({exc})") from exc
    history = validate_history(frame, source=str(file))
    if history.empty:
        what = ("has no rows, only a header" if frame.empty else
                f"has {len(frame):,} rows, but every y is missing (NaN or empty)")
        raise HistoryError(f"{file}: the history {what}; a history needs samples: columns "
                           "unique_id, ds, y with y a number")
    return history


def write_history(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a validated history; byte-identical output for identical input and library versions.

    Parquet is written without the pandas index and with fixed settings; ``.csv.gz`` with a
    zeroed gzip timestamp, so regenerating a file reproduces it exactly.
    """
    file = Path(path)
    frame = validate_history(frame, source=str(file))
    file.parent.mkdir(parents=True, exist_ok=True)
    if _is_parquet(file):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        table = table.replace_schema_metadata(None)
        table = table.cast(
            pa.schema(
                [
                    pa.field(UNIQUE_ID, pa.dictionary(pa.int32(), pa.string())),
                    pa.field(DS, pa.timestamp("ns", tz="UTC")),
                    pa.field(Y, pa.float64()),
                ]
            )
        )
        pq.write_table(
            table,
            file,
            compression="zstd",
            compression_level=9,
            use_dictionary=True,
            write_statistics=False,
            row_group_size=1 << 20,
        )
    elif file.name.lower().endswith(".csv.gz"):
        text = _to_csv(frame)
        with open(file, "wb") as raw, gzip.GzipFile(
            filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
        ) as gz:
            gz.write(text.encode("utf-8"))
    elif file.name.lower().endswith(".csv"):
        file.write_text(_to_csv(frame), encoding="utf-8")
    else:
        raise HistoryError(f"{file}: unknown history format; use .parquet, .csv or .csv.gz")
    return file


def _to_csv(frame: pd.DataFrame) -> str:
    out = frame.copy()
    out[DS] = out[DS].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    buffer = io.StringIO()
    out.to_csv(buffer, index=False, float_format="%.10g", lineterminator="\n")
    return buffer.getvalue()
