from pathlib import Path

import pytest
import yaml

from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.synthetic import SAMPLE_POOL
from idlegpu.scheduler.config import load_config

REPO = Path(__file__).resolve().parents[1]


def base() -> dict:
    return {
        "pool": {"total_gpus": 64, "headroom_gpus": 4},
        "query_templates": {"replicas": 'kube_deployment_status_replicas{deployment="$service"}'},
        "services": [{"name": "chat", "gpus_per_replica": 4, "min_replicas": 2, "max_replicas": 8}],
    }


def test_example_config_describes_the_sample_pool():
    settings = load_config(REPO / "idlegpu.yaml")
    assert settings.pool.total_gpus == SAMPLE_POOL.total_gpus
    assert settings.pool.headroom_gpus == SAMPLE_POOL.headroom_gpus
    assert settings.pool.timezone == SAMPLE_POOL.timezone
    assert settings.pool.holiday_country == "KR"
    got = [(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas) for s in settings.services]
    want = [(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas) for s in SAMPLE_POOL.services]
    assert got == want


def test_templates_fill_in_the_service_and_services_override_them():
    data = base()
    data["query_templates"]["kv_cache_usage"] = 'avg(vllm:kv_cache_usage_perc{model_name="$service"})'
    data["services"][0]["queries"] = {"kv_cache_usage": "avg(vllm:gpu_cache_usage_perc)"}
    data["query_templates"]["prompt_tokens_per_s"] = {"query": "sum(x_total)", "counter": True}
    queries = load_config(data=data).queries_for("chat")
    assert queries["replicas"].query == 'kube_deployment_status_replicas{deployment="chat"}'
    assert queries["kv_cache_usage"].query == "avg(vllm:gpu_cache_usage_perc)"
    assert queries["prompt_tokens_per_s"].counter is True
    assert queries["replicas"].counter is False


def test_environment_overrides_the_file(monkeypatch):
    monkeypatch.setenv("IDLEGPU_PROMETHEUS__URL", "http://prom.example:9090")
    monkeypatch.setenv("IDLEGPU_POOL__HEADROOM_GPUS", "12")
    settings = load_config(data=base())
    assert settings.prometheus.url == "http://prom.example:9090"
    assert settings.pool.headroom_gpus == 12
    assert settings.pool.total_gpus == 64  # the rest of the file's pool section stays


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["services"][0].update(gpus_per_replica=0), "services.0.gpus_per_replica"),
        (lambda d: d["services"][0].update(min_replicas=9), "min_replicas (9) is above"),
        (lambda d: d["pool"].update(timezone="Mars/Base"), "pool.timezone: unknown time zone"),
        (lambda d: d["pool"].update(holiday_country="XX"), "pool.holiday_country"),
        (lambda d: d["pool"].update(headroom_gpus=64), "headroom_gpus (64) must be below"),
        (lambda d: d["pool"].update(total_gpus=10), "more than pool.total_gpus"),
        (lambda d: d["services"].append(dict(d["services"][0])), "appear more than once"),
        (lambda d: d["services"][0].update(queries={"qps": "x"}), "unknown metric(s) qps"),
        (lambda d: d["query_templates"].update(desired="x"), "unknown metric(s) desired; use"),
        (lambda d: d["services"][0].update(gpu_per_replica=4), "gpu_per_replica: unknown field"),
        (lambda d: d.pop("query_templates"), "has no replicas query"),
        (lambda d: d["pool"].pop("total_gpus"), "pool.total_gpus: required field is missing"),
    ],
)
def test_invalid_config_names_the_field(mutate, needle):
    data = base()
    mutate(data)
    with pytest.raises(ConfigError) as info:
        load_config(data=data)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_service_lookup_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown service 'chta'; the config defines chat"):
        load_config(data=base()).service("chta")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pool: [1, 2\nservices: {")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(bad)
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(base()))
    assert load_config(ok).service_names == ["chat"]
