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

from . import admin, batches, jobs, queues  # noqa: F401 - each registers its commands on `main`
from .admin import enqueue_demo
from .base import (
    answers_errors,
    engine_of,
    fail,
    main,
    pause_collector,
    setting_option,
    settings_of,
    started,
    tasks_option,
    url_option,
)

__all__ = [
    "answers_errors",
    "engine_of",
    "enqueue_demo",
    "fail",
    "main",
    "pause_collector",
    "setting_option",
    "settings_of",
    "started",
    "tasks_option",
    "url_option",
]
