"""schemathesis (4.x) against a REAL ``idlegpu serve`` (the sample replayed at Wed 17:00, so the
plan routes answer too), with a member's and an operator's token: for every operation of the
OpenAPI document, examples, the coverage phase and bounded fuzzing, and the checks that no
answer is a 5xx and that every answer's status, content type, headers and body are the ones
the document declares. ``IDLEGPU_SCHEMATHESIS_EXAMPLES`` (default 10) sets the examples per
operation; the README says how to run it longer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_api_hostile import serving

REPO = Path(__file__).resolve().parents[1]
ST = Path(sys.executable).with_name("st")
EXAMPLES = os.environ.get("IDLEGPU_SCHEMATHESIS_EXAMPLES", "10")
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_headers_conformance,response_schema_conformance")


@pytest.mark.slow  # long (over 15 s): scripts/test.sh and CI run it, a plain pytest does not
@pytest.mark.parametrize("role", ["member", "operator"])
def test_schemathesis_finds_no_server_error_and_no_answer_off_the_document(
        tmp_path, role) -> None:
    assert ST.is_file(), "schemathesis is in the test extra: pip install -e '.[test]'"
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    with serving(store, {"fuzz": role}, "--history",
                 str(REPO / "data/sample/history.parquet")) as (server, output):
        run = subprocess.run(
            [str(ST), "run", f"{server.url}/openapi.json",
             "-H", f"Authorization: Bearer {server.tokens['fuzz']}",
             "--checks", CHECKS, "--phases", "examples,coverage,fuzzing",
             "--max-examples", EXAMPLES, "--workers", "1", "--request-timeout", "30",
             "--seed", "20261201", "--warnings", "off", "--no-color"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    tail = run.stdout[-4000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "failures" not in tail.lower().split("summary")[-1], tail
    (log,) = output
    assert "Traceback" not in log and "internal error on" not in log, log[-3000:]
