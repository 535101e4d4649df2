"""Shared fixtures. ``prometheus_factory`` starts REAL Prometheus servers backfilled from a
history frame (see ``tests/prom_server.py``); they are stopped at the end of the session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pandas as pd
import pytest
from hypothesis import settings as hypothesis_settings
from prom_server import PrometheusMissingError, PromServer, find_binaries

# CI explores the same examples on every run (reproducible); locally they vary and find more.
# No per-example deadline anywhere: speed lives in bench/, and on 2 shared cores one example can
# take 0.5 s without anything being wrong (a deadline there is a flaky test, not a check)
hypothesis_settings.register_profile("local", deadline=None)
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "local")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the ``idlegpu`` command in-process: ``cli(args) -> (exit code, stdout, stderr)``."""
    from idlegpu.scheduler.cli import main

    def run(args: list[str]) -> tuple[int, str, str]:
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def prometheus_binaries() -> tuple[str, str]:
    """``(prometheus, promtool)``; fails loudly (never skips) when they are not installed."""
    try:
        return find_binaries()
    except PrometheusMissingError as exc:
        pytest.fail(f"Prometheus tests need a real server: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def prometheus_factory(
    tmp_path_factory: pytest.TempPathFactory, prometheus_binaries: tuple[str, str]
) -> Iterator[Callable[..., PromServer]]:
    """``start(history, name="prom") -> PromServer``: backfill ``history`` into a fresh data
    directory and serve it on a free loopback port; ``.url`` is its address."""
    servers: list[PromServer] = []

    def start(history: pd.DataFrame, *, name: str = "prom", **kwargs: object) -> PromServer:
        server = PromServer.from_history(history, tmp_path_factory.mktemp(name), **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# ---- a REAL Kubernetes control plane (tests/kube_control_plane.py, tests/node_sim.py) ----------
# (imported here, not at the top, so this section stays one appended block)
from kube_control_plane import ControlPlane, KubeBinariesMissingError
from kube_control_plane import find_binaries as find_kube_binaries
from node_sim import NodeSimulator


@pytest.fixture(scope="session")
def kube_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real etcd + kube-apiserver + controller-manager + scheduler per test session
    (``kube_control_plane.ControlPlane``: ``.kubeconfig``, ``.kubeconfig_for("nobody")``,
    ``.api_client()``, ``.kubectl(...)``, ``.create_namespace(name)``). Binaries come from
    ``KUBEBUILDER_ASSETS``: without them the tests skip, or fail when ``CI`` is set."""
    try:
        find_kube_binaries()
    except KubeBinariesMissingError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the Kubernetes tests need a real control plane: {exc}", pytrace=False)
        pytest.skip(
            "no Kubernetes control-plane binaries: run `../shared/k8s/install.sh .cache/k8s/bin` "
            "then `KUBEBUILDER_ASSETS=.cache/k8s/bin` (scripts/test.sh does it)"
        )
    plane = ControlPlane(tmp_path_factory.mktemp("kube"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def kube_namespace(kube_control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh Namespace (its ServiceAccount ``default`` exists) per test; deletion is asked
    for afterwards and not waited for."""
    import re
    import secrets

    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = kube_control_plane.create_namespace(f"{stem or 't'}-{secrets.token_hex(3)}")
    try:
        yield name
    finally:
        kube_control_plane.delete_namespace(name)


@pytest.fixture
def node_sim(kube_control_plane: ControlPlane) -> Iterator[Callable[..., NodeSimulator]]:
    """``start(nodes=1, gpus=4, **options) -> node_sim.NodeSimulator``: simulated GPU nodes,
    Ready and schedulable on return, playing the kubelet for their pods; stopped and their
    Nodes deleted after the test. ``options`` are NodeSimulator's (start_delay, run_seconds,
    shutdown_seconds, exit_code, labels, taints, ...)."""
    sims: list[NodeSimulator] = []

    def start(nodes: int = 1, gpus: int = 4, **options: object) -> NodeSimulator:
        sim = NodeSimulator(kube_control_plane.kubeconfig, nodes, gpus=gpus, **options)
        sims.append(sim)
        return sim.start()

    yield start
    for sim in sims:
        sim.stop(delete_nodes=True)


# ---- a REAL Kueue controller manager (tests/kueue_manager.py) on that control plane ----------
from kueue_manager import KueueManager, KueueMissingError, find_kueue  # noqa: E402


@pytest.fixture(scope="session")
def kueue(kube_control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[KueueManager]:
    """Kueue's real controller manager (``../shared/kueue``) on the session's control plane,
    with its CRDs installed. Without the binary or the CRDs the tests skip, or fail when
    ``CI`` is set."""
    try:
        find_kueue()
    except KueueMissingError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the Kueue tests need a real Kueue: {exc}", pytrace=False)
        pytest.skip(str(exc))
    manager = KueueManager(kube_control_plane, tmp_path_factory.mktemp("kueue")).start()
    try:
        yield manager
    finally:
        manager.stop()


# ---- a REAL PostgreSQL server (tests/pg_server.py): postgres_url, fresh_postgres_url -----------
from pg_server import fresh_postgres_url, postgres_server, postgres_url  # noqa: E402, F401
