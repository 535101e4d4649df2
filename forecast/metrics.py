"""Metric names and series ids: ``<service>/<metric>``, e.g. ``chat/replicas``.

Kept apart from ``idlegpu.forecast.schema`` (which needs pandas) so that reading the
configuration, and the commands that only need it, start without loading pandas.
"""

from __future__ import annotations

# Metric names of the series of one service; ``<service>/<metric>`` is the series id.
REPLICAS = "replicas"
REQUESTS_RUNNING = "requests_running"
REQUESTS_WAITING = "requests_waiting"
KV_CACHE_USAGE = "kv_cache_usage"
PROMPT_TOKENS_PER_S = "prompt_tokens_per_s"
GENERATION_TOKENS_PER_S = "generation_tokens_per_s"
SERVICE_METRICS = (
    REPLICAS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    KV_CACHE_USAGE,
    PROMPT_TOKENS_PER_S,
    GENERATION_TOKENS_PER_S,
)
# Read live only, never kept as history: the autoscaler's desired replicas (with ``replicas``
# it tells how many GPUs the service is short of right now).
DESIRED_REPLICAS = "desired_replicas"
LIVE_METRICS = (DESIRED_REPLICAS,)


def series_id(service: str, metric: str) -> str:
    return f"{service}/{metric}"


def split_series_id(uid: str) -> tuple[str, str]:
    """``"chat/replicas"`` -> ``("chat", "replicas")``; an id without ``/`` has metric ``""``."""
    service, _, metric = uid.rpartition("/")
    if not service:
        return uid, ""
    return service, metric
