"""The `jobqueue` command's queue commands (`jobqueue serve` lives in the web layer, see
jobqueue/cli.py, which puts the two together).

Exit codes (jobqueue.core.errors): 0 ok; 1 unexpected or database error (including an
unreachable database); 2 bad input; 3 the job's state does not allow the action, or the server
cannot run the queue safely (a worker refusing to start, `doctor` finding a problem; warnings
alone exit 0); 4 no such job; 75 busy right now or no writable primary (try again).

Each command imports what it uses when it runs, so `jobqueue enqueue` costs little more than
importing SQLAlchemy and PyMySQL: no Alembic, no prometheus_client, no Flask.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
from typing import Any

import click

from .errors import (EXIT_BAD_INPUT, EXIT_ERROR, EXIT_NOT_FOUND, EXIT_STATE, JobQueueError, LeaseStillValid,
                     RunAgainNeeded, ValidationError, answer_for)
from .settings import BY_ATTRIBUTE, PREFIX, Settings, SettingsError, use

url_option = click.option("--database-url", envvar="JOBQUEUE_DATABASE_URL", default=None,
                          help="mysql+pymysql://user:pass@host/db or sqlite:///path; several URLs separated by "
                               "spaces name candidate primaries [env JOBQUEUE_DATABASE_URL; default: SQLite under "
                               "./instance]")
tasks_option = click.option("--tasks", "tasks", envvar="JOBQUEUE_TASKS", default=None,
                            help="Comma-separated modules that register tasks [env JOBQUEUE_TASKS]")


def setting_option(attribute: str, *flags: str, **kwargs: Any):
    """A flag whose default is a setting's (settings.py declares it once): its JOBQUEUE_ variable,
    parsed as the setting's own, else the declared default."""
    declared = BY_ATTRIBUTE[attribute]

    def default() -> Any:
        raw = os.environ.get(PREFIX + declared.name)
        try:
            return declared.default if raw is None else declared.parse(declared.name, raw)
        except SettingsError as exc:
            raise click.BadParameter(str(exc)) from None

    shown = f"{declared.default:g}" if isinstance(declared.default, float) else str(declared.default)
    help_text = f"{kwargs.pop('help', '')} [env {PREFIX}{declared.name}; default: {shown}]".lstrip()
    return click.option(*flags, default=default, show_default=False, help=help_text, **kwargs)

allow_unregistered_option = click.option(
    "--allow-unregistered", is_flag=True,
    help="Take a task name that neither --tasks, the built-in tasks nor any worker registered (its worker "
         "has not started yet); without it such a name is refused as a likely typo")


def fail(code: int, message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def answers_errors(fn):
    """The queue's errors as their exit code and one line, the same mapping the API uses."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return fn(*args, **kwargs)
        except LeaseStillValid as exc:
            fail(exc.exit_code, f"{exc} (use --force)")
        except RunAgainNeeded as exc:
            fail(exc.exit_code, f"{exc} (use --again)")
        except JobQueueError as exc:
            fail(answer_for(exc).exit_code, str(exc))
        except SettingsError as exc:
            fail(EXIT_BAD_INPUT, str(exc))
        except SQLAlchemyError as exc:
            fail(EXIT_ERROR, f"database: {getattr(exc, 'orig', None) or exc}")
    return wrapped


def settings_of(ctx: click.Context, url: str | None = None) -> Settings:
    """The process's settings: the environment, with --database-url over it."""
    url = url or ctx.obj.get("database_url")
    try:
        settings = Settings.from_env(**({"DATABASE_URL": url} if url else {}))
    except SettingsError as exc:
        fail(EXIT_BAD_INPUT, str(exc))
    use(settings)
    return settings


def engine_of(ctx: click.Context, url: str | None, pool_size: int = 1):
    from .db import create_engine

    settings = settings_of(ctx, url)
    try:
        engine = create_engine(settings.database_urls or None, pool_size=pool_size, settings=settings)
    except ValueError as exc:
        fail(EXIT_BAD_INPUT, str(exc))
    started()
    return engine


# Start-up makes some 50,000 objects that live as long as the process (SQLAlchemy's and our
# modules, the task modules, the schema) and little garbage. The cyclic collector scans them
# again and again while they are made (~15% of a command's start-up), and once more at exit
# (~0.1 s, as long as a worker's preflight and first claim together). So the console entry point
# pauses it (`pause_collector`) until the command has imported what it uses and built its engine
# (`started`), then freezes what exists: never scanned again, at exit neither.
_collector_paused = False


def pause_collector() -> None:
    """Called by the console entry point (jobqueue.cli.run) before the command's own imports
    (SQLAlchemy, the repository, the worker, the task modules); `started()` resumes collecting."""
    global _collector_paused
    if gc.isenabled():
        gc.disable()
        _collector_paused = True


def started() -> None:
    """The command has what it needs to run: keep what exists out of every later collection and
    collect again (a long-running command makes garbage like any program). Nothing unless
    `pause_collector` paused the collector (never in a test that runs a command in-process)."""
    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str, sort_keys=True))


def actor() -> str:
    """Who runs this command, for the audit log: the OS account (from the password database, so
    it is right when $USER is unset, as under cron or systemd)."""
    name = None
    try:
        import pwd

        name = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        name = os.environ.get("USER") or os.environ.get("LOGNAME")
    return f"cli:{name or 'unknown'}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@url_option
@setting_option("log_level", "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                                               case_sensitive=False))
@click.pass_context
def main(ctx: click.Context, database_url: str | None, log_level: str) -> None:
    """A job queue in a MySQL table, claimed with SELECT ... FOR UPDATE SKIP LOCKED."""
    from . import logs, metrics

    long_running = ctx.invoked_subcommand in ("worker", "serve", "demo")
    if ctx.invoked_subcommand not in main.commands:
        started()   # commands from above the core (serve) make no engine here: collect as usual
    logs.setup(log_level, threaded=long_running)
    if not long_running:
        metrics.off()   # a one-shot command serves no metrics: do not pay for them
    ctx.ensure_object(dict)
    ctx.obj["database_url"] = database_url


@main.command("init-db")
@url_option
@click.pass_context
@answers_errors
def init_db_cmd(ctx: click.Context, database_url: str | None) -> None:
    """Create or upgrade the schema (safe to run twice)."""
    from .migrate import init_db

    before, after = init_db(engine_of(ctx, database_url))
    click.echo(f"schema at revision {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@main.command()
@click.argument("task")
@click.option("--key", "task_key", required=True, help="Idempotency key (1-80 characters)")
@click.option("--payload", default="{}", show_default=True, help="A JSON object")
@click.option("--queue", default=None, help="Queue name (default: the task's queue)")
@click.option("--priority", type=int, default=0, show_default=True, help="Lower runs first")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before it may run")
@click.option("--max-attempts", type=int, default=None, help="Attempts before it fails for good")
@allow_unregistered_option
@tasks_option
@url_option
@click.pass_context
@answers_errors
def enqueue(ctx: click.Context, task: str, task_key: str, payload: str, queue: str | None, priority: int,
            delay: float, max_attempts: int | None, allow_unregistered: bool, tasks: str | None,
            database_url: str | None) -> None:
    """Add a job; prints {"id", "task_key", "duplicate", "status"}. TASK is a task of --tasks, a
    built-in one, or one a worker registered; --allow-unregistered takes any name."""
    from . import repository
    from .task_modules import load_task_modules

    settings = settings_of(ctx, database_url)
    load_task_modules(tasks if tasks is not None else settings.task_modules)
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        fail(EXIT_BAD_INPUT, f"--payload is not valid JSON: {exc}")
    with engine_of(ctx, database_url).connect() as conn:
        res = repository.enqueue(conn, task, task_key, data, queue=queue, priority=priority, delay=delay,
                                 max_attempts=max_attempts, allow_unregistered=allow_unregistered)
        status = res.status or repository.get_job(conn, res.id).status
    print_json({"id": res.id, "task_key": res.task_key, "duplicate": res.duplicate, "status": str(status)})


@main.command("enqueue-many")
@click.argument("file", type=click.File("rb"))
@allow_unregistered_option
@tasks_option
@url_option
@click.pass_context
@answers_errors
def enqueue_many_cmd(ctx: click.Context, file, allow_unregistered: bool, tasks: str | None,
                     database_url: str | None) -> None:
    """Add the jobs in FILE, JSON lines (`-`: standard input), one job a line with the fields of
    POST /api/jobs ({"task", "task_key", "payload", "queue", "priority", "delay",
    "max_attempts", "allow_unregistered"}); blank lines are skipped. 1,000 jobs per transaction.

    Prints one JSON line per job, in order: {"id", "task_key", "duplicate", "status"}. A bad
    line prints {"line", "error", "field"} instead, and nothing of its batch is written (its other
    jobs print {"line", "task_key", "error"}); the other batches still go in. Exit 2 if any line
    was refused."""
    import queue
    import threading
    from json.encoder import encode_basestring_ascii as json_string   # json.dumps of a str, minus its overhead

    from . import repository
    from .task_modules import load_task_modules
    from .validation import MAX_BATCH_JOBS, job_spec, max_payload_bytes

    settings = settings_of(ctx, database_url)
    load_task_modules(tasks if tasks is not None else settings.task_modules)
    limit = max_payload_bytes()
    out = sys.stdout
    refused: list[str] = []
    engine = engine_of(ctx, database_url)

    known = repository.KnownTasks(engine)

    def parse(raw: bytes):
        try:
            return repository.validate_job(job_spec(json.loads(raw.decode("utf-8"))), limit=limit, registry=known,
                                           allow_unregistered=allow_unregistered)
        except ValidationError as exc:
            return exc
        except RecursionError:
            return ValidationError("the line is nested too deeply to be read")
        except ValueError as exc:   # not JSON, or not UTF-8 (UnicodeDecodeError)
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
                    line = {"line": number, "task_key": job.task_key,
                            "error": f"not written: line {first} of the same batch was refused"}
                out.write(json.dumps(line) + "\n")
            return
        results = repository.enqueue_many(conn, repository.Validated(job for _, job in batch))
        out.write("".join(f'{{"id": {r.id}, "task_key": {json_string(r.task_key)}, "duplicate": '
                          f'{"true" if r.duplicate else "false"}, "status": "{r.status.value}"}}\n'
                          for r in results))
        out.flush()

    # A thread reads and checks the next batch while this one is written: the GIL is free while
    # the write waits for the server, and the lines cost about as much as the write's own Python.
    batches: queue.Queue = queue.Queue(maxsize=1)
    taking = threading.Event()   # cleared when this thread stops taking batches
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
        except BaseException as exc:   # noqa: BLE001 - raised in the main thread
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
        fail(EXIT_BAD_INPUT, f"{len(refused)} line(s) refused; their batches were not written "
                             f"(first: {refused[0]})")


class FiniteRange(click.FloatRange):
    """A number in a range, never NaN or an infinity: NaN compares false with both ends, so
    click.FloatRange let `--done-older-than nan` through to a traceback."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class PrefetchType(click.ParamType):
    """A number of jobs from 0 to 256, or `auto` (None)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value is None or value == "auto":
            return None
        if isinstance(value, int):
            number = value
        else:
            try:
                number = int(value)
            except ValueError:
                self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)
        if not 0 <= number <= 256:
            self.fail(f"{number} is not in the range 0<=x<=256", param, ctx)
        return number


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True, help="Handler threads")
@click.option("--queues", default=None, help="Comma-separated queues to take jobs from (default: all)")
@click.option("--name", default=None, help="Worker name, added to host:pid in lease owners")
@setting_option("lease_seconds", "--lease-seconds", type=FiniteRange(1, 86400),
                help="How long a claimed job is leased, renewed every third of it")
@setting_option("grace_seconds", "--grace-seconds", type=FiniteRange(0, 86400),
                help="On SIGTERM, how long running jobs may finish before they are released")
@click.option("--idle-cap-seconds", type=FiniteRange(0.05, 300), default=2.0, show_default=True,
              help="Longest sleep between claims when idle")
@click.option("--prefetch", type=PrefetchType(), default="auto", show_default=True,
              help="Jobs claimed ahead of a free thread (leased and renewed while they wait): a number, or "
                   "auto (up to one per thread while handlers take under 0.1 s on average)")
@click.option("--burst", is_flag=True, help="Exit when nothing is ready for this worker and it holds nothing")
@click.option("--no-doorbell", is_flag=True,
              help="Do not listen for other processes' enqueues while idle (MySQL); poll only")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve this process's Prometheus metrics on 127.0.0.1:PORT/metrics")
@tasks_option
@url_option
@click.pass_context
@answers_errors
def worker(ctx: click.Context, concurrency: int, queues: str | None, name: str | None, lease_seconds: float,
           grace_seconds: float, idle_cap_seconds: float, prefetch: int | None, burst: bool, no_doorbell: bool,
           metrics_port: int | None, tasks: str | None, database_url: str | None) -> None:
    """Run a worker process with N threads."""
    from .task_modules import load_task_modules
    from .worker import Worker, WorkerConfig

    settings = settings_of(ctx, database_url)
    load_task_modules(tasks if tasks is not None else settings.task_modules)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=settings.metrics_addr or "127.0.0.1")
    queue_list = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    config = WorkerConfig(concurrency=concurrency, queues=queue_list, name=name, lease_seconds=lease_seconds,
                          grace_seconds=grace_seconds, idle_cap_seconds=idle_cap_seconds, burst=burst,
                          prefetch=prefetch, doorbell=not no_doorbell,
                          # With several candidate primaries a read-only one at start is a failover
                          # under way: wait for the new primary instead of refusing.
                          refuse_read_only_at_start=len(settings.database_urls) <= 1)
    engine = engine_of(ctx, database_url, pool_size=concurrency + 3)
    sys.exit(Worker(engine, config).run())


@main.command()
@url_option
@click.pass_context
@answers_errors
def reap(ctx: click.Context, database_url: str | None) -> None:
    """Return running jobs whose lease expired to ready (or failed when out of attempts)."""
    from . import repository

    with engine_of(ctx, database_url).connect() as conn:
        result = repository.reap(conn)
        promoted = repository.promote_due(conn)
    print_json({"reclaimed": result.reclaimed, "failed": result.failed, "promoted": promoted})


def _operator(ctx: click.Context, database_url: str | None, action) -> None:
    with engine_of(ctx, database_url).connect() as conn:
        result = action(conn)
    print_json({"id": result.job_id, "before": str(result.before), "after": str(result.after),
                "changed": result.changed})


@main.command()
@click.argument("job_id", type=int)
@click.option("--force", is_flag=True, help="Also requeue a running job whose lease is still valid")
@click.option("--again", is_flag=True, help="Also requeue a done job: its handler runs again (record_result still "
                                            "keeps the one result row of its task_key)")
@url_option
@click.pass_context
@answers_errors
def requeue(ctx: click.Context, job_id: int, force: bool, again: bool, database_url: str | None) -> None:
    """Put a job back to ready (attempts kept)."""
    from . import repository

    _operator(ctx, database_url, lambda conn: repository.requeue_job(conn, job_id, force=force, again=again,
                                                                     actor=actor()))


@main.command("fail")
@click.argument("job_id", type=int)
@click.option("--reason", default=None, help="Kept as the job's last error")
@url_option
@click.pass_context
@answers_errors
def fail_cmd(ctx: click.Context, job_id: int, reason: str | None, database_url: str | None) -> None:
    """Mark a job failed now."""
    from . import repository

    _operator(ctx, database_url, lambda conn: repository.fail_job(conn, job_id, reason, actor=actor()))


@main.command("cancel")
@click.argument("job_id", type=int)
@click.option("--reason", default=None, help="Kept in the audit log")
@url_option
@click.pass_context
@answers_errors
def cancel_cmd(ctx: click.Context, job_id: int, reason: str | None, database_url: str | None) -> None:
    """Cancel a job: at once from ready, scheduled or failed; a running job's lease is fenced.
    Exit 3 when the job is already done."""
    from . import repository

    _operator(ctx, database_url, lambda conn: repository.cancel_job(conn, job_id, reason, actor=actor()))


def _queue_state(ctx: click.Context, database_url: str | None, queue: str, paused: bool) -> None:
    from . import repository

    with engine_of(ctx, database_url).connect() as conn:
        verb = repository.pause_queue if paused else repository.resume_queue
        state = verb(conn, queue, actor=actor())
    print_json({"queue": state.queue, "paused": state.paused})


@main.command()
@click.argument("queue")
@url_option
@click.pass_context
@answers_errors
def pause(ctx: click.Context, queue: str, database_url: str | None) -> None:
    """Stop claims from QUEUE within about a second (enqueue still works; running jobs finish)."""
    _queue_state(ctx, database_url, queue, True)


@main.command()
@click.argument("queue")
@url_option
@click.pass_context
@answers_errors
def resume(ctx: click.Context, queue: str, database_url: str | None) -> None:
    """Let workers claim from QUEUE again."""
    _queue_state(ctx, database_url, queue, False)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output")
@url_option
@click.pass_context
@answers_errors
def queues(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Every known queue: paused or not (who, when) and its jobs by status."""
    from . import repository
    from .models import Status

    with engine_of(ctx, database_url).connect() as conn:
        rows, _ = repository.list_queues(conn)
    if as_json:
        print_json({"queues": [{k: r[k] for k in ("queue", "paused", "changed_at", "changed_by", "counts")}
                               for r in rows]})
        return
    columns = [s.value for s in Status]
    click.echo(f"{'queue':<20}{'state':<9}" + "".join(f"{c:>11}" for c in columns) + "  changed")
    for r in rows:
        changed = f"  {r['changed_by']} at {r['changed_at']:%Y-%m-%d %H:%M:%S}" if r["changed_at"] else ""
        click.echo(f"{r['queue']:<20}{'paused' if r['paused'] else 'active':<9}"
                   + "".join(f"{r['counts'][c]:>11}" for c in columns) + changed)


@main.group()
def recurring() -> None:
    """Recurring jobs: cron schedules (UTC) stored in the database, enqueued by any worker."""


def _schedule_json(row: dict[str, Any]) -> dict[str, Any]:
    return {"name": row["name"], "cron": row["cron"], "task": row["task_name"], "payload": row["payload"],
            "queue": row["queue"], "enabled": row["enabled"], "source": row["source"],
            "next_run_at": row["next_run_at"], "last_run_at": row["last_run_at"], "last_job_id": row["last_job_id"]}


@recurring.command("add")
@click.argument("name")
@click.option("--cron", required=True, help='Five fields, UTC, e.g. "*/5 * * * *"; or @hourly, @daily, ...')
@click.option("--task", required=True, help="The task each run enqueues")
@click.option("--payload", default="{}", show_default=True, help="A JSON object")
@click.option("--queue", default=None, help="Queue name (default: the task's queue)")
@tasks_option
@url_option
@click.pass_context
@answers_errors
def recurring_add(ctx: click.Context, name: str, cron: str, task: str, payload: str, queue: str | None,
                  tasks: str | None, database_url: str | None) -> None:
    """Add a recurring job (or replace the definition of NAME); prints it."""
    from . import repository
    from .task_modules import load_task_modules

    settings = settings_of(ctx, database_url)
    load_task_modules(tasks if tasks is not None else settings.task_modules)
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        fail(EXIT_BAD_INPUT, f"--payload is not valid JSON: {exc}")
    with engine_of(ctx, database_url).connect() as conn:
        row, created = repository.upsert_recurring(conn, name, cron=cron, task=task, payload=data, queue=queue,
                                                   actor=actor())
    print_json({**_schedule_json(row), "created": created})


@recurring.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output")
@url_option
@click.pass_context
@answers_errors
def recurring_list(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Every recurring job: schedule, next and last run, the last run's job, enabled."""
    from . import repository

    with engine_of(ctx, database_url).connect() as conn:
        rows, _ = repository.list_recurring(conn)
    if as_json:
        print_json({"recurring": [_schedule_json(r) for r in rows]})
        return
    click.echo(f"{'name':<24}{'cron':<18}{'task':<20}{'enabled':<9}{'next run (UTC)':<21}{'last run':<21}last job")
    for r in rows:
        last = f"{r['last_run_at']:%Y-%m-%d %H:%M}" if r["last_run_at"] else "-"
        click.echo(f"{r['name']:<24}{r['cron']:<18}{r['task_name']:<20}{'yes' if r['enabled'] else 'no':<9}"
                   f"{r['next_run_at']:%Y-%m-%d %H:%M}{'':<5}{last:<21}{r['last_job_id'] or '-'}")


@recurring.command("remove")
@click.argument("name")
@url_option
@click.pass_context
@answers_errors
def recurring_remove(ctx: click.Context, name: str, database_url: str | None) -> None:
    """Delete a recurring job (its jobs stay). Exit 4 when there is none of that name."""
    from . import repository

    with engine_of(ctx, database_url).connect() as conn:
        repository.remove_recurring(conn, name, actor=actor())
    print_json({"name": name, "removed": True})


def _set_enabled(ctx: click.Context, database_url: str | None, name: str, enabled: bool) -> None:
    from . import repository

    with engine_of(ctx, database_url).connect() as conn:
        row, changed = repository.set_recurring_enabled(conn, name, enabled, actor=actor())
    print_json({"name": name, "enabled": row["enabled"], "changed": changed, "next_run_at": row["next_run_at"]})


@recurring.command("disable")
@click.argument("name")
@url_option
@click.pass_context
@answers_errors
def recurring_disable(ctx: click.Context, name: str, database_url: str | None) -> None:
    """Stop enqueueing runs of NAME."""
    _set_enabled(ctx, database_url, name, False)


@recurring.command("enable")
@click.argument("name")
@url_option
@click.pass_context
@answers_errors
def recurring_enable(ctx: click.Context, name: str, database_url: str | None) -> None:
    """Enqueue runs of NAME again, from its next tick (missed ticks are not caught up)."""
    _set_enabled(ctx, database_url, name, True)


@main.command()
@click.option("--done-older-than", "done_days", type=FiniteRange(0, 36500), default=None,
              help="Days a done job is kept [default: JOBQUEUE_KEEP_DONE_DAYS, 7; 0 keeps them]")
@click.option("--failed-older-than", "failed_days", type=FiniteRange(0, 36500), default=None,
              help="Days a failed or cancelled job is kept [default: JOBQUEUE_KEEP_FAILED_DAYS, 30; 0 keeps them]")
@click.option("--dry-run", is_flag=True, help="Count what would be pruned; delete nothing")
@url_option
@click.pass_context
@answers_errors
def prune(ctx: click.Context, done_days: float | None, failed_days: float | None, dry_run: bool,
          database_url: str | None) -> None:
    """Delete finished jobs past their keep time, in batches of 1,000 with pauses (their task_keys
    keep answering duplicate); prints the counts as JSON."""
    from . import repository

    settings = settings_of(ctx, database_url)
    with engine_of(ctx, database_url).connect() as conn:
        counts = repository.prune(conn, done_days=settings.keep_done_days if done_days is None else done_days,
                                  failed_days=settings.keep_failed_days if failed_days is None else failed_days,
                                  keys_days=settings.keep_keys_days, dry_run=dry_run, by=actor())
    print_json(counts.as_dict())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output")
@url_option
@click.pass_context
@answers_errors
def stats(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """Job counts by queue and status."""
    from . import repository
    from .models import Status

    with engine_of(ctx, database_url).connect() as conn:
        rows = repository.count_by_status(conn)
    queues: dict[str, dict[str, int]] = {}
    for queue, status, n in rows:
        queues.setdefault(queue, {s.value: 0 for s in Status})[status] = n
    totals = {s.value: sum(q[s.value] for q in queues.values()) for s in Status}
    if as_json:
        print_json({"queues": queues, "totals": totals})
        return
    columns = [s.value for s in Status]
    click.echo(f"{'queue':<20}" + "".join(f"{c:>11}" for c in columns))
    for queue in sorted(queues):
        click.echo(f"{queue:<20}" + "".join(f"{queues[queue][c]:>11}" for c in columns))
    click.echo(f"{'(all)':<20}" + "".join(f"{totals[c]:>11}" for c in columns))


@main.command("list")
@click.option("--status", default=None, help="ready, scheduled, running, done or failed")
@click.option("--queue", default=None)
@click.option("--task", default=None, help="Task name")
@click.option("--key", default=None, help="task_key prefix")
@click.option("-q", "--search", "q", default=None,
              help="Text in the payload, the last error or the task_key (reads at most the newest 50,000 jobs "
                   "matching the other filters; --before continues below)")
@click.option("--before", default=None, help="Jobs older than this id (the previous answer's next_before)")
@click.option("--limit", default=None, help="At most this many (default 50, at most 500)")
@click.option("--json", "as_json", is_flag=True, help="{jobs, next_before, prev_after, matches, ...}")
@url_option
@click.pass_context
@answers_errors
def list_cmd(ctx: click.Context, status: str | None, queue: str | None, task: str | None, key: str | None,
             q: str | None, before: str | None, limit: str | None, as_json: bool, database_url: str | None) -> None:
    """Jobs matching the filters, newest first (keyset paging: --before)."""
    from . import repository
    from .validation import job_query

    query = job_query({"status": status, "queue": queue, "task": task, "key": key, "q": q, "before": before,
                       "limit": limit})
    with engine_of(ctx, database_url).connect() as conn:
        page = repository.page_jobs(conn, query.job_filter, before=query.before, limit=query.limit)
    if as_json:
        print_json(page.as_dict())
        return
    click.echo(f"{'id':>10}  {'status':<9} {'attempts':>8}  {'queue':<12} {'task':<16} {'task_key':<32} last error")
    for job in page.jobs:
        error = (job.last_error or "").splitlines()[0][:60] if job.last_error and job.status.value == "failed" else ""
        click.echo(f"{job.id:>10}  {job.status.value:<9} {f'{job.attempts}/{job.max_attempts}':>8}  "
                   f"{job.queue[:12]:<12} {job.task_name[:16]:<16} {job.task_key[:32]:<32} {error}")
    matches = f"{page.matches:,}{'+' if page.capped else ''}"
    tail = f"{len(page.jobs)} shown of {matches} matching"
    if page.window is not None:
        tail += f" (searched {page.window:,} jobs at most)"
    if page.older is not None:
        tail += f"; older: --before {page.older}"
    click.echo(tail, err=True)


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="The job with its result and attempt_history")
@url_option
@click.pass_context
@answers_errors
def show(ctx: click.Context, job_id: int, as_json: bool, database_url: str | None) -> None:
    """One job: its row, its attempts and its result (exit 4 when there is no such job)."""
    from . import repository
    from .models import iso

    with engine_of(ctx, database_url).connect() as conn:
        job = repository.get_job(conn, job_id)
        if job is None:
            fail(EXIT_NOT_FOUND, f"job {job_id} not found")
        result = repository.get_result(conn, job.task_key)
        attempts = repository.list_attempts(conn, job_id)
    data = job.as_dict()
    data["result"] = result["result"] if result else None
    data["attempt_history"] = [{**a, "started_at": iso(a["started_at"]), "finished_at": iso(a["finished_at"])}
                               for a in attempts]
    if as_json:
        print_json(data)
        return
    for name in ("id", "task_key", "task", "queue", "status", "priority", "lease_owner", "lease_until", "run_at",
                 "created_at", "started_at", "finished_at", "updated_at"):
        click.echo(f"{name:<13} {data[name] if data[name] is not None else '-'}")
    click.echo(f"{'attempts':<13} {job.attempts}/{job.max_attempts}")
    click.echo(f"{'payload':<13} {json.dumps(job.payload, sort_keys=True, ensure_ascii=False)}")
    click.echo(f"{'result':<13} " + (json.dumps(data['result'], sort_keys=True, ensure_ascii=False)
                                      if result else "-"))
    if job.last_error:
        click.echo("last error:")
        click.echo("  " + job.last_error.replace("\n", "\n  "))
    for a in attempts:
        error = (a["error"] or "").splitlines()[0][:80] if a["error"] else ""
        click.echo(f"attempt {a['attempt']}: {a['outcome']} by {a['worker'] or '-'} "
                   f"{iso(a['started_at']) or '-'} .. {iso(a['finished_at'])} {error}".rstrip())


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help='{"job_id", "status", "reasons": [{"code", "detail", ...}]}')
@url_option
@click.pass_context
@answers_errors
def explain(ctx: click.Context, job_id: int, as_json: bool, database_url: str | None) -> None:
    """Why a job is (not) running: its reasons, the main one first (exit 4 when there is no such
    job). Reads only; waits at most about a second on a held row."""
    from . import repository

    # Two connections: a held row's holder is named by a probe on a second one.
    with engine_of(ctx, database_url, pool_size=2).connect() as conn:
        explanation = repository.explain(conn, job_id)
    if as_json:
        print_json(explanation.as_dict())
        return
    click.echo(f"job {explanation.job_id}: {explanation.status.value}")
    for reason in explanation.reasons:
        click.echo(f"  {reason.code}: {reason.detail}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, verdict, detail, advice}")
@click.option("--queue", default="default", show_default=True, help="Queue whose claim plan is EXPLAINed")
@url_option
@click.pass_context
@answers_errors
def doctor(ctx: click.Context, as_json: bool, queue: str, database_url: str | None) -> None:
    """Check the database can run the queue safely; exit 3 when there is a problem."""
    from . import doctor as doctor_mod

    from .replica_watch import ReplicaWatch

    engine = engine_of(ctx, database_url)
    replicas = ReplicaWatch.from_settings(settings_of(ctx, database_url))
    try:
        checks = doctor_mod.run_checks(engine, queue=queue, replicas=replicas)
    finally:
        engine.dispose()
        if replicas is not None:
            replicas.dispose()
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in checks]))
    else:
        for c in checks:
            click.echo(f"{c.verdict.value:<8} {c.name}: {c.detail}")
            if c.advice and c.verdict is not doctor_mod.Verdict.OK:
                click.echo(f"{'':<8} -> {c.advice}")
    if doctor_mod.has_problem(checks):
        sys.exit(EXIT_STATE)


@main.command()
@click.option("--jobs", type=click.IntRange(1, 100000), default=12, show_default=True)
@url_option
@click.pass_context
@answers_errors
def demo(ctx: click.Context, jobs: int, database_url: str | None) -> None:
    """Create the schema, enqueue demo jobs and process them with a burst worker (no web)."""
    from .migrate import init_db
    from .task_modules import load_task_modules
    from .worker import Worker, WorkerConfig

    load_task_modules()
    engine = engine_of(ctx, database_url, pool_size=8)
    init_db(engine)
    enqueue_demo(engine, jobs)
    Worker(engine, WorkerConfig(concurrency=4, burst=True, lease_seconds=30)).run()
    ctx.invoke(stats, as_json=False, database_url=database_url)


@main.command("hash-password")
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True,
              help="The password (asked for when not given)")
def hash_password(password: str) -> None:
    """Print a password hash for JOBQUEUE_USERS (name:role:hash)."""
    from werkzeug.security import generate_password_hash

    if len(password) < 8:
        fail(EXIT_BAD_INPUT, "use at least 8 characters")
    click.echo(generate_password_hash(password))


def enqueue_demo(engine, jobs: int) -> None:
    from . import repository

    specs = []
    for i in range(jobs):
        kind = i % 4
        if kind == 0:
            specs.append({"task": "export_orders", "task_key": f"demo-export-{i}", "payload": {"rows": 5}})
        elif kind == 1:
            specs.append({"task": "sleep", "task_key": f"demo-sleep-{i}", "payload": {"seconds": 2}})
        elif kind == 2:
            specs.append({"task": "noop", "task_key": f"demo-noop-{i}"})
        else:
            specs.append({"task": "fail", "task_key": f"demo-fail-{i}", "max_attempts": 2,
                          "payload": {"message": "demo failure: requeue me from the dashboard"}})
    with engine.connect() as conn:
        results = repository.enqueue_many(conn, specs)
    click.echo(f"enqueued {sum(not r.duplicate for r in results)} demo jobs "
               f"({sum(r.duplicate for r in results)} already known)", err=True)


if __name__ == "__main__":
    from jobqueue.cli import run

    run()
