"""How long a job unit will run: estimates from past runs of the same family.

A *family* is one image (without its tag) and step, ``UnitSpec.family``, e.g.
``registry.example.com/research/eval#main``. For a unit, ``RuntimeEstimator.estimate`` tries,
in order:

1. ``model``: once the family has at least ``min_model_runs`` (20) past runs carrying the
   unit's numeric parameters (at least one of them varying), a quantile regression of
   ``log(runtime)`` on those parameters plus ``gpus``, fitted once per family and parameter
   set (scikit-learn, imported only then; without it this step is skipped):

   - ``model="loglinear"`` (default): linear quantile regression on ``log(parameter)`` and
     ``log(gpus)`` (``QuantileRegressor``, no penalty), i.e. a power law
     ``runtime ~ c * tokens^a * gpus^b``; only parameters positive in every run take part.
     Runtimes of training and generation jobs grow roughly as powers of their sizes, and a
     power law extrapolates to parameter combinations never run, which a family of 20-200
     runs rarely covers. On five synthetic power-law families of 30-100 runs, predicting every
     parameter combination (most never run), it landed within 0.9-2.1x of the true q0.9 for
     80 % of them (worst 0.6x-3.2x).
   - ``model="gbm"``: ``GradientBoostingRegressor(loss="quantile", alpha=quantile)`` on the raw
     parameters; no shape assumed, but trees do not extrapolate (a combination never seen gets
     the nearest one's estimate): 0.8-2.0x for 80 %, worst 0.35x-9x on the same families.

   A quantile of ``log(runtime)`` is the log of the runtime's quantile, so fitting in logs
   changes nothing but the shape of the model.
2. ``history``: the ``quantile`` (``admission.runtime_quantile``, e.g. 0.9; numpy's linear
   interpolation) of the family's last ``max_runs`` runtimes, once there are at least
   ``min_history_runs`` (3). Runs on the unit's GPU count are used alone when there are
   enough of them; otherwise every run is scaled to the unit's GPU count.
3. ``user``: the request's ``runtime_estimate_s`` times ``safety_factor``
   (``admission.runtime_safety_factor``).
4. ``default``: ``default_s`` (4 hours), flagged as a guess (``Estimate.is_guess``).

**GPU scaling** (an assumption, not a measurement): a run of ``r`` seconds on ``p`` GPUs takes
``r * max(1, p / g)`` seconds on ``g`` GPUs. Fewer GPUs slow a job down linearly (its work is
spread over fewer devices); more GPUs are credited no speed-up, because real scaling is
sub-linear and an under-estimate costs a preemption at the end of the window while an
over-estimate only costs a later start. The model path applies the same rule when the unit's
GPU count was never seen in the family (it predicts at the nearest GPU count seen).

Pure: no clock, no I/O, except ``load_runs`` / ``write_runs`` at the edge. ``sample_runs(seed)``
makes the bundled ``data/sample/runs.csv`` (``python -m idlegpu.scheduler.runtime`` rewrites it).

Runs file columns: ``family`` (optional: derived from image and step), ``image``, ``step``,
``gpus``, ``runtime_s``, ``finished_at`` (ISO 8601, naive = UTC), ``parameters`` (a JSON
object, may be empty).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.types import UnitSpec, family_of

if TYPE_CHECKING:
    from idlegpu.scheduler.config import AdmissionConfig

DEFAULT_RUNTIME_S = 4 * 3600.0
MIN_HISTORY_RUNS = 3
MIN_MODEL_RUNS = 20
MAX_RUNS = 200
RUN_COLUMNS = ("family", "image", "step", "gpus", "runtime_s", "finished_at", "parameters")
SAMPLE_SEED = 20251001
SAMPLE_RUNS = "runs.csv"

Source = Literal["history", "model", "user", "default"]


class RunHistoryError(PermanentError):
    """A runs file or frame does not follow the runs format."""


@dataclass(frozen=True)
class Estimate:
    seconds: float
    source: Source
    n_runs: int
    """Past runs of the family the estimate rests on (those seen, for user/default)."""
    note: str = ""
    """One line on how it was made, for people."""

    @property
    def is_guess(self) -> bool:
        return self.source == "default"


def gpu_scale(past_gpus: float, gpus: float) -> float:
    """Factor turning a runtime on ``past_gpus`` GPUs into one on ``gpus`` (see module doc)."""
    return max(1.0, float(past_gpus) / float(gpus))


def numeric_parameters(parameters: Mapping[str, Any] | tuple[tuple[str, str], ...]) -> dict:
    """The parameters that read as finite numbers, as floats."""
    items = parameters.items() if isinstance(parameters, Mapping) else parameters
    out: dict[str, float] = {}
    for name, value in items:
        if isinstance(value, bool):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[str(name)] = number
    return out


@dataclass(frozen=True)
class _Fit:
    """A fitted model of one family and parameter set, with what estimates need of its data."""

    model: Any
    """The fitted regressor; None without enough complete runs or without scikit-learn."""
    n_runs: int
    gpus_seen: tuple[float, ...]
    gpus_max: float


class RuntimeEstimator:
    """Runtime estimates for job units from a frame of past runs (see the module doc)."""

    def __init__(
        self,
        history: pd.DataFrame | None,
        quantile: float = 0.9,
        safety_factor: float = 1.3,
        default_s: float = DEFAULT_RUNTIME_S,
        *,
        min_history_runs: int = MIN_HISTORY_RUNS,
        min_model_runs: int = MIN_MODEL_RUNS,
        max_runs: int = MAX_RUNS,
        use_model: bool = True,
        model: Literal["loglinear", "gbm"] = "loglinear",
    ) -> None:
        if model not in ("loglinear", "gbm"):
            raise ValueError(f"model must be loglinear or gbm, got {model!r}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if safety_factor < 1.0:
            raise ValueError(f"safety_factor must be at least 1, got {safety_factor}")
        if not default_s > 0:
            raise ValueError(f"default_s must be positive, got {default_s}")
        self.quantile = quantile
        self.safety_factor = safety_factor
        self.default_s = float(default_s)
        self.min_history_runs = max(1, min_history_runs)
        self.min_model_runs = max(self.min_history_runs, min_model_runs)
        self.max_runs = max_runs
        self.use_model = use_model
        self.model = model
        frame = _normalise(history if history is not None else _empty_runs(), "history")
        frame = frame.sort_values("finished_at", ascending=False, kind="stable")
        self._families: dict[str, pd.DataFrame] = {
            fam: sub.head(max_runs).reset_index(drop=True)
            for fam, sub in frame.groupby("family", sort=True)
        }
        self._no_runs = _empty_runs()  # one for every family without runs (read only)
        self._tables: dict[str, tuple[pd.DataFrame, frozenset[str]]] = {}
        self._models: dict[tuple[str, tuple[str, ...]], _Fit] = {}
        self.without_model: set[str] = set()
        """Families whose runs were enough for the model but that were estimated from history
        quantiles, scikit-learn (the ``models`` extra) not being installed."""

    @classmethod
    def from_config(
        cls, history: pd.DataFrame | None, admission: AdmissionConfig,
        default_s: float = DEFAULT_RUNTIME_S, **kwargs: Any,
    ) -> RuntimeEstimator:
        return cls(history, admission.runtime_quantile, admission.runtime_safety_factor,
                   default_s, **kwargs)

    def seconds(self, unit: UnitSpec) -> float:
        """``estimate(unit).seconds``: what the planner and the simulator plan a unit with."""
        return self.estimate(unit).seconds

    def missing_model_note(self) -> str | None:
        """One line saying that estimates so far went without their model because scikit-learn
        is not installed, or None: the same runs give other estimates, and so other plans,
        with the ``models`` extra than without it."""
        if not self.without_model:
            return None
        families = sorted(self.without_model)
        named = ", ".join(families[:2]) + (f" and {len(families) - 2} more"
                                            if len(families) > 2 else "")
        kind = "family" if len(families) == 1 else "families"
        return (f"runtime estimates: {len(families)} job {kind} ({named}) have the "
                f"{self.min_model_runs}+ past runs for the {self.model} runtime model, "
                "which needs scikit-learn (the models extra: pip install "
                "'idlegpu[models]'); estimated from their runs' q"
                f"{self.quantile:g} instead, so plans differ from an install with it")

    def runs(self, family: str) -> pd.DataFrame:
        """The family's runs the estimator uses (most recent first)."""
        runs = self._families.get(family)
        return self._no_runs if runs is None else runs

    def estimate(self, unit: UnitSpec) -> Estimate:
        runs = self.runs(unit.family)
        n = len(runs)
        if n >= self.min_model_runs and self.use_model:
            modelled = self._model_estimate(unit, runs)
            if modelled is not None:
                return modelled
        if n >= self.min_history_runs:
            return self._history_estimate(unit, runs)
        if unit.runtime_estimate_s is not None and unit.runtime_estimate_s > 0:
            seconds = float(unit.runtime_estimate_s) * self.safety_factor
            return Estimate(
                seconds, "user", n,
                f"user estimate {unit.runtime_estimate_s:.0f} s x {self.safety_factor:g} "
                f"({n} past run(s) of {unit.family})",
            )
        return Estimate(
            self.default_s, "default", n,
            f"a guess: no runtime estimate and {n} past run(s) of {unit.family}",
        )

    def _history_estimate(self, unit: UnitSpec, runs: pd.DataFrame) -> Estimate:
        same = runs[runs["gpus"] == unit.gpus]
        if len(same) >= self.min_history_runs:
            values = same["runtime_s"].to_numpy(float)
            how = f"on {unit.gpus} GPU(s)"
        else:
            scale = np.maximum(1.0, runs["gpus"].to_numpy(float) / unit.gpus)
            values = runs["runtime_s"].to_numpy(float) * scale
            how = f"scaled to {unit.gpus} GPU(s)"
        seconds = float(np.quantile(values, self.quantile))
        return Estimate(
            seconds, "history", len(values),
            f"q{self.quantile:g} of {len(values)} run(s) of {unit.family} {how}",
        )

    def _model_estimate(self, unit: UnitSpec, runs: pd.DataFrame) -> Estimate | None:
        wanted = numeric_parameters(unit.parameters)
        loglinear = self.model == "loglinear"
        if loglinear:
            wanted = {k: v for k, v in wanted.items() if v > 0}
        if not wanted:
            return None
        usable = self._parameters(unit.family, runs)[1]
        features = tuple(name for name in sorted(wanted) if name in usable)
        if not features:
            return None
        key = (unit.family, features)
        if key not in self._models:
            self._models[key] = self._fit_family(unit.family, runs, features)
        fit = self._models[key]
        if fit.model is None:  # too few complete runs, or no scikit-learn
            return None
        if loglinear:
            at_gpus, scale = float(unit.gpus), 1.0  # gpus is a fitted power: no nearest-seen
        else:
            at_gpus = min(fit.gpus_seen, key=lambda g: (abs(g - unit.gpus), -g))
            scale = gpu_scale(at_gpus, unit.gpus)
        x = pd.DataFrame([[wanted[f] for f in features] + [at_gpus]],
                         columns=[*features, "gpus"])
        if loglinear:
            x = np.log(x)
        predicted = float(np.exp(fit.model.predict(x)[0])) * scale
        if loglinear and unit.gpus > fit.gpus_max:
            # no speed-up credited beyond the GPUs seen (the module's scaling rule)
            top = x.assign(gpus=np.log(fit.gpus_max))
            predicted = max(predicted, float(np.exp(fit.model.predict(top)[0])))
        if not (math.isfinite(predicted) and predicted > 0):
            return None
        return Estimate(
            predicted, "model", fit.n_runs,
            f"q{self.quantile:g} {self.model} model of {fit.n_runs} run(s) of {unit.family} "
            f"on {', '.join(features)} and gpus",
        )

    def _parameters(self, family: str, runs: pd.DataFrame) -> tuple[pd.DataFrame, frozenset[str]]:
        """The family's numeric run parameters (a column each, NaN where a run lacks one) and
        those the model may use: known for at least ``min_model_runs`` runs, varying, and
        (loglinear) positive in every run. Built once per family."""
        cached = self._tables.get(family)
        if cached is None:
            table = pd.DataFrame(
                [numeric_parameters(p) for p in runs["parameters"]], index=runs.index
            )
            loglinear = self.model == "loglinear"
            usable = frozenset(
                name for name in table.columns
                if table[name].notna().sum() >= self.min_model_runs
                and table[name].nunique() > 1
                and not (loglinear and (table[name] <= 0).any())
            )
            cached = self._tables[family] = (table, usable)
        return cached

    def _fit_family(self, family: str, runs: pd.DataFrame, features: tuple[str, ...]) -> _Fit:
        """The model of ``runtime_s`` on ``features`` and gpus over the family's runs that
        have them all (no model when fewer than ``min_model_runs``)."""
        table = self._parameters(family, runs)[0]
        data = table.loc[:, list(features)].assign(gpus=runs["gpus"].astype(float))
        data = data.dropna()
        if len(data) < self.min_model_runs:
            return _Fit(None, len(data), (), math.nan)
        model = self._fit(data, runs.loc[data.index, "runtime_s"])
        if model is None:
            self.without_model.add(family)
        return _Fit(model, len(data), tuple(sorted(set(data["gpus"]))), data["gpus"].max())

    def _fit(self, data: pd.DataFrame, runtime: pd.Series) -> Any:
        y = np.log(runtime.to_numpy(float))
        try:
            if self.model == "loglinear":
                from sklearn.linear_model import QuantileRegressor

                model = QuantileRegressor(quantile=self.quantile, alpha=0.0, solver="highs")
                return model.fit(np.log(data), y)
            from sklearn.ensemble import GradientBoostingRegressor
        except ImportError:  # the models extra is not installed: history quantiles only
            return None
        model = GradientBoostingRegressor(
            loss="quantile", alpha=self.quantile, n_estimators=200, learning_rate=0.1,
            max_depth=3, min_samples_leaf=max(3, len(data) // 20), random_state=0,
        )
        return model.fit(data, y)


# --------------------------------------------------------------------------- runs files


def _empty_runs() -> pd.DataFrame:
    return pd.DataFrame({
        "family": pd.Series(dtype=object), "image": pd.Series(dtype=object),
        "step": pd.Series(dtype=object), "gpus": pd.Series(dtype="int64"),
        "runtime_s": pd.Series(dtype=float),
        "finished_at": pd.Series(dtype="datetime64[ns, UTC]"),
        "parameters": pd.Series(dtype=object),
    })


def _normalise(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """Check and type a runs frame: ``parameters`` as dicts, ``finished_at`` UTC."""
    if not isinstance(frame, pd.DataFrame):
        raise RunHistoryError(f"{where}: expected a DataFrame of runs")
    required = [c for c in RUN_COLUMNS if c not in ("family", "parameters")]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise RunHistoryError(
            f"{where}: missing column(s) {', '.join(missing)}; a runs file has "
            f"{', '.join(RUN_COLUMNS)}"
        )
    out = frame.reset_index(drop=True).copy()
    if out.empty:
        return _empty_runs()

    def bad(mask: pd.Series, what: str) -> None:
        if mask.any():
            row = int(np.flatnonzero(mask.to_numpy())[0])
            raise RunHistoryError(f"{where}: row {row + 1}: {what} (and {int(mask.sum()) - 1} more)"
                                  if mask.sum() > 1 else f"{where}: row {row + 1}: {what}")

    for col in ("image", "step"):
        text = out[col].astype("string").str.strip()
        bad(text.isna() | (text == ""), f"{col} is empty")
        out[col] = text.astype(object)
    gpus = pd.to_numeric(out["gpus"], errors="coerce")
    bad(gpus.isna() | (gpus < 1) | (gpus != gpus.round()),
        "gpus must be a whole number >= 1")
    out["gpus"] = gpus.astype("int64")
    runtime = pd.to_numeric(out["runtime_s"], errors="coerce")
    bad(runtime.isna() | ~np.isfinite(runtime) | (runtime <= 0),
        "runtime_s must be a positive number of seconds")
    out["runtime_s"] = runtime.astype(float)
    finished = pd.to_datetime(out["finished_at"], errors="coerce", utc=True, format="ISO8601")
    bad(finished.isna(), "finished_at is not an ISO 8601 time")
    out["finished_at"] = finished
    derived = [family_of(i, s) for i, s in zip(out["image"], out["step"], strict=True)]
    if "family" in out.columns:
        fam = out["family"].astype("string").str.strip()
        out["family"] = [d if pd.isna(f) or f == "" else str(f)
                         for f, d in zip(fam, derived, strict=True)]
    else:
        out["family"] = derived
    if "parameters" not in out.columns:
        out["parameters"] = [{} for _ in range(len(out))]
    params = []
    for i, value in enumerate(out["parameters"]):
        if isinstance(value, Mapping):
            params.append(dict(value))
            continue
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            params.append({})
            continue
        try:
            parsed = json.loads(value)
        except (TypeError, ValueError) as exc:
            raise RunHistoryError(
                f"{where}: row {i + 1}: parameters is not JSON ({exc})"
            ) from None
        if not isinstance(parsed, dict):
            raise RunHistoryError(f"{where}: row {i + 1}: parameters must be a JSON object")
        params.append(parsed)
    out["parameters"] = params
    return out.loc[:, list(RUN_COLUMNS)]


def load_runs(path: str | Path) -> pd.DataFrame:
    """Read a runs file (``.csv``, ``.csv.gz`` or ``.parquet``) into a checked frame."""
    file = Path(path)
    if not file.is_file():
        raise RunHistoryError(
            f"runs file {file} not found; data/sample/runs.csv is an example "
            "(python -m idlegpu.scheduler.runtime regenerates it)"
        )
    name = file.name.lower()
    try:
        if name.endswith(".parquet"):
            frame = pd.read_parquet(file)
        elif name.endswith((".csv", ".csv.gz")):
            frame = pd.read_csv(file, dtype={"parameters": str}, keep_default_na=False,
                                na_values={"gpus": [""], "runtime_s": [""]})
        else:
            raise RunHistoryError(f"runs file {file}: use .csv, .csv.gz or .parquet")
    except RunHistoryError:
        raise
    except (ValueError, OSError, ImportError) as exc:  # parser errors of pandas / pyarrow
        raise RunHistoryError(f"runs file {file} cannot be read: {exc}") from None
    return _normalise(frame, str(file))


def write_runs(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write runs as CSV (parameters as JSON, times as ``...Z``): byte-stable for a frame."""
    file = Path(path)
    out = frame.loc[:, list(RUN_COLUMNS)].copy()
    out["finished_at"] = pd.to_datetime(out["finished_at"], utc=True).dt.strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    out["parameters"] = [
        p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in out["parameters"]
    ]
    file.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(file, index=False, lineterminator="\n")
    return file


# --------------------------------------------------------------------------- sample


REGISTRY = "registry.example.com/research/"
_SIZE = {"dense-3b": 0.5, "dense-7b": 1.0, "moe-16b": 1.5, "dense-32b": 3.5}
_BENCH = {"gsm8k": 1.0, "haerae": 0.8, "humaneval": 0.6, "ifeval": 0.9, "kmmlu": 1.3,
          "kobest": 0.7}


def _eval_hours(p: dict, g: int) -> float:
    fewshot = 1.3 if p.get("num_fewshot", 0) else 1.0
    return (0.4 + 0.5 * _SIZE[p["model"]]) * _BENCH[p["benchmark"]] * fewshot * (8 / g) ** 0.9


def _datagen_hours(p: dict, g: int) -> float:
    return 0.4 * p["samples"] ** 0.8 * _SIZE[p["model"]] * (4 / g) ** 0.85


def _rl_hours(p: dict, g: int) -> float:
    return p["rl_steps"] / 60 * _SIZE[p["policy"]] ** 0.5 * (16 / g) ** 0.8


def _sft_hours(p: dict, g: int) -> float:
    return 3.5 * p["epochs"] * _SIZE[p["base_model"]] ** 0.7 * (8 / g) ** 0.85


def _pretrain_hours(p: dict, g: int) -> float:
    tokens_b = float(p["train_tokens"].rstrip("B"))
    return 0.4 * tokens_b * _SIZE[p["model"]] ** 0.8 / (g / 32) ** 0.9


_EVAL = {"model": tuple(_SIZE), "benchmark": tuple(_BENCH), "num_fewshot": (0, 5)}
_RL = {"algorithm": ("grpo", "ppo"), "policy": tuple(_SIZE), "rl_steps": (200, 300, 500, 800)}
_SFT = {"base_model": ("dense-3b", "dense-7b", "dense-32b"), "epochs": (1, 2, 3),
        "lr": (2e-05, 1e-05, 5e-06)}
# The images and steps of the sample job trace (data/sample/jobs.yaml): single-step requests
# run step "main", the post-training pipeline runs sft -> rl -> eval.
_SAMPLE_FAMILIES: tuple[dict[str, Any], ...] = (
    {"name": "lm-eval", "step": "main", "tags": ("0.4.3", "0.4.4"), "gpus": (4, 8), "runs": 80,
     "params": _EVAL, "hours": _eval_hours},
    {"name": "lm-eval", "step": "eval", "tags": ("0.4.4",), "gpus": (8,), "runs": 25,
     "params": _EVAL, "hours": _eval_hours},
    {"name": "vllm-datagen", "step": "main", "tags": ("0.6.0", "0.6.1"), "gpus": (4, 8),
     "runs": 55, "hours": _datagen_hours,
     "params": {"model": tuple(_SIZE), "samples": (1, 2, 4, 8),
                "temperature": (0.6, 0.8, 1.0)}},
    {"name": "verl-rl", "step": "main", "tags": ("0.3.1", "0.3.2"), "gpus": (8, 16), "runs": 35,
     "params": _RL, "hours": _rl_hours},
    {"name": "verl-rl", "step": "rl", "tags": ("0.3.2",), "gpus": (8,), "runs": 20,
     "params": _RL, "hours": _rl_hours},
    {"name": "trl-sft", "step": "main", "tags": ("0.11.3", "0.11.4"), "gpus": (4, 8), "runs": 40,
     "params": _SFT, "hours": _sft_hours},
    {"name": "trl-sft", "step": "sft", "tags": ("0.11.4",), "gpus": (8,), "runs": 20,
     "params": _SFT, "hours": _sft_hours},
    {"name": "megatron-train", "step": "main", "tags": ("2025.09.2", "2025.10.1"),
     "gpus": (16, 32), "runs": 25, "hours": _pretrain_hours,
     "params": {"model": ("dense-3b", "dense-7b"), "train_tokens": ("25B", "50B", "100B"),
                "lr": (0.0003, 0.0004)}},
)
_SAMPLE_START = pd.Timestamp("2025-10-01T00:00:00Z")
_SAMPLE_END = pd.Timestamp("2026-02-01T00:00:00Z")


def sample_runs(seed: int = SAMPLE_SEED) -> pd.DataFrame:
    """300 made-up past runs of the families of the sample job trace (``lm-eval``,
    ``vllm-datagen``, ``verl-rl``, ``trl-sft``, ``megatron-train`` under
    ``registry.example.com/research/``; step ``main``, or ``sft``/``rl``/``eval`` of the
    post-training pipeline), deterministic for a seed. Runtimes follow each family's
    parameters (numeric ones like ``epochs`` or ``rl_steps``, and model names) with sub-linear
    GPU scaling, log-normal noise (sigma 0.15) and 5 % slow outliers (1.5-2.5x); parameters
    are JSON strings as in the file."""
    rng = np.random.default_rng(seed)
    span_min = int((_SAMPLE_END - _SAMPLE_START).total_seconds() // 60)
    rows = []
    for fam in _SAMPLE_FAMILIES:
        image = REGISTRY + fam["name"]
        for _ in range(fam["runs"]):
            params = {k: v[int(rng.integers(len(v)))] for k, v in fam["params"].items()}
            gpus = int(fam["gpus"][int(rng.integers(len(fam["gpus"])))])
            tag = fam["tags"][int(rng.integers(len(fam["tags"])))]
            hours = fam["hours"](params, gpus) * float(rng.lognormal(0.0, 0.15))
            if rng.random() < 0.05:
                hours *= float(rng.uniform(1.5, 2.5))
            finished = _SAMPLE_START + pd.Timedelta(minutes=int(rng.integers(span_min)))
            rows.append({
                "family": family_of(image, fam["step"]), "image": f"{image}:{tag}",
                "step": fam["step"], "gpus": gpus,
                "runtime_s": max(60, round(hours * 3600)), "finished_at": finished,
                "parameters": json.dumps(params, sort_keys=True),
            })
    frame = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    frame = frame.sort_values(["finished_at", "family"], kind="stable").reset_index(drop=True)
    frame["runtime_s"] = frame["runtime_s"].astype("int64")
    return frame


def main(argv: list[str] | None = None) -> None:
    """``python -m idlegpu.scheduler.runtime [PATH] [SEED]``: rewrite the sample runs file."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path("data/sample") / SAMPLE_RUNS
    seed = int(args[1]) if len(args) > 1 else SAMPLE_SEED
    frame = sample_runs(seed)
    write_runs(frame, path)
    print(f"wrote {len(frame)} runs of {frame['family'].nunique()} families to {path}")


if __name__ == "__main__":
    main()
