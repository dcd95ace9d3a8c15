"""Pure logic: no database."""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta

import pytest

from jobqueue.core.backoff import IdleBackoff, retry_delay
from jobqueue.core.db import resolve_url
from jobqueue.core.doctor import Verdict, check_server, clock_verdict
from jobqueue.core.errors import UnsupportedDatabase
from jobqueue.core.logs import RateLimited, event
from jobqueue.core.models import EmptyClaim, EmptyClaimReport
from jobqueue.core.preflight import BinlogSettings, binlog_refusal, check_version, parse_version, writable_refusal


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


@pytest.mark.parametrize(
    "text, flavour, version, ok",
    [
        ("10.11.19-MariaDB-0+deb12u1", "mariadb", (10, 11, 19), True),
        ("5.5.5-10.6.12-MariaDB-log", "mariadb", (10, 6, 12), True),
        ("10.5.23-MariaDB", "mariadb", (10, 5, 23), False),
        ("8.0.36", "mysql", (8, 0, 36), True),
        ("8.0.0-dmr", "mysql", (8, 0, 0), False),
        ("5.7.44-log", "mysql", (5, 7, 44), False),
    ],
)
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


@pytest.mark.parametrize(
    "log_bin, session, server, refused",
    [
        (True, "STATEMENT", "STATEMENT", True),
        (True, "ROW", "STATEMENT", True),  # new sessions would log statements
        (True, "MIXED", "MIXED", False),
        (True, "ROW", "ROW", False),
        (False, "STATEMENT", "STATEMENT", False),  # nothing is logged (doctor: warning)
    ],
)
def test_statement_binlogs_are_refused_only_while_logging(log_bin, session, server, refused):
    reason = binlog_refusal(BinlogSettings(log_bin, session, server))
    assert (reason is not None) == refused
    if refused:
        assert "statement-based" in reason


def test_any_read_only_flag_means_a_replica():
    assert writable_refusal({"read_only": False, "innodb_read_only": False}) is None
    assert "super_read_only is ON" in writable_refusal({"read_only": False, "super_read_only": True})


@pytest.mark.parametrize(
    "skew, verdict",
    [
        (0.0, Verdict.OK),
        (1.9, Verdict.OK),
        (-2.5, Verdict.WARNING),
        (14.9, Verdict.WARNING),
        (15.1, Verdict.PROBLEM),
        (-600, Verdict.PROBLEM),
    ],
)
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


def test_lease_lost_flag_acts_as_an_event():
    import threading
    import time

    from jobqueue.core.tasks import LeaseLost

    flag = LeaseLost()
    assert not flag.is_set() and flag.wait(0.01) is False
    flag.set()
    assert flag.is_set() and flag.wait(0) is True and flag.wait() is True
    waiting = LeaseLost()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(waiting.wait(10)))
    waiter.start()
    time.sleep(0.05)
    waiting.set()
    waiter.join(5)
    assert woke == [True]


def test_a_batch_of_events_is_written_as_one_line_each_like_single_events():
    import io
    import logging

    from jobqueue.core.logs import EventFormatter, event, events

    def written(log_call, fmt="%(levelname)s %(name)s %(message)s") -> list[str]:
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(EventFormatter(fmt))
        logger = logging.getLogger("jobqueue.test_batch")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            log_call(logger)
        finally:
            logger.removeHandler(handler)
        return out.getvalue().splitlines()

    each = [{"job_id": 1, "task_key": "a b", "seconds": "0.001"}, {"job_id": 2, "task_key": "c", "seconds": None}]
    batch = written(lambda lg: events(lg, logging.INFO, "complete", each))
    single = written(lambda lg: [event(lg, logging.INFO, "complete", **fields) for fields in each])
    assert (
        batch
        == single
        == [
            'INFO jobqueue.test_batch event=complete job_id=1 task_key="a b" seconds=0.001',
            "INFO jobqueue.test_batch event=complete job_id=2 task_key=c",
        ]
    )
    assert written(lambda lg: events(lg, logging.INFO, "complete", [])) == []
    # The message anywhere in the format; values quoted where a space, quote, =, tab, CR or LF
    # (or nothing) would break a `key=value` split.
    odd = [{"a": "", "b": 'x"y', "c": "k=v", "d": "t\tu", "e": "l\nm", "f": "r\rs"}, {"a": "plain", "b": 3}]
    fmt = "[%(message)s] %(levelname)s"
    batch = written(lambda lg: events(lg, logging.INFO, "odd", odd), fmt)
    single = written(lambda lg: [event(lg, logging.INFO, "odd", **fields) for fields in odd], fmt)
    assert (
        batch
        == single
        == ['[event=odd a="" b="x\\"y" c="k=v" d="t\tu" e="l\\nm" f="r\\rs"] INFO', "[event=odd a=plain b=3] INFO"]
    )


def test_the_listener_writes_every_line_in_order_and_flush_writes_the_rest():
    """The logging listener thread writes records in batches, pausing between them; flush()
    (at exit) writes whatever is still queued. Run in a child interpreter: the listener is the
    process's own."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import io, logging, sys, threading
        from jobqueue.core import logs
        out = io.StringIO()
        logs.setup("INFO", stream=out)
        log = logging.getLogger("jobqueue.t")
        def burst(n):
            for i in range(200):
                logs.event(log, logging.INFO, "line", thread=n, i=i)
        threads = [threading.Thread(target=burst, args=(n,)) for n in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        logs.events(log, logging.INFO, "batch", [{"i": i} for i in range(5)])
        logs.flush()
        sys.stdout.write(out.getvalue())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 605
    for n in range(3):
        mine = [line for line in lines if f"event=line thread={n} " in line]
        assert [int(line.rsplit("i=", 1)[1]) for line in mine] == list(range(200))
    assert [line.split(" INFO jobqueue.t ")[1] for line in lines[-5:]] == [f"event=batch i={i}" for i in range(5)]


@pytest.mark.parametrize(
    "payload, read_back",
    [
        ({"n": 1, "f": 2.5, "s": "café", "none": None, "yes": True, "list": [1, {"a": [2]}]}, None),  # as given
        ({"pair": (1, 2)}, {"pair": [1, 2]}),
        ({7: "seven"}, {"7": "seven"}),
        ({"nested": {"deep": [(1,)]}}, {"nested": {"deep": [[1]]}}),
        ({"flag": False, "zero": 0, "big": 10**30}, None),
    ],
)
def test_a_checked_payload_is_what_the_handler_reads_back(payload, read_back):
    """check_payload keeps a payload that JSON gives back unchanged (no copy to make) and gives the
    decoded stored text otherwise: a tuple comes back a list, an int key a str key."""
    import json

    from jobqueue.core.validation import checked_payload

    checked, stored = checked_payload(payload, 1 << 20)
    assert stored == json.dumps(payload)
    assert checked == json.loads(stored) == (payload if read_back is None else read_back)
    assert [type(v) for v in checked.values()] == [type(v) for v in json.loads(stored).values()]


def test_a_lease_past_its_local_deadline_never_starts():
    """Issue 25: a prefetched job whose lease may have expired in the database (no renewal got
    through) does not start its handler, even before the renewer's clock marked it lost."""
    from jobqueue.core.models import ClaimedJob, Job, Lease, Status
    from jobqueue.core.tasks import JobContext
    from jobqueue.core.worker.leases import LeaseKeeper, LeaseState

    now = [100.0]
    keeper = LeaseKeeper(10.0, clock=lambda: now[0], margin=1.0)
    job = Job(
        id=1,
        task_key="k",
        task_name="noop",
        queue="default",
        priority=0,
        payload={},
        status=Status.RUNNING,
        attempts=1,
        max_attempts=3,
        lease_owner="w:1",
    )
    ctx = JobContext(
        job_id=1,
        task_key="k",
        task_name="noop",
        queue="default",
        attempt=1,
        max_attempts=3,
        worker_id="w:1",
        _record_result=lambda result: True,
    )
    early = keeper.hold(ClaimedJob(job=job, lease=Lease(1, "w:1", 1)), 1, ctx, sent_at=100.0)
    late = keeper.hold(ClaimedJob(job=job, lease=Lease(1, "w:1", 2)), 2, ctx, sent_at=100.0)
    now[0] = 108.9
    assert keeper.start(early) and early.state is LeaseState.RUNNING
    now[0] = 109.0  # sent_at + lease - margin
    assert not keeper.start(late) and late.state is LeaseState.WAITING


def test_automatic_prefetch_by_the_average_job_time():
    """Issue 29: none before a job finished or while jobs take 0.1 s or more; one per thread
    while they take milliseconds; as many as keep the last job in hand waiting about 5 ms, up to
    the bound, while they take microseconds."""
    from jobqueue.core.worker.claimer import auto_prefetch
    from jobqueue.core.worker.config import WorkerConfig

    most = WorkerConfig(concurrency=4).max_prefetch
    assert most == 60
    assert WorkerConfig(concurrency=64).max_prefetch == 64
    assert WorkerConfig(concurrency=4, prefetch=3).max_prefetch == 3
    assert [auto_prefetch(4, most, a) for a in (None, 0.5, 0.1, 0.05, 0.002, 0.001, 0.0005, 0.00001, 0.0)] == [
        0,
        0,
        0,
        4,
        4,
        5,
        10,
        60,
        60,
    ]
