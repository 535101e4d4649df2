"""Console sessions age on the server's clock (the one that judges token expiry), not on the
wall clock: a server replaying a past moment (``serve --now``) keeps its sessions for
``hours`` of its own time, and a test can move that time by hand."""

from __future__ import annotations

from idlegpu.scheduler.console.session import Sessions


class HandClock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def test_a_session_expires_after_its_hours_on_the_servers_clock():
    clock = HandClock(1_800_000_000.0)  # 2027-01-15, not now: the wall clock is not asked
    sessions = Sessions("secret", hours=8, now=clock)
    session, cookie = sessions.issue(user="me", auth="token", team="t", role="member")
    assert session.expires == clock.at + 8 * 3600
    clock.at += 8 * 3600 - 1
    assert sessions.read(cookie) is not None
    clock.at += 1
    assert sessions.read(cookie) is None


def test_a_login_nonce_ages_on_the_servers_clock():
    clock = HandClock(1_800_000_000.0)
    sessions = Sessions("secret", now=clock)
    nonce = sessions.login_nonce()
    assert sessions.login_nonce_ok(nonce, max_age_s=60)
    clock.at += 61
    assert not sessions.login_nonce_ok(nonce, max_age_s=60)


def test_a_logout_outlives_nothing_on_the_servers_clock():
    clock = HandClock(1_800_000_000.0)
    sessions = Sessions("secret", hours=1, now=clock)
    session, cookie = sessions.issue(user="me", auth="token", team="t", role="member")
    sessions.end(session)
    assert sessions.read(cookie) is None
    clock.at += 2 * 3600  # past its expiry the logout is forgotten, and the cookie is stale
    other, _ = sessions.issue(user="me", auth="token", team="t", role="member")
    sessions.end(other)
    assert session.id not in sessions._ended
