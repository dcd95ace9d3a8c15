"""enqueue_many's multi-row INSERT IGNORE: which rows a batch wrote, with known, pruned and
repeated keys, in the caller's transaction, under concurrent batches on real connections, and
the guard that lets IGNORE skip nothing but known keys."""

from __future__ import annotations

import json
import random
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from jobqueue.core import repository, service, validation
from jobqueue.core.models import Status
from jobqueue.core.repository.enqueue import ServerRefusedRows
from jobqueue.core.schema import job_queue, pruned_key

jq = job_queue.c


def rows_by_key(conn):
    return {r.task_key: r for r in conn.execute(sa.select(jq.task_key, jq.id, jq.status, jq.payload, jq.queue))}


def at_once(engine, callers: int, call) -> None:
    """call(n, conn) on `callers` threads, each on its own connection, started together; what
    any of them raised is raised here."""
    barrier = threading.Barrier(callers)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            with engine.connect() as conn:
                barrier.wait()
                call(n, conn)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []


def test_a_fresh_batch_reports_each_rows_own_id_in_order(engine):
    with engine.connect() as conn:
        res = service.enqueue_many(
            conn, [{"task": "noop", "task_key": f"f{i}", "delay": 60 if i % 3 == 0 else 0} for i in range(250)]
        )
        table = rows_by_key(conn)
    assert [r.task_key for r in res] == [f"f{i}" for i in range(250)]
    assert all(not r.duplicate and r.id == table[r.task_key].id for r in res)
    assert [r.status for r in res] == [Status.SCHEDULED if i % 3 == 0 else Status.READY for i in range(250)]
    assert all(table[r.task_key].status == r.status.value for r in res)


def test_known_repeated_and_new_keys_in_one_batch(engine):
    with engine.connect() as conn:
        first = service.enqueue(conn, "noop", "old")
        service.enqueue(conn, "noop", "taken", delay=60)
        res = service.enqueue_many(conn, [{"task": "noop", "task_key": k} for k in ("a", "old", "a", "b", "taken")])
        table = rows_by_key(conn)
    assert [(r.task_key, r.duplicate, r.status) for r in res] == [
        ("a", False, Status.READY),
        ("old", True, Status.READY),
        ("a", True, Status.READY),
        ("b", False, Status.READY),
        ("taken", True, Status.SCHEDULED),
    ]
    assert res[1].id == first.id and res[2].id == res[0].id
    assert set(table) == {"old", "taken", "a", "b"} and all(r.id == table[r.task_key].id for r in res)


def test_a_replayed_batch_writes_nothing_and_answers_the_first_ids(engine):
    jobs = [{"task": "noop", "task_key": f"r{i}"} for i in range(40)]
    with engine.connect() as conn:
        first = service.enqueue_many(conn, jobs)
        again = service.enqueue_many(conn, jobs)
        assert conn.execute(sa.select(sa.func.count()).select_from(job_queue)).scalar() == 40
    assert all(a.duplicate and a.id == f.id and a.status is Status.READY for a, f in zip(again, first))


def test_a_pruned_key_in_a_fresh_batch_is_not_written_again(engine):
    with engine.connect() as conn:
        (old,) = service.enqueue_many(conn, [{"task": "noop", "task_key": "gone"}])
        when = repository.reads.database_now(conn) - timedelta(days=30)
        conn.execute(sa.update(job_queue).where(jq.id == old.id).values(status="done", finished_at=when, run_at=when))
        conn.commit()
        service.prune(conn, done_days=7, failed_days=30)
        res = service.enqueue_many(conn, [{"task": "noop", "task_key": k} for k in ("new-1", "gone", "new-2")])
        table = rows_by_key(conn)
        assert conn.execute(sa.select(pruned_key.c.task_key)).scalars().all() == ["gone"]
    assert [(r.duplicate, r.status) for r in res] == [(False, Status.READY), (True, Status.DONE), (False, Status.READY)]
    assert res[1].id == old.id
    assert set(table) == {"new-1", "new-2"}  # the row the INSERT made for "gone" was taken out again


def test_keys_and_payloads_are_stored_exactly_as_given(engine):
    """Values are literals escaped by the driver on MySQL: quotes, backslashes and % go in as they
    are; the payload is stored in the form SQLAlchemy's JSON type always stored (json.dumps)."""
    keys = ["it's", "back\\slash", "100%", "%s %(x)s", "é-ü", 'quote"d']
    payload = {"note": "100% 'paid' \\ \"ok\"", "n": [1, 2.5, None], "ü": True}
    with engine.connect() as conn:
        res = service.enqueue_many(conn, [{"task": "noop", "task_key": k, "payload": payload} for k in keys])
        table = rows_by_key(conn)
        raw = conn.execute(sa.select(sa.cast(jq.payload, sa.Text)).where(jq.task_key == keys[0])).scalar()
    assert [r.task_key for r in res] == keys and set(table) == set(keys)
    assert all(table[k].payload == payload for k in keys)
    assert raw == json.dumps(payload)  # the text as written, on every server (migration 0008)


@pytest.mark.servers_only
def test_literals_follow_the_servers_no_backslash_escapes_mode(engine):
    keys = ["a\\'b", "c''d\\"]
    with engine.connect() as conn:
        conn.exec_driver_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
        res = service.enqueue_many(conn, [{"task": "noop", "task_key": k, "payload": {"p": k}} for k in keys])
        table = rows_by_key(conn)
    assert set(table) == set(keys) and all(not r.duplicate for r in res)
    assert all(table[k].payload == {"p": k} for k in keys)


def test_in_the_callers_transaction_a_mixed_batch_keeps_the_callers_rows(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "known")
        with conn.begin():
            service.enqueue(conn, "noop", "callers-own")
            res = service.enqueue_many(conn, [{"task": "noop", "task_key": k} for k in ("known", "x", "y")])
        assert [r.duplicate for r in res] == [True, False, False]
        assert set(rows_by_key(conn)) == {"known", "callers-own", "x", "y"}
        conn.rollback()  # end the read's transaction
        with conn.begin() as tx:
            service.enqueue_many(conn, [{"task": "noop", "task_key": k} for k in ("known", "z")])
            tx.rollback()
        assert set(rows_by_key(conn)) == {"known", "callers-own", "x", "y"}


def test_more_rows_than_one_statement_holds(engine, monkeypatch):
    """Large batches are split into several INSERTs (by size on MySQL, by rows on SQLite); the
    ids still belong to their rows."""
    enqueue_module = __import__("sys").modules["jobqueue.core.repository.enqueue"]
    monkeypatch.setattr(enqueue_module, "STATEMENT_BYTES", 2000)
    monkeypatch.setattr(enqueue_module, "SQLITE_ROWS", 7)
    monkeypatch.setattr(enqueue_module, "READ_KEYS", 9)
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "s17")
        res = service.enqueue_many(
            conn, [{"task": "noop", "task_key": f"s{i}", "payload": {"i": i}} for i in range(60)]
        )
        table = rows_by_key(conn)
    assert [r.duplicate for r in res] == [i == 17 for i in range(60)]
    assert all(r.id == table[r.task_key].id for r in res)
    assert all(table[r.task_key].payload == ({} if i == 17 else {"i": i}) for i, r in enumerate(res))


@pytest.mark.servers_only
def test_a_value_the_server_would_change_is_refused_and_nothing_is_written(engine, monkeypatch):
    """INSERT IGNORE turns a too-long value into a warning and a truncated row. Validation
    refuses such values first; should one get past it (here: a queue name check loosened), the
    warning is read and the batch rolled back."""
    monkeypatch.setattr(validation, "QUEUE_NAME", __import__("re").compile(r"[a-z]{1,100}"))
    with engine.connect() as conn:
        with pytest.raises(ServerRefusedRows, match="1265|1406"):
            service.enqueue_many(
                conn, [{"task": "noop", "task_key": "fine"}, {"task": "noop", "task_key": "long", "queue": "q" * 70}]
            )
        assert rows_by_key(conn) == {}


def test_many_concurrent_batches_over_the_same_keys_write_each_once(mysql_engine):
    """Four connections enqueue the same 300 keys (each in its own order, with 50 keys of its
    own) at once, in batches of 100: every key is written once, exactly one caller is told it
    wrote it, and every id reported is the id of that key's row. Batches meet keys that others
    inserted a moment before (mixed batches, redone the exact way) and wait on rows others
    have not committed yet."""
    shared = [f"shared-{i}" for i in range(300)]
    results: dict[int, list] = {}

    def caller(n: int, conn) -> None:
        keys = shared[:] + [f"own-{n}-{i}" for i in range(50)]
        random.Random(n).shuffle(keys)
        out = []
        for lo in range(0, len(keys), 100):
            out += service.enqueue_many(conn, [{"task": "noop", "task_key": k} for k in keys[lo : lo + 100]])
        results[n] = out

    at_once(mysql_engine, 4, caller)
    with mysql_engine.connect() as conn:
        table = rows_by_key(conn)
    assert len(table) == 300 + 4 * 50
    writers: dict[str, int] = {}
    for out in results.values():
        for r in out:
            assert r.id == table[r.task_key].id
            if not r.duplicate:
                writers[r.task_key] = writers.get(r.task_key, 0) + 1
    assert writers == {key: 1 for key in table}


def test_concurrent_batches_split_in_several_statements_report_their_own_rows_ids(mysql_engine, monkeypatch):
    """MySQL's default innodb_autoinc_lock_mode 2 does not promise a multi-row INSERT consecutive
    ids, so each statement's are checked (one row read) before LAST_INSERT_ID() onwards is
    trusted. Four connections write 30 batches of 200 fresh keys each at once, each batch in
    several statements: every id reported is its own row's."""
    enqueue_module = __import__("sys").modules["jobqueue.core.repository.enqueue"]
    monkeypatch.setattr(enqueue_module, "STATEMENT_BYTES", 4000)
    results: list = []

    def caller(n: int, conn) -> None:
        for b in range(30):
            results.extend(
                service.enqueue_many(conn, [{"task": "noop", "task_key": f"i{n}-{b}-{i}"} for i in range(200)])
            )

    at_once(mysql_engine, 4, caller)
    with mysql_engine.connect() as conn:
        table = rows_by_key(conn)
    assert len(results) == len(table) == 4 * 30 * 200
    wrong = [r.task_key for r in results if r.duplicate or r.id != table[r.task_key].id]
    assert wrong == []


def test_ids_not_in_a_row_are_not_trusted(mysql_engine):
    """The check itself, on real rows: three rows written by one statement whose ids are no
    longer first, first + 1, first + 2 (the last one moved) are read back, not assumed."""
    from types import SimpleNamespace

    from jobqueue.core.repository.enqueue import _numbered_in_a_row

    keys = [SimpleNamespace(task_key=k) for k in ("a", "b", "c")]
    with mysql_engine.connect() as conn:
        first = service.enqueue_many(conn, [{"task": "noop", "task_key": k.task_key} for k in keys])[0].id
        assert _numbered_in_a_row(conn, keys, first)
        with conn.begin():
            conn.execute(sa.update(job_queue).where(jq.task_key == "c").values(id=first + 5))
        assert not _numbered_in_a_row(conn, keys, first)
        assert _numbered_in_a_row(conn, keys[:2], first)
