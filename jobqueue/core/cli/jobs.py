"""Commands on jobs: enqueue one or many, list, show, explain, result, requeue, fail, cancel."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..errors import EXIT_BAD_INPUT, EXIT_NOT_FOUND, ValidationError
from .base import (
    actor,
    allow_unregistered_option,
    engine_of,
    fail,
    json_option,
    main,
    payload_of,
    print_json,
    queue_command,
    tasks_option,
    with_tasks,
)


@main.command()
@click.argument("task")
@click.option("--key", "task_key", required=True, help="Idempotency key (1-80 characters)")
@click.option("--payload", default="{}", show_default=True, help="A JSON object")
@click.option("--queue", default=None, help="Queue name (default: the task's queue)")
@click.option("--priority", type=int, default=0, show_default=True, help="Lower runs first")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before it may run")
@click.option("--max-attempts", type=int, default=None, help="Attempts before it fails for good")
@click.option(
    "--after",
    "after",
    multiple=True,
    metavar="KEY",
    help="Wait (blocked) until the job with this task_key is done; repeat for several",
)
@click.option(
    "--on-parent-failure",
    type=click.Choice(["cancel", "run"]),
    default="cancel",
    show_default=True,
    help="When a job named in --after fails or is cancelled: cancel this one, or run it anyway",
)
@click.option("--batch", default=None, metavar="KEY", help="A member of this open batch (`jobqueue batch open`)")
@allow_unregistered_option
@tasks_option
@queue_command
def enqueue(
    ctx: click.Context,
    task: str,
    task_key: str,
    payload: str,
    queue: str | None,
    priority: int,
    delay: float,
    max_attempts: int | None,
    after: tuple[str, ...],
    on_parent_failure: str,
    batch: str | None,
    allow_unregistered: bool,
    tasks: str | None,
    database_url: str | None,
) -> None:
    """Add a job; prints {"id", "task_key", "duplicate", "status"}. TASK is a task of --tasks, a
    built-in one, or one a worker registered; --allow-unregistered takes any name. With --after,
    the job is `blocked` until those jobs are done; an unknown key or a cycle exits 2, writing
    nothing. With --batch, a member of that batch: a closed batch exits 3, an unknown one 4."""
    from .. import repository, service

    with_tasks(ctx, database_url, tasks)
    data = payload_of(payload)
    with engine_of(ctx, database_url).connect() as conn:
        res = service.enqueue(
            conn,
            task,
            task_key,
            data,
            queue=queue,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            allow_unregistered=allow_unregistered,
            after=after,
            on_parent_failure=on_parent_failure,
            batch=batch,
        )
        status = res.status or repository.reads.get_job(conn, res.id).status
    print_json({"id": res.id, "task_key": res.task_key, "duplicate": res.duplicate, "status": str(status)})


@main.command("enqueue-many")
@click.argument("file", type=click.File("rb"))
@allow_unregistered_option
@tasks_option
@queue_command
def enqueue_many_cmd(
    ctx: click.Context, file, allow_unregistered: bool, tasks: str | None, database_url: str | None
) -> None:
    """Add the jobs in FILE, JSON lines (`-`: standard input), one job a line with the fields of
    POST /api/jobs ({"task", "task_key", "payload", "queue", "priority", "delay",
    "max_attempts", "allow_unregistered"}); blank lines are skipped. 1,000 jobs per transaction.

    Prints one JSON line per job, in order: {"id", "task_key", "duplicate", "status"}. A bad
    line prints {"line", "error", "field"} instead, and nothing of its batch is written (its other
    jobs print {"line", "task_key", "error"}); the other batches still go in. Exit 2 if any line
    was refused."""
    import queue
    import threading
    from json.encoder import encode_basestring_ascii as json_string  # json.dumps of a str, minus its overhead

    from .. import repository, service
    from ..validation import MAX_BATCH_JOBS, job_spec, max_payload_bytes

    with_tasks(ctx, database_url, tasks)
    limit = max_payload_bytes()
    out = sys.stdout
    refused: list[str] = []
    engine = engine_of(ctx, database_url)

    known = repository.task_definitions.KnownTasks(engine)

    def parse(raw: bytes):
        try:
            return repository.enqueue.validate_job(
                job_spec(json.loads(raw.decode("utf-8"))),
                limit=limit,
                registry=known,
                allow_unregistered=allow_unregistered,
            )
        except ValidationError as exc:
            return exc
        except RecursionError:
            return ValidationError("the line is nested too deeply to be read")
        except ValueError as exc:  # not JSON, or not UTF-8 (UnicodeDecodeError)
            return ValidationError(f"not a JSON object: {exc}")

    def flush(conn, batch: list[tuple[int, Any]]) -> None:
        bad = {number: job for number, job in batch if isinstance(job, ValidationError)}
        if bad:
            first = min(bad)
            for number, job in batch:
                if number in bad:
                    refused.append(f"line {number}: {job}")
                    line = {"line": number, "error": str(job), "field": job.field}
                else:
                    line = {
                        "line": number,
                        "task_key": job.task_key,
                        "error": f"not written: line {first} of the same batch was refused",
                    }
                out.write(json.dumps(line) + "\n")
            return
        results = service.enqueue_many(conn, repository.enqueue.Validated(job for _, job in batch))
        out.write(
            "".join(
                f'{{"id": {r.id}, "task_key": {json_string(r.task_key)}, "duplicate": '
                f'{"true" if r.duplicate else "false"}, "status": "{r.status.value}"}}\n'
                for r in results
            )
        )
        out.flush()

    # A thread reads and checks the next batch while this one is written: the GIL is free while
    # the write waits for the server, and the lines cost about as much as the write's own Python.
    batches: queue.Queue = queue.Queue(maxsize=1)
    taking = threading.Event()  # cleared when this thread stops taking batches
    taking.set()

    def hand_over(item: Any) -> None:
        while taking.is_set():
            try:
                batches.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def read() -> None:
        try:
            batch: list[tuple[int, Any]] = []
            for number, raw in enumerate(file, 1):
                if raw.isspace():
                    continue
                batch.append((number, parse(raw)))
                if len(batch) == MAX_BATCH_JOBS:
                    hand_over(batch)
                    batch = []
                    if not taking.is_set():
                        return
            hand_over(batch)
            hand_over(None)
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread
            hand_over(exc)

    # Start-up's objects are out of the collector's way already (engine_of: started()).
    threading.Thread(target=read, name="enqueue-many-reader", daemon=True).start()
    try:
        with engine.connect() as conn:
            while (batch := batches.get()) is not None:
                if isinstance(batch, BaseException):
                    raise batch
                if batch:
                    flush(conn, batch)
    finally:
        taking.clear()
    if refused:
        fail(EXIT_BAD_INPUT, f"{len(refused)} line(s) refused; their batches were not written (first: {refused[0]})")


def _operator(ctx: click.Context, database_url: str | None, action) -> None:
    with engine_of(ctx, database_url).connect() as conn:
        result = action(conn)
    print_json(
        {"id": result.job_id, "before": str(result.before), "after": str(result.after), "changed": result.changed}
    )


@main.command()
@click.argument("job_id", type=int)
@click.option("--force", is_flag=True, help="Also requeue a running job whose lease is still valid")
@click.option(
    "--again",
    is_flag=True,
    help="Also requeue a done job: its handler runs again (record_result still "
    "keeps the one result row of its task_key)",
)
@queue_command
def requeue(ctx: click.Context, job_id: int, force: bool, again: bool, database_url: str | None) -> None:
    """Put a job back to ready (attempts kept)."""
    from .. import service

    _operator(
        ctx, database_url, lambda conn: service.requeue_job(conn, job_id, force=force, again=again, actor=actor())
    )


@main.command("fail")
@click.argument("job_id", type=int)
@click.option("--reason", default=None, help="Kept as the job's last error")
@queue_command
def fail_cmd(ctx: click.Context, job_id: int, reason: str | None, database_url: str | None) -> None:
    """Mark a job failed now."""
    from .. import service

    _operator(ctx, database_url, lambda conn: service.fail_job(conn, job_id, reason, actor=actor()))


@main.command("cancel")
@click.argument("job_id", type=int)
@click.option("--reason", default=None, help="Kept in the audit log")
@queue_command
def cancel_cmd(ctx: click.Context, job_id: int, reason: str | None, database_url: str | None) -> None:
    """Cancel a job: at once from ready, scheduled or failed; a running job's lease is fenced.
    Exit 3 when the job is already done."""
    from .. import service

    _operator(ctx, database_url, lambda conn: service.cancel_job(conn, job_id, reason, actor=actor()))


@main.command("list")
@click.option("--status", default=None, help="ready, scheduled, running, done or failed")
@click.option("--queue", default=None)
@click.option("--task", default=None, help="Task name")
@click.option("--key", default=None, help="task_key prefix")
@click.option(
    "-q",
    "--search",
    "q",
    default=None,
    help="Text in the payload, the last error or the task_key (reads at most the newest 50,000 jobs "
    "matching the other filters; --before continues below)",
)
@click.option("--before", default=None, help="Jobs older than this id (the previous answer's next_before)")
@click.option("--limit", default=None, help="At most this many (default 50, at most 500)")
@json_option("{jobs, next_before, prev_after, matches, ...}")
@queue_command
def list_cmd(
    ctx: click.Context,
    status: str | None,
    queue: str | None,
    task: str | None,
    key: str | None,
    q: str | None,
    before: str | None,
    limit: str | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Jobs matching the filters, newest first (keyset paging: --before)."""
    from .. import repository
    from ..validation import job_query

    query = job_query(
        {"status": status, "queue": queue, "task": task, "key": key, "q": q, "before": before, "limit": limit}
    )
    with engine_of(ctx, database_url).connect() as conn:
        page = repository.reads.page_jobs(conn, query.job_filter, before=query.before, limit=query.limit)
    if as_json:
        print_json(page.as_dict())
        return
    click.echo(f"{'id':>10}  {'status':<9} {'attempts':>8}  {'queue':<12} {'task':<16} {'task_key':<32} last error")
    for job in page.jobs:
        error = (job.last_error or "").splitlines()[0][:60] if job.last_error and job.status.value == "failed" else ""
        click.echo(
            f"{job.id:>10}  {job.status.value:<9} {f'{job.attempts}/{job.max_attempts}':>8}  "
            f"{job.queue[:12]:<12} {job.task_name[:16]:<16} {job.task_key[:32]:<32} {error}"
        )
    matches = f"{page.matches:,}{'+' if page.capped else ''}"
    tail = f"{len(page.jobs)} shown of {matches} matching"
    if page.window is not None:
        tail += f" (searched {page.window:,} jobs at most)"
    if page.older is not None:
        tail += f"; older: --before {page.older}"
    click.echo(tail, err=True)


@main.command()
@click.argument("job_id", type=int)
@json_option("The job with its result and attempt_history")
@queue_command
def show(ctx: click.Context, job_id: int, as_json: bool, database_url: str | None) -> None:
    """One job: its row, its attempts and its result (exit 4 when there is no such job)."""
    from .. import repository
    from ..models import iso

    with engine_of(ctx, database_url).connect() as conn:
        job = repository.reads.get_job(conn, job_id)
        if job is None:
            fail(EXIT_NOT_FOUND, f"job {job_id} not found")
        result = repository.reads.get_result(conn, job.task_key)
        attempts = repository.reads.list_attempts(conn, job_id)
    data = job.as_dict()
    data["result"] = result["result"] if result else None
    data["attempt_history"] = [
        {**a, "started_at": iso(a["started_at"]), "finished_at": iso(a["finished_at"])} for a in attempts
    ]
    if as_json:
        print_json(data)
        return
    for name in (
        "id",
        "task_key",
        "task",
        "queue",
        "status",
        "priority",
        "lease_owner",
        "lease_until",
        "run_at",
        "created_at",
        "started_at",
        "finished_at",
        "updated_at",
    ):
        click.echo(f"{name:<13} {data[name] if data[name] is not None else '-'}")
    click.echo(f"{'attempts':<13} {job.attempts}/{job.max_attempts}")
    click.echo(f"{'payload':<13} {json.dumps(job.payload, sort_keys=True, ensure_ascii=False)}")
    click.echo(f"{'result':<13} " + (json.dumps(data["result"], sort_keys=True, ensure_ascii=False) if result else "-"))
    if job.last_error:
        click.echo("last error:")
        click.echo("  " + job.last_error.replace("\n", "\n  "))
    for a in attempts:
        error = (a["error"] or "").splitlines()[0][:80] if a["error"] else ""
        click.echo(
            f"attempt {a['attempt']}: {a['outcome']} by {a['worker'] or '-'} "
            f"{iso(a['started_at']) or '-'} .. {iso(a['finished_at'])} {error}".rstrip()
        )


@main.command()
@click.argument("job_id", type=int)
@json_option('{"job_id", "status", "reasons": [{"code", "detail", ...}]}')
@queue_command
def explain(ctx: click.Context, job_id: int, as_json: bool, database_url: str | None) -> None:
    """Why a job is (not) running: its reasons, the main one first (exit 4 when there is no such
    job). Reads only; waits at most about a second on a held row."""
    from .. import repository

    # Two connections: a held row's holder is named by a probe on a second one.
    with engine_of(ctx, database_url, pool_size=2).connect() as conn:
        explanation = repository.explain.explain(conn, job_id)
    if as_json:
        print_json(explanation.as_dict())
        return
    click.echo(f"job {explanation.job_id}: {explanation.status.value}")
    for reason in explanation.reasons:
        click.echo(f"  {reason.code}: {reason.detail}")


@main.command("result")
@click.argument("task_key")
@click.option(
    "--wait",
    "wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the job to finish (0: answer at once)",
)
@json_option('{"id", "task_key", "status", "result", "error", "finished_at"}')
@queue_command
def result_cmd(ctx: click.Context, task_key: str, wait: float, as_json: bool, database_url: str | None) -> None:
    """The result of the job TASK_KEY: what its handler returned or recorded (JSON; null if
    neither). Exit 0 done (prints the result), 1 failed or cancelled (prints its last error),
    3 not finished (at once, or after --wait SECONDS), 4 no such job. While it waits it reads the
    job's row once a second. --json prints {"id", "task_key", "status", "result", "error",
    "finished_at"}: `status` done, failed, cancelled or
    where it stands (scheduled, ready, running), `result` null unless done, `error` the last error
    of a failed or cancelled job, `finished_at` ISO 8601 or null."""
    from ..errors import EXIT_ERROR, EXIT_OK, EXIT_STATE
    from ..models import Status
    from ..results import wait_for

    outcome = wait_for(engine_of(ctx, database_url), task_key=task_key, timeout=wait)
    code = EXIT_OK if outcome.status is Status.DONE else EXIT_ERROR if outcome.finished else EXIT_STATE
    if as_json:
        print_json(outcome.as_dict())
    elif outcome.status is Status.DONE:
        click.echo(json.dumps(outcome.result, sort_keys=True, ensure_ascii=False))
    elif outcome.finished:
        click.echo(f"job {task_key} {outcome.status.value}: {outcome.error or 'no error recorded'}", err=True)
    else:
        click.echo(f"job {task_key} not finished: {outcome.status.value}", err=True)
    sys.exit(code)
