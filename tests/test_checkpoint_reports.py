"""What a workload may send to ``POST /v1/units/{unit}/checkpoint``, bounded before it is
parsed: every malformed or hostile body is a 4xx naming the field and the fix, never a 500.
(The route on the real API server with real pod-bound tokens: test_checkpoint_notice_kube.)"""

import json

import pytest

from idlegpu.scheduler.api.auth import ApiError
from idlegpu.scheduler.api.checkpoints import MAX_REPORT_BYTES, parse_report


def refused(body: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_report(body)
    return caught.value


def test_a_good_acknowledgement_and_a_progress_report_parse():
    ack = parse_report(json.dumps({"kind": "checkpoint", "step": 1200, "path": "/ckpt/1200",
                                   "saved_at": "2026-12-03T14:20:00Z", "attempt": 2}).encode())
    assert (ack.kind, ack.step, ack.path, ack.attempt) == ("checkpoint", 1200, "/ckpt/1200", 2)
    assert ack.saved_at.utcoffset().total_seconds() == 0
    progress = parse_report(b'{"kind": "progress", "step": 0}')
    assert progress.kind == "progress" and progress.path is None


@pytest.mark.parametrize(("body", "status", "field"), [
    (b"not json", 400, None),
    (b"\xff\xfe", 400, None),
    (b"[" * 100_00, 413, None),                      # over the limit before any parsing
    (b"[1, 2]", 422, None),
    (b'{"step": 1}', 422, "kind"),
    (b'{"kind": "restart", "step": 1}', 422, "kind"),
    (b'{"kind": "checkpoint"}', 422, "step"),
    (b'{"kind": "checkpoint", "step": -1}', 422, "step"),
    (b'{"kind": "checkpoint", "step": true}', 422, "step"),
    (b'{"kind": "checkpoint", "step": "12"}', 422, "step"),
    (b'{"kind": "checkpoint", "step": 1.5}', 422, "step"),
    (b'{"kind": "checkpoint", "step": 9007199254740993}', 422, "step"),
    (b'{"kind": "checkpoint", "step": 1, "path": 7}', 422, "path"),
    (b'{"kind": "checkpoint", "step": 1, "path": "a\\u0000b"}', 422, "path"),
    (b'{"kind": "checkpoint", "step": 1, "path": "\\ud800"}', 422, "path"),
    (b'{"kind": "checkpoint", "step": 1, "saved_at": "yesterday"}', 422, "saved_at"),
    (b'{"kind": "checkpoint", "step": 1, "saved_at": "2026-12-03T14:20:00"}', 422, "saved_at"),
    (b'{"kind": "checkpoint", "step": 1, "attempt": 0}', 422, "attempt"),
    (b'{"kind": "checkpoint", "step": 1, "attempt": "2"}', 422, "attempt"),
    (b'{"kind": "checkpoint", "step": 1, "unit": "someone-else"}', 422, "unit"),
])
def test_a_malformed_report_is_a_4xx_naming_the_field(body, status, field):
    error = refused(body)
    assert (error.status, error.field) == (status, field), error.message
    assert "\n" not in error.message and len(error.message) < 300


def test_a_path_at_the_limit_passes_and_one_past_it_names_the_field():
    room = MAX_REPORT_BYTES - len(b'{"kind": "checkpoint", "step": 1, "path": ""}')
    assert parse_report(b'{"kind": "checkpoint", "step": 1, "path": "' + b"x" * min(room, 1024)
                        + b'"}').path == "x" * min(room, 1024)
    error = refused(b'{"kind": "checkpoint", "step": 1, "path": "' + b"x" * 1025 + b'"}')
    assert error.field == "path" and "1024" in error.message
