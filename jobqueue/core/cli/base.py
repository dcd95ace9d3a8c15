"""What every queue command shares: the options, the settings and the engine, errors as exit
codes, the collector paused during start-up, and the `main` group the commands register on."""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
from typing import Any

import click

from ..errors import EXIT_BAD_INPUT, EXIT_ERROR, JobQueueError, LeaseStillValid, RunAgainNeeded, answer_for
from ..settings import BY_ATTRIBUTE, PREFIX, Settings, SettingsError, use

url_option = click.option(
    "--database-url",
    envvar="JOBQUEUE_DATABASE_URL",
    default=None,
    help="mysql+pymysql://user:pass@host/db or sqlite:///path; several URLs separated by "
    "spaces name candidate primaries [env JOBQUEUE_DATABASE_URL; default: SQLite under "
    "./instance]",
)
tasks_option = click.option(
    "--tasks",
    "tasks",
    envvar="JOBQUEUE_TASKS",
    default=None,
    help="Comma-separated modules that register tasks [env JOBQUEUE_TASKS]",
)


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
    "--allow-unregistered",
    is_flag=True,
    help="Take a task name that neither --tasks, the built-in tasks nor any worker registered (its worker "
    "has not started yet); without it such a name is refused as a likely typo",
)


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


def with_tasks(ctx: click.Context, url: str | None, tasks: str | None) -> Settings:
    """The settings, with the task modules of --tasks (else JOBQUEUE_TASKS) imported."""
    from ..task_modules import load_task_modules

    settings = settings_of(ctx, url)
    load_task_modules(tasks if tasks is not None else settings.task_modules)
    return settings


def payload_of(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        fail(EXIT_BAD_INPUT, f"--payload is not valid JSON: {exc}")


def engine_of(ctx: click.Context, url: str | None, pool_size: int = 1, *, worker: bool = False):
    """The command's engine; a worker's bounds its sessions' idle transactions (create_engine)."""
    from ..db import create_engine

    settings = settings_of(ctx, url)
    try:
        engine = create_engine(
            settings.database_urls or None,
            pool_size=pool_size,
            settings=settings,
            idle_transaction_seconds=settings.idle_transaction_seconds if worker else None,
        )
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
@setting_option(
    "log_level", "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False)
)
@click.pass_context
def main(ctx: click.Context, database_url: str | None, log_level: str) -> None:
    """A job queue in a MySQL table, claimed with SELECT ... FOR UPDATE SKIP LOCKED."""
    from .. import logs, metrics

    long_running = ctx.invoked_subcommand in ("worker", "serve", "demo")
    if ctx.invoked_subcommand not in main.commands:
        started()  # commands from above the core (serve) make no engine here: collect as usual
    logs.setup(log_level, threaded=long_running)
    if not long_running:
        metrics.off()  # a one-shot command serves no metrics: do not pay for them
    ctx.ensure_object(dict)
    ctx.obj["database_url"] = database_url


def queue_command(fn):
    """--database-url, the click context, and the queue's errors as exit codes: the stack every
    command that reaches the database wears."""
    return url_option(click.pass_context(answers_errors(fn)))


def json_option(help: str = "Machine-readable output"):
    return click.option("--json", "as_json", is_flag=True, help=help)


def print_table(as_json: bool, data: Any, header: str, lines) -> None:
    """`data` as one JSON line with --json, else the header and a line per row."""
    if as_json:
        print_json(data)
        return
    click.echo(header)
    for line in lines:
        click.echo(line)


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
