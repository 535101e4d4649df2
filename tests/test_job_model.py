"""The job model beyond image and GPUs: volumes (claims, scratch, /dev/shm, ConfigMaps, Secrets),
Secret and ConfigMap references in the environment, ephemeral storage, the operator's per-team
allow-lists, per-GPU resource caps, NVIDIA_* variables refused, the store round trip, and
``recheck_unit``: the daemon re-applying the rules to what the store holds, under its own
config."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from idlegpu.forecast.errors import ConfigError
from idlegpu.scheduler.adapters.store import JobStore, spec_from_json, spec_to_json
from idlegpu.scheduler.config import AdmissionConfig, load_config
from idlegpu.scheduler.specs import (
    RECHECK_PREFIX,
    SpecError,
    expand_units,
    recheck_unit,
    validate_request,
)
from idlegpu.scheduler.types import EnvFromSource, EnvKeyRef, UnitSpec, UnitVolume

REPO = Path(__file__).resolve().parents[1]
IMAGE = "registry.example.com/research/trainer:1.4.2"
NOW = datetime(2026, 1, 28, 9, 0, tzinfo=UTC)
ADMISSION = AdmissionConfig(team_volumes={
    "nlp": {"persistent_volume_claims": ["ckpt-nlp", "scratch-nlp-*"], "secrets": ["wandb"],
            "config_maps": ["recipes"]},
    "*": {"persistent_volume_claims": ["datasets"], "config_maps": ["nccl-tuning"]},
})


def request(**changes) -> dict:
    data = {"name": "sft-a", "team": "nlp", "kind": "sft", "image": IMAGE, "gpus": 8,
            "checkpoint": {"interval": "30m"}}
    data.update(changes)
    return data


def full_request(**changes) -> dict:
    return request(
        env={"NCCL_DEBUG": "WARN", "WANDB_API_KEY": {"value_from": {"secret": "wandb",
                                                                    "key": "api-key"}},
             "RECIPE": {"value_from": {"config_map": "recipes", "key": "name",
                                       "optional": True}}},
        env_from=[{"config_map": "nccl-tuning"}, {"secret": "wandb", "prefix": "WANDB_"}],
        volumes=[
            {"name": "ckpt", "mount_path": "/ckpt", "persistent_volume_claim": "ckpt-nlp",
             "sub_path": "{name}/{step}/{member}"},
            {"name": "data", "mount_path": "/data", "persistent_volume_claim": "datasets",
             "read_only": True},
            {"name": "dshm", "mount_path": "/dev/shm",
             "empty_dir": {"medium": "Memory", "size_limit": "32Gi"}},
            {"name": "scratch", "mount_path": "/scratch", "empty_dir": {"size_limit": "100Gi"}},
            {"name": "recipes", "mount_path": "/etc/recipes", "config_map": "recipes"},
            {"name": "token", "mount_path": "/var/run/secrets/wandb", "secret": "wandb"},
        ],
        ephemeral_storage={"request": "100Gi", "limit": "400Gi"},
        **changes,
    )


def only_unit(data: dict, admission: AdmissionConfig = ADMISSION) -> UnitSpec:
    (unit,) = expand_units(validate_request(data, admission, source="job.yaml"))
    return unit


def refusal(data: dict, admission: AdmissionConfig = ADMISSION) -> str:
    with pytest.raises(SpecError) as info:
        validate_request(data, admission, source="job.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------------------------
# What a unit carries


def test_a_request_with_every_feature_expands_into_a_unit_that_carries_it():
    unit = only_unit(full_request())
    assert unit.volumes == (
        UnitVolume("ckpt", "persistent_volume_claim", "/ckpt", "ckpt-nlp",
                   sub_path="sft-a/main/0"),
        UnitVolume("data", "persistent_volume_claim", "/data", "datasets", read_only=True),
        UnitVolume("dshm", "empty_dir", "/dev/shm", medium="Memory", size_limit="32Gi"),
        UnitVolume("scratch", "empty_dir", "/scratch", size_limit="100Gi"),
        UnitVolume("recipes", "config_map", "/etc/recipes", "recipes", read_only=True),
        UnitVolume("token", "secret", "/var/run/secrets/wandb", "wandb", read_only=True),
    )
    assert unit.env_refs == (
        EnvKeyRef("WANDB_API_KEY", "secret", "wandb", "api-key"),
        EnvKeyRef("RECIPE", "config_map", "recipes", "name", optional=True),
    )
    assert unit.env_from == (EnvFromSource("config_map", "nccl-tuning"),
                             EnvFromSource("secret", "wandb", prefix="WANDB_"))
    assert (unit.ephemeral_storage_request, unit.ephemeral_storage_limit) == ("100Gi", "400Gi")
    # plain env still works, and a reference is not a plain value
    env = dict(unit.env)
    assert env["NCCL_DEBUG"] == "WARN" and "WANDB_API_KEY" not in env and "RECIPE" not in env


def test_defaults_add_nothing():
    unit = only_unit(request())
    assert (unit.volumes, unit.env_from, unit.env_refs) == ((), (), ())
    assert unit.ephemeral_storage_request is None and unit.ephemeral_storage_limit is None


def test_one_quantity_sets_ephemeral_request_and_limit():
    unit = only_unit(request(ephemeral_storage="150Gi"))
    assert (unit.ephemeral_storage_request, unit.ephemeral_storage_limit) == ("150Gi", "150Gi")
    unit = only_unit(request(ephemeral_storage={"limit": "150Gi"}))
    assert unit.ephemeral_storage_request == "150Gi"  # the request defaults to the limit


def test_steps_replace_volumes_env_from_and_storage_and_merge_env_key_by_key():
    data = full_request(steps=[
        {"name": "train", "sweep": {"seed": [1, 2]}},
        {"name": "eval", "volumes": [{"name": "ckpt", "mount_path": "/ckpt", "read_only": True,
                                      "persistent_volume_claim": "ckpt-nlp",
                                      "sub_path": "{name}/train/0"}],
         "env_from": [], "ephemeral_storage": "20Gi",
         "env": {"WANDB_API_KEY": "disabled"}},
    ])
    train0, train1, evaluate = expand_units(validate_request(data, ADMISSION))
    # a templated sub_path: every sweep member its own directory of one claim
    assert [u.volumes[0].sub_path for u in (train0, train1)] == ["sft-a/train/0", "sft-a/train/1"]
    assert len(train0.volumes) == 6 and train0.env_from and train0.env_refs[0].name == "WANDB_API_KEY"
    assert evaluate.volumes == (UnitVolume("ckpt", "persistent_volume_claim", "/ckpt", "ckpt-nlp",
                                           read_only=True, sub_path="sft-a/train/0"),)
    assert evaluate.env_from == () and evaluate.ephemeral_storage_limit == "20Gi"
    assert dict(evaluate.env)["WANDB_API_KEY"] == "disabled"  # the step's plain value wins
    assert [r.name for r in evaluate.env_refs] == ["RECIPE"]


def test_a_sub_path_that_escapes_after_templating_is_refused():
    data = request(parameters={"run": "../../other-team"}, volumes=[
        {"name": "ckpt", "mount_path": "/ckpt", "persistent_volume_claim": "ckpt-nlp",
         "sub_path": "runs/{run}"}])
    assert refusal(data).startswith("job.yaml: volumes.0.sub_path: 'runs/../../other-team' "
                                    "contains '..'")


# --------------------------------------------------------------------------------------------
# The operator's allow-lists


def test_nothing_but_empty_dirs_may_be_mounted_by_default():
    only_unit(request(volumes=[{"name": "s", "mount_path": "/s", "empty_dir": None}]),
              AdmissionConfig())
    message = refusal(full_request(), AdmissionConfig())
    assert message.startswith(
        "job.yaml: volumes.0.persistent_volume_claim: team 'nlp' may not mount the persistent "
        "volume claim 'ckpt-nlp': no persistent_volume_claims are allowed for nlp "
        "(admission.team_volumes.nlp.persistent_volume_claims is empty)")


def test_a_claim_off_the_list_is_refused_naming_the_field_the_team_and_what_is_allowed():
    data = request(steps=[{"name": "train", "volumes": [
        {"name": "v", "mount_path": "/v", "persistent_volume_claim": "ckpt-vision"}]}])
    assert refusal(data) == (
        "job.yaml: steps.0.volumes.0.persistent_volume_claim: team 'nlp' may not mount the "
        "persistent volume claim 'ckpt-vision'; allowed for nlp: ckpt-nlp, scratch-nlp-*, "
        "datasets (admission.team_volumes.nlp.persistent_volume_claims); use one of those, or "
        "ask the pool's operator to add it there")


def test_patterns_and_the_star_entry_apply():
    unit = only_unit(request(volumes=[
        {"name": "a", "mount_path": "/a", "persistent_volume_claim": "scratch-nlp-7"},
        {"name": "b", "mount_path": "/b", "persistent_volume_claim": "datasets"},
        {"name": "c", "mount_path": "/c", "config_map": "nccl-tuning"}]))
    assert [v.source for v in unit.volumes] == ["scratch-nlp-7", "datasets", "nccl-tuning"]
    # another team gets only the "*" entry
    other = request(team="vision", volumes=[
        {"name": "a", "mount_path": "/a", "persistent_volume_claim": "ckpt-nlp"}])
    assert "team 'vision' may not mount" in refusal(other)
    assert "allowed for vision: datasets" in refusal(other)


@pytest.mark.parametrize(("changes", "field", "needle"), [
    ({"env": {"TOKEN": {"value_from": {"secret": "prod-db", "key": "password"}}}},
     "env.TOKEN.value_from.secret:", ("team 'nlp' may not read the secret 'prod-db'; allowed "
     "for nlp: wandb")),
    ({"env": {"X": {"value_from": {"config_map": "kube-root-ca.crt", "key": "ca.crt"}}}},
     "env.X.value_from.config_map:", "may not read the config map 'kube-root-ca.crt'"),
    ({"env_from": [{"secret": "prod-db"}]}, "env_from.0.secret:",
     "may not read the secret 'prod-db'"),
    ({"volumes": [{"name": "s", "mount_path": "/s", "secret": "prod-db"}]}, "volumes.0.secret:",
     "may not mount the secret 'prod-db'"),
])
def test_secret_and_config_map_references_need_the_allow_list(changes, field, needle):
    message = refusal(request(**changes))
    assert message.startswith(f"job.yaml: {field}") and needle in message, message


def test_allow_lists_are_config_with_checked_team_names(monkeypatch):
    with pytest.raises(ValueError, match="not a team name"):
        AdmissionConfig(team_volumes={"NLP": {}})
    with pytest.raises(ValueError, match="extra"):
        AdmissionConfig(team_volumes={"nlp": {"pvcs": ["x"]}})
    monkeypatch.setenv("IDLEGPU_ADMISSION__TEAM_VOLUMES",
                       json.dumps({"nlp": {"secrets": ["wandb"]}}))
    settings = load_config(REPO / "idlegpu.yaml")
    assert settings.admission.team_volumes["nlp"].secrets == ["wandb"]


# --------------------------------------------------------------------------------------------
# Resource caps


@pytest.mark.parametrize(("changes", "field", "needle"), [
    ({"cpu": 1e300}, "cpu:", ("1e+300 CPUs is above the cap of 16 per GPU (128 for 8 GPU(s), "
     "admission.max_cpu_per_gpu); ask for at most 128")),
    ({"memory": "1Ei"}, "memory:", ("1Ei is above the cap of 128Gi per GPU (1Ti for 8 GPU(s), "
     "admission.max_memory_per_gpu); ask for at most 1Ti")),
    ({"memory": "99999999999999999999999999Ei"}, "memory:", "is above the cap of 128Gi"),
    ({"ephemeral_storage": "1Ei"}, "ephemeral_storage:", ("1Ei of node disk is above the cap of "
     "200Gi per GPU (1600Gi for 8 GPU(s), admission.max_ephemeral_storage_per_gpu)")),
    ({"volumes": [{"name": "s", "mount_path": "/s", "empty_dir": {"size_limit": "2Ti"}}]},
     "volumes.0.empty_dir.size_limit:", "an empty_dir of 2Ti on the node's disk is above the cap"),
    ({"volumes": [{"name": "s", "mount_path": "/dev/shm",
                   "empty_dir": {"medium": "Memory", "size_limit": "1Ti"}}]},
     "volumes.0.empty_dir.size_limit:", ("a Memory empty_dir of 1Ti counts against the unit's "
     "memory (512Gi); set size_limit to at most 512Gi, or raise memory")),
    ({"ephemeral_storage": "100Gi", "volumes": [
        {"name": "s", "mount_path": "/s", "empty_dir": {"size_limit": "200Gi"}}]},
     "volumes.0.empty_dir.size_limit:", "above the unit's ephemeral_storage limit (100Gi)"),
])
def test_resource_caps_name_the_field_value_cap_and_fix(changes, field, needle):
    message = refusal(request(**changes))
    assert message.startswith(f"job.yaml: {field}") and needle in message, message


def test_caps_allow_exactly_the_cap_and_follow_the_config():
    only_unit(request(cpu=128, memory="1Ti", ephemeral_storage="1600Gi"))
    tight = AdmissionConfig(max_cpu_per_gpu=2, max_memory_per_gpu="16Gi")
    # the default 8 CPUs per GPU is above a tighter cap: the error says so and how to fix it
    assert "cpu: 64 CPUs is above the cap of 2 per GPU (16 for 8 GPU(s)" in refusal(
        request(), tight)
    only_unit(request(cpu=16, memory="128Gi"), tight)
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        AdmissionConfig(max_memory_per_gpu="lots")


def test_defaults_are_sane():
    admission = AdmissionConfig()
    assert admission.team_volumes == {}
    assert (admission.max_cpu_per_gpu, admission.max_memory_per_gpu,
            admission.max_ephemeral_storage_per_gpu) == (16.0, "128Gi", "200Gi")
    assert (admission.max_cpu_without_gpus, admission.max_memory_without_gpus,
            admission.max_ephemeral_storage_without_gpus) == (8.0, "64Gi", "100Gi")


# --------------------------------------------------------------------------------------------
# NVIDIA_* variables and other refusals


@pytest.mark.parametrize("changes", [
    {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
    {"env": {"nvidia_visible_devices": "all"}},
    {"env": {"NVIDIA_VISIBLE_DEVICES": {"value_from": {"secret": "wandb", "key": "k"}}}},
    {"steps": [{"name": "a", "env": {"NVIDIA_DRIVER_CAPABILITIES": "all"}}]},
    {"env_from": [{"config_map": "recipes", "prefix": "NVIDIA_"}]},
])
def test_nvidia_variables_are_refused_with_the_reason(changes):
    message = refusal(request(**changes))
    assert "NVIDIA_VISIBLE_DEVICES=all exposes every GPU of the node" in message, message


@pytest.mark.parametrize(("volumes", "field", "needle"), [
    ([{"name": "a", "mount_path": "/a", "empty_dir": {}},
      {"name": "a", "mount_path": "/b", "empty_dir": {}}],
     "volumes.1.name:", "volume name 'a' is also the name of volumes.0; give every volume"),
    ([{"name": "a", "mount_path": "/x/", "empty_dir": {}},
      {"name": "b", "mount_path": "//x", "empty_dir": {}}],
     "volumes.1.mount_path:", "/x is also the mount path of volumes.0"),
    ([{"name": "a", "mount_path": "/a", "host_path": {"path": "/"}}],
     "volumes.0.host_path:", "hostPath volumes are not allowed"),
    ([{"name": "a", "mount_path": "/dev", "empty_dir": {}}], "volumes.0.mount_path:", "under /dev"),
    ([{"name": "a", "mount_path": "/a/../b", "empty_dir": {}}], "volumes.0.mount_path:", "'..'"),
    ([{"name": "a", "mount_path": "/a", "empty_dir": {}, "sub_path": "../x"}],
     "volumes.0.sub_path:", "contains '..'"),
    ([{"name": "a", "mount_path": "/a", "empty_dir": {"medium": "HugePages"}}],
     "volumes.0.empty_dir.medium:", "Input should be '' or 'Memory'"),
])
def test_volumes_are_checked(volumes, field, needle):
    message = refusal(request(volumes=volumes))
    assert message.startswith(f"job.yaml: {field}") and needle in message, message


@pytest.mark.parametrize(("env", "field", "needle"), [
    ({"K": {"value_from": {"secret": "wandb", "config_map": "recipes", "key": "k"}}},
     "env.K.value_from:", "names both secret and config_map; set exactly one"),
    ({"K": {"value_from": {"key": "k"}}}, "env.K.value_from:", "names neither"),
    ({"K": {"value_from": {"secret": "wandb", "key": "bad key"}}}, "env.K.value_from.key:",
     "use the key as it is in the Secret"),
    ({"K": None}, "env.K:", "value_from"),
])
def test_references_are_checked(env, field, needle):
    message = refusal(request(env=env))
    assert message.startswith(f"job.yaml: {field}") and needle in message, message


# --------------------------------------------------------------------------------------------
# The store round trip


def test_new_fields_survive_the_store_round_trip_as_json():
    unit = only_unit(full_request())
    data = spec_to_json(unit)
    text = json.dumps(data)  # plain JSON, no repr of a dataclass
    assert "UnitVolume(" not in text and data["volumes"][0]["sub_path"] == "sft-a/main/0"
    assert spec_from_json(json.loads(text)) == unit


def test_old_stored_json_without_the_new_fields_still_loads():
    unit = only_unit(request())
    old = {k: v for k, v in spec_to_json(unit).items()
           if k not in ("volumes", "env_from", "env_refs", "ephemeral_storage_request",
                        "ephemeral_storage_limit")}
    loaded = spec_from_json(old)
    assert loaded == unit and loaded.volumes == () and loaded.ephemeral_storage_limit is None
    # a newer writer's extra keys inside a volume are ignored too
    newer = spec_to_json(only_unit(full_request()))
    newer["volumes"][0]["mount_propagation"] = "None"
    assert spec_from_json(newer).volumes[0].name == "ckpt"


def test_a_real_store_keeps_volumes_and_references(tmp_path):
    req = validate_request(full_request(), ADMISSION)
    units = expand_units(req)
    with JobStore(f"sqlite:///{tmp_path / 'jobs.db'}") as store:
        store.submit(req.name, req.team, req.kind, req.model_dump(mode="json"), units, NOW)
        (row,) = store.queue()
    assert row.spec == units[0]


# --------------------------------------------------------------------------------------------
# recheck_unit: the daemon's own rules on what the store holds


def test_a_valid_unit_passes_the_recheck():
    unit = only_unit(full_request())
    recheck_unit(unit, "nlp", ADMISSION)


def test_the_recheck_refuses_what_a_submitter_let_through_under_its_own_environment(
        tmp_path, monkeypatch, cli):
    """``IDLEGPU_ADMISSION__ALLOWED_REGISTRIES=evil.io/ idlegpu submit`` stores the unit; the
    daemon, with its own config, refuses it before creating a Job."""
    job = tmp_path / "job.yaml"
    job.write_text("name: sneaky\nteam: nlp\nkind: eval\nimage: evil.io/miner:1.0\ngpus: 8\n")
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    monkeypatch.setenv("IDLEGPU_ADMISSION__ALLOWED_REGISTRIES", '["evil.io/"]')
    code, _out, err = cli(["submit", str(job), "--store", store, "--config",
                           str(REPO / "idlegpu.yaml"), "--now", "2026-01-28T18:00:00+09:00"])
    assert code == 0, err
    monkeypatch.delenv("IDLEGPU_ADMISSION__ALLOWED_REGISTRIES")
    daemon = load_config(REPO / "idlegpu.yaml")
    with JobStore(store) as jobs:
        (row,) = jobs.queue()
    with pytest.raises(SpecError) as info:
        recheck_unit(row.spec, row.team, daemon.admission)
    message = str(info.value)
    assert message.startswith(RECHECK_PREFIX + "image: image 'evil.io/miner:1.0' is not from an "
                              "allowed registry; push it to one of: registry.example.com/")


def tampered(**changes) -> UnitSpec:
    return replace(only_unit(full_request()), **changes)


@pytest.mark.parametrize(("unit", "needle"), [
    (tampered(image="docker.io/library/python:3.11"), "image:"),
    (tampered(image=IMAGE.replace("1.4.2", "latest")), "image: image"),
    (tampered(gpus=65), "gpus: 65 GPUs is outside 0..64 (admission.max_gpus_per_job)"),
    (tampered(cpu=1e300), "cpu: 1e+300 CPUs is above the cap of 16 per GPU"),
    (tampered(cpu=float("nan")), "cpu: nan is not a number of CPU cores"),
    (tampered(memory="1Ei"), "memory: 1Ei is above the cap of 128Gi per GPU"),
    (tampered(memory="lots"), "memory: 'lots' is not a memory quantity"),
    (tampered(gpus=0, cpu=9.0), ("cpu: 9 CPUs is above the cap of 8 for a unit without GPUs "
     "(admission.max_cpu_without_gpus)")),
    (tampered(gpus=0, memory="65Gi", volumes=()),
     "memory: 65Gi is above the cap of 64Gi for a unit without GPUs"),
    (tampered(gpus=0, cpu=1.0, memory="1Gi", volumes=()),
     "ephemeral_storage: 400Gi of node disk is above the cap of 100Gi for a unit without GPUs"),
    (tampered(ephemeral_storage_limit=None), "ephemeral_storage.limit: a request without a limit"),
    (tampered(env=(("NVIDIA_VISIBLE_DEVICES", "all"),)), ("env.NVIDIA_VISIBLE_DEVICES: "
     "environment variable 'NVIDIA_VISIBLE_DEVICES' is refused: NVIDIA_* variables")),
    (tampered(env_refs=(EnvKeyRef("NVIDIA_VISIBLE_DEVICES", "secret", "wandb", "k"),)),
     "env.NVIDIA_VISIBLE_DEVICES: environment variable"),
    (tampered(env_from=(EnvFromSource("secret", "wandb", prefix="NVIDIA_"),)),
     "env_from.0.prefix: the prefix 'NVIDIA_'"),
    (tampered(volumes=(UnitVolume("h", "host_path", "/host", "/"),)),
     "volumes.0.host_path: hostPath volumes are not allowed"),
    (tampered(volumes=(UnitVolume("n", "nfs", "/n", "server:/export"),)),
     "volumes.0: unknown volume kind 'nfs'"),
    (tampered(volumes=(UnitVolume("c", "persistent_volume_claim", "/c", "ckpt-vision"),)),
     ("volumes.0.persistent_volume_claim: team 'nlp' may not mount the persistent volume claim "
     "'ckpt-vision'")),
    (tampered(volumes=(UnitVolume("a", "empty_dir", "/a"), UnitVolume("a", "empty_dir", "/b"))),
     "volumes.1.name: volume name 'a' is also the name of volumes.0"),
    (tampered(volumes=(UnitVolume("a", "empty_dir", "/a"), UnitVolume("b", "empty_dir", "/a/"))),
     "volumes.1.mount_path: /a is also the mount path of volumes.0"),
    (tampered(volumes=(UnitVolume("a", "empty_dir", "relative"),)),
     "volumes.0.mount_path: 'relative' is not absolute"),
    (tampered(volumes=(UnitVolume("a", "persistent_volume_claim", "/a", "ckpt-nlp",
                                  sub_path="../../etc"),)), "volumes.0.sub_path: "),
    (tampered(volumes=(UnitVolume("a", "secret", "/a", "wandb", medium="Memory"),)),
     "volumes.0.empty_dir: medium and size_limit are for empty_dir volumes only"),
    (tampered(env_refs=(EnvKeyRef("DB", "secret", "prod-db", "password"),)),
     "env.DB.value_from.secret: team 'nlp' may not read the secret 'prod-db'"),
    (tampered(env_from=(EnvFromSource("config_map", "prod-config"),)),
     "env_from.0.config_map: team 'nlp' may not read the config map 'prod-config'"),
])
def test_the_recheck_refuses_tampered_units(unit, needle):
    with pytest.raises(SpecError) as info:
        recheck_unit(unit, "nlp", ADMISSION)
    message = str(info.value)
    assert message.startswith(RECHECK_PREFIX) and needle in message, message
    assert "\n" not in message


def test_the_recheck_uses_the_team_it_is_given_and_lists_every_problem():
    unit = only_unit(full_request())
    with pytest.raises(SpecError) as info:
        recheck_unit(replace(unit, cpu=1e300), "vision", ADMISSION)
    message = str(info.value)
    # another team may not use nlp's claim and secrets; every problem on one line
    assert "cpu: 1e+300 CPUs" in message and "team 'vision' may not mount" in message
    assert "team 'vision' may not read the secret 'wandb'" in message
    assert message.count(" | ") >= 3


def test_the_recheck_follows_the_daemons_config_not_the_submitters():
    unit = only_unit(full_request())
    recheck_unit(unit, "nlp", ADMISSION)
    with pytest.raises(SpecError, match="team 'nlp' may not mount"):
        recheck_unit(unit, "nlp", AdmissionConfig())  # the daemon allows no claims
    with pytest.raises(SpecError, match="above the cap of 4 per GPU"):
        recheck_unit(unit, "nlp", ADMISSION.model_copy(update={"max_cpu_per_gpu": 4.0}))


def test_config_errors_name_the_setting():
    with pytest.raises(ConfigError, match="admission.team_volumes"):
        load_config(data={"pool": {"total_gpus": 8}, "services": [
            {"name": "s", "gpus_per_replica": 1, "min_replicas": 0, "max_replicas": 1,
             "queries": {"replicas": "up"}}], "admission": {"team_volumes": {"NLP": {}}}})
