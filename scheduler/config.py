"""The whole pool configuration (``idlegpu.yaml``): the forecast's sections
(``idlegpu.forecast.config``) and the scheduler's, validated with pydantic.

The scheduler's sections: how jobs are admitted (``admission``, with each request's limits and
each team's volumes), the job store, the cluster the Jobs run on, the daemon, the monthly
report and the job API. Environment variables override the file as for the forecast's part
(``IDLEGPU_API__PORT=9000``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator

from idlegpu.forecast.config import PoolUncertainty
from idlegpu.forecast.config import Settings as ForecastSettings
from idlegpu.forecast.settings_base import KUBERNETES_QUANTITY, StrictModel, load_settings


class TeamVolumes(StrictModel):
    """What one team's jobs may mount or reference (``admission.team_volumes.<team>``): exact
    names, or shell patterns such as ``ckpt-nlp-*``. An ``empty_dir`` needs no entry."""

    persistent_volume_claims: list[str] = Field(default_factory=list)
    secrets: list[str] = Field(default_factory=list)
    """Secrets for volumes, ``env_from`` and ``value_from``."""
    config_maps: list[str] = Field(default_factory=list)
    """ConfigMaps for volumes, ``env_from`` and ``value_from``."""


class RequestLimits(StrictModel):
    """What one job request may cost (``admission.limits``), checked on the text and the
    parsed structure before any sweep is expanded or template rendered. Defaults fit every
    example and the sample trace with room to spare."""

    max_request_bytes: int = Field(default=256 * 1024, gt=0, le=64 * 2**20)
    """Size of one request file or API body, in UTF-8 bytes."""
    max_file_bytes: int = Field(default=32 * 2**20, gt=0, le=2**30)
    """Size of a file holding many requests (``jobs:`` lists, simulation traces)."""
    max_depth: int = Field(default=32, ge=8, le=256)
    """Nesting of mappings and lists (a request needs about 6)."""
    max_alias_nodes: int = Field(default=10_000, ge=0)
    """Nodes YAML aliases may add in total (each ``*alias`` counts every node it repeats)."""
    max_alias_bytes: int = Field(default=256 * 1024, ge=0)
    """Characters of scalars YAML aliases may add in total."""
    max_parameters: int = Field(default=256, gt=0, le=10_000)
    """Parameters of one unit (job-level and step parameters together, and swept ones)."""
    max_sweep_values: int = Field(default=256, gt=0, le=100_000)
    """Values of one swept parameter."""
    max_sweep_members: int = Field(default=256, gt=0, le=4096)
    """Members of one step's sweep (the cartesian product of its values)."""
    max_steps: int = Field(default=64, gt=0, le=1024)
    """Steps of a pipeline."""
    max_units: int = Field(default=1024, gt=0, le=4096)
    """Units of one request (every step's members together)."""
    max_string_bytes: int = Field(default=16 * 1024, gt=0)
    """Characters of any one string, as written and as rendered (an arg, an env value...)."""
    max_unit_bytes: int = Field(default=256 * 1024, gt=0)
    """Characters of one rendered unit (image, command, args, env, parameters, output...)."""
    max_request_expanded_bytes: int = Field(default=16 * 2**20, gt=0)
    """Characters of all the rendered units of one request together (what the store keeps)."""
    max_description_bytes: int = Field(default=4096, ge=0)
    """Characters of ``description``."""
    min_priority: int = Field(default=-1000, ge=-(2**31), le=0)
    max_priority: int = Field(default=1000, ge=0, le=2**31 - 1)
    """``priority`` must lie in min_priority..max_priority."""

    @model_validator(mode="after")
    def _consistent(self) -> RequestLimits:
        if self.max_sweep_members > self.max_units:
            raise ValueError(f"max_sweep_members ({self.max_sweep_members}) is above "
                             f"max_units ({self.max_units}); lower it or raise max_units")
        return self


class AdmissionConfig(StrictModel):
    """How research jobs are admitted to and preempted from the pool."""

    confidence: float = Field(default=0.9, ge=0.5, lt=1.0)
    """Probability that GPUs promised to a job really stay free (quantile of the forecast)."""
    runtime_quantile: float = Field(default=0.9, gt=0.0, lt=1.0)
    """Quantile of past runtimes a job is planned with."""
    runtime_safety_factor: float = Field(default=1.3, ge=1.0)
    """Multiplies a runtime that comes from the user's estimate rather than from history."""
    grace_seconds: int = Field(default=600, ge=0)
    """Time a preempted job gets to checkpoint and exit (terminationGracePeriodSeconds); also
    the lead time of proactive preemption before the forecast ramp."""
    checkpoint_notice_seconds: int = Field(default=600, ge=0, le=86400)
    """Notice a unit that answers checkpoint notices (``checkpoint.notice`` in its request)
    gets before a planned stop: its pods are annotated ``idlegpu.io/checkpoint-request`` with
    the deadline, and the stop comes at its acknowledgement or at the deadline. Planned
    stops of such units are decided this much earlier, so the deadline never passes the
    moment the service needs the GPUs. 0: no notices, blind SIGTERMs."""
    min_segment_seconds: int = Field(default=1800, gt=0)
    """Shortest run worth starting for a checkpointable job (restart costs)."""
    restart_cost_seconds: int = Field(default=600, ge=0)
    """What stopping a job costs beyond its unsaved work, in seconds per GPU (restart, reload,
    warm-up); victims are chosen to free what is needed at the least unsaved work plus this."""
    nowcast_half_life_seconds: int = Field(default=21600, ge=0)
    """How fast the live pool corrects the forecast: the gap between the GPUs free now and
    what the forecast promised for now is added to the promise, halving every this many
    seconds ahead (0: plan on the forecast alone). Forecast errors persist for hours: a pool
    quieter (or busier) than forecast tends to stay so."""
    node_reservation_seconds: int = Field(default=14400, ge=0)
    """How far ahead whole nodes are reserved for a unit the nodes refuse now (a gang that
    needs N whole nodes, fewer of which are free): it gets the nodes where the units on them
    end first if that is within this many seconds, and only what ends before may use them
    meanwhile (0: no node reservations). Further out the units' end estimates and the
    service's replicas make the nodes an unreliable promise, and the reservation idles them
    for hours: on the sample pool as 8-GPU nodes, unbounded reservations finished fewer gangs
    than none, 4 h the most (``bench/node_placement_bench.py``)."""
    grow_window_seconds: int = Field(default=7200, ge=0)
    """An elastic unit (``min_gpus``) admitted on fewer GPUs than it asks, because no more
    were free then, is stopped just after a checkpoint to restart on more where at least one
    more of its steps is free now and stays free at the admission confidence for this many
    seconds, it has work left for that long, and the extra GPUs' work outweighs the restart
    (the stop's grace and a reload of every GPU). It goes back to the queue in its turn and
    is admitted on the most GPUs that fit. 0: elastic units never grow."""
    pool_uncertainty: PoolUncertainty = "joint"
    """How the pool's free GPUs at the confidence come from the services' forecasts: ``joint``
    takes the quantile of scenarios that keep the services' measured co-movement
    (``idlegpu.forecast.scenarios``; never below the sum's promise); ``sum`` adds every
    service's quantile (exact when they move in lockstep, pessimistic otherwise)."""
    kv_cache_pressure: float = Field(default=0.95, gt=0.0, le=1.0)
    """KV-cache usage at which the service is under pressure (preempt to free GPUs)."""
    waiting_pressure: float = Field(default=8.0, ge=0.0)
    """Requests waiting per serving replica at which the service is under pressure."""
    max_signal_age_seconds: int = Field(default=120, gt=0)
    """Live vLLM signals older than this are stale: no admission on stale signals."""
    missing_signals_preempt_after_seconds: int | None = Field(default=900, gt=0)
    """Preempt jobs when signals stay missing this long (None: never preempt for that)."""
    missing_signals_stop_whole_units: bool = False
    """Also stop the units that cannot checkpoint when the signals stay missing (a stop loses
    all they did). False: they run on through the outage, nothing new is admitted, and the
    kube-scheduler's preemption of the best-effort PriorityClass still gives the service
    its GPUs."""
    max_forecast_age_seconds: int = Field(default=26 * 3600, gt=0)
    """No admission on a forecast older than this (it is refreshed every evening)."""
    fair_share_days: float = Field(default=7.0, gt=0)
    """Team fair share looks at GPU-hours used over this many past days."""
    allowed_registries: list[str] = Field(default_factory=lambda: ["registry.example.com/"])
    """Image prefixes jobs may use (e.g. ``registry.example.com/research/``)."""
    max_gpus_per_job: int = Field(default=64, gt=0)
    team_volumes: dict[str, TeamVolumes] = Field(default_factory=dict)
    """Per team, the PersistentVolumeClaims, Secrets and ConfigMaps its jobs may mount or
    reference; the entry ``"*"`` applies to every team. Default: none (``empty_dir`` only)."""
    max_cpu_per_gpu: float = Field(default=16.0, gt=0, allow_inf_nan=False)
    """CPU cores a unit may ask for per GPU it asks for."""
    max_memory_per_gpu: str = "128Gi"
    """Memory a unit may ask for per GPU (a Kubernetes quantity)."""
    max_ephemeral_storage_per_gpu: str = "200Gi"
    """Node-local disk (``ephemeral_storage``, disk ``empty_dir`` size) per GPU."""
    max_cpu_without_gpus: float = Field(default=8.0, gt=0, allow_inf_nan=False)
    """CPU cap of a unit that asks for no GPU (absolute)."""
    max_memory_without_gpus: str = "64Gi"
    """Memory cap of a unit that asks for no GPU (absolute)."""
    max_ephemeral_storage_without_gpus: str = "100Gi"
    """Node-local disk cap of a unit that asks for no GPU (absolute)."""
    limits: RequestLimits = RequestLimits()
    """What one request may cost: sizes, depth, aliases, parameters, sweeps, steps, units."""

    @field_validator("max_memory_per_gpu", "max_ephemeral_storage_per_gpu",
                     "max_memory_without_gpus", "max_ephemeral_storage_without_gpus")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not re.fullmatch(KUBERNETES_QUANTITY, value.strip()):
            raise ValueError(f"{value!r} is not a Kubernetes quantity; write e.g. 128Gi")
        return value.strip()

    @field_validator("team_volumes")
    @classmethod
    def _team_names(cls, value: dict[str, TeamVolumes]) -> dict[str, TeamVolumes]:
        for team in value:
            if team != "*" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", team):
                raise ValueError(
                    f"{team!r} is not a team name; use the team as jobs write it (lowercase "
                    "letters, digits and '-') or \"*\" for every team")
        return value


_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


class KueueConfig(StrictModel):
    """idlegpu as a Kueue admission check (``cluster.kueue``): the daemon serves these
    AdmissionChecks (``spec.controllerName: idlegpu.io/forecast``): a Workload of a
    ClusterQueue that lists one waits until the forecast has room for its runtime."""

    admission_checks: list[Annotated[str, Field(pattern=_DNS_SUBDOMAIN)]] = Field(
        default_factory=list, max_length=16)
    """Names of the AdmissionChecks to serve, e.g. [idlegpu-forecast]; empty: none (Kueue
    is not read at all)."""
    teams: dict[Annotated[str, Field(pattern=_DNS_SUBDOMAIN, max_length=63)],
                Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=dict)
    """The team of each namespace's Workloads, for fair share and the reports (default: the
    namespace's name)."""


class NativeJobsConfig(StrictModel):
    """Users' own suspended Jobs (``cluster.native_jobs``): a ``batch/v1`` Job created with
    ``spec.suspend: true`` and the label ``idlegpu.io/queue: <pool.name>`` in one of these
    namespaces is queued as a unit (admitted by unsuspending it, stopped by suspending it).
    Kubernetes RBAC is the boundary: whoever may create Jobs there may queue them."""

    namespaces: list[Annotated[str, Field(pattern=_DNS_SUBDOMAIN, max_length=63)]] = Field(
        default_factory=list, max_length=64)
    """Where Jobs may queue (each needs the RoleBinding of deploy/optional/native-jobs-rbac.yaml);
    empty: none (no Job is read)."""
    teams: dict[Annotated[str, Field(pattern=_DNS_SUBDOMAIN, max_length=63)],
                Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=dict)
    """The team of each namespace's Jobs (default: the namespace's name)."""


class ClusterConfig(StrictModel):
    """Where and how research Jobs run (the inference pool's GPU nodes)."""

    namespace: str = "idlegpu-jobs"
    kubeconfig: str | None = None
    """Path of a kubeconfig; None: the default one, or the in-cluster service account."""
    context: str | None = None
    in_cluster: bool = False
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Labels of the inference pool's GPU nodes, e.g. {pool: inference}."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)
    """A pod ``affinity`` (e.g. nodeAffinity to the pool's GPU product), as in a pod spec."""
    priority_class: str = "idlegpu-best-effort"
    """A PriorityClass with a negative value and preemptionPolicy Never (deploy/)."""
    active_deadline_seconds: int | None = Field(default=3 * 86400, gt=0)
    """Longest any one Job may run (its ``activeDeadlineSeconds``), a safety net should the
    daemon be gone; a Job with a planned stop gets its stop time plus the grace period."""
    ttl_seconds_after_finished: int | None = Field(default=86400, ge=0)
    """Finished Jobs (and their pods' logs) are removed this long after they end."""
    pending_timeout_seconds: int | None = Field(default=900, gt=0)
    """An admitted Job whose pod no node has placed after this long (GPUs spread over nodes, a
    taint, a quota) is stopped and its unit requeued; None waits for ever."""
    stop_timeout_seconds: int | None = Field(default=None, gt=0)
    """A stopped Job whose pods have not ended this long after the stop (a dead node never
    confirms the end) is given up on: its unit is released and the Job deleted. None: the
    grace period plus 10 minutes."""
    gang_timeout_seconds: int | None = Field(default=120, gt=0)
    """A multi-node unit (a gang) whose pods are not all bound to a node this long after its
    Job was created (a node taken meanwhile) is rolled back: its pods are deleted, its GPUs returned
    and the unit requeued, never left holding GPUs while waiting for its siblings. None: only
    the pending timeout."""
    max_unscheduled_attempts: int | None = Field(default=4, ge=1)
    """After this many attempts in a row that never ran (the last one unplaceable), the unit
    fails with the reason instead of reserving GPUs every pending timeout for ever."""
    instance: str | None = Field(default=None, min_length=1, max_length=63)
    """Identity of this daemon instance, a label on every Job it creates; it sees and touches
    only its own Jobs, so two daemons (two pools, or two stores) can share a namespace.
    None: the pool name and the store's random id (e.g. ``seoul-a1-3f9c2b7e``); replicas of
    one daemon share their store and so their identity."""
    backoff_limit: int = Field(default=0, ge=0)
    """Pod retries within one attempt; 0 leaves retrying to the admitter's next attempt."""
    service_account: str | None = None
    """Service account of the research pods (none of the API: no token is mounted)."""
    run_as_user: int | None = Field(default=None, gt=0)
    """UID for images whose USER is root or unset (pods always run as non-root)."""
    job_api_url: str | None = Field(default=None, max_length=2048)
    """The job API's address as the research pods reach it (e.g.
    ``https://idlegpu-api.idlegpu.svc:8080``): pods of units that answer checkpoint notices
    get it as ``$IDLEGPU_API_URL`` to acknowledge at, with a pod-bound token of audience
    ``token_audience``. None: such pods get the notice file but cannot acknowledge (they are
    stopped at the notice's deadline)."""
    token_audience: str = Field(default="idlegpu", min_length=1, max_length=253)
    """Audience of the projected service-account token of those pods (the job API's
    ``api.token_review.audiences`` must list it)."""
    token_expiration_seconds: int = Field(default=600, ge=600, le=86400)
    """Lifetime of that token; the kubelet rotates it before it expires (600 is the least
    the API server accepts)."""
    kueue: KueueConfig = Field(default_factory=KueueConfig)
    """Kueue's Workloads admitted through idlegpu's admission checks (``KueueConfig``)."""
    native_jobs: NativeJobsConfig = Field(default_factory=NativeJobsConfig)
    """Users' own suspended Jobs with the ``idlegpu.io/queue`` label (``NativeJobsConfig``)."""


class LeaderElectionConfig(StrictModel):
    """Leader election between daemon replicas (``daemon.leader_election``), on a
    ``coordination.k8s.io/v1`` Lease: only the leader runs passes and writes reports; a
    standby keeps its forecast fresh and takes over once the leader stops renewing."""

    enabled: bool = False
    lease_name: str = Field(default="idlegpu", min_length=1, max_length=253)
    namespace: str | None = None
    """Namespace of the Lease; None: the daemon's own (``$POD_NAMESPACE``, set from the
    Downward API in ``deploy/``), else ``cluster.namespace``."""
    identity: str | None = None
    """This replica's name in the Lease; None: ``$POD_NAME``, else ``<hostname>-<pid>``."""
    lease_duration_seconds: float = Field(default=15, gt=0)
    """How long a standby waits, on its own clock, after it last saw the Lease change before
    it takes over."""
    renew_deadline_seconds: float = Field(default=10, gt=0)
    """The leader steps down when it could not renew for this long (< the lease duration)."""
    retry_period_seconds: float = Field(default=2, gt=0)
    """How often the leader renews and a standby tries."""

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.lease_duration_seconds > self.renew_deadline_seconds:
            raise ValueError("leader_election.lease_duration_seconds must be greater than "
                             "renew_deadline_seconds")
        if not self.renew_deadline_seconds > 1.2 * self.retry_period_seconds:
            raise ValueError("leader_election.renew_deadline_seconds must be greater than "
                             "1.2 x retry_period_seconds")
        return self


class DaemonConfig(StrictModel):
    """The admission daemon's timing and endpoints."""

    mode: str = Field(default="always-on", pattern="^(always-on|night-only)$")
    """``always-on`` admits whenever the forecast allows; ``night-only`` only 20:00-08:00."""
    reconcile_seconds: int = Field(default=60, gt=0)
    backstop_seconds: int = Field(default=15, gt=0)
    forecast_refresh_hour: int = Field(default=17, ge=0, le=23)
    """Local hour of the nightly forecast refresh (before the evening window)."""
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    """Port of /metrics and /healthz (0: none)."""
    reports_dir: str = "reports"
    leader_election: LeaderElectionConfig = LeaderElectionConfig()
    """Two or more replicas (with the store on PostgreSQL): one leads, the others stand by."""


class StoreConfig(StrictModel):
    url: str = "sqlite:///idlegpu.db"
    """SQLAlchemy URL of the job store: a SQLite file by default, or postgresql://..."""
    retention_days: float | None = Field(default=90.0, gt=0)
    """Ended and cancelled units keep their full spec this long after they ended; then the
    daemon drops its bulk (command, args, env, parameters, resume args; the request's body),
    in batches, once an hour. What the monthly reports read (units' team, kind and GPUs,
    attempts, events) is kept. None: keep everything."""



class ReportConfig(StrictModel):
    """Monthly usage reports (``idlegpu report``)."""

    price_per_gpu_hour: float = Field(default=3000.0, ge=0)
    """What one GPU-hour would cost elsewhere, in ``currency`` (e.g. a 3-year public-cloud
    commitment): useful GPU-hours times this price are the report's cost savings."""
    currency: str = "KRW"
    """ISO 4217 code of the price (three uppercase letters: KRW, USD, EUR, ...)."""

    @field_validator("currency")
    @classmethod
    def _iso_4217(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", value):
            raise ValueError("currency must be an ISO 4217 code of 3 uppercase letters, e.g. KRW")
        return value

API_ROLES: tuple[str, ...] = ("member", "operator", "viewer")
"""``member``: submits for its team and cancels its team's work; ``operator``: also cancels
anyone's work and reads the audit log; ``viewer``: reads only."""


class IdentityMapping(StrictModel):
    """One rule of ``api.identities``: a Kubernetes or proxy user (and/or one of its groups)
    acting for ``team`` with ``role``. The first rule that matches wins."""

    user: str | None = Field(default=None, min_length=1)
    """The user name exactly (``system:serviceaccount:research:alice``, ``alice@corp``)."""
    group: str | None = Field(default=None, min_length=1)
    """A group the user is in (both given: the user must also be in the group)."""
    team: str = Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    role: str = "member"

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in API_ROLES:
            raise ValueError(f"unknown role {value!r}; use one of {', '.join(API_ROLES)}")
        return value

    @model_validator(mode="after")
    def _names_someone(self) -> IdentityMapping:
        if self.user is None and self.group is None:
            raise ValueError("an identity mapping needs a user, a group or both")
        return self


class ApiQuota(StrictModel):
    """What each member of a team may hold through the job API (each caller on its own, not
    the team together); past it a submit is refused with 429, naming the quota, the use and
    when it frees. The defaults keep one member's growth of the job store to about 100 MB
    and what a daemon pass reads of it to about 200 MB."""

    live_units: int = Field(default=2000, ge=1)
    """Units submitted and not yet ended (queued, admitted, running)."""
    requests_per_hour: int = Field(default=120, ge=1)
    """Requests submitted in the last hour."""
    stored_bytes: int = Field(default=50_000_000, ge=1)
    """Bytes of stored spec (each unit's JSON and its request's) of the live units."""


class ApiTeam(StrictModel):
    """What one team may ask of the job API."""

    max_priority: int | None = None
    """The highest ``priority`` its requests may carry (a higher one is refused, 422, naming
    this cap); None: no cap."""
    quota: ApiQuota = ApiQuota()
    """Each member's quota (``api.users`` overrides it for one caller)."""


class TokenReviewConfig(StrictModel):
    """Kubernetes TokenReview: bearer tokens the API server accepts (ServiceAccount tokens,
    OIDC tokens it is configured for) authenticate callers of the job API."""

    enabled: bool = False
    kubeconfig: str | None = None
    """Credentials that may create ``tokenreviews`` (default: ``$KUBECONFIG`` or
    ``~/.kube/config``, else the pod's service account)."""
    context: str | None = None
    in_cluster: bool = False
    audiences: list[str] = Field(default_factory=list)
    """Audiences the token must be for (empty: the API server's own)."""
    cache_seconds: float = Field(default=10.0, ge=0, le=300)
    """How long one answer of the API server is reused for the same token."""
    timeout_seconds: float = Field(default=5.0, gt=0, le=60)


class ProxyConfig(StrictModel):
    """An authenticating proxy in front of the job API: its user and group headers are
    trusted only on connections from ``api.trusted_proxies``."""

    user_header: str = Field(default="X-Remote-User", min_length=1)
    group_header: str = Field(default="X-Remote-Group", min_length=1)
    """May repeat, or carry several groups separated by commas."""


class ApiConfig(StrictModel):
    """The job API (``idlegpu serve``): who may call it, as whom, and for which team."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tokens: bool = True
    """Accept tokens issued by ``idlegpu token create`` (stored hashed in the job store)."""
    token_review: TokenReviewConfig = TokenReviewConfig()
    proxy: ProxyConfig = ProxyConfig()
    trusted_proxies: list[str] = Field(default_factory=list)
    """CIDRs (``127.0.0.1/32``, ``10.8.0.0/16``) whose connections may name the user in
    ``proxy.user_header``; empty: proxy headers are never trusted."""
    identities: list[IdentityMapping] = Field(default_factory=list)
    """Kubernetes and proxy users and groups -> team and role (first match wins)."""
    teams: dict[str, ApiTeam] = Field(default_factory=dict)
    """Per team (``"*"``: every team not listed) what it may ask for, e.g. its
    ``max_priority`` and each member's ``quota``."""
    users: dict[str, ApiQuota] = Field(default_factory=dict)
    """Per caller (its user name: a token's name, a Kubernetes or proxy user) a quota of its
    own, over its team's: how an operator raises (or lowers) one member's."""
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    """Request bodies of the submit routes larger than this are refused (413) while they are
    read, before they are parsed (every other route: 16 KiB)."""
    docs: bool = True
    """Serve ``/docs`` and ``/redoc`` (from this server's own assets); ``/openapi.json``
    stays either way."""
    session_secret: SecretStr | None = None
    """The key the web console signs its session cookies with; every ``idlegpu serve``
    replica behind one address must share it (best from a Secret, as
    ``IDLEGPU_API__SESSION_SECRET``). None: ``IDLEGPU_SESSION_SECRET``, else random at start
    (sessions then end when the server restarts)."""

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        import ipaddress

        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not an address range such as 127.0.0.1/32"
                                 ) from None
        return value

    def team(self, name: str) -> ApiTeam:
        return self.teams.get(name) or self.teams.get("*") or ApiTeam()

    def quota(self, team: str, user: str) -> tuple[ApiQuota, str]:
        """The quota of caller ``user`` of ``team``, and the setting it comes from."""
        if user in self.users:
            return self.users[user], f"api.users.{user}"
        key = team if team in self.teams else "*" if "*" in self.teams else None
        return self.team(team).quota, (f"api.teams.{key}.quota" if key else
                                       "the default of api.teams.<team>.quota")


class Settings(ForecastSettings):
    """Everything ``idlegpu.yaml`` holds."""

    other_sections: ClassVar[tuple[str, ...]] = ()  # the whole file: none left to another

    admission: AdmissionConfig = AdmissionConfig()
    store: StoreConfig = StoreConfig()
    cluster: ClusterConfig = ClusterConfig()
    daemon: DaemonConfig = DaemonConfig()
    report: ReportConfig = ReportConfig()
    api: ApiConfig = ApiConfig()
    """The job API (``idlegpu serve``)."""


def load_config(path: str | Path | None = None, *,
                data: Mapping[str, Any] | None = None) -> Settings:
    """Read ``idlegpu.yaml`` (or ``data``) plus ``IDLEGPU_*`` environment overrides."""
    return load_settings(Settings, path, data=data)
