"""`jobqueue serve`: the dashboard under gunicorn with embedded workers and the reaper."""

from __future__ import annotations

import ipaddress
import os
import secrets
import sys

import click

from ..core.cli import (
    answers_errors,
    engine_of,
    enqueue_demo,
    fail,
    setting_option,
    settings_of,
    tasks_option,
    url_option,
)
from ..core.errors import EXIT_BAD_INPUT
from .config import ConfigError, load_settings


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port [env PORT; default 8000]")
@setting_option("web_workers", "--web-workers", type=click.IntRange(1, 64), help="gunicorn worker processes")
@setting_option(
    "embedded_workers", "--embedded-workers", type=click.IntRange(0, 256), help="Job threads inside each web process"
)
@click.option("--dev", is_flag=True, help="Development mode: localhost only, a generated admin login and API token")
@click.option("--demo", is_flag=True, help="Enqueue demo jobs first")
@tasks_option
@url_option
@click.pass_context
@answers_errors
def serve(
    ctx: click.Context,
    host: str,
    port: int | None,
    web_workers: int,
    embedded_workers: int,
    dev: bool,
    demo: bool,
    tasks: str | None,
    database_url: str | None,
) -> None:
    """Run the dashboard under gunicorn with embedded workers and the reaper."""
    from ..core.logs import flush
    from ..core.migrate import init_db
    from ..core.task_modules import load_task_modules

    env = os.environ
    url = database_url or ctx.obj.get("database_url")
    if url:
        env["JOBQUEUE_DATABASE_URL"] = url
    if tasks:
        env["JOBQUEUE_TASKS"] = tasks
    env["JOBQUEUE_WEB_WORKERS"] = str(web_workers)
    env["JOBQUEUE_EMBEDDED_WORKERS"] = str(embedded_workers)
    port = port or int(env.get("PORT") or 8000)
    if dev:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            fail(EXIT_BAD_INPUT, "--dev serves localhost only; bind 127.0.0.1 or configure JOBQUEUE_USERS")
        env["JOBQUEUE_DEV"] = "1"
        env.setdefault("JOBQUEUE_SECRET_KEY", secrets.token_hex(32))
        if not env.get("JOBQUEUE_USERS"):
            # One password for every gunicorn worker process.
            env.setdefault("JOBQUEUE_DEV_PASSWORD", secrets.token_urlsafe(12))
        if not env.get("JOBQUEUE_API_TOKENS"):
            env["JOBQUEUE_API_TOKENS"] = f"dev:admin:{secrets.token_urlsafe(24)}"
    settings = settings_of(ctx, url)
    try:
        web = load_settings(settings=settings)
    except ConfigError as exc:
        fail(EXIT_BAD_INPUT, str(exc))
    load_task_modules(settings.task_modules)
    engine = engine_of(ctx, url, pool_size=2)
    init_db(engine)
    if demo:
        enqueue_demo(engine, 12)
    engine.dispose()
    env["JOBQUEUE_BIND"] = f"{host}:{port}"
    shown = f"[{host}]" if ":" in host else host
    banner = [f"jobqueue dashboard: http://{shown}:{port}/"]
    if web.dev_password:
        banner.append(f"login: admin / {web.dev_password}   (development mode, localhost only)")
    else:
        banner.append(f"login: one of {', '.join(sorted(web.users))} (from JOBQUEUE_USERS)")
    if dev and web.api_tokens:
        banner.append(
            f"API token: {web.api_tokens[0].token}   (curl -H 'Authorization: Bearer ...' "
            f"http://{shown}:{port}/api/stats)"
        )
    # gunicorn prints this once its workers are up (gunicorn_conf.when_ready), after its own lines.
    env["_JOBQUEUE_SERVE_BANNER"] = "\n".join(banner)
    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gunicorn_conf.py")
    flush()
    os.execvp(sys.executable, [sys.executable, "-m", "gunicorn", "-c", conf])
