"""Enqueue by name from a process that imports no handler (issue 23, part 3): the built-in tasks
are known everywhere, a task a worker registered is known with that worker's options, a misspelt
name is still refused, and `allow_unregistered` takes a name no worker has shown yet. Through the
Python client, the command line and the HTTP API."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import sqlalchemy as sa

from jobqueue.core.schema import job_queue, task_definition
from testkit.procs import REPO, cli_env, jobqueue

# A producer: imports jobqueue and nothing else (no testkit, no --tasks).
PRODUCER = textwrap.dedent("""
    import json, sys
    import jobqueue
    from jobqueue.core.errors import ValidationError

    jq = jobqueue.JobQueue.from_env()
    out = {}
    for name, key, options in json.loads(sys.argv[1]):
        try:
            res = jq.enqueue(name, key, {"key": "k"}, **options)
            out[key] = {"id": res.id, "duplicate": res.duplicate}
        except ValidationError as exc:
            out[key] = {"error": str(exc), "field": exc.field}
    assert "testkit" not in sys.modules and "testkit.tasks" not in sys.modules
    print(json.dumps(out))
""")


def produce(url: str, *calls) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env=cli_env(JOBQUEUE_DATABASE_URL=url, JOBQUEUE_TASKS=""),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def job(engine, key: str):
    with engine.connect() as c:
        return c.execute(sa.select(job_queue).where(job_queue.c.task_key == key)).one()


def start_a_worker(url: str) -> None:
    """A real worker process with the test tasks: it registers them as it starts."""
    done = jobqueue(url, "worker", "--burst", "--tasks", "testkit.tasks", "--queues", "nothing-here")
    assert done.returncode == 0, done.stderr


def test_a_process_that_imports_no_handler_enqueues_by_name(db_url, engine):
    # Before any worker: the built-in task is known, a worker's task is not (yet).
    first = produce(
        db_url,
        ["noop", "builtin-1", {}],
        ["keyed_pair", "early-1", {}],
        ["keyed_pair", "early-2", {"allow_unregistered": True}],
    )
    assert "id" in first["builtin-1"], first
    assert first["early-1"]["field"] == "task" and "unknown task 'keyed_pair'" in first["early-1"]["error"]
    assert "allow_unregistered" in first["early-1"]["error"]
    early = job(engine, "early-2")
    assert (early.queue, early.max_attempts, early.concurrency_key) == ("default", 5, None)

    start_a_worker(db_url)
    with engine.connect() as c:
        names = set(c.execute(sa.select(task_definition.c.name)).scalars())
    assert {"keyed_pair", "fail_first_attempt", "noop"} <= names

    later = produce(
        db_url,
        ["keyed_pair", "later-1", {}],
        ["fail_first_atempt", "typo-1", {}],
        ["fail_first_attempt", "later-2", {}],
    )
    assert "id" in later["later-1"] and "id" in later["later-2"], later
    # The worker's options: its concurrency key and its attempts, not the defaults.
    assert job(engine, "later-1").concurrency_key == "keyed_pair:k"
    assert job(engine, "later-2").max_attempts == 1
    assert later["typo-1"]["field"] == "task"
    assert "fail_first_attempt" in later["typo-1"]["error"]  # the names it could have meant


def test_the_command_line_enqueues_by_name_without_the_task_module(db_url, engine):
    def enqueue(*args):
        return subprocess.run(
            [sys.executable, "-m", "jobqueue.cli", "enqueue", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=cli_env(JOBQUEUE_DATABASE_URL=db_url),
        )

    assert enqueue("noop", "--key", "cli-1").returncode == 0
    refused = enqueue("record_runs", "--key", "cli-2")
    assert refused.returncode == 2 and "unknown task 'record_runs'" in refused.stderr
    allowed = enqueue("record_runs", "--key", "cli-3", "--allow-unregistered")
    assert allowed.returncode == 0, allowed.stderr
    start_a_worker(db_url)
    assert enqueue("record_runs", "--key", "cli-4").returncode == 0
    assert job(engine, "cli-4").max_attempts == 5 and job(engine, "cli-4").task_name == "record_runs"

    lines = "\n".join(
        json.dumps(j)
        for j in [
            {"task": "hold_first_attempt", "task_key": "many-1"},
            {"task": "never_registered", "task_key": "many-2", "allow_unregistered": True},
        ]
    )
    many = subprocess.run(
        [sys.executable, "-m", "jobqueue.cli", "enqueue-many", "-"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=cli_env(JOBQUEUE_DATABASE_URL=db_url),
    )
    assert many.returncode == 0, many.stdout + many.stderr
    assert job(engine, "many-1").max_attempts == 3 and job(engine, "many-2").queue == "default"


def test_the_http_api_enqueues_a_task_only_a_worker_registered(db_url, engine):
    from jobqueue.core.repository.processes import register_process
    from jobqueue.core.tasks import TaskSpec, handled_elsewhere
    from testkit.web import api, signed_in_app

    with engine.connect() as c:  # what a worker whose code has `remote_only` writes as it starts
        register_process(
            c,
            process_id="elsewhere:1",
            host="elsewhere",
            pid=1,
            kind="worker",
            concurrency=1,
            queues="*",
            tasks=[TaskSpec("remote_only", handled_elsewhere, "mail", 2)],
        )
    with signed_in_app(db_url) as (_, client):
        made = api(client, "POST", "/api/jobs", json={"task": "remote_only", "task_key": "api-1"})
        assert made.status_code == 201, made.json
        typo = api(client, "POST", "/api/jobs", json={"task": "remote_onyl", "task_key": "api-2"})
        assert typo.status_code == 422 and typo.json["field"] == "task" and "remote_only" in typo.json["error"]
        odd = api(client, "POST", "/api/jobs", json={"task": "x", "task_key": "api-3", "allow_unregistered": "yes"})
        assert odd.status_code == 422 and odd.json["field"] == "allow_unregistered"
        batch = api(
            client,
            "POST",
            "/api/jobs",
            json=[
                {"task": "remote_only", "task_key": "api-4"},
                {"task": "later", "task_key": "api-5", "allow_unregistered": True},
            ],
        )
        assert batch.status_code == 201, batch.json
    assert (job(engine, "api-1").queue, job(engine, "api-1").max_attempts) == ("mail", 2)
    assert job(engine, "api-4").queue == "mail" and job(engine, "api-5").task_name == "later"
    with engine.connect() as c:
        assert (
            c.execute(
                sa.select(sa.func.count()).select_from(job_queue).where(job_queue.c.task_key.in_(["api-2", "api-3"]))
            ).scalar()
            == 0
        )
