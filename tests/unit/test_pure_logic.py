"""Pure logic: no database."""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta

import pytest

from webapp.core.backoff import IdleBackoff, retry_delay
from webapp.core.errors import UnsupportedDatabase
from webapp.core.logs import RateLimited, event
from webapp.core.models import EmptyClaim, EmptyClaimReport
from webapp.core.doctor import Verdict, check_server, clock_verdict
from webapp.core.preflight import BinlogSettings, binlog_refusal, check_version, parse_version, writable_refusal
from webapp.core.db import resolve_url


def test_retry_delay_grows_exponentially_with_jitter_and_a_cap():
    rng = random.Random(1)
    delays = [retry_delay(n, base=1.0, cap=100.0, rng=rng) for n in range(1, 12)]
    for n, d in enumerate(delays[:6], start=1):
        assert 0.5 * 2 ** (n - 1) <= d <= 1.5 * 2 ** (n - 1)
    assert all(d <= 100.0 for d in delays) and delays[-1] >= 50
    assert len({round(retry_delay(3, rng=rng), 6) for _ in range(20)}) > 1  # jittered


def test_idle_backoff_by_kind_of_empty_claim():
    now = datetime(2026, 1, 1)
    b = IdleBackoff(minimum=0.05, cap=2.0, contended=0.02, rng=random.Random(0))
    idle = EmptyClaimReport(EmptyClaim.IDLE, db_now=now)
    sleeps = [b.next(idle) for _ in range(10)]
    assert sleeps[0] < 0.06 and all(a < b for a, b in zip(sleeps[:5], sleeps[1:5])) and max(sleeps) <= 2.0
    assert 1.4 <= sleeps[-1] <= 2.0
    contended = EmptyClaimReport(EmptyClaim.CONTENDED, skipped=3, db_now=now)
    streak = [b.next(contended) for _ in range(8)]
    assert streak[0] < 0.05 and 0.25 <= streak[-1] <= 0.75  # soon, then less eager while rows stay held
    waiting = EmptyClaimReport(EmptyClaim.WAITING, next_lease_expiry=now + timedelta(seconds=1.2), db_now=now)
    b.reset()
    assert 1.2 <= b.next(waiting) <= 2.0  # sleeps until about the next expiry
    soon = EmptyClaimReport(EmptyClaim.IDLE, next_scheduled=now + timedelta(seconds=0.3), db_now=now)
    b2 = IdleBackoff(minimum=0.05, cap=2.0)
    for _ in range(10):
        b2.next(idle)
    assert b2.next(soon) <= 0.3  # a retry coming due cuts the sleep short


@pytest.mark.parametrize("text, flavour, version, ok", [
    ("10.11.19-MariaDB-0+deb12u1", "mariadb", (10, 11, 19), True),
    ("5.5.5-10.6.12-MariaDB-log", "mariadb", (10, 6, 12), True),
    ("10.5.23-MariaDB", "mariadb", (10, 5, 23), False),
    ("8.0.36", "mysql", (8, 0, 36), True),
    ("8.0.0-dmr", "mysql", (8, 0, 0), False),
    ("5.7.44-log", "mysql", (5, 7, 44), False),
])
def test_server_versions(text, flavour, version, ok):
    info = parse_version(text)
    assert (info.flavour, info.version) == (flavour, version)
    if ok:
        check_version(info)
    else:
        with pytest.raises(UnsupportedDatabase, match="SKIP LOCKED"):
            check_version(info)


def test_old_server_is_a_doctor_problem_with_the_same_reason_a_worker_gives():
    old = parse_version("10.5.23-MariaDB")
    check = check_server(old)
    assert check.verdict is Verdict.PROBLEM and "MariaDB 10.6" in check.detail and check.advice
    with pytest.raises(UnsupportedDatabase) as refused:
        check_version(old)
    assert str(refused.value) == check.detail
    assert check_server(parse_version("8.0.1")).verdict is Verdict.OK


@pytest.mark.parametrize("log_bin, session, server, refused", [
    (True, "STATEMENT", "STATEMENT", True),
    (True, "ROW", "STATEMENT", True),       # new sessions would log statements
    (True, "MIXED", "MIXED", False),
    (True, "ROW", "ROW", False),
    (False, "STATEMENT", "STATEMENT", False),  # nothing is logged (doctor: warning)
])
def test_statement_binlogs_are_refused_only_while_logging(log_bin, session, server, refused):
    reason = binlog_refusal(BinlogSettings(log_bin, session, server))
    assert (reason is not None) == refused
    if refused:
        assert "statement-based" in reason


def test_any_read_only_flag_means_a_replica():
    assert writable_refusal({"read_only": False, "innodb_read_only": False}) is None
    assert "super_read_only is ON" in writable_refusal({"read_only": False, "super_read_only": True})


@pytest.mark.parametrize("skew, verdict", [
    (0.0, Verdict.OK), (1.9, Verdict.OK), (-2.5, Verdict.WARNING), (14.9, Verdict.WARNING),
    (15.1, Verdict.PROBLEM), (-600, Verdict.PROBLEM),
])
def test_clock_thresholds(skew, verdict):
    assert clock_verdict(skew) is verdict


def test_log_lines_are_greppable_key_values(caplog):
    log = logging.getLogger("t")
    with caplog.at_level(logging.INFO):
        event(log, logging.INFO, "claim", job_id=7, task_key="a b", error='x="1"\nnext', skipped=None)
    assert caplog.messages == ['event=claim job_id=7 task_key="a b" error="x=\\"1\\"\\nnext"']


def test_rate_limited_counts_what_it_held_back():
    r = RateLimited(interval=60)
    assert r.allow("idle") == 0
    assert r.allow("idle") is None and r.allow("idle") is None
    assert r.allow("other") == 0
    r.reset()
    assert r.allow("idle") == 0


def test_database_urls(monkeypatch, tmp_path):
    monkeypatch.delenv("JOBQUEUE_DATABASE_URL", raising=False)
    monkeypatch.setenv("JOBQUEUE_INSTANCE_PATH", str(tmp_path))
    assert resolve_url() == f"sqlite:///{tmp_path}/jobqueue.sqlite3"
    assert resolve_url("mysql://u@h/db") == "mysql+pymysql://u@h/db"
    monkeypatch.setenv("JOBQUEUE_DATABASE_URL", "mariadb://u@h/db")
    assert resolve_url() == "mariadb+pymysql://u@h/db"


@pytest.mark.parametrize("payload, read_back", [
    ({"n": 1, "f": 2.5, "s": "café", "none": None, "yes": True, "list": [1, {"a": [2]}]}, None),   # as given
    ({"pair": (1, 2)}, {"pair": [1, 2]}),
    ({7: "seven"}, {"7": "seven"}),
    ({"nested": {"deep": [(1,)]}}, {"nested": {"deep": [[1]]}}),
    ({"flag": False, "zero": 0, "big": 10 ** 30}, None),
])
def test_a_checked_payload_is_what_the_handler_reads_back(payload, read_back):
    """check_payload keeps a payload that JSON gives back unchanged (no copy to make) and gives the
    decoded stored text otherwise: a tuple comes back a list, an int key a str key."""
    import json

    from webapp.core.validation import checked_payload

    checked, stored = checked_payload(payload, 1 << 20)
    assert stored == json.dumps(payload)
    assert checked == json.loads(stored) == (payload if read_back is None else read_back)
    assert [type(v) for v in checked.values()] == [type(v) for v in json.loads(stored).values()]
