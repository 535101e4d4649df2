"""`idlegpu submit/queue --server` with no idlegpu token: the current kubeconfig context's
bearer token (a ServiceAccount's, from the TokenRequest API of the REAL kube-apiserver 1.36),
which the job API checks with a TokenReview."""

from __future__ import annotations

from pathlib import Path

import test_api_kube
import yaml
from api_server import job
from test_cli_remote import run

kube_api = test_api_kube.kube_api  # the fixture: a job API whose TokenReviews reach the server
sa_token = test_api_kube.sa_token


def kubeconfig_with_token(tmp_path: Path, kube, token: str) -> Path:
    path = tmp_path / "researcher.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "research",
        "clusters": [{"name": "pool", "cluster": {
            "server": kube.url, "certificate-authority": str(kube.certs / "ca.crt")}}],
        "users": [{"name": "alice", "user": {"token": token}}],
        "contexts": [{"name": "research", "context": {"cluster": "pool", "user": "alice"}}],
    }), encoding="utf-8")
    return path


def test_the_kubeconfig_token_submits_as_its_service_account(kube_api, kube_control_plane,
                                                             tmp_path, capsys, monkeypatch):
    url, ns = kube_api
    token = sa_token(kube_control_plane, ns, "alice")
    monkeypatch.delenv("IDLEGPU_TOKEN", raising=False)
    monkeypatch.delenv("IDLEGPU_TOKEN_FILE", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_with_token(tmp_path, kube_control_plane,
                                                               token)))
    request = tmp_path / "sft.yaml"
    request.write_text(yaml.safe_dump(job()), encoding="utf-8")
    code, out, err = run(capsys, "submit", str(request), "--server", url)
    assert code == 0, err
    assert f"by tokenreview:system:serviceaccount:{ns}:alice" in " ".join(out.split())
    code, out, err = run(capsys, "queue", "--server", url, "--scope", "mine")
    assert code == 0 and "4 unit(s)" in out, err

    # a kubeconfig whose token the API server does not know: 401, and where it came from
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_with_token(tmp_path, kube_control_plane,
                                                               token[:-6] + "AAAAAA")))
    code, _, err = run(capsys, "queue", "--server", url)
    assert code == 2 and "the current kubeconfig context" in " ".join(err.split())
