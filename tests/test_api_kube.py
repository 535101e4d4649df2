"""The job API's Kubernetes TokenReview on a REAL kube-apiserver 1.36 (``kube_control_plane``):
a ServiceAccount token made by the TokenRequest API authenticates and maps to a team and role
through ``api.identities``; a forged token, a tampered one and the token of a deleted account
do not (401); an account no rule maps is refused (403)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from api_server import ApiServer, Client, MovableClock, api_settings, job

from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.server import create_server


def sa_token(kube, namespace: str, name: str, *, create: bool = True) -> str:
    """A fresh token of ServiceAccount ``namespace/name`` (TokenRequest, 10 minutes)."""
    from kubernetes import client

    with kube.api_client() as api:
        core = client.CoreV1Api(api)
        if create:
            core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        request = core.create_namespaced_service_account_token(
            name, namespace, {"spec": {"expirationSeconds": 600}})
    return request.status.token


@pytest.fixture
def kube_api(kube_control_plane, kube_namespace, tmp_path) -> Iterator[tuple[str, str]]:
    """``(url, namespace)`` of a job API whose TokenReviews go to the real API server."""
    ns = kube_namespace
    settings = api_settings(
        token_review={"enabled": True, "kubeconfig": kube_control_plane.kubeconfig,
                      "cache_seconds": 0},
        identities=[
            {"user": f"system:serviceaccount:{ns}:alice", "team": "alignment"},
            {"group": f"system:serviceaccounts:{ns}", "team": "vision", "role": "viewer"},
        ])
    store = JobStore(f"sqlite:///{tmp_path / 'kube-api.db'}")
    server = ApiServer(create_server(settings, store, clock=MovableClock())).start()
    try:
        yield server.url, ns
    finally:
        server.stop()
        store.close()


def test_a_service_account_token_authenticates_and_maps_to_its_team(kube_api,
                                                                   kube_control_plane):
    url, ns = kube_api
    alice = Client(url, sa_token(kube_control_plane, ns, "alice"))
    who = alice.get("/v1/whoami")
    assert who.status_code == 200, who.text
    body = who.json()
    assert body["user"] == f"system:serviceaccount:{ns}:alice"
    assert body["auth"] == "tokenreview" and (body["team"], body["role"]) == ("alignment",
                                                                           "member")
    assert f"system:serviceaccounts:{ns}" in body["groups"]
    made = alice.post("/v1/requests", json=job())
    assert made.status_code == 201, made.text
    assert made.json()["submitted_by"] == f"tokenreview:system:serviceaccount:{ns}:alice"

    # another account of the namespace: mapped by its group, a viewer
    bob = Client(url, sa_token(kube_control_plane, ns, "bob"))
    assert bob.get("/v1/whoami").json()["role"] == "viewer"
    assert bob.post(f"/v1/requests/{made.json()['id']}/cancel").status_code == 403
    assert alice.post(f"/v1/requests/{made.json()['id']}/cancel").status_code == 200


@pytest.mark.slow  # long (10-25 s): run by scripts/test.sh and CI
def test_forged_tampered_and_orphaned_tokens_are_401(kube_api, kube_control_plane):
    url, ns = kube_api
    token = sa_token(kube_control_plane, ns, "carol")
    header, payload, signature = token.split(".")
    tampered = ".".join([header, payload, signature[:-4] + ("AAAA" if signature[-4:] != "AAAA"
                                                              else "BBBB")])
    for forged in ("not-a-kubernetes-token", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", tampered):
        response = Client(url, forged).get("/v1/whoami")
        assert response.status_code == 401, forged
        assert response.json()["error"]["message"] == (
            "the Kubernetes API server does not accept this token")
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    # the token was good while its account existed (carol: mapped by group, a viewer)
    assert Client(url, token).get("/v1/whoami").status_code == 200
    from kubernetes import client

    with kube_control_plane.api_client() as api:
        client.CoreV1Api(api).delete_namespaced_service_account("carol", ns)
    # the API server itself caches a token's review for a few seconds (and sees the
    # deletion through its informer): it turns 401 soon after, never stays valid
    deadline = time.monotonic() + 30
    while Client(url, token).get("/v1/whoami").status_code != 401:
        assert time.monotonic() < deadline, "the deleted account's token still authenticates"
        time.sleep(0.5)


def test_an_account_no_rule_maps_is_refused_403(kube_api, kube_control_plane):
    url, _ = kube_api
    other = kube_control_plane.create_namespace("api-unmapped")
    try:
        response = Client(url, sa_token(kube_control_plane, other, "default",
                                        create=False)).get("/v1/whoami")
        assert response.status_code == 403
        assert response.json()["error"]["message"] == (
            f"'system:serviceaccount:{other}:default' is authenticated but no api.identities "
            "entry maps it (or its groups) to a team and role; ask an operator")
    finally:
        kube_control_plane.delete_namespace(other)


def test_an_unreachable_api_server_is_503_not_401(tmp_path):
    import kubernetes
    from api_server import free_port

    from idlegpu.scheduler.api.tokenreview import TokenReviewer

    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    reviewer = TokenReviewer(kubernetes.client.ApiClient(configuration), timeout_seconds=2)
    settings = api_settings(token_review={"enabled": True})
    store = JobStore(f"sqlite:///{tmp_path / 'down.db'}")
    server = ApiServer(create_server(settings, store, reviewer=reviewer)).start()
    try:
        response = Client(server.url, "some-kubernetes-token").get("/v1/whoami")
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
        assert response.json()["error"]["message"] == (
            "cannot reach the Kubernetes API server to check the token; retry later")
    finally:
        server.stop()
        store.close()
