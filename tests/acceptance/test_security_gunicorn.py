"""Issue 12 against real gunicorn: sessions end everywhere, next= stays home, the throttle holds
back the guesser (clients on their own source addresses) across worker processes, and a held
table lock answers 503 quickly while /login, static files and /healthz still answer."""

from __future__ import annotations

import re
import threading
import time
from urllib.parse import urljoin, urlsplit

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from jobqueue.core import repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.schema import audit_log
from testkit.procs import GunicornServer, wait_until
from testkit.web import ADMIN_PASSWORD, WebClient, server_env

pytestmark = pytest.mark.slow


def test_sessions_and_the_throttle_hold_across_processes(mysql_url, tmp_path):
    engine = create_engine(mysql_url)
    with engine.connect() as conn:
        job_id = service.enqueue(conn, "noop", "copied-cookie").id
        service.fail_job(conn, job_id, "set up", actor="test")
    a = GunicornServer(
        mysql_url, tmp_path, web_workers=2, embedded_workers=0, extra_env=server_env(mysql_url), name="gunicorn-a"
    )
    b = GunicornServer(
        mysql_url, tmp_path, web_workers=1, embedded_workers=0, extra_env=server_env(mysql_url), name="gunicorn-b"
    )
    try:
        owner = WebClient(a.base)
        assert owner.login()[0] == 302
        token = owner.csrf_token("/")
        copies = []
        for server in (a, b):
            copy = WebClient(server.base)
            copy.cookies = dict(owner.cookies)
            assert copy.get("/")[0] == 200  # the same session in both servers
            copies.append(copy)
        assert owner.post("/logout", {"csrf_token": token})[0] == 302
        for copy in copies:
            for _ in range(4):  # whichever gunicorn worker answers
                status, headers, _ = copy.get("/jobs")
                assert status == 302 and headers["location"].startswith("/login"), status
            status, headers, _ = copy.post(f"/jobs/{job_id}/requeue", {"csrf_token": token, "confirm": "yes"})
            assert status in (302, 400) and "login" in headers.get("location", "/login")
        _the_guesser_is_throttled_not_the_owner(a, b)
        with engine.connect() as conn:
            assert repository.reads.get_job(conn, job_id).status.value == "failed"
            assert (
                conn.execute(
                    sa.select(sa.func.count()).select_from(audit_log).where(audit_log.c.actor.like("web:%"))
                ).scalar()
                == 0
            )
    finally:
        assert a.stop() == 0 and b.stop() == 0
        engine.dispose()


HOSTILE_NEXT = [
    "/%09/evil.example",
    "/%5Cevil.example",
    "//evil.example",
    "https:evil.example",
    "/%0d/evil.example",
    "/%0d%0aLocation:%20https://evil.example",
    "%09//evil.example",
    "/%5C%5Cevil.example",
]


def test_next_and_a_held_table_lock(mysql_url, tmp_path):
    server = GunicornServer(mysql_url, tmp_path, web_workers=2, embedded_workers=0, extra_env=server_env(mysql_url))
    try:
        _next_stays_home(server)
        _a_held_table_lock_gives_a_quick_503(server, mysql_url)
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "Traceback" not in log and " 500 " not in log


def _next_stays_home(server):
    for target in HOSTILE_NEXT:
        client = WebClient(server.base, source="127.0.0.2")
        status, headers, _ = client.login(query="?next=" + target)
        assert status == 302, (target, status)
        landed = urlsplit(urljoin(server.base + "/login", headers["location"].strip().replace("\\", "/")))
        assert landed.netloc == urlsplit(server.base).netloc, (target, headers["location"])
    assert WebClient(server.base).login(query="?next=/jobs%3Fstatus%3Dfailed")[1]["location"] == "/jobs?status=failed"


def _the_guesser_is_throttled_not_the_owner(a, b):
    # Guesses alternate between two gunicorn servers (three worker processes): one limit for all.
    servers = [a, b]
    guesser = [WebClient(servers[i % 2].base, source="127.0.0.3").login("alice", "guess")[0] for i in range(12)]
    assert guesser[:5] == [401] * 5 and set(guesser[5:]) == {429}, guesser
    assert WebClient(a.base, source="127.0.0.4").login("alice", ADMIN_PASSWORD)[0] == 302
    assert WebClient(b.base, source="127.0.0.4").login("alice", ADMIN_PASSWORD)[0] == 302
    more = [
        WebClient(servers[i % 2].base, source="127.0.0.3").login("alice", ADMIN_PASSWORD if i % 3 else "guess")
        for i in range(12)
    ]
    assert [m[0] for m in more] == [429] * 12
    waits = [int(m[1]["retry-after"]) for m in more]
    assert waits == sorted(waits) and waits[0] > 0

    # Log lines are written by each process's listener thread, a moment after the request.
    def throttled_lines() -> list[str]:
        return re.findall(r"event=login_throttled user=alice addr=127\.0\.0\.3 limit=address_user", a.log() + b.log())

    wait_until(lambda: len(throttled_lines()) >= 19, timeout=5, message="19 login_throttled lines")
    assert len(throttled_lines()) == 19
    throttled = 0.0
    for server in servers:
        viewer = WebClient(server.base, source="127.0.0.5")
        assert viewer.login("victor", "viewer-password-1")[0] == 302
        text = viewer.get("/metrics")[2]
        m = re.search(r'^jobqueue_logins_throttled_total\{limit="address_user"\} ([0-9.]+)$', text, re.M)
        throttled += float(m.group(1)) if m else 0.0
    assert throttled == 19


def _a_held_table_lock_gives_a_quick_503(server, mysql_url):
    client = WebClient(server.base)
    assert client.login()[0] == 302
    u = make_url(mysql_url)
    holder = pymysql.connect(host=u.host, port=u.port or 3306, user=u.username, database=u.database)
    answers: dict[str, tuple] = {}

    def fetch(name: str, path: str, who: WebClient):
        started = time.monotonic()
        status, headers, _ = who.get(path, timeout=60)
        answers[name] = (status, headers.get("retry-after"), time.monotonic() - started)

    try:
        holder.cursor().execute("LOCK TABLES job_queue WRITE")
        threads = [threading.Thread(target=fetch, args=(f"jobs-{i}", "/jobs", client)) for i in range(4)]
        threads += [
            threading.Thread(target=fetch, args=(p, p, WebClient(server.base)))
            for p in ("/login", "/static/app.css", "/healthz")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        still_held = holder.cursor().execute("SELECT 1") == 1  # the lock was never released meanwhile
    finally:
        holder.close()
    print({k: f"{v[0]} in {v[2]:.2f} s" for k, v in sorted(answers.items())})
    assert still_held and len(answers) == 7
    for i in range(4):
        assert answers[f"jobs-{i}"][:2] == (503, "2"), answers
    assert all(answers[p][0] == 200 for p in ("/login", "/static/app.css", "/healthz")), answers
