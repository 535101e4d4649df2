"""What one request may cost (issue 13, item 4): sizes, depth, aliases, parameters, sweeps,
steps, units and rendered sizes are refused before anything is expanded, quickly and with little
memory; numbers that reach SQLite or a timestamp are range-checked; no input raises anything but
a one-line SpecError (exit 2 from the CLI), and the store does not grow when a request is refused.

The time and memory bounds are guards, not benchmarks: before the limits the amplification file
took 4 s and 2 GB to accept, a 40k-value sweep 17 s and 60k steps 33 s to refuse, a 10^6-value
sweep more than 90 s, and a year-1 deadline raised OverflowError."""

from __future__ import annotations

import json
import sqlite3
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idlegpu.scheduler.config import AdmissionConfig, RequestLimits
from idlegpu.scheduler.specs import (
    JobRequest,
    SpecError,
    expand_units,
    load_request,
    load_requests,
    load_trace,
    parse_request_text,
    validate_request,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples" / "jobs").glob("*.yaml"))
TRACE = REPO / "data" / "sample" / "jobs.yaml"
IMAGE = "registry.example.com/research/trainer:1.4.2"
NOW = "2026-01-28T18:00:00+09:00"
SECONDS = 2.0  # generous: the behaviour guarded against took 4 to 90+ s
MEGABYTES = 50  # and 0.2 to 4+ GB


def request(**fields: Any) -> dict[str, Any]:
    data = {"name": "adv", "team": "alignment", "kind": "sft", "image": IMAGE, "gpus": 1}
    data.update(fields)
    return data


def amplification(blob: int, args: int = 40, steps: int = 4, members: int = 256) -> str:
    """The issue's file: a ``blob``-character parameter templated ``args`` times into args,
    ``steps`` steps of ``members`` sweep members each."""
    return json.dumps(request(
        parameters={"blob": "x" * blob},
        steps=[{"name": f"s{i}", "sweep": {"seed": list(range(members))},
                "args": ["{blob}"] * args} for i in range(steps)],
        output="s3://runs/{name}/{step}/{member}"))


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ",".join(['"lol"'] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    lines += ["name: adv", "team: alignment", "kind: sft", f"image: {IMAGE}", "gpus: 1",
              f"parameters: {{p: *a{levels - 1}}}"]
    return "\n".join(lines) + "\n"


def refused(call: Callable[[], Any]) -> tuple[str, float, float]:
    """``call``'s SpecError message, its seconds and its peak traced memory in MB (a second
    run under tracemalloc, which slows Python down), asserting it raised SpecError within the
    time and memory bounds."""
    start = time.perf_counter()
    with pytest.raises(SpecError) as caught:
        call()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        with pytest.raises(SpecError):
            call()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message
    assert seconds < SECONDS, f"{seconds:.2f} s: {message}"
    assert peak < MEGABYTES, f"{peak:.1f} MB: {message}"
    return message, seconds, peak


# --------------------------------------------------------------------------------------------
# The adversarial files


def test_the_amplification_file_of_the_issue_is_refused_at_the_parameter() -> None:
    message, _, _ = refused(lambda: parse_request_text(amplification(50_000)))
    assert message.startswith("request: parameters.blob: a string of 50,000 characters")
    assert "admission.limits.max_string_bytes" in message


def test_a_unit_that_would_render_too_large_is_refused_before_rendering() -> None:
    # 10 kB x 40 args: every string fits, each unit would hold 400 kB
    message, _, _ = refused(lambda: parse_request_text(amplification(10_000)))
    assert message.startswith("request: steps.0: each unit of step 's0' would hold up to")
    assert "admission.limits.max_unit_bytes" in message


def test_a_request_whose_units_together_are_too_large_is_refused() -> None:
    # 1 kB x 40 args x 1,024 units = 40 MB in the store
    message, _, _ = refused(lambda: parse_request_text(amplification(1_000)))
    assert "admission.limits.max_request_expanded_bytes" in message


def test_fields_copied_into_every_unit_count_too() -> None:
    # 800 scratch volumes (200 kB as written) copied into 1,024 units: 200 MB in the store
    volumes = [{"name": f"v{i}", "mount_path": f"/scratch/{i}/" + "p" * 230, "empty_dir": {}}
               for i in range(800)]
    text = json.dumps(request(volumes=volumes, steps=[
        {"name": f"s{i}", "sweep": {"seed": list(range(256))}} for i in range(4)]),
        separators=(",", ":"))
    assert len(text) < 256 * 1024
    message, _, _ = refused(lambda: parse_request_text(text))
    assert "admission.limits.max_request_expanded_bytes" in message


def test_a_rendered_string_too_long_is_refused_at_its_field() -> None:
    text = json.dumps(request(parameters={"a": "y" * 9000}, args=["--x", "{a}{a}"]))
    message, _, _ = refused(lambda: parse_request_text(text))
    assert message.startswith("request: args.1: renders to up to 18,")


def test_the_worst_accepted_amplification_costs_little() -> None:
    # just under every limit: 1,024 units of 40 x 300 characters (12 MB together)
    tracemalloc.start()
    start = time.perf_counter()
    units = expand_units(parse_request_text(amplification(300)))
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert len(units) == 1024
    assert seconds < 10 and peak < 200


@pytest.mark.parametrize("levels", [4, 9, 30])
def test_billion_laughs_are_refused_quickly_and_never_expanded(levels: int) -> None:
    message, _, _ = refused(lambda: parse_request_text(billion_laughs(levels)))
    assert "YAML aliases (line" in message and "max_alias_nodes" in message
    assert "lol" not in message


def test_aliases_under_the_bound_are_fine_and_errors_never_write_them_out() -> None:
    text = billion_laughs(levels=3, width=9)  # 729 values: within the bound, but not scalars
    message, _, _ = refused(lambda: parse_request_text(text))
    assert "parameters.p: got a list" in message and "lol" not in message
    assert len(message) < 2000  # five problems at most, none of them the 729 values


def test_a_recursive_alias_is_refused() -> None:
    message, _, _ = refused(lambda: parse_request_text("a: &a [1, *a]\nname: x\n"))
    assert "refers to the collection it is in" in message


@pytest.mark.parametrize("text", [
    "name: adv\nargs: " + "[" * 3000 + "]" * 3000 + "\n",
    "name: adv\nargs: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "name: adv\nargs: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "".join("  " * i + f"k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n",
], ids=["3000-lists", "100k-lists", "3000-mappings", "40-block-levels"])
def test_deep_nesting_is_refused(text: str) -> None:
    message, _, _ = refused(lambda: parse_request_text(text))
    assert "nest deeper than 32 levels" in message and "admission.limits.max_depth" in message


def test_a_million_value_sweep_is_refused_as_text_and_as_data() -> None:
    text = json.dumps(request(sweep={"seed": list(range(1_000_000))}, args=["{seed}"]))
    message, _, _ = refused(lambda: parse_request_text(text))
    assert "bytes is above the limit of 262,144 (admission.limits.max_request_bytes)" in message
    data = json.loads(text)  # an API body parsed elsewhere: the counts refuse it
    message, _, _ = refused(lambda: validate_request(data))
    assert message.startswith("request: sweep.seed: 1,000,000 values is above the limit of 256")


def test_a_40k_value_sweep_within_the_size_limit_is_refused_in_milliseconds() -> None:
    text = json.dumps(request(sweep={"seed": list(range(40_000))}, args=["{seed}"]),
                      separators=(",", ":"))
    assert len(text) < 256 * 1024
    message, seconds, _ = refused(lambda: parse_request_text(text))
    assert message.startswith("request: sweep.seed: 40,000 values")
    # about 0.2 s alone; the full suite on 2 shared cores (its control plane and servers still
    # running) once took 1.4 s: the bound catches an expansion (tens of seconds), not noise
    assert seconds < 2.5


def test_a_sweep_product_past_the_limit_is_refused_before_expansion() -> None:
    data = request(sweep={"a": list(range(200)), "b": list(range(200)), "c": list(range(200))},
                   args=["{a}{b}{c}"])
    message, _, _ = refused(lambda: validate_request(data))
    assert "sweep: the sweep has more than 256 grid points" in message


@pytest.mark.parametrize("count", [60_000, 20_000])
def test_many_steps_are_refused(count: int) -> None:
    steps = [{"name": f"s{i}"} for i in range(count)]
    text = json.dumps(request(steps=steps), separators=(",", ":"))
    refused(lambda: parse_request_text(text))
    message, _, _ = refused(lambda: validate_request(request(steps=steps)))
    assert message.startswith(f"request: steps: {count:,} steps is above the limit of 64")


def test_too_many_units_parameters_and_a_long_description_are_refused() -> None:
    steps = [{"name": f"s{i}", "sweep": {"k": list(range(200))}} for i in range(6)]
    message, _, _ = refused(lambda: validate_request(request(steps=steps, args=["{k}"])))
    assert "request: steps: the request expands to 1,200 units" in message
    params = {f"p{i}": i for i in range(300)}
    message, _, _ = refused(lambda: validate_request(request(parameters=params)))
    assert message.startswith("request: parameters: 300 parameters is above the limit of 256")
    message, _, _ = refused(lambda: validate_request(request(description="d" * 5000)))
    assert message.startswith("request: description: 5,000 characters")


def test_a_cyclic_mapping_given_as_data_is_refused() -> None:
    data = request()
    data["parameters"] = {"p": []}
    data["parameters"]["p"].append(data["parameters"]["p"])
    message, _, _ = refused(lambda: validate_request(data))
    assert "nested deeper than 32 levels" in message


# --------------------------------------------------------------------------------------------
# Numbers that reach SQLite or a timestamp


@pytest.mark.parametrize(("fields", "start"), [
    ({"priority": 2**63}, "request: priority: priority 9223372036854775808 is outside -1000..1000"),
    ({"priority": -(2**63) - 1}, "request: priority: priority -9223372036854775809 is outside"),
    ({"deadline": "0001-01-01T00:00:00+09:00"},
     "request: deadline: 0001-01-01T00:00:00+09:00 is outside the years 1970 to 2999"),
    ({"deadline": "9999-12-31T23:59:59-12:00"}, "request: deadline: 9999-12-31T23:59:59-12:00 is"),
    ({"runtime_estimate": 1e300}, "request: runtime_estimate: 1e+300 is more than ten years"),
    ({"max_preemptions": 2**63}, "request: max_preemptions: Input should be less than or equal"),
    ({"steps": [{"name": "a", "priority": 10**30}]}, "request: steps.0.priority: priority"),
    ({"checkpoint": {"interval": "99999999999d"}}, "request: checkpoint.interval: "),
])
def test_numbers_out_of_range_are_one_line_errors(fields: dict[str, Any], start: str) -> None:
    message, _, _ = refused(lambda: validate_request(request(**fields)))
    assert message.startswith(start), message


def test_the_priority_range_is_configurable() -> None:
    admission = AdmissionConfig(limits=RequestLimits(min_priority=-5, max_priority=5))
    with pytest.raises(SpecError, match=r"priority 6 is outside -5\.\.5"):
        validate_request(request(priority=6), admission)
    assert validate_request(request(priority=1000)).priority == 1000


def test_a_trace_entry_out_of_range_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(yaml.safe_dump({"jobs": [{
        **request(), "submit_at": "0001-01-01T00:00:00+09:00", "actual_runtime": "1h"}]}))
    with pytest.raises(SpecError, match=r"jobs\.0\.submit_at: .* outside the years 1970"):
        load_trace(trace)


@pytest.mark.parametrize(("text", "part"), [
    ("name: adv\npriority: " + "9" * 5000 + "\n", "a number with more than 4,300 digits"),
    ("name: adv\ndeadline: 2025-02-30\n", "day is out of range for month"),
    ("name: \x00\n", "invalid YAML"),
    (b"\xff\xfename: adv\n", "not UTF-8 text"),
    ("name: '\udc80'\n", "not valid Unicode"),
    ("a: 1\n---\nb: 2\n", "invalid YAML at line 2"),
    ("!!python/object/apply:os.system [echo hi]\n", "could not determine a constructor"),
    ("{[1]: 2}\n", "found unhashable key"),
    ("name: !!int \n", "a value cannot be read"),
    ("name: !!float x\n", "a value cannot be read"),
    ("name: !!binary '%'\n", "name: String should match pattern"),
    ("", "expected a mapping of request fields, got NoneType"),
    ("args: [[1]]\n" + "\n".join(f"{k}: {v}" for k, v in request().items()),
     "args.0: Input should be a valid string; use a list of strings, e.g. [--lr, '{lr}']"),
])
def test_unreadable_texts_are_one_line_errors(text: str | bytes, part: str) -> None:
    message, _, _ = refused(lambda: parse_request_text(text))
    assert part in message


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(512 * 2**20)  # sparse: 512 MiB that are never read
    message, _, _ = refused(lambda: load_request(big))
    assert "a request of 536,870,912 bytes is above the limit of 262,144" in message
    message, _, _ = refused(lambda: load_requests(big))
    assert "admission.limits.max_file_bytes" in message


# --------------------------------------------------------------------------------------------
# What the limits must not refuse


def test_the_examples_and_the_sample_trace_are_within_the_limits() -> None:
    for example in EXAMPLES:
        text = example.read_text()
        assert len(text) < RequestLimits().max_request_bytes // 8
        try:
            assert isinstance(parse_request_text(text, source=example.name), JobRequest)
        except SpecError as exc:  # only the allow-list of sft-volumes.yaml, never a limit
            assert "admission.limits" not in str(exc) and "team_volumes" in str(exc)
    start = time.perf_counter()
    entries = load_trace(TRACE)
    assert len(entries) == 124
    assert time.perf_counter() - start < 3.0  # 0.08 s here (0.2 s before the limits)


def test_limits_can_be_raised() -> None:
    data = request(sweep={"seed": list(range(300))}, args=["{seed}"])
    with pytest.raises(SpecError, match="300 values is above the limit of 256"):
        validate_request(data)
    roomy = AdmissionConfig(limits=RequestLimits(max_sweep_values=512, max_sweep_members=512))
    assert len(expand_units(validate_request(data, roomy))) == 300


def test_the_limits_config_is_checked() -> None:
    with pytest.raises(ValueError, match="max_sweep_members"):
        RequestLimits(max_sweep_members=2048, max_units=1024)


# --------------------------------------------------------------------------------------------
# The CLI: exit 2, one line, and the store does not grow


def _store_counts(db: Path) -> tuple[int, int, int]:
    with sqlite3.connect(db) as con:
        return (db.stat().st_size, con.execute("select count(*) from requests").fetchone()[0],
                con.execute("select count(*) from units").fetchone()[0])


def test_refused_requests_leave_the_store_as_it_was(tmp_path: Path, cli) -> None:
    db = tmp_path / "jobs.db"
    store = f"sqlite:///{db}"
    code, _, err = cli(["submit", str(REPO / "examples/jobs/eval-sweep.yaml"), "--store", store,
                        "--now", NOW])
    assert code == 0, err
    before = _store_counts(db)
    files = {
        "amplification": amplification(50_000), "unit": amplification(10_000),
        "together": amplification(1_000), "laughs": billion_laughs(),
        "deep": "name: adv\nargs: " + "[" * 3000 + "]" * 3000,
        "sweep": json.dumps(request(sweep={"seed": list(range(1_000_000))})),
        "steps": json.dumps(request(steps=[{"name": f"s{i}"} for i in range(60_000)])),
        "priority": json.dumps(request(priority=2**63)),
        "deadline": json.dumps(request(deadline="0001-01-01T00:00:00+09:00")),
    }
    for name, text in files.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        start = time.perf_counter()
        code, out, err = cli(["submit", str(path), "--store", store, "--now", NOW])
        seconds = time.perf_counter() - start
        tracemalloc.start()
        cli(["submit", str(path), "--store", store, "--now", NOW])
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        assert code == 2, (name, out, err)
        assert _one_error_line(err), (name, err)
        assert out == ""
        assert seconds < SECONDS and peak < MEGABYTES, (name, seconds, peak)
        assert _store_counts(db) == before, name
    err = cli(["submit", str(tmp_path / "priority.yaml"), "--store", store])[2]
    assert "priority: priority 9223372036854775808 is outside -1000..1000" in err
    err = cli(["submit", str(tmp_path / "deadline.yaml"), "--store", store])[2]
    assert "deadline: 0001-01-01T00:00:00+09:00 is outside the years 1970 to 2999" in err


def _one_error_line(err: str) -> bool:
    """stderr holds one ``error:`` line, last (after the config line), and no traceback."""
    lines = err.rstrip("\n").split("\n")
    return (lines[-1].startswith("error: ") and sum(ln.startswith("error") for ln in lines) == 1
            and "Traceback" not in err and len(lines) <= 2)


# --------------------------------------------------------------------------------------------
# Random and adversarial texts: a request or a SpecError, never anything else

_MARKUP = ["[/]", "[on black][black]hidden[/]", "[bold", "[link=file:///etc/passwd]x[/link]",
           "\x1b[2J", "{", "}", "{name}", "{{", "{0}", "{a.b}", "{a!r}", "{a:>9999999}"]
_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.sampled_from([2**63, -(2**63) - 1, 10**400, 0, -1, 65, 10**6]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.sampled_from(_MARKUP),
    st.sampled_from(["1h", "0s", "-5m", "1e999", "64Gi", "500m", "0001-01-01T00:00:00Z",
                     "2025-11-03T09:00:00+09:00", "9999-12-31T23:59:59-23:59", "s3://b/{name}",
                     IMAGE, "registry.example.com/x:latest", "*", "&a", "!!binary"]),
)
_values = st.recursive(
    _scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                      st.dictionaries(st.text(max_size=12) | st.sampled_from(
                                          list(request()) + ["steps", "sweep", "parameters",
                                                             "args", "env", "volumes"]),
                                          inner, max_size=5)),
    max_leaves=30)
_words = st.sampled_from(_MARKUP) | st.text(max_size=30)
_plausible = {  # values of the right type, so that more of the requests get through
    "args": st.lists(_words | st.sampled_from(["{lr}", "{name}", "{output}", "{member}"]),
                     max_size=6),
    "command": st.lists(_words, max_size=3),
    "description": _words,
    "priority": st.integers(-2000, 2000),
    "env": st.dictionaries(st.sampled_from(["A", "B_C", "NOTE"]), _words, max_size=3),
    "parameters": st.dictionaries(st.sampled_from(["lr", "seed", "data"]),
                                  st.integers() | _words | st.floats(), max_size=3),
    "sweep": st.dictionaries(st.sampled_from(["seed", "shard"]),
                             st.lists(st.integers(0, 300), max_size=8), max_size=2),
    "steps": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "c-1"])}),
                      max_size=3),
    "gpus": st.integers(-2, 70),
    "deadline": st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
}
_FIELDS = ["name", "team", "kind", "image", "gpus", "min_gpus", "cpu", "memory", "priority",
           "deadline", "max_preemptions", "runtime_estimate", "args", "command", "env",
           "parameters", "sweep", "steps", "output", "volumes", "env_from", "checkpoint",
           "ephemeral_storage", "description", "privileged", "unknown_field"]


@st.composite
def request_texts(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["mutated", "structure", "text", "bytes", "yaml-ish"]))
    if kind == "mutated":
        data: dict[str, Any] = request(parameters={"lr": 1e-4}, args=["--lr", "{lr}"],
                                       output="s3://runs/{name}/{step}/{member}")
        for _ in range(draw(st.integers(0, 3))):
            field = draw(st.sampled_from(_FIELDS))
            data[field] = draw(_values if draw(st.booleans()) else _plausible.get(field, _values))
        dump = draw(st.sampled_from(["json", "yaml"]))
        try:
            return json.dumps(data) if dump == "json" else yaml.safe_dump(data)
        except (ValueError, TypeError, OverflowError):
            return repr(data)
    if kind == "structure":
        return json.dumps(draw(_values), default=str)
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "yaml-ish":
        pieces = st.sampled_from(["name: ", "- ", "[", "]", "{", "}", ": ", "\n", "  ", "&a ",
                                  "*a ", "<<: ", "!!str ", "!!int ", "? ", "'", '"', "#", "---",
                                  "steps:", "sweep:", "args:", "x", "1", "[/]", "\t", "%YAML 1.1"])
        return "".join(draw(st.lists(pieces, max_size=60)))
    return draw(st.text(max_size=200))


def _check(message: str) -> None:
    assert "\n" not in message
    assert "internal error" not in message, message
    assert len(message) < 4000


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(request_texts())
def test_any_text_is_a_request_or_one_spec_error(text: str | bytes) -> None:
    try:
        parsed = parse_request_text(text)
    except SpecError as exc:
        _check(str(exc))
        return
    assert isinstance(parsed, JobRequest)
    assert expand_units(parsed)  # a valid request expands without another exception


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(request_texts())
def test_the_cli_submits_or_exits_2_with_one_line(tmp_path_factory, cli, text) -> None:
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "request.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    code, out, err = cli(["submit", str(path), "--store", f"sqlite:///{folder / 'j.db'}",
                          "--now", NOW])
    assert code in (0, 2), (code, out, err)
    assert "Traceback" not in err
    if code == 2:
        assert _one_error_line(err), err
        _check(err.rstrip("\n").split("\n")[-1])
    else:
        assert out.startswith("queued ")
