"""deploy/api.yaml runs two replicas of the job API: they share the console's session secret
(from a Secret), else a cookie issued by one is refused by the other."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_both_api_replicas_sign_sessions_with_the_secret_of_one_secret():
    docs = list(yaml.safe_load_all((REPO / "deploy/api.yaml").read_text(encoding="utf-8")))
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["IDLEGPU_API__SESSION_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "idlegpu-api", "key": "session_secret"}
    manual = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "docs").glob("*.md"))
    assert "create secret generic idlegpu-api" in manual
