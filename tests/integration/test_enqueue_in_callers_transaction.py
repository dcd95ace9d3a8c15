"""enqueue(conn=) in the application's own transaction, at the application's isolation level
(REPEATABLE READ is both servers' default): two real connections whose transactions overlap, a
prune by another process while the caller's transaction is open, and MariaDB 11.8's error 1020
(innodb_snapshot_isolation), made to happen on purpose. Issue 25, defect 2."""

from __future__ import annotations

import threading
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from jobqueue import JobQueue
from jobqueue.core import db
from jobqueue.core.errors import TransactionConflict
from jobqueue.core.models import Status
from jobqueue.core.schema import job_queue
from testkit.procs import jobqueue as jobqueue_cli
from testkit.procs import wait_until

jq_c = job_queue.c
LEVELS = ["READ UNCOMMITTED", "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
orders = sa.Table("shop_orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))


@pytest.fixture
def shop(mysql_url):
    """(the queue's client, a factory of application engines at a given isolation level)."""
    client = JobQueue(mysql_url)
    engines = []

    def app_engine(level: str = "REPEATABLE READ") -> sa.Engine:
        # The application's own engine: SQLAlchemy's defaults, not the queue's create_engine.
        engine = sa.create_engine(mysql_url, isolation_level=level, poolclass=NullPool)
        engines.append(engine)
        return engine

    orders.create(client.engine)
    yield client, app_engine
    for engine in engines:
        engine.dispose()
    client.close()


def enqueue(client: JobQueue, key: str, conn, how: str):
    """One job, by enqueue or by enqueue_many (with a second, fresh key beside it)."""
    if how == "one":
        return client.enqueue("noop", key, conn=conn)
    first, other = client.enqueue_many(
        [{"task": "noop", "task_key": key}, {"task": "noop", "task_key": f"{key}-{uuid.uuid4().hex[:8]}"}], conn=conn
    )
    assert other.duplicate is False
    return first


def snapshot(conn) -> None:
    """The caller's transaction reads something first, as a request does: at REPEATABLE READ its
    snapshot is taken here, before the other transaction commits."""
    conn.execute(sa.select(orders.c.id).limit(1)).all()  # (a COUNT(*) may take no snapshot)


def jobs_with(client: JobQueue, key: str) -> list:
    with client.engine.connect() as conn:
        return conn.execute(sa.select(jq_c.id, jq_c.status).where(jq_c.task_key == key)).all()


def stale_snapshot_refused(db_server: str, level: str, *, serializable: bool = True) -> bool:
    """MariaDB 11.6.2+ (innodb_snapshot_isolation=ON) refuses, with 1020, a locking read of a row
    another transaction changed after the caller's transaction began: the caller hears
    TransactionConflict and runs its transaction again; MariaDB 10.11 and MySQL read the row.
    (At SERIALIZABLE 11.8 refuses the waited-for and the pruned key, not a key committed before
    the INSERT.)"""
    return db_server == "mariadb11" and (level == "REPEATABLE READ" or (serializable and level == "SERIALIZABLE"))


@pytest.mark.parametrize("how", ["one", "many"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_key_committed_after_the_callers_snapshot_is_a_duplicate(shop, db_server, level, how):
    client, app_engine = shop
    engine = app_engine(level)
    theirs = None
    with engine.connect() as conn:
        with conn.begin() as tx:
            snapshot(conn)
            theirs = client.enqueue("noop", "export-42")  # another request, committed now
            if stale_snapshot_refused(db_server, level, serializable=False):
                with pytest.raises(TransactionConflict, match="1020.*run the whole transaction again"):
                    enqueue(client, "export-42", conn, how)
                tx.rollback()
        if not conn.in_transaction():  # the caller's retry, or the first try
            conn.begin()
        ours = enqueue(client, "export-42", conn, how)
        conn.execute(orders.insert().values(id=1))  # the caller's transaction goes on
        conn.commit()
    assert (ours.duplicate, ours.id, ours.status) == (True, theirs.id, Status.READY)
    assert len(jobs_with(client, "export-42")) == 1


@pytest.mark.parametrize("how", ["one", "many"])
@pytest.mark.parametrize("level", LEVELS)
def test_two_overlapping_transactions_enqueue_one_job(shop, db_server, level, how):
    """The second transaction's INSERT waits on the first one's row; the first commits; the
    second answers duplicate=True with its id and keeps its own transaction (on MariaDB 11.8 at
    REPEATABLE READ: is told to run it again, and then does)."""
    client, app_engine = shop
    engine = app_engine(level)
    with engine.connect() as first, engine.connect() as second:
        tx1, _ = first.begin(), second.begin()
        snapshot(first)
        snapshot(second)
        second_id = second.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        theirs = enqueue(client, "export-42", first, how)
        answer: dict = {"conflicts": 0}

        def second_request():
            try:
                while True:
                    try:
                        answer["ours"] = enqueue(client, "export-42", second, how)
                        break
                    except TransactionConflict:
                        answer["conflicts"] += 1
                        second.rollback()
                        second.begin()
                second.execute(orders.insert().values(id=2))
                second.commit()
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                answer["error"] = exc

        t = threading.Thread(target=second_request)
        t.start()
        try:
            wait_until(
                lambda: "error" in answer or "ours" in answer or waiting_on_a_lock(client, second_id),
                timeout=10,
                message="the second INSERT to wait on the first",
            )
        finally:
            tx1.commit()
            t.join(20)
    assert "error" not in answer, repr(answer.get("error"))
    ours = answer["ours"]
    assert (ours.duplicate, ours.id) == (True, theirs.id)
    assert answer["conflicts"] == (1 if stale_snapshot_refused(db_server, level) else 0)
    assert len(jobs_with(client, "export-42")) == 1
    with client.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar() == 1


def waiting_on_a_lock(client: JobQueue, connection_id: int) -> bool:
    """The connection is in its INSERT (InnoDB calls the wait RUNNING, not LOCK WAIT, at READ
    UNCOMMITTED on MariaDB, so its processlist row says it)."""
    with client.engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s "
                "AND INFO LIKE 'INSERT IGNORE INTO job_queue%%'",
                (int(connection_id),),
            ).scalar()
        )


def prune_in_another_process(client: JobQueue, url: str, key: str) -> None:
    with client.engine.begin() as conn:
        conn.execute(
            sa.update(job_queue)
            .where(jq_c.task_key == key)
            .values(
                status="done",
                finished_at=sa.text("UTC_TIMESTAMP(6) - INTERVAL 2 DAY"),
                run_at=sa.text("UTC_TIMESTAMP(6) - INTERVAL 2 DAY"),
            )
        )
    out = jobqueue_cli(url, "prune", "--done-older-than", "1")
    assert out.returncode == 0, out.stderr
    assert jobs_with(client, key) == []


@pytest.mark.parametrize("how", ["one", "many"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_key_pruned_while_the_callers_transaction_is_open_stays_taken(shop, mysql_url, db_server, level, how):
    """A prune committed after the caller's snapshot: the replay must answer the pruned job
    (duplicate, done) and write nothing. MariaDB 11.8 at REPEATABLE READ cannot read the pruned
    record under the caller's snapshot (1020): the caller is told to run its transaction again,
    and the new transaction answers the duplicate."""
    client, app_engine = shop
    old = client.enqueue("noop", "export-7")
    engine = app_engine(level)
    conflict = stale_snapshot_refused(db_server, level)
    with engine.connect() as conn:
        with conn.begin() as tx:
            snapshot(conn)
            prune_in_another_process(client, mysql_url, "export-7")
            if conflict:
                with pytest.raises(TransactionConflict, match="run the whole transaction again"):
                    enqueue(client, "export-7", conn, how)
                tx.rollback()
            else:
                ours = enqueue(client, "export-7", conn, how)
                assert (ours.duplicate, ours.id, ours.status) == (True, old.id, Status.DONE)
        if conflict:
            with conn.begin():  # the caller's retry
                snapshot(conn)
                ours = enqueue(client, "export-7", conn, how)
            assert (ours.duplicate, ours.id, ours.status) == (True, old.id, Status.DONE)
    assert jobs_with(client, "export-7") == [], "a pruned job's key was taken again"


# --- MariaDB 11.8's 1020, on purpose ------------------------------------------------------------


def bump_under(client: JobQueue, job_id: int):
    """A write to the job's row, committed by another transaction after the snapshot below."""

    def fn(conn) -> None:
        conn.execute(sa.select(jq_c.priority).where(jq_c.id == job_id)).scalar()  # the snapshot
        if not bumped:
            bumped.append(True)
            with client.engine.begin() as other:
                other.execute(sa.update(job_queue).where(jq_c.id == job_id).values(priority=jq_c.priority + 1))
        conn.execute(sa.update(job_queue).where(jq_c.id == job_id).values(priority=jq_c.priority + 10))

    bumped: list = []
    return fn


def test_a_1020_in_a_queue_owned_transaction_is_retried(shop, db_server):
    """db.transaction on an engine at REPEATABLE READ (JobQueue(app_engine) runs the queue's own
    transactions on it): the write conflict is retried in a new transaction. On MariaDB 11.8 the
    first try fails with 1020; elsewhere the UPDATE waits for nothing and proceeds."""
    client, app_engine = shop
    job = client.enqueue("noop", "k-1020")
    retried = []
    with app_engine().connect() as conn:
        fn = bump_under(client, job.id)

        def counted(c):
            retried.append(True)
            return fn(c)

        db.transaction(conn, counted, what="test")
    assert len(retried) == (2 if db_server == "mariadb11" else 1)
    with client.engine.connect() as conn:
        assert conn.execute(sa.select(jq_c.priority).where(jq_c.id == job.id)).scalar() == 11


def test_a_1020_in_the_callers_transaction_says_to_run_it_again(shop, db_server):
    client, app_engine = shop
    job = client.enqueue("noop", "k-1020")
    with app_engine().connect() as conn:
        tx = conn.begin()
        conn.execute(orders.insert().values(id=5))
        fn = bump_under(client, job.id)
        if db_server == "mariadb11":
            with pytest.raises(TransactionConflict, match=r"1020.*run the whole transaction again"):
                db.transaction(conn, fn, what="test")
            tx.rollback()
        else:
            db.transaction(conn, fn, what="test")
            tx.commit()
    with client.engine.connect() as conn:
        kept = conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar()
    assert kept == (0 if db_server == "mariadb11" else 1)


def test_a_deadlock_in_the_callers_transaction_says_to_run_it_again(shop):
    """Two callers each enqueue the key the other enqueued first: InnoDB picks a victim (1213),
    which has lost its whole transaction and its savepoint; it hears TransactionConflict, not
    'SAVEPOINT does not exist'."""
    client, app_engine = shop
    engine = app_engine()
    errors: list = []
    with engine.connect() as a, engine.connect() as b:
        ta, tb = a.begin(), b.begin()
        client.enqueue("noop", "dl-a", conn=a)
        client.enqueue("noop", "dl-b", conn=b)

        def cross(conn, key, tx):
            try:
                client.enqueue("noop", key, conn=conn)
                tx.commit()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [
            threading.Thread(target=cross, args=(a, "dl-b", ta)),
            threading.Thread(target=cross, args=(b, "dl-a", tb)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert len(errors) == 1 and isinstance(errors[0], TransactionConflict), errors
    assert "deadlock" in str(errors[0])
