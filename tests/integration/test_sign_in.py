"""The sign-in state's SQL on both backends: sessions end, the throttle counts every attempt
exactly once (also when they race), succeeds give an attempt back, and old rows are pruned."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from jobqueue.core import repository
from jobqueue.core.repository.sessions import ThrottleKey, ThrottleRule
from jobqueue.core.schema import login_throttle, web_session

RULE = ThrottleRule("address_user", free=3, first_delay=30.0, max_delay=120.0, forget=600.0)
ADDRESS = ThrottleRule("address", free=5, first_delay=30.0, max_delay=120.0, forget=600.0)


def test_sessions_start_end_and_list(engine):
    with engine.connect() as conn:
        for sid, user in (("s1", "alice"), ("s2", "alice"), ("s3", "victor")):
            repository.sessions.start_session(conn, sid, user_name=user, credential="c", address="10.0.0.1")
        state = repository.sessions.session_state(conn, "s1")
        assert (state.user_name, state.ended_at) == ("alice", None) and 0 <= state.age_seconds < 60
        assert repository.sessions.session_state(conn, "nope") is None
        assert repository.sessions.end_session(conn, "s1", "logout") is True
        assert repository.sessions.end_session(conn, "s1", "logout") is False
        assert repository.sessions.session_state(conn, "s1").end_reason == "logout"
        listed = repository.sessions.list_sessions(conn, idle_seconds=3600, max_seconds=7200)
        assert sorted(s["id"] for s in listed) == ["s2", "s3"]
        assert repository.sessions.end_sessions(conn, actor="test", user_name="victor") == 1
        assert repository.sessions.end_sessions(conn, actor="test") == 1
        assert repository.sessions.list_sessions(conn, idle_seconds=3600, max_seconds=7200) == []
        assert repository.sessions.prune_sign_in(conn, idle_seconds=3600, max_seconds=7200) == 3
        assert conn.execute(sa.select(sa.func.count()).select_from(web_session)).scalar() == 0


def test_throttle_counts_blocks_and_forgives_a_success(engine):
    pair, address = ThrottleKey("pair", RULE), ThrottleKey("addr", ADDRESS)
    with engine.connect() as conn:
        gates = [repository.sessions.login_attempt(conn, [address, pair]) for _ in range(5)]
        assert [g.allowed for g in gates] == [True, True, True, False, False]
        assert gates[3].limit == "address_user" and 30 < gates[3].wait_seconds <= 60
        assert 60 < gates[4].wait_seconds <= 120
        repository.sessions.login_succeeded(conn, [address, pair])
        rows = dict(conn.execute(sa.select(login_throttle.c.id, login_throttle.c.failures)).all())
        assert rows == {"addr": 4}  # the pair starts over, the address gets one back
        assert repository.sessions.login_attempt(conn, [address, ThrottleKey("other", RULE)]).allowed


def test_a_blocked_address_makes_no_new_rows(engine):
    address = ThrottleKey("addr", ADDRESS)
    with engine.connect() as conn:
        for i in range(5):
            assert repository.sessions.login_attempt(conn, [address, ThrottleKey(f"p{i}", RULE)]).allowed
        for i in range(5, 50):
            assert not repository.sessions.login_attempt(conn, [address, ThrottleKey(f"p{i}", RULE)]).allowed
        assert conn.execute(sa.select(sa.func.count()).select_from(login_throttle)).scalar() == 6
        assert conn.execute(sa.select(login_throttle.c.failures).where(login_throttle.c.id == "addr")).scalar() == 50


def test_racing_attempts_are_each_counted(mysql_engine):
    key = ThrottleKey("raced", RULE)
    start = threading.Barrier(8)
    gates = []

    def guess():
        start.wait()
        with mysql_engine.connect() as conn:
            gates.append(repository.sessions.login_attempt(conn, [key]))

    threads = [threading.Thread(target=guess) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(g.allowed for g in gates) == RULE.free
    with mysql_engine.connect() as conn:
        assert conn.execute(sa.select(login_throttle.c.failures)).scalar() == 8
