"""Job request files: validation with one-line messages naming the field and the fix, expansion
into units (steps x sweep members), templating, the examples and the sample job trace."""

from __future__ import annotations

import copy
import statistics
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler import sample_jobs
from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.specs import (
    JobRequest,
    SpecError,
    TraceEntry,
    expand_units,
    format_duration,
    load_request,
    load_requests,
    load_trace,
    parse_duration,
    scalar_text,
    validate_request,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples" / "jobs").glob("*.yaml"))
TRACE = REPO / "data" / "sample" / "jobs.yaml"
IMAGE = "registry.example.com/research/trainer:1.4.2"
EXAMPLE_ADMISSION = AdmissionConfig(team_volumes={
    # what examples/jobs/sft-volumes.yaml says the operator allows
    "alignment": {"persistent_volume_claims": ["ckpt-alignment"], "secrets": ["wandb", "hf-token"],
                  "config_maps": ["sft-recipes"]},
    "*": {"persistent_volume_claims": ["datasets"], "config_maps": ["nccl-tuning"]},
})
NEEDS_ALLOW_LIST = {"sft-volumes.yaml"}


def pipeline() -> dict:
    """prepare (1 unit) -> train swept over lr x seed (2 x 2 = 4 units) -> evaluate (1 unit)."""
    return {
        "name": "sweep-pipeline",
        "team": "alignment",
        "kind": "sft",
        "image": IMAGE,
        "command": ["python", "run.py"],
        "parameters": {"data": "s3://data/mix-v1", "epochs": 2, "lr": 1.0e-4},
        "env": {"RUN_TAG": "{name}-{step}-{member}"},
        "gpus": 8,
        "output": "s3://runs/{team}/{name}/{step}/{member}",
        "deadline": "2025-11-03T09:00:00+09:00",
        "steps": [
            {"name": "prepare", "kind": "datagen", "gpus": 4, "args": ["--data", "{data}"],
             "runtime_estimate": "90m"},
            {
                "name": "train",
                "args": ["--lr", "{lr}", "--seed", "{seed}", "--epochs", "{epochs}",
                         "--save", "{output}/ckpt", "--gpus", "{gpus}"],
                "runtime_estimate": "6h",
                "checkpoint": {"interval": "30m", "resume_args": ["--resume", "{output}/ckpt"]},
                "sweep": {"lr": [1.0e-5, 3.0e-5], "seed": [1, 2]},
                "priority": 2,
            },
            {"name": "evaluate", "kind": "eval",
             "image": "registry.example.com/research/lm-eval:0.4.5",
             "args": ["--model", "s3://runs/{team}/{name}/train/0/ckpt"], "runtime_estimate": 3600},
        ],
    }


def minimal(**changes) -> dict:
    data = {"name": "demo", "team": "alignment", "kind": "eval", "image": IMAGE, "gpus": 4}
    data.update(changes)
    return data


# --------------------------------------------------------------------------------------------
# Expansion


def test_pipeline_with_a_sweep_in_the_middle_expands_to_1_4_1_units():
    units = expand_units(JobRequest.model_validate(pipeline()))
    assert [(u.step, u.step_index, u.member) for u in units] == [
        ("prepare", 0, 0),
        ("train", 1, 0), ("train", 1, 1), ("train", 1, 2), ("train", 1, 3),
        ("evaluate", 2, 0),
    ]
    prepare, train, evaluate = units[0], units[1:5], units[5]
    assert prepare.depends_on == ()
    assert all(u.depends_on == ((0, 0),) for u in train)
    assert evaluate.depends_on == ((1, 0), (1, 1), (1, 2), (1, 3))
    # kinds, images, GPUs and resources: job-level defaults, step overrides
    assert [u.kind for u in units] == ["datagen", "sft", "sft", "sft", "sft", "eval"]
    assert evaluate.image.endswith("lm-eval:0.4.5") and prepare.image == IMAGE
    assert (prepare.gpus, train[0].gpus) == (4, 8)
    assert (prepare.cpu, prepare.memory) == (32.0, "256Gi")  # 8 CPUs and 64Gi per GPU
    assert (prepare.runtime_estimate_s, train[0].runtime_estimate_s, evaluate.runtime_estimate_s) \
        == (5400.0, 21600.0, 3600.0)
    assert [u.priority for u in units] == [0, 2, 2, 2, 2, 0]
    assert all(u.deadline == datetime(2025, 11, 3, 0, 0, tzinfo=UTC) for u in units)
    assert [u.checkpointable for u in units] == [False, True, True, True, True, False]
    assert train[0].checkpoint_interval_s == 1800.0 and prepare.checkpoint_interval_s is None
    assert not any(u.saves_on_stop for u in units)  # only periodic checkpoints, unless told


def test_a_workload_that_saves_on_stop_says_so_per_step():
    data = pipeline()
    data["steps"][1]["checkpoint"]["saves_on_stop"] = True
    units = expand_units(validate_request(data))
    assert [u.saves_on_stop for u in units] == [False, True, True, True, True, False]


def test_sweep_members_follow_the_grid_first_key_slowest_and_templates_are_filled():
    units = expand_units(JobRequest.model_validate(pipeline()))
    train = units[1:5]
    grid = [(dict(u.parameters)["lr"], dict(u.parameters)["seed"]) for u in train]
    assert grid == [("1e-05", "1"), ("1e-05", "2"), ("3e-05", "1"), ("3e-05", "2")]
    third = train[2]
    assert third.args == (
        "--lr", "3e-05", "--seed", "1", "--epochs", "2",
        "--save", "s3://runs/alignment/sweep-pipeline/train/2/ckpt", "--gpus", "8",
    )
    assert third.output == "s3://runs/alignment/sweep-pipeline/train/2"
    assert third.resume_args == ("--resume", "s3://runs/alignment/sweep-pipeline/train/2/ckpt")
    assert units[0].args == ("--data", "s3://data/mix-v1")
    assert units[0].resume_args == ()
    assert third.command == ("python", "run.py")
    # the sweep value replaces the job-level parameter of the same name
    assert dict(third.parameters) == {"data": "s3://data/mix-v1", "epochs": "2", "lr": "3e-05",
                                      "seed": "1"}


def test_parameters_and_built_ins_are_injected_into_the_environment():
    third = expand_units(JobRequest.model_validate(pipeline()))[3]
    env = dict(third.env)
    assert env["RUN_TAG"] == "sweep-pipeline-train-2"
    assert env["IDLEGPU_PARAM_LR"] == "3e-05"
    assert env["IDLEGPU_PARAM_SEED"] == "1"
    assert env["IDLEGPU_PARAM_DATA"] == "s3://data/mix-v1"
    assert env["IDLEGPU_PARAM_EPOCHS"] == "2"
    assert (env["IDLEGPU_JOB"], env["IDLEGPU_TEAM"], env["IDLEGPU_STEP"]) == (
        "sweep-pipeline", "alignment", "train"
    )
    assert (env["IDLEGPU_MEMBER"], env["IDLEGPU_GPUS"]) == ("2", "8")
    assert env["IDLEGPU_OUTPUT"] == "s3://runs/alignment/sweep-pipeline/train/2"
    assert third.env[0] == ("RUN_TAG", "sweep-pipeline-train-2")  # the user's variables first
    assert len({k for k, _ in third.env}) == len(third.env)


def test_a_request_without_steps_is_one_step_named_main():
    request = JobRequest.model_validate(
        minimal(args=["--flag={on}", "--literal={{x}}"], parameters={"on": True},
                sweep=None, output=None)
    )
    (unit,) = expand_units(request)
    assert (unit.step, unit.step_index, unit.member, unit.depends_on) == ("main", 0, 0, ())
    assert unit.args == ("--flag=true", "--literal={x}")
    assert unit.output is None and "IDLEGPU_OUTPUT" not in dict(unit.env)
    assert unit.kind == "eval" and unit.priority == 0 and unit.deadline is None
    assert request.step_names == ["main"] and request.member_counts() == {"main": 1}


def test_a_job_level_sweep_fans_out_the_single_step():
    request = JobRequest.model_validate(
        minimal(sweep={"bench": ["a", "b", "c"]}, output="s3://r/{name}/{bench}",
                args=["--tasks={bench}"])
    )
    units = expand_units(request)
    assert [u.args for u in units] == [("--tasks=a",), ("--tasks=b",), ("--tasks=c",)]
    assert [u.member for u in units] == [0, 1, 2]
    assert all(u.depends_on == () for u in units)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("36h", 129600), ("90m", 5400), ("2d", 172800), ("1h30m", 5400), ("45s", 45),
     ("1.5h", 5400), ("1w", 604800), (5400, 5400), ("5400", 5400), (" 2h 15m ", 8100)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_duration_text_round_trips():
    for seconds in (45, 90, 3600, 5400, 129600, 3 * 86400 + 60):
        assert parse_duration(format_duration(seconds)) == seconds


def test_cpu_memory_and_volumes_are_accepted():
    admission = AdmissionConfig(team_volumes={
        "alignment": {"persistent_volume_claims": ["hf-cache"], "config_maps": ["app"]}})
    request = validate_request(minimal(
        cpu="500m", memory="0.5Ti",
        volumes=[
            {"name": "cache", "mount_path": "/cache", "persistent_volume_claim": "hf-cache"},
            {"name": "scratch", "mount_path": "/scratch", "empty_dir": None},
            {"name": "cfg", "mount_path": "/etc/app", "config_map": "app", "read_only": True},
        ],
        capabilities={"drop": ["ALL"]}, privileged=False,
    ), admission)
    (unit,) = expand_units(request)
    assert (unit.cpu, unit.memory) == (0.5, "0.5Ti")
    assert request.volumes[1].empty_dir is not None
    assert [(v.name, v.kind, v.source) for v in unit.volumes] == [
        ("cache", "persistent_volume_claim", "hf-cache"), ("scratch", "empty_dir", ""),
        ("cfg", "config_map", "app")]


# --------------------------------------------------------------------------------------------
# Rejections: every forbidden or broken setting names its field, on one line, with a fix


def _set(path: str, value):
    def mutate(data: dict) -> None:
        target = data
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return mutate


def _sets(*pairs):
    def mutate(data: dict) -> None:
        for path, value in pairs:
            _set(path, value)(data)
    return mutate


def _drop_and_set(drop: str, key: str, value):
    def mutate(data: dict) -> None:
        del data[drop]
        data[key] = value
    return mutate


REJECTIONS = [
    ("privileged", _set("privileged", True), "privileged:", "not allowed"),
    ("host_network", _set("host_network", True), "host_network:", "not allowed"),
    ("host_pid", _set("host_pid", True), "host_pid:", "not allowed"),
    ("host_ipc", _set("host_ipc", True), "host_ipc:", "not allowed"),
    ("host_path_volume",
     _set("volumes", [{"name": "d", "mount_path": "/data", "host_path": "/mnt/data"}]),
     "volumes.0.host_path:", "hostPath volumes are not allowed"),
    ("privilege_escalation", _set("allow_privilege_escalation", True),
     "allow_privilege_escalation:", "not allowed"),
    ("capabilities_add", _set("capabilities", {"add": ["SYS_ADMIN"]}), "capabilities.add:",
     "SYS_ADMIN"),
    ("step_privileged", _set("steps.1.privileged", True), "steps.1.privileged:", "not allowed"),
    ("step_host_network", _set("steps.2.host_network", True), "steps.2.host_network:",
     "not allowed"),
    ("image_outside_registry", _set("image", "docker.io/library/python:3.11"), "image:",
     "not from an allowed registry"),
    ("step_image_outside_registry", _set("steps.2.image", "ghcr.io/x/eval:1.0"),
     "steps.2.image:", "allowed registry"),
    ("untagged_image", _set("image", "registry.example.com/research/trainer"), "image:",
     "no tag"),
    ("latest_image", _set("image", "registry.example.com/research/trainer:latest"), "image:",
     "latest"),
    ("malformed_image", _set("image", "registry.example.com/Research Trainer:1"), "image:",
     "not a valid image reference"),
    ("gpus_0", _set("gpus", 0), "gpus:", "at least 1 GPU"),
    ("gpus_above_max", _set("gpus", 65), "gpus:", "above this pool's limit of 64"),
    ("step_gpus_above_max", _set("steps.0.gpus", 128), "steps.0.gpus:", "limit of 64"),
    ("gpus_fraction", _set("gpus", 1.5), "gpus:", "whole number"),
    ("bad_memory", _set("memory", "lots"), "memory:", "Kubernetes quantity"),
    ("bad_cpu", _set("cpu", -2), "cpu:", "CPU cores"),
    ("bad_duration", _set("steps.0.runtime_estimate", "forever"),
     "steps.0.runtime_estimate:", "duration such as"),
    ("zero_duration", _set("steps.1.checkpoint", {"interval": "0m"}),
     "steps.1.checkpoint.interval:", "positive duration"),
    ("checkpoint_without_interval", _set("steps.1.checkpoint", {"enabled": True}),
     "steps.1.checkpoint.interval:", "interval: 30m"),
    ("typo_gpu", _drop_and_set("gpus", "gpu", 4), "gpu:", "did you mean 'gpus'"),
    ("typo_in_step", _set("steps.0.runtime_estimte", "1h"), "steps.0.runtime_estimte:",
     "did you mean 'runtime_estimate'"),
    ("typo_in_checkpoint", _set("steps.1.checkpoint.resume_arg", []),
     "steps.1.checkpoint.resume_arg:", "did you mean 'resume_args'"),
    ("unknown_placeholder", _set("steps.1.args", ["--lr", "{learning_rate}"]),
     "steps.1.args.1:", ("unknown placeholder {learning_rate}; use one of: data, epochs, gpus, "
                         "lr, member, name, output, seed, step, team")),
    ("unknown_placeholder_in_output", _set("output", "s3://runs/{bucket}/{name}"),
     "output:", "unknown placeholder {bucket}"),
    ("unknown_placeholder_in_env", _set("env", {"X": "{nope}"}), "env.X:",
     "unknown placeholder {nope}"),
    ("unknown_placeholder_in_resume_args",
     _set("steps.1.checkpoint", {"interval": "1h", "resume_args": ["{ckpt}"]}),
     "steps.1.checkpoint.resume_args.0:", "unknown placeholder {ckpt}"),
    ("format_spec_placeholder", _set("steps.1.args", ["{lr:.3f}"]), "steps.1.args.0:",
     "not supported"),
    ("unbalanced_brace", _set("steps.0.args", ["}"]), "steps.0.args.0:", "unbalanced braces"),
    ("deadline_without_timezone", _set("deadline", "2025-11-03T09:00:00"), "deadline:",
     "no time zone"),
    ("bad_kind", _set("kind", "train"), "kind:", "use one of training, sft, rl, eval"),
    ("bad_name", _set("name", "My_Job"), "name:", "lowercase letters"),
    ("long_name", _set("name", "x" * 51), "name:", "at most 50"),
    ("duplicate_step", _set("steps.2.name", "train"), "steps.2.name:", "used twice"),
    ("sweep_next_to_steps", _set("sweep", {"lr": [1, 2]}), "sweep:", "move it to steps"),
    ("empty_sweep_values", _set("steps.1.sweep", {"lr": []}), "steps.1.sweep:", "no values"),
    ("repeated_sweep_value", _set("steps.1.sweep", {"lr": [1, 1]}), "steps.1.sweep:",
     "list each value once"),
    ("builtin_parameter", _set("parameters", {"gpus": 2}), "parameters:", "built-in placeholder"),
    ("nested_parameter", _set("parameters", {"opt": {"lr": 1}}), "parameters.opt:",
     "use a string, a number or true/false"),
    ("reserved_env", _set("env", {"IDLEGPU_PARAM_LR": "1"}), "env:", "reserved prefix"),
    ("shared_output", _set("output", "s3://runs/{name}/{step}"), "output:",
     "would both write to s3://runs/sweep-pipeline/train"),
    ("output_not_a_uri", _set("output", "/tmp/out"), "output:", "cloud storage URI"),
    ("volume_two_sources",
     _set("volumes", [{"name": "v", "mount_path": "/v", "secret": "s", "config_map": "c"}]),
     "volumes.0:", "exactly one source"),
    ("pvc_not_allowed",
     _set("volumes", [{"name": "v", "mount_path": "/v", "persistent_volume_claim": "ckpt"}]),
     "volumes.0.persistent_volume_claim:",
     "team 'alignment' may not mount the persistent volume claim 'ckpt'"),
    ("step_secret_volume_not_allowed",
     _set("steps.1.volumes", [{"name": "v", "mount_path": "/v", "secret": "token"}]),
     "steps.1.volumes.0.secret:", "may not mount the secret 'token'"),
    ("secret_env_not_allowed", _set("env", {"K": {"value_from": {"secret": "s", "key": "k"}}}),
     "env.K.value_from.secret:", "may not read the secret 's'"),
    ("env_from_not_allowed", _set("env_from", [{"config_map": "cm"}]),
     "env_from.0.config_map:", "may not read the config map 'cm'"),
    ("value_from_without_key", _set("env", {"K": {"value_from": {"secret": "s"}}}),
     "env.K.value_from.key:", "required field is missing"),
    ("value_from_typo", _set("env", {"K": {"valuefrom": {"secret": "s", "key": "k"}}}),
     "env.K.value_from:", "env.K.valuefrom: unknown field; did you mean 'value_from'"),
    ("env_list_value", _set("env", {"K": [1, 2]}), "env.K:", "value_from"),
    ("nvidia_env", _set("env", {"NVIDIA_VISIBLE_DEVICES": "all"}), "env.NVIDIA_VISIBLE_DEVICES:",
     "exposes every GPU of the node"),
    ("nvidia_env_from_secret",
     _set("steps.0.env", {"NVIDIA_DRIVER_CAPABILITIES": {"value_from": {"secret": "s", "key": "k"}}}),
     "steps.0.env.NVIDIA_DRIVER_CAPABILITIES:", "NVIDIA_VISIBLE_DEVICES=all"),
    ("nvidia_prefix", _set("env_from", [{"secret": "s", "prefix": "NVIDIA_"}]),
     "env_from.0.prefix:", "NVIDIA_VISIBLE_DEVICES=all"),
    ("duplicate_volume_name",
     _set("volumes", [{"name": "v", "mount_path": "/a", "empty_dir": {}},
                      {"name": "v", "mount_path": "/b", "empty_dir": {}}]),
     "volumes.1.name:", "also the name of volumes.0"),
    ("duplicate_mount_path",
     _set("volumes", [{"name": "a", "mount_path": "/data/", "empty_dir": {}},
                      {"name": "b", "mount_path": "/data", "empty_dir": {}}]),
     "volumes.1.mount_path:", "also the mount path of volumes.0"),
    ("mount_over_proc", _set("volumes", [{"name": "a", "mount_path": "/proc/x", "empty_dir": {}}]),
     "volumes.0.mount_path:", "under /proc"),
    ("mount_over_root", _set("volumes", [{"name": "a", "mount_path": "/", "empty_dir": {}}]),
     "volumes.0.mount_path:", "container's root"),
    ("absolute_sub_path",
     _set("volumes", [{"name": "a", "mount_path": "/a", "empty_dir": {}, "sub_path": "/x"}]),
     "volumes.0.sub_path:", "relative to the volume's root"),
    ("sub_path_escapes_after_templating",
     _sets(("steps.0.parameters", {"shard": "../../other-team"}),
           ("steps.0.volumes", [{"name": "a", "mount_path": "/a", "empty_dir": {},
                                 "sub_path": "runs/{shard}"}])),
     "steps.0.volumes.0.sub_path:", "contains '..'"),
    ("sub_path_unknown_placeholder",
     _set("volumes", [{"name": "a", "mount_path": "/a", "empty_dir": {}, "sub_path": "{x}"}]),
     "volumes.0.sub_path:", "unknown placeholder {x}"),
    ("memory_empty_dir_above_memory",
     _set("steps.0.volumes", [{"name": "shm", "mount_path": "/dev/shm",
                               "empty_dir": {"medium": "Memory", "size_limit": "1Ti"}}]),
     "steps.0.volumes.0.empty_dir.size_limit:", "counts against the unit's memory (256Gi)"),
    ("bad_claim_name",
     _set("volumes", [{"name": "a", "mount_path": "/a", "persistent_volume_claim": "My_Claim"}]),
     "volumes.0.persistent_volume_claim:", "the claim's name"),
    ("cpu_above_cap", _set("steps.1.cpu", 1e300), "steps.1.cpu:",
     "1e+300 CPUs is above the cap of 16 per GPU (128 for 8 GPU(s), admission.max_cpu_per_gpu)"),
    ("memory_above_cap", _set("steps.1.memory", "1Ei"), "steps.1.memory:",
     ("1Ei is above the cap of 128Gi per GPU (1Ti for 8 GPU(s), admission.max_memory_per_gpu); "
     "ask for at most 1Ti")),
    ("step_memory_above_cap", _set("steps.0.memory", "600Gi"), "steps.0.memory:",
     "above the cap of 128Gi per GPU (512Gi for 4 GPU(s)"),
    ("inherited_cpu_above_cap_names_the_step", _set("cpu", 100), "cpu:",
     "in step 'prepare': 100 CPUs is above the cap of 16 per GPU (64 for 4 GPU(s)"),
    ("ephemeral_above_cap", _set("ephemeral_storage", "1Pi"), "ephemeral_storage:",
     "1Pi of node disk is above the cap of 200Gi per GPU"),
    ("ephemeral_request_above_limit",
     _set("ephemeral_storage", {"request": "20Gi", "limit": "10Gi"}),
     "ephemeral_storage.request:", "above the limit 10Gi"),
    ("ephemeral_without_limit", _set("ephemeral_storage", {"request": "20Gi"}),
     "ephemeral_storage.limit:", "required field is missing"),
    ("disk_empty_dir_above_cap",
     _set("volumes", [{"name": "s", "mount_path": "/s", "empty_dir": {"size_limit": "1Pi"}}]),
     "volumes.0.empty_dir.size_limit:", "on the node's disk is above the cap of 200Gi per GPU"),
    ("negative_max_preemptions", _set("max_preemptions", -1), "max_preemptions:",
     "greater than or equal to 0"),
    ("saves_on_stop_not_a_boolean", _set("steps.1.checkpoint.saves_on_stop", "maybe"),
     "steps.1.checkpoint.saves_on_stop:", "(got 'maybe'); use true or false"),
]


@pytest.mark.parametrize(
    ("mutate", "field", "needle"),
    [r[1:] for r in REJECTIONS],
    ids=[r[0] for r in REJECTIONS],
)
def test_bad_requests_are_rejected_naming_the_field(mutate, field, needle):
    data = pipeline()
    mutate(data)
    with pytest.raises(SpecError) as info:
        validate_request(data, source="job.yaml")
    message = str(info.value)
    assert message.startswith(f"job.yaml: {field}"), message
    assert needle in message, message
    assert "\n" not in message
    assert "; " in message  # the problem, then how to fix it
    assert isinstance(info.value, PermanentError)


def test_an_image_needs_some_image_and_gpu_count():
    data = pipeline()
    del data["image"]
    with pytest.raises(SpecError, match=r"request: image: required field is missing.*'prepare'"):
        validate_request(data)
    data = minimal()
    del data["gpus"]
    with pytest.raises(SpecError, match=r"request: gpus: required field is missing.*set gpus"):
        validate_request(data)


def test_an_inherited_template_error_names_the_step():
    data = pipeline()
    data["args"] = ["--seed={seed}"]  # only the train step sweeps a seed
    del data["steps"][0]["args"]
    with pytest.raises(SpecError, match=r"args\.0: in step 'prepare': unknown placeholder \{seed\}"):
        validate_request(data)


def test_parameters_that_share_an_environment_name_are_rejected():
    with pytest.raises(SpecError, match="both become IDLEGPU_PARAM_LR"):
        validate_request(minimal(parameters={"lr": 1, "LR": 2}))


def test_several_problems_are_reported_on_one_line():
    message = ""
    try:
        validate_request(minimal(gpus=0, memory="lots", privileged=True))
    except SpecError as exc:
        message = str(exc)
    assert "gpus:" in message and "memory:" in message and "privileged:" in message
    assert " | " in message and "\n" not in message


def test_admission_limits_come_from_the_validation_context():
    data = minimal(image="harbor.corp/ml/trainer:2.0", gpus=16)
    with pytest.raises(PermanentError):
        validate_request(data)
    context = {"allowed_registries": ["harbor.corp/ml/"], "max_gpus_per_job": 8}
    with pytest.raises(ValueError, match="limit of 8 per job"):
        JobRequest.model_validate(data, context=context)
    context["max_gpus_per_job"] = 16
    assert JobRequest.model_validate(data, context=context).gpus == 16
    admission = AdmissionConfig(allowed_registries=["harbor.corp"], max_gpus_per_job=16)
    assert validate_request(data, admission).image == "harbor.corp/ml/trainer:2.0"
    # a bare host admits its own repositories, not look-alike hosts
    with pytest.raises(SpecError, match="not from an allowed registry"):
        validate_request(minimal(image="harbor.corp.evil.io/ml/trainer:2.0"), admission)


def test_a_digest_pins_an_image_without_a_tag():
    image = "registry.example.com/research/trainer@sha256:" + "a" * 64
    assert validate_request(minimal(image=image)).image == image


# --------------------------------------------------------------------------------------------
# Files


def test_load_request_reports_missing_files_yaml_syntax_and_fields(tmp_path):
    with pytest.raises(SpecError, match="nope.yaml: file not found"):
        load_request(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nteam: [unclosed\nkind: eval\n")
    with pytest.raises(SpecError, match=r"bad.yaml: invalid YAML at line \d+") as info:
        load_request(bad)
    assert "\n" not in str(info.value)
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"name: demo\nteam: a\nkind: eval\nimage: {IMAGE}\ngpu: 4\n")
    with pytest.raises(SpecError) as info:
        load_request(typo)
    assert str(info.value) == f"{typo}: gpu: unknown field; did you mean 'gpus'?"
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_request(scalar)


def test_load_request_applies_the_admission_config(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(f"name: demo\nteam: a\nkind: eval\nimage: {IMAGE}\ngpus: 32\n")
    assert load_request(path).gpus == 32
    with pytest.raises(SpecError, match=r"job.yaml: gpus: 32 GPUs is above this pool's limit"):
        load_request(path, AdmissionConfig(max_gpus_per_job=16))


def test_load_requests_takes_one_request_or_a_list(tmp_path):
    one = tmp_path / "one.yaml"
    one.write_text(f"name: a\nteam: t\nkind: eval\nimage: {IMAGE}\ngpus: 4\n")
    assert [r.name for r in load_requests(one)] == ["a"]
    many = tmp_path / "many.yaml"
    many.write_text(
        "jobs:\n"
        f"  - {{name: a, team: t, kind: eval, image: '{IMAGE}', gpus: 4}}\n"
        f"  - {{name: b, team: t, kind: rl, image: '{IMAGE}', gpus: 8}}\n"
    )
    assert [r.name for r in load_requests(many)] == ["a", "b"]
    with pytest.raises(SpecError, match="holds a list of requests"):
        load_request(many)
    broken = tmp_path / "broken.yaml"
    broken.write_text(many.read_text().replace("gpus: 8", "gpus: 0"))
    with pytest.raises(SpecError, match=r"broken.yaml: jobs.1.gpus: a job needs at least 1 GPU"):
        load_requests(broken)
    twice = tmp_path / "twice.yaml"
    twice.write_text(many.read_text().replace("name: b", "name: a"))
    with pytest.raises(SpecError, match=r"jobs.1.name: 'a' is already the name of jobs.0"):
        load_requests(twice)


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {
        "pretrain.yaml", "sft-rl-eval.yaml", "eval-sweep.yaml", "datagen.yaml", "sft-volumes.yaml"
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_validate_against_the_default_allow_list(path):
    if path.name in NEEDS_ALLOW_LIST:
        # claims and secrets need the operator's allow-list: refused by default, naming it
        with pytest.raises(SpecError, match=r"admission\.team_volumes\.alignment"):
            load_request(path, AdmissionConfig())
        request = load_request(path, EXAMPLE_ADMISSION)
    else:
        request = load_request(path, AdmissionConfig())
    units = expand_units(request)
    assert units and all(u.image.startswith("registry.example.com/") for u in units)
    assert all(u.output and "{" not in u.output for u in units)
    assert all("{" not in a for u in units for a in (*u.args, *u.resume_args))


def test_example_shapes():
    by_name = {p.name: expand_units(load_request(p, EXAMPLE_ADMISSION)) for p in EXAMPLES}
    pretrain = by_name["pretrain.yaml"]
    assert len(pretrain) == 1 and pretrain[0].gpus == 32 and pretrain[0].checkpointable
    chain = by_name["sft-rl-eval.yaml"]
    assert [(u.step, u.kind) for u in chain][:3] == [("sft", "sft"), ("rl", "rl"), ("eval", "eval")]
    assert len(chain) == 6 and chain[-1].depends_on == ((1, 0),)
    assert len(by_name["eval-sweep.yaml"]) == 6
    assert not any(u.checkpointable for u in by_name["eval-sweep.yaml"])
    assert len(by_name["datagen.yaml"]) == 4
    assert {v.kind for u in by_name["datagen.yaml"] for v in u.volumes} == {"empty_dir"}
    (sft,) = by_name["sft-volumes.yaml"]
    assert {v.kind for v in sft.volumes} == {
        "persistent_volume_claim", "config_map", "secret", "empty_dir"}
    assert sft.env_refs and sft.env_from and sft.ephemeral_storage_limit == "200Gi"
    assert not any(k.startswith("WANDB_API") for k, _ in sft.env)  # a reference, not a value


# --------------------------------------------------------------------------------------------
# Property: any valid request expands into sane units

NAMES = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
SCALARS = st.one_of(
    st.integers(-1000, 1000), st.booleans(), st.from_regex(r"[a-z0-9/._-]{1,10}", fullmatch=True),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)


@st.composite
def requests(draw, max_gpus: int):
    params = draw(st.dictionaries(st.sampled_from(["lr", "data", "epochs", "model"]), SCALARS,
                                  max_size=3))
    steps = []
    for i in range(draw(st.integers(1, 4))):
        step: dict = {"name": f"s{i}-{draw(NAMES)}"}
        if draw(st.booleans()):
            step["gpus"] = draw(st.integers(1, max_gpus))
        keys = draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=2))
        if keys:
            step["sweep"] = {
                k: draw(st.lists(SCALARS, min_size=1, max_size=3, unique_by=scalar_text))
                for k in keys
            }
            step["args"] = [f"--{k}={{{k}}}" for k in keys] + ["{member}"]
        if draw(st.booleans()):
            step["checkpoint"] = {"interval": draw(st.integers(60, 7200)),
                                  "resume_args": ["--resume", "{output}/{step}"]}
        steps.append(step)
    return {
        "name": draw(NAMES), "team": draw(NAMES), "kind": draw(st.sampled_from(
            ["training", "sft", "rl", "eval", "datagen", "other"])),
        "image": IMAGE, "gpus": draw(st.integers(1, max_gpus)), "parameters": params,
        "args": [f"--{k}={{{k}}}" for k in params],
        "output": "s3://b/{team}/{name}/{step}/{member}",
        "steps": steps,
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 64).flatmap(lambda m: st.tuples(st.just(m), requests(m))))
def test_any_valid_request_expands_to_units_within_limits(case):
    max_gpus, data = case
    request = JobRequest.model_validate(
        copy.deepcopy(data), context={"allowed_registries": ["registry.example.com/"],
                                      "max_gpus_per_job": max_gpus},
    )
    units = expand_units(request)
    counts = request.member_counts()
    assert len(units) == sum(counts.values())
    seen: set[tuple[int, int]] = set()
    for unit in units:
        assert 1 <= unit.gpus <= max_gpus
        assert all(index < unit.step_index for index, _ in unit.depends_on)
        assert set(unit.depends_on) <= seen  # only units listed (and run) before it
        if unit.step_index > 0:
            previous = data["steps"][unit.step_index - 1]["name"]
            assert len(unit.depends_on) == counts[previous]
        assert "{" not in unit.output and all("{" not in a for a in unit.args)
        seen.add((unit.step_index, unit.member))
    assert len({u.output for u in units}) == len(units)


# --------------------------------------------------------------------------------------------
# The sample job trace


@pytest.fixture(scope="module")
def trace() -> list[TraceEntry]:
    return load_trace(TRACE)


def _month(entry: TraceEntry) -> str:
    return entry.submit_at.astimezone(ZoneInfo("Asia/Seoul")).strftime("%Y-%m")


def test_trace_covers_the_sample_period_with_growing_adoption(trace):
    assert TRACE.stat().st_size < 200_000
    assert all(e.submit_at.tzinfo is not None for e in trace)
    months = Counter(_month(e) for e in trace)
    assert sorted(months) == ["2025-10", "2025-11", "2025-12", "2026-01"]
    assert all(25 <= n <= 40 for n in months.values()), months
    assert months["2025-10"] < months["2025-11"] < months["2025-12"] < months["2026-01"]
    hours = {m: sum(e.gpu_hours for e in trace if _month(e) == m) for m in months}
    assert hours["2026-01"] > 1.4 * hours["2025-11"]  # the operator saw about +70 %
    assert [e.submit_at for e in trace] == sorted(e.submit_at for e in trace)


def test_trace_job_mix(trace):
    units = [(e, u) for e in trace for u in e.units()]
    gpus = [u.gpus for _, u in units]
    assert all(1 <= g <= 32 for g in gpus)
    assert sum(g % 4 == 0 and 4 <= g <= 32 for g in gpus) >= 0.9 * len(gpus)
    large = [(e, u) for e, u in units if u.gpus >= 24]
    assert 12 <= len(large) <= 24  # demand for the nights outgrows the pool, as it did
    assert all(u.checkpointable and u.kind == "training" for _, u in large)
    assert all(120 <= e.actual_runtime_s(u.step) / 3600 <= 320 for e, u in large)
    for e, u in units:
        hours = e.actual_runtime_s(u.step, u.member) / 3600
        if u.kind in ("sft", "rl"):
            assert u.gpus in (8, 16) and 4 <= hours <= 20
        if u.kind in ("eval", "datagen"):
            assert not u.checkpointable and u.gpus <= 8 and 0.75 <= hours <= 7.5
    assert any(u.checkpointable for _, u in units if u.kind in ("sft", "rl"))
    assert any(not u.checkpointable for _, u in units if u.kind in ("sft", "rl"))
    sweeps = [e for e in trace if e.request.kind == "eval" and len(e.units()) > 1]
    assert sweeps and all(4 <= len(e.units()) <= 8 for e in sweeps if not e.request.steps)
    assert any(e.request.steps for e in trace)  # pipelines
    assert any(e.request.deadline for e in trace) and any(e.request.max_preemptions for e in trace)


def test_trace_users_underestimate_runtimes(trace):
    ratios = [
        e.actual_runtime_s(u.step, u.member) / u.runtime_estimate_s
        for e in trace for u in e.units() if u.runtime_estimate_s
    ]
    assert 1.0 <= statistics.median(ratios) <= 1.3
    assert min(ratios) < 1.0 < max(ratios)
    assert any(u.runtime_estimate_s is None for e in trace for u in e.units())


def test_trace_regenerates_byte_for_byte(tmp_path):
    out = sample_jobs.write(tmp_path / "jobs.yaml")
    assert out.read_bytes() == TRACE.read_bytes()


def test_trace_entries_check_their_runtimes(tmp_path):
    entry = {"submit_at": "2025-10-01T09:00:00+09:00", **pipeline()}
    entry["actual_runtime"] = {"prepare": "1h", "train": ["5h", "6h", "7h", "8h"],
                               "evaluate": "50m"}
    path = tmp_path / "trace.yaml"

    def write(entry_: dict) -> None:
        import yaml
        path.write_text(yaml.safe_dump({"jobs": [entry_]}))

    write(entry)
    (loaded,) = load_trace(path)
    assert loaded.actual_runtime_s("train", 2) == 7 * 3600
    assert loaded.actual_runtime_s("evaluate") == 3000
    assert loaded.submit_at == datetime(2025, 10, 1, 0, 0, tzinfo=UTC)
    assert round(loaded.gpu_hours, 2) == round((4 * 1 + 8 * 26 + 8 * 50 / 60), 2)
    entry["actual_runtime"] = {"prepare": "1h", "train": ["5h"], "evaluate": "50m"}
    write(entry)
    with pytest.raises(SpecError, match=r"jobs.0.actual_runtime.train: 1 durations for 4"):
        load_trace(path)
    entry["actual_runtime"] = {"prepare": "1h"}
    write(entry)
    with pytest.raises(SpecError, match=r"jobs.0.actual_runtime: .*missing: train, evaluate"):
        load_trace(path)
    entry["actual_runtime"] = "2h"
    entry["gpu"] = 3
    write(entry)
    with pytest.raises(SpecError, match=r"jobs.0.gpu: unknown field; did you mean 'gpus'"):
        load_trace(path)
    del entry["gpu"]
    entry["actual_runtime"] = "soon"
    write(entry)
    with pytest.raises(SpecError, match=r"jobs.0.actual_runtime: .*duration"):
        load_trace(path)
