"""idlegpu run --once: one real controller pass replayed against the sample history."""

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from idlegpu.scheduler.cli.actions.daemon import manifest_stream, yaml_needs_quotes

REPO = Path(__file__).resolve().parents[1]
EVENING = ["--now", "2026-01-28T20:00:00+09:00",
           "--history", str(REPO / "data/sample/history.parquet"),
           "--runs", str(REPO / "data/sample/runs.csv")]
# args a YAML reader would take for numbers or bools when printed plain
TRICKY_ARGS = ["--lr", "2e-05", "--shuffle", "yes", "--seed", "0x10", "--flag", "on"]


def submit(cli, store, request=REPO / "examples/jobs/pretrain.yaml"):
    code, _, err = cli(["submit", str(request), "--store", store,
                        "--now", "2026-01-28T17:00:00+09:00"])
    assert code == 0, err


def tricky_request(tmp_path) -> Path:
    request = yaml.safe_load((REPO / "examples/jobs/pretrain.yaml").read_text())
    request["args"] = [*request["args"], *TRICKY_ARGS]
    request["env"] = {**request["env"], "USE_FLASH": "yes", "SEED": "0x10"}
    path = tmp_path / "tricky.yaml"
    path.write_text(yaml.safe_dump(request, sort_keys=False))
    return path


def dry_run_once(cli, store, config=REPO / "idlegpu.yaml"):
    return cli(["run", "--once", "--dry-run", "--config", str(config), "--store", store,
                *EVENING])


def test_run_once_dry_run_replays_a_past_evening(tmp_path, cli):
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    submit(cli, store)
    code, out, err = dry_run_once(cli, store)
    assert code == 0, err
    # stdout holds the manifests alone, one YAML document each; everything else is on stderr
    assert out.startswith("---\n"), out[:200]
    docs = list(yaml.safe_load_all(out))
    # the example is a gang: its Indexed Job, then its headless Service
    assert [d["kind"] for d in docs] == ["Job", "Service"], docs
    job = docs[0]
    assert docs[1]["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "idlegpu-best-effort"
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    # the example's 32 GPUs are a gang of 4 pods of 8 (an Indexed Job)
    assert limits["nvidia.com/gpu"] == "8" and job["spec"]["parallelism"] == 4
    assert "admit" in err and "1 Job(s) would be created" in err
    assert "admit" not in out and "would be created" not in out
    code, out, _ = cli(["queue", "--store", store])
    assert "queued" in out and "admitted" not in out  # a dry run records nothing


def test_a_unit_that_answers_notices_gets_the_notice_file_and_a_token_for_the_api(tmp_path,
                                                                                   cli):
    settings = yaml.safe_load((REPO / "idlegpu.yaml").read_text())
    settings["cluster"]["job_api_url"] = "http://idlegpu-api.idlegpu-system.svc:8080"
    config = tmp_path / "idlegpu.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    request = yaml.safe_load((REPO / "examples/jobs/pretrain.yaml").read_text())
    request["checkpoint"]["notice"] = True
    path = tmp_path / "noticed.yaml"
    path.write_text(yaml.safe_dump(request, sort_keys=False))
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    submit(cli, store, path)
    code, out, err = dry_run_once(cli, store, config)
    assert code == 0, err
    pod = next(yaml.safe_load_all(out))["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["idlegpu-notice"]["downwardAPI"]["items"] == [{
        "path": "checkpoint-request",
        "fieldRef": {"fieldPath": "metadata.annotations['idlegpu.io/checkpoint-request']"}}]
    assert volumes["idlegpu-token"]["projected"]["sources"] == [{"serviceAccountToken": {
        "audience": "idlegpu", "expirationSeconds": 600, "path": "token"}}]
    assert pod["automountServiceAccountToken"] is False  # no token of the Kubernetes API
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["IDLEGPU_API_URL"] == settings["cluster"]["job_api_url"]
    assert env["IDLEGPU_CHECKPOINT_REQUEST_FILE"] == "/etc/idlegpu/checkpoint-request"
    assert env["IDLEGPU_TOKEN_FILE"] == "/var/run/secrets/idlegpu/token"
    mounts = {m["name"]: (m["mountPath"], m["readOnly"]) for m in container["volumeMounts"]}
    assert mounts["idlegpu-notice"] == ("/etc/idlegpu", True)
    assert mounts["idlegpu-token"] == ("/var/run/secrets/idlegpu", True)


def test_dry_run_manifests_keep_number_like_args_strings(tmp_path, cli):
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    submit(cli, store, tricky_request(tmp_path))
    code, out, err = dry_run_once(cli, store)
    assert code == 0, err
    for arg in ("2e-05", "yes", "0x10", "on"):
        assert re.search(rf"^\s*- '{arg}'$", out, re.M), (arg, out)  # quoted in the stream
    container = next(yaml.safe_load_all(out))["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-len(TRICKY_ARGS):] == TRICKY_ARGS
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["USE_FLASH"] == "yes" and env["SEED"] == "0x10"


def test_run_needs_once_for_a_replay(tmp_path, cli):
    code, _, err = cli(["run", "--config", str(REPO / "idlegpu.yaml"),
                        "--now", "2026-01-28T20:00:00+09:00"])
    assert code == 2 and "use it with --once" in err


def test_speed_only_paces_a_replayed_daemon(tmp_path, cli):
    code, _, err = cli(["run", "--once", "--config", str(REPO / "idlegpu.yaml"),
                        "--now", "2026-01-28T20:00:00+09:00", "--speed", "60",
                        "--history", str(REPO / "data/sample/history.parquet")])
    assert code == 2 and "--speed paces a replayed daemon" in err


# ---------------------------------------------------------------- the YAML stream itself

# YAML 1.2 core schema (spec 1.2.2, 10.3.2): the plain scalars it resolves to null, bool,
# int or float; written from the spec, independently of the dumper's own rule
YAML_12_CORE = re.compile(r"""(?x)
    null | Null | NULL | ~ |
  | true | True | TRUE | false | False | FALSE
  | [-+]? [0-9]+ | 0o [0-7]+ | 0x [0-9a-fA-F]+
  | [-+]? ( \.[0-9]+ | [0-9]+ ( \.[0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
  | [-+]? \. ( inf | Inf | INF ) | \. ( nan | NaN | NAN )
""")


def plain_scalars(text: str):
    """Every scalar written plain (unquoted) in the stream."""
    def walk(node):
        if isinstance(node, yaml.ScalarNode):
            if node.style is None:
                yield node.value
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                yield from walk(item)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                yield from walk(key)
                yield from walk(value)

    for doc in yaml.compose_all(text):
        yield from walk(doc)


def reads_back(value) -> None:
    doc = {"apiVersion": "v1", "value": value, "list": [value, "x"], value: "as a key"}
    text = manifest_stream([doc, {"second": value}])
    assert list(yaml.safe_load_all(text)) == [doc, {"second": value}]  # YAML 1.1 (PyYAML)
    for plain in plain_scalars(text):
        assert not YAML_12_CORE.fullmatch(plain), (plain, text)  # YAML 1.2 takes it as a string


def any_case(words):
    return st.sampled_from(words).flatmap(lambda w: st.tuples(
        *[st.sampled_from([c.lower(), c.upper()]) for c in w]).map("".join))


NUMBERISH = st.one_of(
    st.from_regex(r"\A[-+]?[0-9]{1,4}(\.[0-9]{0,3})?([eE][-+]?[0-9]{1,3})?\Z"),
    st.from_regex(r"\A[-+]?\.[0-9]{1,3}([eE][-+]?[0-9]{1,2})?\Z"),
    st.from_regex(r"\A[-+]?0[xXoObB][0-9a-fA-F]{1,6}\Z"),
    st.from_regex(r"\A[0-9]{1,3}(_[0-9]{3}){1,2}\Z"),
    st.from_regex(r"\A[0-9]{1,2}(:[0-5][0-9]){1,2}\Z"),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}"
                  r"([Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(Z|[-+][0-9]{2}:[0-9]{2})?)?\Z"),
    any_case([".inf", "-.inf", "+.inf", ".nan", "inf", "nan"]),
    any_case(["true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"]),
)


@given(st.one_of(st.text(), NUMBERISH, st.builds("{}{}".format, NUMBERISH, st.text(max_size=3))))
def test_every_string_reads_back_as_that_string_in_yaml_1_1_and_1_2(value):
    reads_back(value)


@pytest.mark.parametrize("value", [
    "2e-05", "1e3", "1E3", "-1.5e+10", "0x1F", "0X1f", "0o17", "017", "0b101", "1_000", ".5",
    ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "yes", "Yes", "YES", "no", "No", "on", "ON", "off",
    "Off", "y", "Y", "n", "N", "null", "Null", "NULL", "~", "", "true", "True", "TRUE", "tRuE",
    "false", "FaLsE", "2026-01-28", "2026-01-28T20:00:00Z", "2026-01-28 20:00:00+09:00",
    "1:30", "190:20:30", "<<", "=",
])
def test_strings_any_reader_would_take_for_something_else_are_quoted(value):
    assert yaml_needs_quotes(value)
    text = manifest_stream([{"v": value}])
    assert text == f"---\nv: '{value}'\n"
    reads_back(value)


@pytest.mark.parametrize("value", [
    "--lr=2e-05", "python", "batch/v1", "idlegpu-best-effort", "s3://runs/a/b", "v1.2.3",
    "yes please", "1.2.3", "0xZZ", "registry.example.com/research/vllm:0.6.3", "Never",
])
def test_ordinary_strings_stay_plain(value):
    assert not yaml_needs_quotes(value)
    assert manifest_stream([{"v": value}]) == f"---\nv: {value}\n"


def test_the_stream_is_one_document_per_manifest_without_aliases():
    shared = {"a": "1"}
    text = manifest_stream([{"x": shared, "y": shared}, {"z": 1}])
    assert text.count("---\n") == 2 and "&" not in text and "*" not in text
    assert list(yaml.safe_load_all(text)) == [{"x": {"a": "1"}, "y": {"a": "1"}}, {"z": 1}]
    assert manifest_stream([]) == ""


def test_dry_run_output_is_accepted_by_a_real_api_server(tmp_path, cli, kube_control_plane,
                                                         kube_namespace):
    """``idlegpu run --once --dry-run | kubectl apply --dry-run=server -f -`` on a real
    kube-apiserver: the stream parses, validates and admits, and the args stay strings."""
    cp, namespace = kube_control_plane, kube_namespace
    cp.kubectl("apply", "-f", str(REPO / "deploy/priorityclass.yaml"))
    settings = yaml.safe_load((REPO / "idlegpu.yaml").read_text())
    settings["cluster"]["namespace"] = namespace
    config = tmp_path / "idlegpu.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    submit(cli, store, tricky_request(tmp_path))
    code, out, err = dry_run_once(cli, store, config)
    assert code == 0, err
    applied = cp.kubectl("apply", "--dry-run=server", "-o", "yaml", "-f", "-", input=out)
    # the example is a gang: its Indexed Job and its headless Service, both admitted
    job, service = yaml.safe_load(applied.stdout)["items"]
    assert job["kind"] == "Job" and job["metadata"]["namespace"] == namespace
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-len(TRICKY_ARGS):] == TRICKY_ARGS  # as the server stored them
    # and nothing was created: it was a server-side dry run
    listed = cp.kubectl("get", "jobs", "-n", namespace, "-o", "name")
    assert listed.stdout.strip() == ""
