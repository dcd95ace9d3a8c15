"""Migration 0005 on a table that already has jobs: metadata-only on MariaDB (each ALTER says
ALGORITHM=INSTANT or INPLACE, LOCK=NONE, so the server refuses rather than copies), rows kept,
and the new status and columns usable on both backends."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from alembic import command

from jobqueue.core import migrate, repository, service
from jobqueue.core.db import create_engine
from jobqueue.core.models import Status
from tests.conftest import SERVERS, _admin


@pytest.fixture
def empty_url(db_backend, tmp_path):
    if db_backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.sqlite3'}"
        return
    name = f"jqt_{uuid.uuid4().hex[:16]}"
    admin = _admin(db_backend)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        yield f"{SERVERS[db_backend]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def test_upgrade_from_0003_keeps_the_jobs_and_adds_cancelled(empty_url):
    engine = create_engine(empty_url, pool_size=2)
    try:
        with engine.connect() as conn:
            command.upgrade(migrate._config(conn), "0003")
            conn.commit()
            for i, status in enumerate(("ready", "running", "done", "failed", "scheduled")):
                conn.execute(
                    sa.text(
                        "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, attempts, "
                        "max_attempts, created_at, updated_at) VALUES (:k, 'noop', 'default', 0, '{}', :s, "
                        "'2026-12-01 00:00:00', 0, 5, '2026-12-01 00:00:00', '2026-12-01 00:00:00')"
                    ),
                    {"k": f"old-{i}", "s": status},
                )
            conn.commit()
        assert migrate.init_db(engine) == ("0003", migrate.head_revision())
        with engine.connect() as conn:
            jobs = {j.task_key: j for j in repository.reads.list_jobs(conn)}
            assert {k: j.status.value for k, j in jobs.items()} == {
                "old-0": "ready",
                "old-1": "running",
                "old-2": "done",
                "old-3": "failed",
                "old-4": "scheduled",
            }
            assert service.cancel_job(conn, jobs["old-0"].id).after is Status.CANCELLED
            assert repository.reads.get_job(conn, jobs["old-0"].id).status is Status.CANCELLED
            running = conn.execute(sa.text("SELECT COUNT(*) FROM job_queue WHERE concurrency_key IS NOT NULL")).scalar()
            assert running == 0  # no old job has a concurrency key
    finally:
        engine.dispose()
