"""`jobqueue[otel]` is an extra: with opentelemetry not installed (its import blocked here), the
queue imports, enqueues and runs jobs as before, and stores no trace context. With it installed
but no provider set, it stays off and is not even imported by the queue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUN = """
import sys, threading
{block}
import sqlalchemy as sa
from jobqueue.core import service, tracing
from jobqueue.core.db import create_engine
from jobqueue.core.migrate import init_db
from jobqueue.core.tasks import Registry, TaskSpec
from jobqueue.core.worker import Worker, WorkerConfig

engine = create_engine("sqlite:///{path}")
init_db(engine)
ran = []
reg = Registry()
reg.register(TaskSpec("noted", lambda payload, ctx: ran.append(ctx.task_key)))
with engine.connect() as conn:
    service.enqueue(conn, "noted", "k1", {{}}, registry=reg)
    service.enqueue_many(conn, [{{"task": "noted", "task_key": "k2"}}], registry=reg)
Worker(engine, WorkerConfig(concurrency=1, burst=True, idle_cap_seconds=0.1), registry=reg).run()
with engine.connect() as conn:
    rows = conn.exec_driver_sql("SELECT status, trace_context FROM job_queue ORDER BY id").all()
print(sorted(ran), [tuple(r) for r in rows], tracing.enabled(), tracing.current())
print(sorted(m for m, mod in sys.modules.items() if m.startswith("opentelemetry") and mod is not None))
"""


def run(tmp_path, block: str) -> list[str]:
    code = RUN.format(block=block, path=tmp_path / "q.sqlite3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_the_queue_works_with_opentelemetry_not_installed(tmp_path):
    lines = run(tmp_path, "sys.modules['opentelemetry'] = None  # as if not installed")
    assert lines == ["['k1', 'k2'] [('done', None), ('done', None)] False None", "[]"]


def test_installed_but_without_a_provider_it_is_off_and_not_imported(tmp_path):
    lines = run(tmp_path, "")
    assert lines == ["['k1', 'k2'] [('done', None), ('done', None)] False None", "[]"]


def test_a_span_without_a_provider_stores_nothing(tmp_path):
    # The API alone: its proxy provider makes non-recording spans with no valid context.
    lines = run(
        tmp_path,
        "from opentelemetry import trace\n"
        "_span = trace.get_tracer('t').start_as_current_span('outer')\n"
        "_span.__enter__()",
    )
    assert lines[0] == "['k1', 'k2'] [('done', None), ('done', None)] False None"
