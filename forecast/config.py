"""The forecast's part of the pool configuration (``idlegpu.yaml``), validated with pydantic:
the pool, its services and their queries, Prometheus, and how the services' forecasts add up.

The scheduler's sections (admission, store, cluster, daemon, report, api) are
``idlegpu.scheduler.config``'s, whose ``Settings`` extends this one to the whole file; this
``load_config`` reads a whole file too, leaving those sections to it.

Environment variables override the file: prefix ``IDLEGPU_``, nested fields joined by ``__``,
e.g. ``IDLEGPU_PROMETHEUS__URL=http://prom:9090`` or ``IDLEGPU_POOL__HEADROOM_GPUS=8``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from idlegpu.forecast.calendar import HolidayCalendar
from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.metrics import LIVE_METRICS, REPLICAS, SERVICE_METRICS
from idlegpu.forecast.settings_base import (
    ENV_PREFIX,
    KUBERNETES_QUANTITY,
    StrictModel,
    load_settings,
)


class MetricQuery(StrictModel):
    """One PromQL query and how to read it."""

    query: str = Field(min_length=1)
    """PromQL returning one series (aggregate with ``sum``/``max`` when it could return more)."""
    counter: bool = False
    """The query returns a raw counter (e.g. ``vllm:prompt_tokens_total``): idlegpu turns it into
    a per-second rate between consecutive samples, treating a decrease as a counter reset."""


def _known_metric_names(value: dict[str, MetricQuery]) -> dict[str, MetricQuery]:
    known = (*SERVICE_METRICS, *LIVE_METRICS)
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}; use {', '.join(known)}")
    return value


class ServiceConfig(StrictModel):
    """One inference service of the pool (a vLLM Deployment scaled by an autoscaler)."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    """Service name; also the first part of its series ids (``<name>/replicas``)."""
    gpus_per_replica: int = Field(gt=0)
    """GPUs one replica holds (``nvidia.com/gpu`` limit of its pod)."""
    min_replicas: int = Field(ge=0)
    """The autoscaler's minimum replicas."""
    max_replicas: int = Field(gt=0)
    """The autoscaler's maximum replicas."""
    queries: dict[str, MetricQuery] = Field(default_factory=dict)
    """PromQL per metric (``replicas``, ``requests_running``, ``requests_waiting``,
    ``kv_cache_usage``, ``prompt_tokens_per_s``, ``generation_tokens_per_s``, and the live-only
    ``desired_replicas``). A plain string is a gauge query. Missing metrics come from
    ``query_templates``."""

    @field_validator("queries", mode="before")
    @classmethod
    def _plain_strings_are_gauges(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: {"query": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("queries")
    @classmethod
    def _known_metrics(cls, value: dict[str, MetricQuery]) -> dict[str, MetricQuery]:
        return _known_metric_names(value)

    @model_validator(mode="after")
    def _replica_bounds(self) -> ServiceConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        return self


class CustomHoliday(StrictModel):
    """A day the operator declares a holiday (``pool.custom_holidays``)."""

    date: date
    name: str = Field(default="custom holiday", min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _plain_date(cls, value: Any) -> Any:
        return {"date": value} if isinstance(value, str | date) else value


_QUANTITY_FACTORS = {
    "": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


class NodeShape(StrictModel):
    """One kind of node of the pool (``pool.nodes``): ``count`` nodes of this size. For the
    simulator and planning; the daemon reads the live nodes when it can."""

    gpus: int = Field(gt=0)
    """Allocatable ``nvidia.com/gpu`` of one node."""
    cpu: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Allocatable CPU cores of one node (None: not checked)."""
    memory: str | None = None
    """Allocatable memory of one node, a Kubernetes quantity (``1Ti``; None: not checked)."""
    labels: dict[str, str] = Field(default_factory=dict)
    count: int = Field(default=1, gt=0)

    @field_validator("memory")
    @classmethod
    def _memory_quantity(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(KUBERNETES_QUANTITY, str(value).strip()):
            raise ValueError(f"{value!r} is not a Kubernetes quantity; write e.g. 1Ti or 768Gi")
        return str(value).strip()

    @property
    def memory_bytes(self) -> int | None:
        if self.memory is None:
            return None
        quantity = re.fullmatch(r"(\d+(?:\.\d+)?)(\D*)", self.memory)
        assert quantity is not None  # _memory_quantity let only such quantities in
        number, suffix = quantity.groups()
        return int(float(number) * _QUANTITY_FACTORS[suffix])


class PoolConfig(StrictModel):
    """The GPU pool shared by the inference services and idlegpu's jobs."""

    name: str = "inference-pool"
    total_gpus: int = Field(gt=0)
    """GPUs in the pool (allocatable ``nvidia.com/gpu`` on its nodes)."""
    headroom_gpus: int = Field(default=0, ge=0)
    """GPUs always kept free for the service's sudden scale-up; never lent to jobs."""
    timezone: str = "Asia/Seoul"
    """IANA time zone of the users' day (daily curves, nights, reports)."""
    holiday_country: str | None = None
    """Country (ISO 3166 alpha-2, e.g. KR or US; ``US-CA`` also sets the subdivision) whose
    public holidays shape the traffic; None (the default): no public holidays."""
    holiday_subdivision: str | None = None
    """Subdivision of ``holiday_country`` whose holidays apply too (ISO 3166-2 part, e.g.
    ``CA`` for California); the ``holidays`` package lists each country's."""
    custom_holidays: list[CustomHoliday] = Field(default_factory=list)
    """The operator's own holidays (a launch, a company day off): dates, or ``{date, name}``;
    they count as holidays wherever public holidays do."""
    nodes: list[NodeShape] = Field(default_factory=list)
    """The pool's node shapes, e.g. ``[{gpus: 8, cpu: 96, memory: 1Ti, count: 12}]`` (their
    GPUs add up to ``total_gpus``); empty: not described (the pool as one bin, unless the
    daemon reads the live nodes)."""
    placement: Literal["spread", "binpack"] = "spread"
    """How the inference scheduler places the services' replicas on ``nodes``, for planning
    (``analyze``, the report): ``spread`` (the kube-scheduler's default ``LeastAllocated``
    scoring) or ``binpack`` (``MostAllocated``); see ``idlegpu.forecast.nodes``."""

    @model_validator(mode="before")
    @classmethod
    def _country_with_subdivision(cls, data: Any) -> Any:
        # "US-CA" is country US, subdivision CA
        if isinstance(data, Mapping):
            country = data.get("holiday_country")
            if isinstance(country, str) and "-" in country and not data.get("holiday_subdivision"):
                head, _, tail = country.partition("-")
                data = {**data, "holiday_country": head, "holiday_subdivision": tail}
        return data

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}; use an IANA name such as Asia/Seoul")
        return value

    @field_validator("holiday_country")
    @classmethod
    def _known_country(cls, value: str | None) -> str | None:
        import holidays

        if value is None or not value.strip() or value.strip().lower() in ("none", "null"):
            return None
        if value.strip().upper() not in holidays.list_supported_countries():
            raise ValueError(
                f"no holiday calendar for {value!r}; use an ISO 3166 code such as KR or US, "
                "or null for no public holidays"
            )
        return value.strip().upper()

    @model_validator(mode="after")
    def _known_subdivision(self) -> PoolConfig:
        if self.holiday_subdivision is None:
            return self
        if self.holiday_country is None:
            raise ValueError("holiday_subdivision needs a holiday_country (e.g. US with CA)")
        import holidays

        known = holidays.list_supported_countries()[self.holiday_country]
        if self.subdivision_code not in known:
            raise ValueError(
                f"holiday_subdivision {self.holiday_subdivision!r} is not a subdivision of "
                f"{self.holiday_country}; use one of {', '.join(known)}" if known else
                f"holiday_subdivision {self.holiday_subdivision!r}: the holidays package has no "
                f"subdivisions for {self.holiday_country}; leave it out"
            )
        return self

    @model_validator(mode="after")
    def _nodes_make_the_pool(self) -> PoolConfig:
        gpus = sum(shape.gpus * shape.count for shape in self.nodes)
        if self.nodes and gpus != self.total_gpus:
            shapes = " + ".join(f"{s.count} x {s.gpus}" for s in self.nodes)
            raise ValueError(f"pool.nodes hold {shapes} = {gpus} GPUs, but total_gpus is "
                             f"{self.total_gpus}; make them agree")
        return self

    @model_validator(mode="after")
    def _headroom_fits(self) -> PoolConfig:
        if self.headroom_gpus >= self.total_gpus:
            raise ValueError(
                f"headroom_gpus ({self.headroom_gpus}) must be below total_gpus ({self.total_gpus})"
            )
        return self

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def subdivision_code(self) -> str | None:
        """``holiday_subdivision`` as the holidays package spells it (``ca`` -> ``CA``)."""
        value = self.holiday_subdivision
        if value is None or self.holiday_country is None:
            return value
        import holidays

        known = holidays.list_supported_countries().get(self.holiday_country, [])
        return value if value in known else next(
            (k for k in known if k.upper() == value.strip().upper()), value)

    @property
    def calendar(self) -> HolidayCalendar:
        """The one holiday calendar of the pool: public holidays plus ``custom_holidays``."""
        return HolidayCalendar(self.holiday_country, self.subdivision_code,
                               tuple((h.date, h.name) for h in self.custom_holidays))

    @property
    def lendable_gpus(self) -> int:
        """What services and research jobs share: the pool minus its headroom."""
        return self.total_gpus - self.headroom_gpus


class PrometheusConfig(StrictModel):
    """Where and how to read metrics history."""

    url: str = "http://localhost:9090"
    step_seconds: int = Field(default=300, gt=0)
    """Resolution of fetched history, in seconds."""
    max_points_per_query: int = Field(default=10_000, gt=1, le=11_000)
    """Points per series per range query; Prometheus refuses more than 11,000."""
    workers: int = Field(default=8, gt=0, le=64)
    """Range queries in flight at once."""
    timeout_seconds: float = Field(default=60.0, gt=0)
    """Timeout of one HTTP request, in seconds."""
    retries: int = Field(default=3, ge=0)
    """Retries of a failed request (connection errors and 5xx), with exponential backoff."""
    verify_tls: bool = True
    bearer_token: str | None = None
    """Sent as ``Authorization: Bearer``; prefer ``IDLEGPU_PROMETHEUS__BEARER_TOKEN``."""


PoolUncertainty = Literal["joint", "sum"]
"""How the pool's free GPUs at a confidence come from the services' forecasts
(``admission.pool_uncertainty``; ``idlegpu.scheduler.config.AdmissionConfig`` documents it)."""


class ForecastAdmission(Protocol):
    """What the forecast reads of the ``admission`` section, whichever model holds it: the
    scheduler's whole section, or ``AdmissionForForecast`` where only the forecast reads it."""

    @property
    def pool_uncertainty(self) -> PoolUncertainty: ...


class AdmissionForForecast(BaseModel):
    """The ``admission`` section as the forecast's ``Settings`` reads it: its ``pool_uncertainty``.
    The section's other fields are the scheduler's to validate (``idlegpu.scheduler.config``), so
    they are left alone here, not refused."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    pool_uncertainty: PoolUncertainty = "joint"


class Settings(BaseSettings):
    """The forecast's part of ``idlegpu.yaml``: the pool, its services, Prometheus (the whole
    file is ``idlegpu.scheduler.config.Settings``, which extends this)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    other_sections: ClassVar[tuple[str, ...]] = ("store", "cluster", "daemon", "report", "api")
    """Top-level sections of ``idlegpu.yaml`` that are the scheduler's alone: skipped here, so
    that a whole file reads; any other unknown top-level key is still a mistake."""

    pool: PoolConfig
    prometheus: PrometheusConfig = PrometheusConfig()
    query_templates: dict[str, MetricQuery] = Field(default_factory=dict)
    """Queries shared by all services; ``$service`` is replaced by the service name."""
    services: list[ServiceConfig] = Field(min_length=1)
    if TYPE_CHECKING:
        # typed by what the forecast reads, so that the scheduler's Settings may hold the
        # whole section (its AdmissionConfig) in the same field
        admission: ForecastAdmission
    else:
        admission: AdmissionForForecast = AdmissionForForecast()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment first: it overrides what the file (passed as init kwargs) says.
        return (env_settings, init_settings)

    @model_validator(mode="before")
    @classmethod
    def _skip_other_sections(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and cls.other_sections:
            return {k: v for k, v in data.items() if k not in cls.other_sections}
        return data

    @field_validator("query_templates", mode="before")
    @classmethod
    def _template_strings_are_gauges(cls, value: Any) -> Any:
        return ServiceConfig._plain_strings_are_gauges(value)

    @field_validator("query_templates")
    @classmethod
    def _known_templates(cls, value: dict[str, MetricQuery]) -> dict[str, MetricQuery]:
        return _known_metric_names(value)

    @model_validator(mode="after")
    def _pool_is_consistent(self) -> Settings:
        names = [s.name for s in self.services]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"service name(s) {', '.join(dupes)} appear more than once")
        floor = sum(s.min_replicas * s.gpus_per_replica for s in self.services)
        if floor + self.pool.headroom_gpus > self.pool.total_gpus:
            raise ValueError(
                f"the services' minimum replicas hold {floor} GPUs, plus headroom "
                f"{self.pool.headroom_gpus}, more than pool.total_gpus ({self.pool.total_gpus})"
            )
        for service in self.services:
            if REPLICAS not in self.queries_for(service.name):
                raise ValueError(
                    f"service {service.name!r} has no replicas query; set "
                    "services[].queries.replicas or query_templates.replicas"
                )
        return self

    def service(self, name: str) -> ServiceConfig:
        for service in self.services:
            if service.name == name:
                return service
        raise ConfigError(
            f"unknown service {name!r}; the config defines {', '.join(self.service_names)}"
        )

    @property
    def service_names(self) -> list[str]:
        return [s.name for s in self.services]

    def queries_for(self, name: str) -> dict[str, MetricQuery]:
        """The service's queries: its own, else the templates with ``$service`` filled in."""
        service = next(s for s in self.services if s.name == name)
        merged = {
            metric: MetricQuery(
                query=string.Template(tpl.query).safe_substitute(service=name),
                counter=tpl.counter,
            )
            for metric, tpl in self.query_templates.items()
        }
        merged.update(service.queries)
        return merged


def load_config(path: str | Path | None = None, *,
                data: Mapping[str, Any] | None = None) -> Settings:
    """The forecast's part of ``idlegpu.yaml`` (or ``data``) plus ``IDLEGPU_*`` environment
    overrides; ``idlegpu.scheduler.config.load_config`` reads the whole file."""
    return load_settings(Settings, path, data=data)
