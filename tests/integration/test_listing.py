"""Listing jobs: keyset pages both ways with a capped count, a bounded and escaped search, run
again for a done job, and `jobqueue list` / `jobqueue show`; on MariaDB and SQLite."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from jobqueue.core import repository, service
from jobqueue.core.cli import main
from jobqueue.core.errors import RunAgainNeeded, ValidationError
from jobqueue.core.models import Status
from jobqueue.core.repository.operator import JobFilter
from jobqueue.core.schema import audit_log, job_queue, job_result
from jobqueue.core.validation import job_query
from testkit.sql import explain, rows_read, seq_rows, statements_sent

jq = job_queue.c


def fail_now(conn, job_id, error):
    (c,) = [c for c in service.claim(conn, "h:1:1", 50, ["default"], lease_seconds=60) if c.job.id == job_id]
    service.fail(conn, c.lease, error)


def test_keyset_pages_both_ways_with_a_capped_count(engine):
    with engine.connect() as conn:
        ids = [
            r.id for r in service.enqueue_many(conn, [{"task": "noop", "task_key": f"p-{i:03d}"} for i in range(25)])
        ]
        first = repository.reads.page_jobs(conn, limit=10)
        assert [j.id for j in first.jobs] == ids[::-1][:10]
        assert (first.newer, first.older, first.matches, first.capped) == (None, ids[15], 25, False)
        second = repository.reads.page_jobs(conn, before=first.older, limit=10)
        assert [j.id for j in second.jobs] == ids[::-1][10:20] and second.newer == ids[14]
        back = repository.reads.page_jobs(conn, after=second.newer, limit=10)
        assert [j.id for j in back.jobs] == [j.id for j in first.jobs] and back.newer is None
        assert back.older == first.older
        last = repository.reads.page_jobs(conn, before=second.older, limit=10)
        assert [j.id for j in last.jobs] == ids[4::-1] and last.older is None
        capped = repository.reads.page_jobs(conn, limit=10, cap=20)
        assert (capped.matches, capped.capped) == (20, True)
        assert repository.reads.count_matching(conn, JobFilter(status=Status.READY), cap=7) == (7, True)


def test_search_finds_payload_error_and_key_text_case_blind_and_escaped(engine):
    with engine.connect() as conn:
        service.enqueue(conn, "noop", "order-1", {"customer": "ACME Corp", "note": "100% paid"})
        service.enqueue(conn, "noop", "order-2", {"customer": "Globex", "note": "a_b"})
        service.enqueue(conn, "noop", "order-3", {"customer": "Initech", "note": "ab"})
        failed = service.enqueue(conn, "noop", "order-4", {"customer": "Umbrella"}).id
        fail_now(conn, failed, "TimeoutError: upstream did not answer")

        def keys(q, **kw):
            return [j.task_key for j in repository.reads.page_jobs(conn, JobFilter(search=q, **kw)).jobs]

        assert keys("acme") == ["order-1"]  # payload, either case
        assert keys("timeouterror") == ["order-4"]  # last error
        assert keys("order-3") == ["order-3"]  # task_key
        assert keys("%") == ["order-1"]  # a literal %, not "anything"
        assert keys("a_b") == ["order-2"]  # a literal _, not "any character"
        assert keys("'; DROP TABLE job_queue; --") == []
        assert keys("acme", status=Status.FAILED) == []
        assert keys("umbrella", status=Status.FAILED) == ["order-4"]


def test_search_reads_a_bounded_window_and_says_where_it_stopped(engine):
    with engine.connect() as conn:
        ids = [
            r.id
            for r in service.enqueue_many(
                conn,
                [{"task": "noop", "task_key": f"w-{i:03d}", "payload": {"needle": i % 10 == 0}} for i in range(100)],
            )
        ]
        f = JobFilter(search='"needle": true')
        first = repository.reads.page_jobs(conn, f, limit=50, window=30)
        # The newest 30 rows hold 3 needles; the page says where the window stopped and goes on below it.
        assert [j.task_key for j in first.jobs] == ["w-090", "w-080", "w-070"]
        assert (first.window, first.window_floor, first.older, first.matches) == (30, ids[70], ids[70], 3)
        second = repository.reads.page_jobs(conn, f, before=first.older, limit=50, window=30)
        assert [j.task_key for j in second.jobs] == ["w-060", "w-050", "w-040"]
        tail = repository.reads.page_jobs(conn, f, before=ids[10], limit=50, window=30)
        assert [j.task_key for j in tail.jobs] == ["w-000"] and tail.window_floor is None and tail.older is None
        # A full page continues from its last row, whatever the window.
        small = repository.reads.page_jobs(conn, f, limit=2, window=30)
        assert [j.task_key for j in small.jobs] == ["w-090", "w-080"] and small.older == ids[80]


def test_bulk_over_a_search_stays_in_its_window(engine):
    with engine.connect() as conn:
        ids = [
            r.id
            for r in service.enqueue_many(
                conn, [{"task": "noop", "task_key": f"s-{i}", "payload": {"tag": "x"}} for i in range(6)]
            )
        ]
        with pytest.raises(ValueError):
            service.bulk_action(conn, "fail", actor="t", job_filter=JobFilter(search="x"))
        res = service.bulk_action(
            conn, "fail", actor="t", job_filter=JobFilter(search='"x"', min_id=ids[3]), after_id=ids[5]
        )
        assert res.changed == 2
        statuses = [repository.reads.get_job(conn, i).status for i in ids]
    assert statuses == [Status.READY] * 3 + [Status.FAILED] * 2 + [Status.READY]


def test_run_again_needs_its_own_confirmation_and_keeps_one_result(engine, export_dir):
    with engine.connect() as conn:
        job = service.enqueue(conn, "export_orders", "exp-1", {"rows": 2})
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        assert service.record_result(conn, c.lease, "exp-1", {"file": "exp-1.csv"}) is True
        service.complete(conn, c.lease)
        with pytest.raises(RunAgainNeeded) as refused:
            service.requeue_job(conn, job.id, actor="t")
        assert refused.value.exit_code == 3 and refused.value.http_status == 409
        assert repository.reads.get_job(conn, job.id).status is Status.DONE
        result = service.requeue_job(conn, job.id, again=True, actor="t")
        assert (result.before, result.after, result.changed) == (Status.DONE, Status.READY, True)
        (again,) = service.claim(conn, "h:1:2", 1, ["default"], lease_seconds=60)
        assert again.lease.attempt == 2
        assert service.record_result(conn, again.lease, "exp-1", {"file": "exp-1.csv"}) is False
        service.complete(conn, again.lease)
        results = conn.execute(sa.select(sa.func.count()).select_from(job_result)).scalar()
        (attempt,) = repository.reads.list_attempts(conn, job.id)
        (entry,) = conn.execute(sa.select(audit_log)).all()
    assert results == 1
    assert (attempt["attempt"], attempt["outcome"], attempt["worker"]) == (1, "done", "h:1:1")
    assert (entry.before_status, entry.after_status, entry.detail) == ("done", "ready", "run again")


@pytest.mark.parametrize(
    "args, field",
    [
        ({"status": "bogus"}, "status"),
        ({"before": "²"}, "before"),
        ({"before": "-1"}, "before"),
        ({"before": "0"}, "before"),
        ({"limit": "501"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"queue": "q" * 101}, "queue"),
        ({"key": "k" * 81}, "key"),
        ({"q": "x" * 201}, "q"),
        ({"q": "a\x00b"}, "q"),
        ({"before": "5", "after": "3"}, "after"),
    ],
)
def test_bad_listing_input_names_its_field(args, field):
    with pytest.raises(ValidationError) as exc:
        job_query(args)
    assert exc.value.field == field


@pytest.fixture
def run(db_url):
    runner = CliRunner()
    return lambda *args: runner.invoke(main, ["--database-url", db_url, *args], obj={})


def test_list_and_show_commands(run, engine):
    with engine.connect() as conn:
        ids = [
            r.id
            for r in service.enqueue_many(
                conn, [{"task": "noop", "task_key": f"c-{i}", "payload": {"n": i}} for i in range(5)]
            )
        ]
        service.enqueue(conn, "noop", "mail-1", queue="mail")
        fail_now(conn, ids[2], "ValueError: bad row 7")
    table = run("list", "--queue", "default")
    assert table.exit_code == 0, table.output
    assert "c-4" in table.stdout and "mail-1" not in table.stdout and "ValueError: bad row 7" in table.stdout
    data = json.loads(run("list", "--json", "--limit", "2").stdout)
    assert [j["task_key"] for j in data["jobs"]] == ["mail-1", "c-4"] and data["next_before"] == ids[4]
    assert data["matches"] == 6 and data["matches_capped"] is False
    nxt = json.loads(run("list", "--json", "--limit", "2", "--before", str(data["next_before"])).stdout)
    assert [j["task_key"] for j in nxt["jobs"]] == ["c-3", "c-2"]
    found = json.loads(run("list", "--json", "-q", "BAD ROW").stdout)
    assert [j["id"] for j in found["jobs"]] == [ids[2]] and found["search_window"] == 50_000
    assert json.loads(run("list", "--json", "--status", "failed").stdout)["jobs"][0]["status"] == "failed"

    shown = json.loads(run("show", str(ids[2]), "--json").stdout)
    assert shown["id"] == ids[2] and shown["status"] == "failed" and shown["result"] is None
    assert [a["outcome"] for a in shown["attempt_history"]] == ["fail"]
    text = run("show", str(ids[2]))
    assert text.exit_code == 0 and "ValueError: bad row 7" in text.stdout and "attempt 1: fail" in text.stdout
    missing = run("show", "999999")
    assert missing.exit_code == 4 and "not found" in missing.stderr


@pytest.mark.parametrize(
    "args", [["--status", "bogus"], ["--limit", "0"], ["--limit", "x"], ["--before", "²"], ["-q", "x" * 201]]
)
def test_list_bad_input_exits_2(run, args):
    result = run("list", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")


def test_requeue_again_from_the_command_line(run, engine):
    with engine.connect() as conn:
        job = service.enqueue(conn, "noop", "d-1")
        (c,) = service.claim(conn, "h:1:1", 1, ["default"], lease_seconds=60)
        service.complete(conn, c.lease)
    refused = run("requeue", str(job.id))
    assert refused.exit_code == 3 and "--again" in refused.stderr
    done = run("requeue", str(job.id), "--again")
    assert done.exit_code == 0 and json.loads(done.stdout)["before"] == "done"


def _one(rows: list):
    assert len(rows) == 1, rows
    return rows[0]


def _history(conn, n: int, old_keys: int, scheduled: int) -> None:
    """`old_keys` week-old 'old:' keys at the bottom of the ids, `n` newer done rows above them,
    and `scheduled` jobs on top: the shape where the planner walks the primary key backwards."""
    cols = (
        "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
        "max_attempts, created_at, updated_at) "
    )
    now = "UTC_TIMESTAMP(6)"
    conn.exec_driver_sql(
        cols + f"SELECT CONCAT('old:', seq), 'noop', 'default', 0, '{{}}', 'done', {now}, 1, 5, "
        f"{now}, {now} FROM {seq_rows(old_keys)}"
    )
    conn.exec_driver_sql(
        cols + f"SELECT CONCAT('new:', seq), 'noop', IF(MOD(seq, 2), 'a', 'b'), 0, '{{}}', 'done', "
        f"{now}, 1, 5, {now}, {now} FROM {seq_rows(n)}"
    )
    conn.exec_driver_sql(
        cols + f"SELECT CONCAT('later:', seq), 'noop', 'default', 0, '{{}}', 'scheduled', "
        f"{now} + INTERVAL 1 HOUR, 0, 5, {now}, {now} FROM {seq_rows(scheduled)}"
    )
    conn.exec_driver_sql("ANALYZE TABLE job_queue")
    conn.commit()


def _hinted(statement: str) -> bool:
    return "FORCE INDEX" in statement


def _plans(engine, conn, run) -> list[tuple[str, str]]:
    """(key EXPLAIN chose for the page statement as sent, key it chooses for the statement pages
    sent before the hint: the whole rows, no hint)."""
    sent = statements_sent(engine, run, _hinted)
    out = []
    for stmt in sent:
        hinted = _one(explain(conn, stmt.replace("%", "%%")))["key"]
        bare = stmt.split(" FORCE INDEX (")[0] + stmt.split(" FORCE INDEX (")[1].split(")", 1)[1]
        bare = bare.replace("SELECT job_queue.id", "SELECT *", 1)
        unhinted = _one(explain(conn, bare.replace("%", "%%")))["key"]
        out.append((hinted, unhinted))
    return out


def test_a_week_old_prefix_and_the_last_page_of_a_live_status_read_their_own_index(mysql_engine, db_server):
    """At 71,000 rows the planner already walks the primary key backwards for these pages (it
    expects matches spread over the ids; they sit under every newer row); the page pins the
    filter's index, checked by EXPLAIN on the statement it sent, and still returns the right rows."""
    with mysql_engine.connect() as conn:
        _history(conn, 60_000, 8_000, 3_000)
        prefix = lambda: repository.reads.page_jobs(conn, JobFilter(key_prefix="old:"))  # noqa: E731
        assert _plans(mysql_engine, conn, prefix) == [("uk_task_key", "PRIMARY")]
        page = prefix()
        assert [j.task_key for j in page.jobs[:2]] == ["old:8000", "old:7999"] and page.matches == 8000
        assert all(j.task_key.startswith("old:") for j in page.jobs) and len(page.jobs) == 50

        scheduled = conn.exec_driver_sql(
            "SELECT id FROM job_queue WHERE status = 'scheduled' ORDER BY id LIMIT 19, 1"
        ).scalar()
        walked = _one(
            explain(
                conn,
                f"SELECT * FROM job_queue WHERE status = 'scheduled' AND id < {scheduled} ORDER BY id DESC LIMIT 51",
            )
        )
        # The premise, on MariaDB 10.11: unhinted, the planner walks the primary key. MariaDB
        # 11.8 and MySQL 9.7 pick ix_ready_pick by themselves; the page below is hinted on all.
        assert walked["key"] == "PRIMARY" or db_server != "mariadb"
        last = lambda: repository.reads.page_jobs(conn, JobFilter(status=Status.SCHEDULED), before=scheduled)  # noqa: E731
        assert _merged_keys(mysql_engine, conn, last) == {"ix_ready_pick"}
        page = last()
        assert len(page.jobs) == 19 and page.older is None and page.jobs[0].id < scheduled
        assert [j.id for j in page.jobs] == sorted((j.id for j in page.jobs), reverse=True)

        # Any status, done too: each (queue, priority) group's newest entries, merged (_status_page_ids).
        done = lambda: repository.reads.page_jobs(conn, JobFilter(status=Status.DONE), limit=10)  # noqa: E731
        assert _merged_keys(mysql_engine, conn, done) == {"ix_ready_pick"}
        assert [j.id for j in done().jobs] == conn.exec_driver_sql(
            "SELECT id FROM job_queue WHERE status = 'done' ORDER BY id DESC LIMIT 10"
        ).scalars().all()


def _merged_keys(engine, conn, run) -> set[str]:
    """The keys EXPLAIN shows for job_queue in the statements with FORCE INDEX that `run` sent
    (a merge of groups: one row per group)."""
    sent = statements_sent(engine, run, _hinted)
    assert sent
    return {r["key"] for stmt in sent for r in explain(conn, stmt.replace("%", "%%")) if r["table"] == "job_queue"}


def _old_failures(conn, failed: int, done: int) -> None:
    """`failed` failed jobs at the bottom of the ids (a third of them 'upstream said 503'), `done`
    newer done jobs above them, and a few of each live status and cancelled on top; two queues
    and two tasks throughout."""
    cols = (
        "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
        "max_attempts, last_error, created_at, updated_at) "
    )
    now = "UTC_TIMESTAMP(6)"
    conn.exec_driver_sql(
        cols + f"SELECT CONCAT('old:', seq), IF(MOD(seq, 2), 'a', 'b'), IF(MOD(seq, 3), 'q1', 'q2'), "
        f"0, '{{}}', 'failed', {now}, 5, 5, IF(MOD(seq, 3), 'TimeoutError', 'RuntimeError: upstream "
        f"said 503'), {now}, {now} FROM {seq_rows(failed)}"
    )
    conn.exec_driver_sql(
        cols + f"SELECT CONCAT('new:', seq), IF(MOD(seq, 2), 'a', 'b'), IF(MOD(seq, 3), 'q1', 'q2'), "
        f"0, '{{}}', 'done', {now}, 1, 5, NULL, {now}, {now} FROM {seq_rows(done)}"
    )
    conn.exec_driver_sql(
        cols + f"SELECT CONCAT('live:', seq), IF(MOD(seq, 2), 'a', 'b'), IF(MOD(seq, 3), 'q1', 'q2'), "
        f"0, '{{\"note\": \"said 503\"}}', ELT(1 + MOD(seq, 4), 'ready', 'scheduled', 'running', "
        f"'cancelled'), {now}, 0, 5, NULL, {now}, {now} FROM {seq_rows(400)}"
    )
    conn.exec_driver_sql("ANALYZE TABLE job_queue")
    conn.commit()


def _accesses(engine, conn, run) -> list[tuple[str, list[tuple[str, str | None, str, int]]]]:
    """Every SELECT on job_queue that `run` sent but the one reading the page's rows by their ids,
    with the (table, key, access type, rows) of each of its table reads."""
    sent = statements_sent(
        engine,
        run,
        lambda statement: (
            statement.lstrip().upper().startswith("SELECT")
            and "job_queue" in statement
            and "WHERE job_queue.id IN (" not in statement
        ),
    )
    return [
        (s, [(r["table"], r["key"], r["type"], int(r["rows"] or 0)) for r in explain(conn, s.replace("%", "%%"))])
        for s in sent
    ]


SEARCH_FILTERS = [{}, {"queue": "q2"}, {"task": "b"}, {"key_prefix": "old:1"}, {"queue": "q2", "task": "b"}]


@pytest.mark.parametrize("status", list(Status))
def test_a_search_inside_a_status_reads_its_window_never_the_rows_around_it(mysql_engine, db_server, status):
    """`/jobs?status=failed&q=said 503` walked the primary key backwards over every newer row (1.2-2.4 s
    at 1,000,000 rows): the planner expects the matches spread evenly over the ids. The window is
    read through the status's index (or the prefix's, or the task's), and its rows by id one by
    one, or as one id range where they are dense (at least 1 row in SPARSE_WINDOW: the newest done
    jobs); never the rows outside it. At this size the planner walks the primary key once the
    count's cap is small (here 100; the dashboard's 10,000 at 1,000,000 rows). Every filter the
    search can take beside a status, and the pages against a plain scan."""
    with mysql_engine.connect() as conn:
        _old_failures(conn, 3_000, 60_000)
        like = "(payload LIKE '%%said 503%%' OR last_error LIKE '%%said 503%%' OR task_key LIKE '%%said 503%%')"
        walked = _one(
            explain(conn, f"SELECT id FROM job_queue WHERE status = 'failed' AND {like} ORDER BY id DESC LIMIT 101")
        )
        # What the search sent before walks the primary key (MariaDB 10.11, where it was measured).
        assert walked["key"] == "PRIMARY" or db_server != "mariadb"
        for extra in SEARCH_FILTERS:
            f = JobFilter(status=status, search="said 503", **extra)
            where = " AND ".join(
                [f"status = '{status.value}'"]
                + [f"{k} = '{v}'" for k, v in (("queue", extra.get("queue")), ("task_name", extra.get("task"))) if v]
                + ([f"task_key LIKE '{extra['key_prefix']}%%'"] if "key_prefix" in extra else [])
            )
            window = min(
                conn.exec_driver_sql(f"SELECT COUNT(*) FROM job_queue WHERE {where}").scalar(),
                repository.operator.SEARCH_WINDOW,
            )
            page = None

            def search():
                nonlocal page
                page = repository.reads.page_jobs(conn, f, cap=100)

            plans = _accesses(mysql_engine, conn, search)
            # The window through its index (the newest done jobs are the newest rows); then the primary
            # key reads a row by its id, or a range as dense as the window, never a walk.
            (window_plan,) = [plan for statement, plan in plans if "max(" in statement]
            # (One read per (queue, priority) group where a status's entries are merged.)
            assert {key for table, key, _, _ in window_plan if table == "job_queue"} == {
                repository.reads.search_index(conn, f)
            }
            assert all(
                key != "PRIMARY"
                or access == "eq_ref"
                or access == "range"
                and rows <= 2 * repository.reads.SPARSE_WINDOW * window
                for statement, plan in plans
                if "max(" not in statement
                for table, key, access, rows in plan
                if table == "job_queue"
            ), (status, extra, window, plans)
            expected = (
                conn.exec_driver_sql(f"SELECT id FROM job_queue WHERE {where} AND {like} ORDER BY id DESC")
                .scalars()
                .all()
            )
            assert [j.id for j in page.jobs] == expected[:50], (status, extra)
            assert (page.matches, page.capped) == (min(len(expected), 100), len(expected) > 100), (status, extra)


@pytest.mark.parametrize("queue, task, matches", [("q1", "t2", 0), ("q1", "t1", 30_000)])
def test_a_queue_and_a_task_read_only_their_own_entries(mysql_engine, queue, task, matches):
    """`/jobs?queue=mail&task=export_orders` where that task never runs in that queue read every
    entry of the task and each one's row to check its queue (0.7 s at 1,000,000 rows, twice: the
    page and its count), and where the two always go together the planner intersected both
    indexes whole and sorted the result. The pair has its own index (queue, task_name, id): the
    page and its capped count read about what they return, the newest first."""
    with mysql_engine.connect() as conn:
        cols = (
            "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
            "max_attempts, created_at, updated_at) "
        )
        conn.exec_driver_sql(
            cols + "SELECT CONCAT('k', seq), IF(MOD(seq, 2), 't1', 't2'), IF(MOD(seq, 2), 'q1', 'q2'), "
            "0, '{}', 'done', UTC_TIMESTAMP(6), 1, 5, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) "
            f"FROM {seq_rows(60000)}"
        )
        conn.exec_driver_sql("ANALYZE TABLE job_queue")
        conn.commit()
        before = rows_read(conn)
        page = repository.reads.page_jobs(conn, JobFilter(queue=queue, task=task), cap=100)
        read = rows_read(conn) - before
        assert (page.matches, page.capped) == (min(matches, 100), matches > 100)
        assert [j.id for j in page.jobs] == conn.exec_driver_sql(
            f"SELECT id FROM job_queue WHERE queue = '{queue}' AND task_name = '{task}' ORDER BY id DESC LIMIT 50"
        ).scalars().all()
        assert read < 500, read


def test_a_search_inside_a_status_reads_a_smaller_window_without_sorting_the_status(mysql_engine):
    """`/jobs?status=failed&q=said 503` read the newest 50,000 failed jobs row by row, each a
    random read of the primary key (0.6 s at 1,000,000 rows, 14 us a row once the table outgrows
    the buffer pool), after sorting every failed job's index entry to find them. A window read
    row by row holds SPARSE_SEARCH_WINDOW rows, found as each (queue, priority) group's newest
    entries merged: the search reads about groups x window index entries and window rows, and
    says where it stopped."""
    with mysql_engine.connect() as conn:
        _old_failures(conn, 30_000, 30_000)
        window = repository.operator.SPARSE_SEARCH_WINDOW
        before = rows_read(conn)
        page = repository.reads.page_jobs(conn, JobFilter(status=Status.FAILED, search="no such text"))
        read = rows_read(conn) - before
        newest = (
            conn.exec_driver_sql(f"SELECT id FROM job_queue WHERE status = 'failed' ORDER BY id DESC LIMIT {window}")
            .scalars()
            .all()
        )
        assert (page.jobs, page.matches, page.window, page.window_floor) == ([], 0, window, newest[-1])
        groups = 2  # q1 and q2, priority 0
        assert read <= groups * window + window + 100, read
        # The next window starts below this one's floor, and the count over the search agrees.
        assert page.older == newest[-1]
        assert repository.reads.count_matching(conn, JobFilter(status=Status.FAILED, search="said 503")) == (
            min(
                conn.exec_driver_sql(
                    f"SELECT COUNT(*) FROM job_queue WHERE status = 'failed' AND id >= {newest[-1]} "
                    "AND last_error LIKE '%%said 503%%'"
                ).scalar(),
                repository.reads.COUNT_CAP,
            ),
            False,
        )
