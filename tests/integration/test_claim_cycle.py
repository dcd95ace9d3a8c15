"""The worker's cycle on a real server: its queues' queue_state rows share-locked (one SELECT),
the finished jobs' rows locked and the next jobs picked in one locking SELECT (a UNION ALL of
two), completions and claims in one fenced UPDATE, one COMMIT;
and the same outcomes where a server refuses the UNION and the SELECTs go apart (issue 17)."""

from __future__ import annotations

import importlib
import threading
import time

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service
from jobqueue.core.models import Outcome, Status
from jobqueue.core.schema import job_queue

claim_module = importlib.import_module("jobqueue.core.repository.claim")
claim_sql = importlib.import_module("jobqueue.core.repository.claim_sql")
jq = job_queue.c


def key(lease):
    return lease.job_id, lease.attempt


@pytest.fixture(params=["one statement", "apart"])
def shape(request, monkeypatch):
    """The lock-and-pick as one UNION ALL (MariaDB, MySQL 8.0), or as two SELECTs (what a cycle
    falls back to when the server refuses the UNION)."""
    monkeypatch.setattr(claim_sql.REFUSED, "union", request.param == "apart")
    return request.param


def add(conn, n, prefix="k"):
    return [r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"{prefix}{i}"} for i in range(n)])]


def session_counts(conn) -> dict[str, int]:
    """The statements this connection's session has sent, from the server's own counters (read on
    the driver's cursor, so that SQLAlchemy begins no transaction the cycle would then join)."""
    cursor = conn.connection.dbapi_connection.cursor()
    cursor.execute(
        "SHOW SESSION STATUS WHERE Variable_name IN ('Com_select', 'Com_update', 'Com_commit', 'Com_rollback')"
    )
    return {name.lower(): int(value) for name, value in cursor.fetchall()}


def test_a_cycle_completes_and_claims_with_one_select_one_update_one_commit(mysql_engine, shape):
    with mysql_engine.connect() as conn:
        add(conn, 12)
        first = service.claim_cycle(conn, [f"w:{i}" for i in range(4)], ["default"], lease_seconds=60)
        assert len(first.claimed) == 4
        before = session_counts(conn)
        cycle = service.claim_cycle(
            conn, [], ["default"], lease_seconds=60, completions=[c.lease for c in first.claimed]
        )
        after = session_counts(conn)
    sent = {k: after[k] - before[k] for k in before}
    # One SELECT share-locks the queues' queue_state rows (a pause waits for it), locks the
    # finished rows and picks; apart, those are three.
    assert sent == {
        "com_select": 1 if shape == "one statement" else 3,
        "com_update": 1,
        "com_commit": 1,
        "com_rollback": 0,
    }
    assert set(cycle.completed.values()) == {Outcome.OK} and len(cycle.completed) == 4
    # Each finished job's slot took a new job, under that slot's owner.
    assert sorted(c.lease.owner for c in cycle.claimed) == [f"w:{i}" for i in range(4)]
    with mysql_engine.connect() as conn:
        states = {
            r.id: (r.status, r.lease_owner, r.attempts, r.finished_at is not None, r.lease_until is None)
            for r in conn.execute(
                sa.select(jq.id, jq.status, jq.lease_owner, jq.attempts, jq.finished_at, jq.lease_until)
            )
        }
    for c in first.claimed:
        assert states[c.job.id][0] == "done" and states[c.job.id][3] and states[c.job.id][4]
        assert states[c.job.id][1:3] == (c.lease.owner, 1)  # the finishing lease's owner is kept
    for c in cycle.claimed:
        assert states[c.job.id][:3] == ("running", c.lease.owner, 1) and not states[c.job.id][4]


def test_a_finished_row_held_elsewhere_stays_busy_and_its_slot_takes_nothing(mysql_engine, shape):
    with mysql_engine.connect() as conn:
        add(conn, 10)
        first = service.claim_cycle(conn, ["w:1", "w:2"], ["default"], lease_seconds=60)
        held, free = first.claimed
    stray = mysql_engine.connect()
    try:
        stray.execute(sa.text("SELECT id FROM job_queue WHERE id = :id FOR UPDATE"), {"id": held.job.id})
        with mysql_engine.connect() as conn:
            started = time.monotonic()
            cycle = service.claim_cycle(conn, [], ["default"], lease_seconds=60, completions=[held.lease, free.lease])
            took = time.monotonic() - started
        assert cycle.completed == {key(held.lease): Outcome.BUSY, key(free.lease): Outcome.OK}
        assert [c.lease.owner for c in cycle.claimed] == ["w:2"]  # only the completed job's slot
        assert took < 3  # skipped, not waited for (the server's lock wait is 5 s)
    finally:
        stray.rollback()
        stray.close()
    with mysql_engine.connect() as conn:
        assert repository.reads.get_job(conn, held.job.id).status is Status.RUNNING
        again = service.claim_cycle(conn, [], ["default"], lease_seconds=60, completions=[held.lease])
        assert again.completed == {key(held.lease): Outcome.OK}


def test_a_lost_lease_is_not_completed_and_its_job_may_be_claimed_again_in_the_same_cycle(engine, shape):
    with engine.connect() as conn:
        [only] = add(conn, 1)
        first = service.claim_cycle(conn, ["w:1"], ["default"], lease_seconds=60)
        old = first.claimed[0].lease
        service.requeue_job(conn, only, actor="test", force=True)  # the operator takes it back
        cycle = service.claim_cycle(conn, [], ["default"], lease_seconds=60, completions=[old])
        assert cycle.completed == {key(old): Outcome.LEASE_LOST}
        assert [loss.lease for loss in cycle.losses] == [old]
        # The job was ready again: the finished slot took it, as attempt 2.
        assert [(c.job.id, c.lease.attempt, c.lease.owner) for c in cycle.claimed] == [(only, 2, "w:1")]
        job = repository.reads.get_job(conn, only)
        assert (job.status, job.attempts, job.lease_owner) == (Status.RUNNING, 2, "w:1")


def test_a_server_that_refuses_the_union_gets_the_two_selects_and_the_same_outcome(mysql_engine, monkeypatch):
    """A server whose grammar has no locking clause inside a UNION answers a parse error (1064):
    the cycle goes on in the same transaction with the SELECTs apart, and later cycles skip the
    UNION."""
    monkeypatch.setattr(claim_sql.REFUSED, "union", False)
    monkeypatch.setattr(
        claim_module,
        "union_sql",
        lambda dialect, *parts: ("(SELECT 1 FOR UPDATE SKIP LOCKED) UNION ALL SELECT FROM WHERE", {}),
    )
    with mysql_engine.connect() as conn:
        add(conn, 6)
        first = service.claim_cycle(conn, ["w:1", "w:2"], ["default"], lease_seconds=60)
        cycle = service.claim_cycle(
            conn, [], ["default"], lease_seconds=60, completions=[c.lease for c in first.claimed]
        )
        assert set(cycle.completed.values()) == {Outcome.OK}
        assert sorted(c.lease.owner for c in cycle.claimed) == ["w:1", "w:2"]
    assert claim_sql.REFUSED.union is True


def test_cycles_racing_over_the_same_queue_never_take_a_job_twice(mysql_engine, shape):
    """Four cycles at a time, each completing what it took last time and claiming again, until
    the queue is empty: every job done exactly once, under the lease that took it."""
    with mysql_engine.connect() as conn:
        ids = add(conn, 400)
    taken: list[tuple[int, str]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            owners = [f"t{n}:{i}" for i in range(3)]
            completions = []
            with mysql_engine.connect() as conn:
                while True:
                    cycle = service.claim_cycle(
                        conn, owners if not completions else [], ["default"], lease_seconds=60, completions=completions
                    )
                    assert set(cycle.completed.values()) <= {Outcome.OK}
                    completions = [c.lease for c in cycle.claimed]
                    with lock:
                        taken.extend((c.job.id, c.lease.owner) for c in cycle.claimed)
                    if not completions and cycle.report is not None and cycle.report.kind.value == "idle":
                        return
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(job_id for job_id, _ in taken) == sorted(ids)
    with mysql_engine.connect() as conn:
        rows = conn.execute(sa.select(jq.id, jq.status, jq.attempts, jq.lease_owner)).all()
    owner_of = dict(taken)
    assert {(r.status, r.attempts) for r in rows} == {("done", 1)}
    assert all(r.lease_owner == owner_of[r.id] for r in rows)


def test_batches_of_every_size_share_a_few_statements(mysql_engine):
    """A worker's batches take any size up to its capacity: statements are built for a few sizes
    (powers of two) with the unused places matching no row, so that the compiled statements a
    long-running worker keeps stay few whatever sizes it meets."""
    common = importlib.import_module("jobqueue.core.repository.common")
    with mysql_engine.connect() as conn:
        add(conn, 1200)
        before = len(common._compiled)
        held: list = []
        for size in [*range(1, 34), *range(33, 0, -1)]:
            service.complete_many(conn, held[size:])
            cycle = service.claim_cycle(
                conn, [f"w:{i}" for i in range(len(held), size)], ["default"], lease_seconds=60, completions=held[:size]
            )
            assert set(cycle.completed.values()) <= {Outcome.OK} and len(cycle.claimed) == size
            held = [c.lease for c in cycle.claimed]
        built = len(common._compiled) - before
    # done and taken each in 1, 2, 4, 8, 16, 32, 64 places: far fewer than the sizes met.
    assert built <= 7 * 7 + 7 + 7 + 7, built
    with mysql_engine.connect() as conn:
        counts = dict(conn.execute(sa.select(jq.status, sa.func.count()).group_by(jq.status)).all())
    assert counts["running"] == 1 and sum(counts.values()) == 1200


def test_a_cycle_whose_first_queue_is_paused_takes_from_the_next_and_leaves_the_paused_rows_free(mysql_engine, shape):
    """The one-statement cycle picks from its first queue before it knows that queue's state:
    when it is paused, those rows are dropped (their locks end at COMMIT) and the slots take
    from the next open queue. Three queues: the state read is built for four (see shape), the
    last place repeating the first, and a paused queue further down the list is left alone too."""

    def add_to(conn, queue, n):
        jobs = [{"task": "noop", "task_key": f"{queue}{i}", "queue": queue} for i in range(n)]
        return [r.id for r in service.enqueue_many(conn, jobs)]

    with mysql_engine.connect() as conn:
        paused, other, last = add_to(conn, "a", 3), add_to(conn, "b", 3), add_to(conn, "c", 2)
        service.pause_queue(conn, "a", actor="test")
        service.pause_queue(conn, "c", actor="test")
        first = service.claim_cycle(conn, ["w:1", "w:2"], ["a", "b", "c"], lease_seconds=60)
        assert sorted(c.job.id for c in first.claimed) == other[:2]
        # With completions: the finished rows' lock rides in the same statement.
        second = service.claim_cycle(
            conn, [], ["a", "b", "c"], lease_seconds=60, completions=[c.lease for c in first.claimed]
        )
        assert set(second.completed.values()) == {Outcome.OK}
        assert [c.job.id for c in second.claimed] == other[2:]
        states = dict(conn.execute(sa.select(jq.id, jq.status).where(jq.id.in_(paused + last))).all())
    assert set(states.values()) == {"ready"}
    with mysql_engine.connect() as conn:  # nothing of queue a is still locked
        service.resume_queue(conn, "a", actor="test")
        taken = service.claim_cycle(conn, ["w:3", "w:4", "w:5"], ["a"], lease_seconds=60)
    assert sorted(c.job.id for c in taken.claimed) == paused
