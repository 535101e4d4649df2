"""The job API's read routes on a REAL uvicorn server: tonight's plan, the idle windows, the
forecast as data and the monthly reports, from the sample history replayed at a fixed moment
(Wed 2026-01-28 17:00 in Seoul) and a store with queued units of two teams; and
`idlegpu plan --server`."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pandas as pd
import pytest
import yaml
from api_server import IMAGE, ApiServer, Client, MovableClock

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
from idlegpu.scheduler.api.auth import new_token, token_sha256
from idlegpu.scheduler.api.forecasts import Forecasts
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.server import create_server

REPO = Path(__file__).resolve().parents[1]
HISTORY = REPO / "data/sample/history.parquet"
CONFIG = REPO / "idlegpu.yaml"
NOW = datetime.fromisoformat("2026-01-28T17:00:00+09:00")


def request(name: str, team: str, gpus: int, hours: float = 2.0) -> dict:
    return {"name": name, "team": team, "kind": "sft", "image": IMAGE, "gpus": gpus,
            "runtime_estimate": f"{hours:g}h", "command": ["python", "train.py"]}


@dataclass
class Env:
    url: str
    store: JobStore
    forecasts: Forecasts
    clock: MovableClock
    alice: Client  # alignment, member
    victor: Client  # vision, viewer
    anonymous: Client
    units: dict[str, str]  # request name -> its unit id
    alice_token: str
    reports: Path


def settings_for(reports: Path):
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    data.setdefault("daemon", {})["reports_dir"] = str(reports)
    return load_config(data=data)


def token(store: JobStore, name: str, team: str, role: str) -> str:
    secret = new_token()
    store.create_api_token(name, team, role, token_sha256(secret), NOW, None, AuditEntry(
        at=NOW, actor="test", auth="cli", role="operator", team=None, action="token.create",
        target=name))
    return secret


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("api_plan")
    reports = root / "reports"
    month = reports / "2026-01"
    month.mkdir(parents=True)
    (month / "report-2026-01.md").write_text("# GPU harvest, January 2026\n\n12,345 useful "
                                             "GPU-hours\n", encoding="utf-8")
    (month / "report-2026-01.html").write_text("<h1>GPU harvest, January 2026</h1>",
                                               encoding="utf-8")
    (month / "summary.csv").write_text("month,useful_gpu_hours\n2026-01,12345\n",
                                       encoding="utf-8")
    (root / "secret.md").write_text("not a report", encoding="utf-8")
    settings = settings_for(reports)
    store = JobStore(f"sqlite:///{root / 'plan.db'}")
    clock = MovableClock(NOW)
    forecasts = Forecasts(settings, read_history(HISTORY))
    server = ApiServer(create_server(settings, store, clock=clock, forecasts=forecasts)).start()
    alice_token = token(store, "alice", "alignment", "member")
    vera = Client(server.url, token(store, "vera", "vision", "member"))
    alice = Client(server.url, alice_token)
    victor = Client(server.url, token(store, "victor", "vision", "viewer"))
    units = {}
    for client, body in ((alice, request("fits-tonight", "alignment", 16)),
                         (alice, request("small", "alignment", 4, 1.0)),
                         (vera, request("never-fits", "vision", 64))):
        answer = client.post("/v1/requests", json=body)
        assert answer.status_code == 201, answer.text
        units[body["name"]] = answer.json()["unit_ids"][0]
    too_big = vera.post("/v1/requests", json=request("too-big", "vision", 200))
    assert too_big.status_code == 422, too_big.text  # refused at submit: 200 > 64 per job
    assert "gpus" in too_big.json()["error"]["message"]
    vera.close()
    yield Env(server.url, store, forecasts, clock, alice, victor, Client(server.url), units,
              alice_token, reports)
    for client in (alice, victor):
        client.close()
    server.stop()
    store.close()


def test_the_plan_names_a_start_for_what_fits_and_a_reason_for_what_cannot(env):
    started = time.perf_counter()
    answer = env.victor.get("/v1/plan", params={"hours": 24})  # a viewer may read
    cold = time.perf_counter() - started
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["made_at"] == NOW.isoformat() and plan["forecast_age_s"] == 0
    assert plan["start"] == NOW.isoformat() and plan["timezone"] == "Asia/Seoul"
    units = {u["id"]: u for u in plan["units"]}
    fits = units[env.units["fits-tonight"]]
    assert fits["state"] == "planned" and fits["gpus"] == 16 and fits["team"] == "alignment"
    start = datetime.fromisoformat(fits["start_at"])
    assert NOW <= start < datetime.fromisoformat("2026-01-29T08:00:00+09:00")
    assert start.utcoffset().total_seconds() == 9 * 3600  # ISO 8601 with the pool's offset
    assert datetime.fromisoformat(fits["end_at"]) > start
    never = units[env.units["never-fits"]]
    assert never["state"] == "waiting" and never["start_at"] is None
    # the reason covers the whole horizon, not only its last moment
    assert never["reason"].startswith("needs 64 GPUs;")
    assert "at most 50 in the next 24 h" in never["reason"], never["reason"]
    assert "no 64-GPU window opens" in never["reason"]
    assert plan["starting"] >= 2 and plan["waiting"] == 1
    # the free-GPU profile at the confidence, and the windows
    profile = plan["profile"]
    assert len(profile) == 288 and profile[0]["at"] == NOW.isoformat()
    assert max(p["free_gpus"] for p in profile) == 50
    assert plan["windows"] and all(w["confidence"] == 0.9 for w in plan["windows"])
    warm_started = time.perf_counter()
    again = env.alice.get("/v1/plan").json()
    warm = time.perf_counter() - warm_started
    assert again["made_at"] == plan["made_at"] and again["units"] == plan["units"]
    assert env.forecasts.refreshes == 1  # the second call did not refit
    print(f"\nplan route: cold {cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms")


def test_a_unit_shows_its_plan(env):
    fits = env.alice.get(f"/v1/units/{env.units['fits-tonight']}").json()
    assert fits["plan"]["start_at"] is not None and fits["plan"]["reason"]
    never = env.victor.get(f"/v1/units/{env.units['never-fits']}").json()
    assert never["plan"]["start_at"] is None
    assert "no 64-GPU window opens" in never["plan"]["reason"]
    assert env.forecasts.refreshes == 1


def test_windows_and_forecast_agree_with_idlegpu_windows(env, cli, tmp_path):
    answer = env.alice.get("/v1/windows", params={"hours": 48, "min_hours": 1,
                                                  "granularity": 4})
    assert answer.status_code == 200, answer.text
    windows = answer.json()
    assert windows["made_at"] == NOW.isoformat()
    # the CLI at the same moment: history up to 16:55, the forecast from 17:00
    code, _, err = cli(["windows", "--history", str(HISTORY), "--config", str(CONFIG),
                        "--now", "2026-01-28T16:55:00+09:00", "--horizon", "48h",
                        "--out", str(tmp_path)])
    assert code == 0, err
    table = pd.read_csv(tmp_path / "windows.csv")
    expect = [(pd.Timestamp(r.start), pd.Timestamp(r.end), int(r.gpus)) for r in
              table.itertuples()]
    got = [(pd.Timestamp(w["start"]), pd.Timestamp(w["end"]), w["gpus"])
           for w in windows["windows"]]
    assert got == expect and len(got) >= 5
    for w in windows["windows"]:
        assert datetime.fromisoformat(w["start"]).utcoffset() is not None

    forecast = env.victor.get("/v1/forecast", params={"hours": 48}).json()
    assert forecast["made_at"] == NOW.isoformat() and forecast["widened"] == {}
    free = forecast["free"]
    assert len(free["times"]) == len(free["gpus"]) == 576 and free["times"][0] == NOW.isoformat()
    assert max(free["gpus"]) == max(w["gpus"] for w in windows["windows"]) + 2  # 50 in 4s: 48
    chat = forecast["services"]["chat"]
    assert chat["planned_quantile"] == 0.9 and not chat["widened"]
    assert set(chat["replicas"]) == {"q0.5", "q0.9"} and len(chat["replicas"]["q0.9"]) == 576
    assert all(m <= h for m, h in zip(chat["replicas"]["q0.5"], chat["replicas"]["q0.9"],
                                      strict=True))
    # the promise is the refresh's (the joint scenarios of the services, the config's
    # pool_uncertainty), never below the pool minus headroom minus each service's q0.9 x its
    # GPUs: adding quantiles assumes the services move in lockstep, the most conservative case
    promised = env.forecasts.provider.last.free
    assert free["gpus"] == pytest.approx([float(promised[pd.Timestamp(t)])
                                          for t in free["times"]], abs=5e-4)  # to 3 decimals
    settings = settings_for(env.reports)
    assert settings.admission.pool_uncertainty == "joint"
    for step, gpus in enumerate(free["gpus"]):
        used = sum(forecast["services"][s.name]["replicas"]["q0.9"][step] * s.gpus_per_replica
                   for s in settings.services)
        assert gpus >= settings.pool.total_gpus - settings.pool.headroom_gpus - used
    assert all(m >= g for m, g in zip(free["median_gpus"], free["gpus"], strict=True))
    assert env.forecasts.refreshes == 1


def test_reports_list_and_fetch_and_refuse_path_tricks(env):
    listed = env.victor.get("/v1/reports").json()
    assert listed["reports"][0]["month"] == "2026-01"
    assert listed["reports"][0]["formats"] == ["md", "html", "csv"]
    md = env.alice.get("/v1/reports/2026-01")
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    assert md.text.startswith("# GPU harvest, January 2026")
    assert env.alice.get("/v1/reports/2026-01", params={"format": "html"}).text.startswith("<h1>")
    csv = env.alice.get("/v1/reports/2026-01", params={"format": "csv"})
    assert csv.headers["content-type"].startswith("text/csv") and "12345" in csv.text
    assert env.alice.get("/v1/reports/2025-12").status_code == 404
    assert env.alice.get("/v1/reports/2026-01", params={"format": "sh"}).status_code == 422
    for trick in ("..%2Fsecret.md", "..", "2026-13", "2026-01%2F..%2F..%2Fsecret",
                  "%2E%2E", "2026-1"):
        answer = env.alice.get(f"/v1/reports/{trick}")
        assert answer.status_code in (404, 422), (trick, answer.status_code)
        assert "not a report" not in answer.text
    assert env.alice.get("/v1/reports/../secret.md").status_code == 404


def test_every_read_route_needs_a_token(env):
    for path in ("/v1/plan", "/v1/windows", "/v1/forecast", "/v1/reports",
                 "/v1/reports/2026-01"):
        answer = env.anonymous.get(path)
        assert answer.status_code == 401, path
        assert set(answer.json()["error"]) == {"message", "field"}
    bad = Client(env.url, "igt_not-a-token")
    assert bad.get("/v1/plan").status_code == 401
    bad.close()


def test_bad_parameters_are_a_422_with_the_field(env):
    answer = env.alice.get("/v1/windows", params={"granularity": 0})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "granularity"
    assert env.alice.get("/v1/plan", params={"hours": 100}).status_code == 422


def test_a_history_past_its_end_is_a_503_never_a_stale_plan(tmp_path):
    settings = settings_for(tmp_path / "reports")
    store = JobStore(f"sqlite:///{tmp_path / 'stale.db'}")
    clock = MovableClock(datetime.fromisoformat("2026-03-30T17:00:00+09:00"))
    frame = read_history(HISTORY)
    frame = frame[frame["ds"] < pd.Timestamp("2026-01-20", tz="UTC")]
    server = ApiServer(create_server(settings, store, clock=clock,
                                  forecasts=Forecasts(settings, frame))).start()
    client = Client(server.url, token(store, "alice", "alignment", "member"))
    try:
        for path in ("/v1/plan", "/v1/windows", "/v1/forecast"):
            answer = client.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert answer.headers["Retry-After"] == "30"
            assert "stale history" in answer.json()["error"]["message"]
        # a request is still validated, its estimate given: only its plan is missing, and why
        answer = client.post("/v1/requests/validate", json=request("checked", "alignment", 8))
        assert answer.status_code == 200, answer.text
        (unit,) = answer.json()["units"]
        assert unit["runtime"]["source"] == "user" and unit["plan"]["start_at"] is None
        assert unit["plan"]["reason"].startswith("no plan now: ") and "stale history" in unit[
            "plan"]["reason"]
        assert answer.json()["plan_made_at"] is None
    finally:
        client.close()
        server.stop()
        store.close()


def test_prometheus_down_is_a_503(tmp_path):
    settings = settings_for(tmp_path / "reports")
    store = JobStore(f"sqlite:///{tmp_path / 'down.db'}")

    def down(start, end):
        from idlegpu.forecast.errors import SourceUnavailableError

        raise SourceUnavailableError("Prometheus at http://localhost:9 refused the connection")

    forecasts = Forecasts(settings, fetch=down)
    server = ApiServer(create_server(settings, store, clock=MovableClock(NOW),
                                  forecasts=forecasts)).start()
    client = Client(server.url, token(store, "alice", "alignment", "member"))
    try:
        answer = client.get("/v1/plan")
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "30"
        assert "could not be read" in answer.json()["error"]["message"]
        assert "refused the connection" in answer.json()["error"]["message"]
        # a queued unit still answers, its plan saying why there is none
        queued = client.post("/v1/requests", json=request("waits", "alignment", 4))
        unit = client.get(f"/v1/units/{queued.json()['unit_ids'][0]}").json()
        assert unit["plan"]["start_at"] is None
        assert unit["plan"]["reason"].startswith("no plan now: the pool's history could not")
        assert forecasts.refreshes == 0 and forecasts.failed is not None
    finally:
        client.close()
        server.stop()
        store.close()


def test_plan_with_server_prints_the_servers_plan(env, cli, monkeypatch):
    monkeypatch.setenv("IDLEGPU_TOKEN", env.alice_token)
    code, out, err = cli(["plan", "--server", env.url])
    assert code == 0, err
    assert "Plan from Wed 2026-01-28 17:00" in out
    flat = re.sub(r"[\s│┃]", "", out)  # table cells fold on a narrow terminal
    assert "fits-tonight-" in out and env.units["never-fits"] in out
    assert "no64-GPUwindowopens" in flat
    assert "2 job unit(s) start" in out and "1 wait" in out
    # the local plan's tables (the newcomer's friction: a plain one here, a boxed one there)
    assert not set("┏┃│┡━╇") & set(out), out
    assert re.search(r"^ job\s+team\s+kind\s+GPUs\s+from\s+until\s+then\s*$", out, re.M), out
    assert re.search(r"^ ─+\s*$", out, re.M), out  # the header's rule, as `plan` draws it
    monkeypatch.setenv("IDLEGPU_SERVER", env.url)
    code, out, _ = cli(["plan", "--horizon", "12h"])
    assert code == 0 and "Plan from Wed 2026-01-28 17:00" in out
    assert env.forecasts.refreshes == 1


def test_the_wait_reason_speaks_for_the_whole_horizon():
    from datetime import UTC, timedelta

    import numpy as np

    from idlegpu.scheduler.plan import plan_ahead
    from idlegpu.scheduler.types import FreeProfile, PolicySettings, RunningJob, WaitingJob

    t0 = datetime(2026, 1, 28, 9, 0, tzinfo=UTC)  # 18:00 in Seoul
    # 2 h of nothing free, then 12 h of 16 free, then nothing
    profile = FreeProfile(t0, 300, np.array([0] * 24 + [16] * 144 + [0] * 120, float), 0.9, t0)

    def unit(id_, gpus, hours, **kw):
        return WaitingJob(id_, "t", gpus, hours * 3600, False, 0, t0 - timedelta(hours=1), **kw)

    queue = [unit("a", 16, 4), unit("b", 16, 4), unit("c", 16, 4), unit("big", 32, 1),
             unit("late", 8, 1, deadline=t0 - timedelta(minutes=1)), unit("more", 16, 8)]
    plan = plan_ahead(t0, profile, queue, PolicySettings(grace_s=600),
                      horizon=timedelta(hours=24), tz=ZoneInfo("Asia/Seoul"))
    reasons = {job.id: reason for job, reason in plan.waiting}
    assert {r.job_id for r in plan.runs} == {"a", "b"}
    # not the last moment's "0 free now": the whole night
    assert reasons["big"] == ("needs 32 GPUs; 0 free now and at most 16 in the next 24 h (at "
                              "Wed 20:00 KST): no 32-GPU window opens")
    assert reasons["c"] == ("needs 16 GPUs for 4.0 h + grace without a stop; the jobs running "
                            "or planned ahead of it take the 16-GPU window of Wed 20:00 KST – "
                            "Thu 08:00 KST, leaving at most 4.0 h (from Thu 04:00 KST)")
    assert reasons["more"].startswith("needs 16 GPUs for 8.0 h + grace without a stop")
    assert reasons["late"] == "its deadline has passed (Wed 2026-01-28 17:59 KST)"
    # a job already running holds the window all night
    held = RunningJob("r", "t", 16, 0, t0 - timedelta(hours=1), False, 30 * 3600, None, None,
                      "training")
    profile = FreeProfile(t0, 300, np.full(300, 16.0), 0.9, t0)
    plan = plan_ahead(t0, profile, [unit("x", 16, 1)], PolicySettings(grace_s=600),
                      running=[held], horizon=timedelta(hours=24), tz=ZoneInfo("Asia/Seoul"))
    (_, reason), = plan.waiting
    assert reason == ("needs 16 GPUs; the pool has 16 free from Wed 18:00 KST, but the jobs "
                      "running or planned ahead of it hold them: at most 0 left in the next 24 h")


def test_validate_previews_each_units_estimate_and_start_as_if_submitted_now(env):
    """POST /v1/requests/validate: per unit the planner's runtime estimate with its source,
    and from tonight's plan with the request's units queued now its estimated start or the
    reason it would wait; nothing is stored."""
    before = len(env.store.find_units())
    plan_before = env.alice.get("/v1/plan").json()
    fits = request("preview-fits", "alignment", 8, 1.0)
    answer = env.alice.post("/v1/requests/validate", json=fits)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["plan_made_at"] == NOW.isoformat() and body["forecast_age_s"] == 0
    (unit,) = body["units"]
    assert unit["runtime"]["source"] == "user"  # no past runs: the user's 1 h times 1.3
    assert unit["runtime"]["seconds"] == pytest.approx(3600 * 1.3)
    assert unit["plan"]["state"] == "planned" and unit["plan"]["reason"]
    start = datetime.fromisoformat(unit["plan"]["start_at"])
    end = datetime.fromisoformat(unit["plan"]["end_at"])
    assert NOW <= start < NOW + pd.Timedelta(hours=24) and start.utcoffset().seconds == 9 * 3600
    assert (end - start).total_seconds() == pytest.approx(3600 * 1.3)
    # it starts where the pool has its 8 GPUs free beside the units planned to run then
    free = {datetime.fromisoformat(s["at"]): s["free_gpus"] for s in plan_before["profile"]}
    beside = sum(u["gpus"] for u in plan_before["units"] if u["start_at"]
                 and datetime.fromisoformat(u["start_at"]) <= start
                 < datetime.fromisoformat(u["end_at"]))
    assert free[start] >= beside + 8
    huge = env.alice.post("/v1/requests/validate",
                          json=request("preview-huge", "alignment", 64)).json()
    (unit,) = huge["units"]
    assert unit["plan"]["state"] == "waiting" and unit["plan"]["start_at"] is None
    assert "no 64-GPU window opens" in unit["plan"]["reason"]
    steps = dict(request("preview-steps", "alignment", 8, 1.0), steps=[
        {"name": "train"}, {"name": "eval", "gpus": 4}])
    (train, evaluate) = env.alice.post("/v1/requests/validate", json=steps).json()["units"]
    assert train["plan"]["state"] == "planned"
    assert evaluate["plan"]["state"] == "blocked" and evaluate["plan"]["start_at"] is None
    ends = datetime.fromisoformat(train["plan"]["end_at"]).strftime("%a %H:%M")
    assert evaluate["plan"]["reason"] == (f"waits for its previous pipeline step (planned to "
                                          f"end by {ends} KST)")
    assert len(env.store.find_units()) == before  # a dry run
    after = env.alice.get("/v1/plan").json()
    assert [u["id"] for u in after["units"]] == [u["id"] for u in plan_before["units"]]
