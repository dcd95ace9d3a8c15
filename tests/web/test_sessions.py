"""Sessions end on the server (logout, idle, lifetime, a password change, sign out everywhere),
and the login throttle holds back the guesser, not the owner (issue 12, items 1, 3 and 4)."""

from __future__ import annotations

import sqlalchemy as sa
from werkzeug.security import generate_password_hash

from jobqueue import create_app
from jobqueue.core import metrics
from jobqueue.core.schema import audit_log, login_throttle, web_session
from testkit.web import ADMIN_PASSWORD, VIEWER_PASSWORD, app_config, csrf_token, login, users_setting

COOKIE = "jobqueue_session"


def copy_of(app, client):
    """Another browser holding the same cookie (one copied before logout, say)."""
    thief = app.test_client()
    thief.set_cookie(COOKIE, client.get_cookie(COOKIE).value)
    return thief


def signed_in(app, user="alice", password=ADMIN_PASSWORD, addr="127.0.0.1"):
    c = app.test_client()
    c.environ_base["REMOTE_ADDR"] = addr
    assert login(c, user, password).status_code == 302
    return c


def sign_out(client):
    return client.post("/logout", data={"csrf_token": csrf_token(client)})


def test_a_cookie_copied_before_logout_is_refused_after_it(app, engine):
    c = signed_in(app)
    thief = copy_of(app, c)
    assert thief.get("/").status_code == 200
    assert sign_out(c).status_code == 302
    assert thief.get("/").status_code == 302 and thief.get("/jobs").headers["Location"].startswith("/login")
    # An action with the copied cookie and its (valid) CSRF token is refused too.
    token_client = copy_of(app, c)
    assert token_client.post("/jobs/bulk", data={"confirm": "yes"}, headers={"HX-Request": "true"}).status_code in (
        400,
        401,
    )
    with engine.connect() as conn:
        (row,) = conn.execute(sa.select(web_session.c.user_name, web_session.c.end_reason)).all()
    assert tuple(row) == ("alice", "logout")


def test_a_second_app_on_the_same_database_sees_the_logout(mysql_url):
    first, second = create_app(app_config(mysql_url)), create_app(app_config(mysql_url))
    try:
        c = signed_in(first)
        elsewhere = copy_of(second, c)
        assert elsewhere.get("/").status_code == 200
        sign_out(c)
        assert elsewhere.get("/").status_code == 302
    finally:
        for a in (first, second):
            a.extensions["jobqueue"].engine.dispose()


def test_idle_sessions_and_old_sessions_end(app, engine):
    idle, old, fresh = signed_in(app), signed_in(app), signed_in(app)
    with engine.begin() as conn:
        rows = conn.execute(sa.select(web_session.c.id).order_by(web_session.c.created_at)).scalars().all()
        conn.execute(
            sa.update(web_session)
            .where(web_session.c.id == rows[0])
            .values(last_seen_at=sa.func.utc_timestamp(6) - sa.text("INTERVAL 61 MINUTE"))
        )
        conn.execute(
            sa.update(web_session)
            .where(web_session.c.id == rows[1])
            .values(created_at=sa.func.utc_timestamp(6) - sa.text("INTERVAL 721 MINUTE"))
        )
    assert idle.get("/").status_code == 302
    assert old.get("/").status_code == 302
    assert fresh.get("/").status_code == 200
    with engine.connect() as conn:
        reasons = dict(conn.execute(sa.select(web_session.c.id, web_session.c.end_reason)).all())
    assert (reasons[rows[0]], reasons[rows[1]], reasons[rows[2]]) == ("idle", "expired", None)


def test_the_limits_are_settings(mysql_url):
    app = create_app(app_config(mysql_url, SESSION_IDLE_MINUTES="5", SESSION_MAX_HOURS="1"))
    try:
        settings = app.extensions["jobqueue"].settings
        assert (settings.session_idle_seconds, settings.session_max_seconds) == (300, 3600)
        assert app.permanent_session_lifetime.total_seconds() == 3600
        c = signed_in(app)
        with app.extensions["jobqueue"].engine.begin() as conn:
            conn.execute(
                sa.update(web_session).values(last_seen_at=sa.func.utc_timestamp(6) - sa.text("INTERVAL 6 MINUTE"))
            )
        assert c.get("/").status_code == 302
    finally:
        app.extensions["jobqueue"].engine.dispose()


def test_a_password_change_ends_the_old_sessions(mysql_url):
    before = create_app(app_config(mysql_url))
    changed_users = users_setting().replace(
        users_setting().split(";")[0].split(":", 2)[2], generate_password_hash("new-password-2")
    )
    after = create_app(app_config(mysql_url, USERS=changed_users))
    try:
        c = signed_in(before)
        victor = signed_in(before, "victor", VIEWER_PASSWORD)
        assert copy_of(after, victor).get("/").status_code == 200  # victor's password did not change
        assert copy_of(after, c).get("/").status_code == 302
        assert c.get("/").status_code == 302  # ended for good, in the old process too
        assert signed_in(after, "alice", "new-password-2").get("/").status_code == 200
    finally:
        for a in (before, after):
            a.extensions["jobqueue"].engine.dispose()


def test_sign_out_everywhere(app, engine):
    alice_1, alice_2 = signed_in(app), signed_in(app)
    victor_1, victor_2 = signed_in(app, "victor", VIEWER_PASSWORD), signed_in(app, "victor", VIEWER_PASSWORD)
    page = alice_1.get("/sessions").get_data(as_text=True)
    assert page.count("<tr><td>") == 4 and "Sign out every user everywhere" in page
    # A viewer may end their own sessions only.
    assert victor_1.post("/sessions/end", data={"scope": "all", "csrf_token": csrf_token(victor_1)}).status_code == 403
    assert victor_1.post("/sessions/end", data={"scope": "mine", "csrf_token": csrf_token(victor_1)}).status_code == 302
    assert victor_2.get("/").status_code == 302 and alice_2.get("/").status_code == 200
    # An admin ends everyone's, their own included.
    victor_3 = signed_in(app, "victor", VIEWER_PASSWORD)
    ended = alice_1.post("/sessions/end", data={"scope": "all", "csrf_token": csrf_token(alice_1)})
    assert ended.status_code == 302 and ended.headers["Location"].startswith("/login")
    assert all(c.get("/").status_code == 302 for c in (alice_1, alice_2, victor_3))
    with engine.connect() as conn:
        audits = conn.execute(sa.select(audit_log.c.actor, audit_log.c.action, audit_log.c.count)).all()
    assert [tuple(a) for a in audits] == [("web:victor", "sign_out_all", 2), ("web:alice", "sign_out_all", 3)]


def test_an_admin_ends_one_users_sessions(app):
    alice, victor = signed_in(app), signed_in(app, "victor", VIEWER_PASSWORD)
    response = alice.post("/sessions/end", data={"scope": "user", "user": "victor", "csrf_token": csrf_token(alice)})
    assert response.status_code == 302 and response.headers["Location"] == "/sessions"
    assert victor.get("/").status_code == 302 and alice.get("/").status_code == 200
    assert (
        alice.post(
            "/sessions/end", data={"scope": "user", "user": "nobody", "csrf_token": csrf_token(alice)}
        ).status_code
        == 400
    )


def test_cookies_from_before_server_sessions_are_refused(app):
    # A cookie signed with the right secret but with no server-side session (the old format).
    c = app.test_client()
    with c.session_transaction() as s:
        s["user"] = "alice"
    assert c.get("/").status_code == 302
    with c.session_transaction() as s:
        s["user"], s["sid"] = "alice", "made-up-token"
    assert c.get("/").status_code == 302


# --- the throttle --------------------------------------------------------------------------------


def attempt(app, user, password, addr):
    c = app.test_client()
    c.environ_base["REMOTE_ADDR"] = addr
    return login(c, user, password)


def test_the_guesser_is_throttled_not_the_owner(app):
    codes = [attempt(app, "alice", "guess", "10.0.0.3").status_code for _ in range(12)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
    assert attempt(app, "alice", ADMIN_PASSWORD, "10.0.0.4").status_code == 302
    more = [attempt(app, "alice", ADMIN_PASSWORD if i % 2 else "guess", "10.0.0.3") for i in range(12)]
    assert {r.status_code for r in more} == {429}
    waits = [int(r.headers["Retry-After"]) for r in more]
    assert waits == sorted(waits) and waits[-1] > waits[0]  # the wait grows with every attempt


def test_an_address_spraying_user_names_is_throttled_with_bounded_rows(app, engine):
    throttled_before = _throttled("address")
    codes = [attempt(app, f"user-{i}", "guess", "10.0.0.9").status_code for i in range(60)]
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(login_throttle)).scalar()
    assert rows == 21  # the address and the 20 names it could try; no more
    assert _throttled("address") - throttled_before == 40
    # Another address is not affected.
    assert attempt(app, "alice", ADMIN_PASSWORD, "10.0.0.10").status_code == 302


def test_ipv6_clients_are_throttled_by_their_64(app):
    codes = [attempt(app, f"u{i}", "guess", f"2001:db8:1:2::{i + 1:x}").status_code for i in range(22)]
    assert codes[:20] == [401] * 20 and codes[20:] == [429, 429]
    assert attempt(app, "alice", ADMIN_PASSWORD, "2001:db8:1:3::1").status_code == 302


def test_throttle_rows_expire_and_are_pruned(app, engine):
    for _ in range(6):
        attempt(app, "alice", "guess", "10.0.0.5")
    assert attempt(app, "alice", ADMIN_PASSWORD, "10.0.0.5").status_code == 429
    with engine.begin() as conn:
        conn.execute(
            sa.update(login_throttle).values(
                blocked_until=None, expires_at=sa.func.utc_timestamp(6) - sa.text("INTERVAL 1 SECOND")
            )
        )
    assert attempt(app, "alice", ADMIN_PASSWORD, "10.0.0.5").status_code == 302
    app.extensions["jobqueue"].sign_in_pruned_at = 0.0
    with engine.begin() as conn:
        conn.execute(
            sa.update(login_throttle).values(expires_at=sa.func.utc_timestamp(6) - sa.text("INTERVAL 1 SECOND"))
        )
    attempt(app, "nobody", "x", "10.0.0.6")  # prunes, then counts this one
    with engine.connect() as conn:
        assert conn.execute(sa.select(login_throttle.c.scope).order_by(login_throttle.c.scope)).scalars().all() == [
            "address",
            "address_user",
        ]


def _throttled(limit: str) -> float:
    for family in metrics.LOGINS_THROTTLED.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("limit") == limit:
                return sample.value
    return 0.0
