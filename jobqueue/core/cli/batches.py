"""`jobqueue batch open|close|show`: batches of jobs with callbacks (repository/batches.py)."""

from __future__ import annotations

import click

from .base import engine_of, json_option, main, payload_of, print_json, queue_command


@main.group()
def batch() -> None:
    """Batches of jobs whose callbacks fire once: on_success when every member is done,
    on_failure at the first member that fails for good, on_complete when every member has
    finished, each only once the batch is closed. Members: `jobqueue enqueue ... --batch KEY`."""


@batch.command("open")
@click.argument("key")
@click.option("--on-success", default=None, metavar="TASK", help="Enqueued once every member is done")
@click.option("--on-failure", default=None, metavar="TASK", help="Enqueued once, at the first member that fails")
@click.option("--on-complete", default=None, metavar="TASK", help="Enqueued once every member has finished")
@click.option("--payload", default="{}", show_default=True, help="A JSON object, handed to each callback")
@queue_command
def open_(
    ctx: click.Context,
    key: str,
    on_success: str | None,
    on_failure: str | None,
    on_complete: str | None,
    payload: str,
    database_url: str | None,
) -> None:
    """Open the batch KEY (1-64 characters), or find it: an existing batch is answered as it
    was opened ("created": false). Prints the batch as `batch show --json` does."""
    from ..repository import batches

    with engine_of(ctx, database_url).connect() as conn:
        shown, created = batches.open_batch(
            conn,
            key,
            on_success=on_success,
            on_failure=on_failure,
            on_complete=on_complete,
            payload=payload_of(payload),
        )
    print_json(shown | {"created": created})


@batch.command()
@click.argument("key")
@queue_command
def close(ctx: click.Context, key: str, database_url: str | None) -> None:
    """Close the batch KEY: no more members; its callbacks fire once every member has finished
    (at once if they have). Closing a closed batch changes nothing. Exit 4: no such batch."""
    from .. import service

    with engine_of(ctx, database_url).connect() as conn:
        print_json(service.close_batch(conn, key))


@batch.command()
@click.argument("key")
@json_option('{"key", "state", "total", "done", "failed", "cancelled", "pending", "callbacks", ...}')
@queue_command
def show(ctx: click.Context, key: str, as_json: bool, database_url: str | None) -> None:
    """The batch KEY: its state (open, closed, finished), its counts and its callbacks."""
    from ..repository import batches

    with engine_of(ctx, database_url).connect() as conn:
        shown = batches.show(conn, key)
    if as_json:
        print_json(shown)
        return
    click.echo(
        f"{shown['key']}  {shown['state']}  total={shown['total']} done={shown['done']} "
        f"failed={shown['failed']} cancelled={shown['cancelled']} pending={shown['pending']}"
    )
    for name, cb in shown["callbacks"].items():
        fired = f"job {cb['job_id']} ({cb['status']})" if cb["job_id"] else "not fired"
        click.echo(f"  {name}: {cb['task']}  {fired}")
